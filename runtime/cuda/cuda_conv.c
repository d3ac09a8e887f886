/* cuda_conv.c — the cuda target's convolutions through cuDNN (dnn.c):
 * conv2d and its two gradients, the algorithm cudnnFind picks once per
 * shape (cached on disk beside the cubins), the workspace they share with
 * cuBLASLt or a block of their own, and each run on the session's stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_session.h"

static const size_t CONV_WORKSPACE = (size_t)256 << 20; /* the most a cuDNN algorithm may use (and Find*Ex may try) */

/* ---- convolutions through cuDNN ------------------------------------------------ */

/* cuDNN when the plan has a convolution and cuDNN loads and starts; its
 * absence is no error (the host then runs the convolutions, counted as
 * fallbacks), and dnn.why says what happened. */
void tf_cuda_open_cudnn(cuda_session *c)
{
    bool any = false;
    for (int i = 0; i < c->plan->nkernels && !any; i++) any = c->plan->kernels[i].lib && is_conv(c->plan->kernels[i].lib->op);
    if (!any || c->fallback_all) {
        snprintf(c->dnn.why, sizeof c->dnn.why, any ? "--cuda-fallback=all" : "no convolution");
        return;
    }
    char err[1200];
    if (tf_cuda_libs_add(&c->libs, TF_CUDA_LIB_CUDNN, &c->search, err, sizeof err)) {
        set_text(c->dnn.why, sizeof c->dnn.why, c->libs.cudnn_error);
        return;
    }
    tf_cudnn_status r = c->libs.dnn.Create(&c->dnn.handle);
    const char *call = "cudnnCreate";
    if (!r) {
        call = "cudnnSetStream";
        r = c->libs.dnn.SetStream(c->dnn.handle, c->stream);
        if (r) c->libs.dnn.Destroy(c->dnn.handle);
    }
    if (r) {
        c->dnn.handle = NULL;
        const char *name = c->libs.dnn.GetErrorString(r);
        snprintf(c->dnn.why, sizeof c->dnn.why, "%s failed: %.200s (%.900s)", call, name ? name : "?", c->libs.cudnn_path);
        return;
    }
    c->dnn.ok = true;
}

/* A conv kernel's x, w and y (dy for the gradients), one of them its result. */
static tf_conv_dir conv_operands(const tf_node *n, const tf_value **x, const tf_value **w, const tf_value **y)
{
    if (n->op == TF_OP_CONV2D) {
        *x = n->in[0], *w = n->in[1], *y = n->out;
        return TF_CONV_FORWARD;
    }
    if (n->op == TF_OP_CONV2D_GRAD_INPUT) {
        *y = n->in[0], *w = n->in[1], *x = n->out;
        return TF_CONV_GRAD_INPUT;
    }
    *x = n->in[0], *y = n->in[1], *w = n->out;
    return TF_CONV_GRAD_WEIGHT;
}

void tf_cuda_conv_free(cuda_session *c, tf_conv *cv)
{
    if (!cv) return;
    tf_conv_free(&c->libs, cv);
    tf_free(cv);
}

/* The most workspace a convolution may use: CONV_WORKSPACE, or half the
 * free memory when that is less (read once). */
static size_t conv_ws_limit(cuda_session *c)
{
    if (!c->dnn.ws_limited) {
        size_t free_b = 0, total_b = 0;
        c->dnn.ws_limited = true;
        c->dnn.ws_limit = CONV_WORKSPACE;
        if (c->libs.cu.MemGetInfo(&free_b, &total_b)) c->dnn.ws_limit = 0;
        else if (free_b / 2 < c->dnn.ws_limit) c->dnn.ws_limit = free_b / 2 / ALIGN * ALIGN;
    }
    return c->dnn.ws_limit;
}

/* Scratch for cudnnFind*Ex, allocated when a first convolution is not in
 * the algorithm cache (a smaller block, or none, when the device refuses). */
static tf_cu_deviceptr find_workspace(cuda_session *c, size_t *bytes)
{
    if (!c->dnn.find_ws) {
        size_t want = conv_ws_limit(c);
        for (; want >= ((size_t)1 << 20); want = want / 2 / ALIGN * ALIGN)
            if (!c->libs.cu.MemAlloc(&c->dnn.find_ws, want)) break;
        if (want < ((size_t)1 << 20)) c->dnn.find_ws = 0;
        c->dnn.find_ws_bytes = c->dnn.find_ws ? want : 0;
        dev_count(c, (int64_t)c->dnn.find_ws_bytes);
        c->dnn.ws_limit = c->dnn.find_ws_bytes;   /* what every later choice must fit */
    }
    *bytes = c->dnn.find_ws_bytes;
    return c->dnn.find_ws;
}

/* Plan kernel gk's convolution; false with the reason in gk->why when cuDNN
 * cannot take it (the host then runs it). The algorithm comes from the
 * disk cache, else from cudnnFind*Ex on the session's own buffers (it
 * overwrites the result, which nothing has written yet). */
bool tf_cuda_conv_setup(cuda_session *c, gkernel *gk, bool *oom_out)
{
    const tf_node *n = gk->k->lib;
    const tf_value *x, *w, *y;
    tf_conv_desc d;
    memset(&d, 0, sizeof d);
    *oom_out = false;
    if (!c->dnn.ok) {
        set_text(gk->why, sizeof gk->why, c->dnn.why);
        return false;
    }
    d.dir = conv_operands(n, &x, &w, &y);
    if (n->nin > 2 && n->op == TF_OP_CONV2D) {
        snprintf(gk->why, sizeof gk->why, "conv2d with a bias operand (lower splits the bias into an add, which cuDNN's conv leaves out)");
        return false;
    }
    tf_dt t = x->type.dtype;
    if (x->kind == TF_VAL_CONST || w->kind == TF_VAL_CONST || y->kind == TF_VAL_CONST || x->type.rank != 4 || w->type.rank != 4 ||
        y->type.rank != 4 || w->type.dtype != t || y->type.dtype != t || (t != TF_DT_F32 && t != TF_DT_F16 && t != TF_DT_BF16)) {
        snprintf(gk->why, sizeof gk->why, "%s of %s x, %s w, %s y: cuDNN is used for rank-4 f32, f16 and bf16 tensors of one type",
                 tf_op_info_of(n->op)->name, tf_dtype_name(x->type.dtype), tf_dtype_name(w->type.dtype), tf_dtype_name(y->type.dtype));
        return false;
    }
    d.type = t == TF_DT_F32 ? TF_CONV_F32 : t == TF_DT_F16 ? TF_CONV_F16 : TF_CONV_BF16;
    d.N = x->type.dims[0].n, d.C = x->type.dims[1].n, d.H = x->type.dims[2].n, d.W = x->type.dims[3].n;
    d.O = w->type.dims[0].n, d.KH = w->type.dims[2].n, d.KW = w->type.dims[3].n;
    d.Ho = y->type.dims[2].n, d.Wo = y->type.dims[3].n;
    tf_node_pair(n, "stride", 1, 1, d.stride);
    tf_node_pair(n, "padding", 0, 0, d.pad);
    tf_node_pair(n, "dilation", 1, 1, d.dilation);
    d.groups = tf_node_int(n, "groups");
    if (d.groups < 1) d.groups = 1;
    d.tf32 = c->tf32;
    d.gpu = c->gpu;
    d.x = dev_of(c, x), d.w = dev_of(c, w), d.y = dev_of(c, y);
    if (!d.x || !d.w || !d.y) {
        snprintf(gk->why, sizeof gk->why, "%s: an operand or the result is not in device memory", tf_op_info_of(n->op)->name);
        return false;
    }
    d.max_workspace = conv_ws_limit(c);
    d.cached_only = true;   /* Find's scratch only when something is not cached */
    tf_conv *cv = tf_calloc(1, sizeof *cv);
    if (!cv) {
        *oom_out = true;
        return false;
    }
    char err[1200];
    tf_cuda_status st = tf_conv_plan(&c->libs, c->dnn.handle, &d, cv, err, sizeof err);
    if (st == TF_CUDA_ERR_NOT_FOUND && cv->cache_miss) {
        d.cached_only = false;
        d.ws = find_workspace(c, &d.max_workspace);
        st = tf_conv_plan(&c->libs, c->dnn.handle, &d, cv, err, sizeof err);
    }
    if (st) {
        char why[1300];
        snprintf(why, sizeof why, "cuDNN: %s", err);
        set_text(gk->why, sizeof gk->why, why);
        *oom_out = st == TF_CUDA_ERR_OOM;
        tf_free(cv);
        return false;
    }
    gk->conv = cv;
    return true;
}

/* Once every convolution is planned: Find's scratch goes back, and the
 * workspace the chosen algorithms need (the largest) is cuBLASLt's when
 * that is big enough, else one block of its own. */
tf_status tf_cuda_conv_workspace(tf_session_t *s, cuda_session *c)
{
    if (c->dnn.find_ws) {
        CU_DO("freeing cuDNN's search workspace", MemFree(c->dnn.find_ws));
        dev_count(c, -(int64_t)c->dnn.find_ws_bytes);
        c->dnn.find_ws = 0;
        c->dnn.find_ws_bytes = 0;
    }
    size_t need = 0;
    for (int i = 0; i < c->plan->nkernels; i++)
        if (c->ks[i].conv && c->ks[i].conv->workspace > need) need = c->ks[i].conv->workspace;
    if (!need) return TF_OK;
    if (c->ws_dev && need <= c->ws_bytes) {   /* one stream: a GEMM and a conv never run at once */
        c->dnn.ws = c->ws_dev;
        c->dnn.ws_bytes = c->ws_bytes;
        return TF_OK;
    }
    tf_cu_result r = c->libs.cu.MemAlloc(&c->dnn.ws_own, need);
    if (r) {
        c->dnn.ws_own = 0;
        tf_cuda_check(&c->libs, r, "cuMemAlloc", __FILE__, __LINE__, c->err, sizeof c->err);
        return cu_fail(s, c, r, "allocating cuDNN's workspace");
    }
    dev_count(c, (int64_t)need);
    c->dnn.ws = c->dnn.ws_own;
    c->dnn.ws_bytes = need;
    return TF_OK;
}

tf_status tf_cuda_run_conv(tf_session_t *s, cuda_session *c, gkernel *gk)
{
    const tf_value *x, *w, *y;
    conv_operands(gk->k->lib, &x, &w, &y);
    char err[600];
    tf_cuda_status st = tf_conv_run(&c->libs, c->dnn.handle, gk->conv, dev_of(c, x), dev_of(c, w), dev_of(c, y), c->dnn.ws, c->dnn.ws_bytes,
                                    err, sizeof err);
    if (st)
        return tf_set_error(s->ctx, st == TF_CUDA_ERR_OOM ? TF_ERR_OOM : TF_ERR_RUNTIME, "error: cuda: kernel %s (%s): %s", gk->k->name,
                            tf_op_info_of(gk->k->lib->op)->name, err);
    return TF_OK;
}

/* --cuda-explain: the algorithm each convolution got, and from where. */
void tf_cuda_explain_convs(FILE *f, const cuda_session *c)
{
    for (int i = 0; i < c->plan->nkernels; i++) {
        const gkernel *gk = &c->ks[i];
        if (gk->how != RUN_CONV) continue;
        const tf_conv *cv = gk->conv;
        fprintf(f, "cuda: kernel %s: %s through cuDNN, %s algorithm %s (%d), %s, %s, %zu bytes of workspace, %s (%.3f ms)\n",
                gk->k->name, tf_op_info_of(gk->k->lib->op)->name, tf_conv_dir_name(cv->dir), tf_conv_algo_name(cv->dir, cv->algo),
                cv->algo, tf_conv_math_name(cv->math), cv->deterministic ? "deterministic" : "non-deterministic", cv->workspace,
                cv->from_cache ? "from the algorithm cache" : "found by cudnnFind", cv->ms);
    }
}
