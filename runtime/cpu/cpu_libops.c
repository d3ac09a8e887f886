/* cpu_libops.c — the cpu target's library kernels besides matmul
 * (cpu_gemm.c): conv2d and its two gradients through oneDNN's primitives
 * or im2col + GEMM (and which of the two, chosen when the session starts),
 * pooling and its gradients, gather and scatter_add on storage, concat and
 * slice_grad as copies; and the f16/bf16 <-> f32 conversions all of them
 * use to run in float32 on values stored narrower. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "conv_dnnl.h"
#include "cpu_backend.h"
#include "cpu_ops.h"
#include "lowp.h"

#ifdef TFUSE_HAVE_LLVM

/* ---- operands in float32 ------------------------------------------------- */

/* f16/bf16 <-> f32 over n elements, split over the pool when long enough
 * to be worth it (lowp.c's vector code; every element converted alone, so
 * the split changes nothing). */
typedef struct conv_job { tf_dt t; bool widen; const void *src; void *dst; } conv_job;
enum { CONV_CHUNK = 1 << 15 };

static void convert_range(const conv_job *j, int64_t i0, int64_t n)
{
    if (j->widen) {
        const uint16_t *h = (const uint16_t *)j->src + i0;
        float *f = (float *)j->dst + i0;
        if (j->t == TF_DT_BF16) tf_cpu_bf16_to_f32(h, f, n);
        else tf_cpu_f16_to_f32(h, f, n);
    } else {
        const float *f = (const float *)j->src + i0;
        uint16_t *h = (uint16_t *)j->dst + i0;
        if (j->t == TF_DT_BF16) tf_cpu_f32_to_bf16(f, h, n);
        else tf_cpu_f32_to_f16(f, h, n);
    }
}

typedef struct conv_chunks_job { const conv_job *j; int64_t n; } conv_chunks_job;

/* chunks [lo, hi) of CONV_CHUNK elements (the last one short) */
static void conv_chunks(void *arg, int64_t lo, int64_t hi)
{
    const conv_chunks_job *cj = arg;
    int64_t i0 = lo * CONV_CHUNK, i1 = hi * CONV_CHUNK < cj->n ? hi * CONV_CHUNK : cj->n;
    if (i1 > i0) convert_range(cj->j, i0, i1 - i0);
}

void tf_cpu_convert(cpu *c, tf_dt t, bool widen, const void *src, void *dst, int64_t n)
{
    conv_job j = {t, widen, src, dst};
    if (n < 2 * CONV_CHUNK || tf_pool_threads(c->pool) < 2) {
        convert_range(&j, 0, n);
        return;
    }
    conv_chunks_job cj = {&j, n};
    tf_pool_run(c->pool, (n + CONV_CHUNK - 1) / CONV_CHUNK, conv_chunks, &cj);
}

/* A float32 view of a value: its storage, or a widened copy in dst. */
const float *tf_cpu_as_f32(cpu *c, const tf_value *v, float *dst)
{
    void *p = storage(c, v);
    tf_dt t = v->type.dtype;
    if (t == TF_DT_F32) return p;
    tf_cpu_convert(c, t, true, p, dst, tf_type_numel(&v->type));
    return dst;
}

/* Round a float32 result into a value's storage (f16/bf16: nearest even). */
void tf_cpu_from_f32(cpu *c, const tf_value *v, const float *src)
{
    void *p = storage(c, v);
    if (v->type.dtype == TF_DT_F32) {
        if (p != src) memcpy(p, src, value_bytes(v));
        return;
    }
    tf_cpu_convert(c, v->type.dtype, false, src, p, tf_type_numel(&v->type));
}

/* ---- convolution ---------------------------------------------------------- */

static void conv_geom(const tf_node *n, const tf_type *x, const tf_type *w, const tf_type *y, tf_conv_geom *g)
{
    tf_node_pair(n, "stride", 1, 1, g->s);
    tf_node_pair(n, "padding", 0, 0, g->p);
    tf_node_pair(n, "dilation", 1, 1, g->dl);
    g->G = tf_node_int(n, "groups");
    if (g->G < 1) g->G = 1;
    g->N = x->dims[0].n, g->C = x->dims[1].n, g->H = x->dims[2].n, g->W = x->dims[3].n;
    g->O = w->dims[0].n, g->Cg = w->dims[1].n, g->KH = w->dims[2].n, g->KW = w->dims[3].n;
    g->Ho = y->dims[2].n, g->Wo = y->dims[3].n, g->Og = g->O / g->G;
}

typedef struct epi_job { ckernel *ck; const uint64_t *rt; } epi_job;

/* The epilogue kernel over images [n0, n1) (its split axis is the images). */
static void epi_piece(void *arg, int64_t n0, int64_t n1)
{
    const epi_job *e = arg;
    e->ck->fn(e->ck->bufs, n0, n1, e->rt);
}

bool tf_cpu_run_conv(cpu *c, ckernel *ck)
{
    ck->conv_failed = false;
    const tf_node *n = ck->k->lib;
    how h = ck->how;
    const tf_value *xv, *wv, *yv, *ov = n->out;
    if (h == RUN_CONV) xv = n->in[0], wv = n->in[1], yv = ov;
    else if (h == RUN_CONV_GI) xv = ov, wv = n->in[1], yv = n->in[0];
    else xv = n->in[0], wv = ov, yv = n->in[1];
    tf_conv_geom g;
    conv_geom(n, &xv->type, &wv->type, &yv->type, &g);
    int T = tf_pool_threads(c->pool);
    int64_t wsize = numel(wv);
    size_t need = 16;
    for (int q = 0; q < n->nin; q++) need += n->in[q]->type.dtype != TF_DT_F32 ? (size_t)numel(n->in[q]) : 0;
    need += ov->type.dtype != TF_DT_F32 ? (size_t)numel(ov) : 0;
    size_t lib = ck->dnnl ? (tf_dnnl_conv_scratch_bytes(ck->dnnl) + 3) / 4
                          : (size_t)T * (size_t)tf_conv_scratch(&g) + (h == RUN_CONV_GW ? (size_t)tf_conv_grad_weight_groups(&g) * (size_t)wsize : 0);
    size_t im2col_need = (size_t)T * (size_t)tf_conv_scratch(&g) + (h == RUN_CONV_GW ? (size_t)tf_conv_grad_weight_groups(&g) * (size_t)wsize : 0);
    float *at = tf_cpu_scratch(c, need + (lib > im2col_need ? lib : im2col_need));   /* room for im2col too, should oneDNN fail */
    const float *in[3] = {0};
    for (int q = 0; q < n->nin; q++) {
        in[q] = tf_cpu_as_f32(c, n->in[q], at);
        if (in[q] == at) at += numel(n->in[q]);
    }
    float *out = ov->type.dtype == TF_DT_F32 ? storage(c, ov) : at;
    if (out == at) at += numel(ov);
    at = (float *)(((uintptr_t)at + 63) / 64 * 64);   /* 64-byte aligned for oneDNN's scratch */
    if (ck->dnnl) {
        const float *bias = n->nin > 2 ? in[2] : NULL;
        float *dst = out;
        if (ck->epi_in_conv) bias = ck->bufs[ck->epi_bias], dst = ck->bufs[ck->epi_out];
        /* an epilogue kernel split along the images runs on each piece's images as soon as they are written */
        int ax = ck->fn && !ck->epi_in_conv && ov->type.dtype == TF_DT_F32 ? tf_kernel_split_axis(ck->k) : -1;
        epi_job e = {ck, c->rt};
        bool per_piece = ax == 0 && ck->k->dims[0] == g.N && h == RUN_CONV, ran = false;
        if (tf_dnnl_conv_run(ck->dnnl, c->pool, in[0], in[1], bias, dst, at, ck->kept, ck->kept_gen != c->state_gen,
                             per_piece ? epi_piece : NULL, &e, &ran)) {
            ck->kept_gen = c->state_gen;
            if (ov->type.dtype != TF_DT_F32 && !ck->epi_in_conv) tf_cpu_from_f32(c, ov, out);
            return ran;
        }
        /* a primitive failed at run time: im2col from now on (said by --cpu-explain), unless the images are in
         * nChw16c, which im2col cannot read, or an epilogue already ran on some pieces (its result may be
         * where the image was): then the step fails */
        if (per_piece || tf_dnnl_conv_is_blocked(ck->dnnl, false) || tf_dnnl_conv_is_blocked(ck->dnnl, true)) {
            ck->conv_failed = true;
            return true;
        }
        tf_dnnl_conv_free(ck->dnnl);
        ck->dnnl = NULL;
        ck->epi_in_conv = false;
        snprintf(ck->conv_why, sizeof ck->conv_why, "a oneDNN primitive failed when it ran; im2col since");
    }
    float *col = at;
    at += (size_t)T * (size_t)tf_conv_scratch(&g);
    if (h == RUN_CONV) tf_cpu_conv2d(c->pool, &g, in[0], in[1], n->nin > 2 ? in[2] : NULL, out, col);
    else if (h == RUN_CONV_GI) tf_cpu_conv2d_grad_input(c->pool, &g, in[0], in[1], out, col);
    else tf_cpu_conv2d_grad_weight(c->pool, &g, in[0], in[1], out, col, at);
    if (ov->type.dtype != TF_DT_F32) tf_cpu_from_f32(c, ov, out);
    return false;
}

/* Whether storage of a and b overlaps. */
static bool overlap(cpu *c, const tf_value *a, const tf_value *b)
{
    const unsigned char *pa = storage(c, a), *pb = storage(c, b);
    return pa && pb && pa < pb + value_bytes(b) && pb < pa + value_bytes(a);
}

/* A forward convolution's region epilogue that oneDNN can write instead:
 * exactly y = conv + bias[o] in f32, over the convolution's whole output,
 * stored once, with the convolution's own result read by nothing else (it
 * is then never written). relu(conv + bias[o]) is recognized but not
 * handed over: oneDNN's ReLU post-op loses NaN (relu(NaN) is NaN here, as
 * in the interpreter), so the epilogue kernel keeps it. The bias and the
 * result's buffers go to *bias and *out; why says why not. */
static bool conv_epilogue(cpu *c, const tf_module *m, const tf_kernel *k, const tf_conv_geom *g, int *bias, int *out, bool *relu, char *why, size_t n)
{
    const tf_node *nd = k->lib;
    const tf_value *cv = root_of(nd->out);
    if (!k->nexprs) return false;
    snprintf(why, n, "its epilogue is not conv + bias[channel] (+ ReLU) in f32");
    if (nd->nin > 2 || k->nstores != 1 || k->nreds || k->rank != 4 || cv->type.dtype != TF_DT_F32) return false;
    int64_t dims[4] = {g->N, g->O, g->Ho, g->Wo}, contig[4] = {g->O * g->Ho * g->Wo, g->Ho * g->Wo, g->Wo, 1}, chan[4] = {0, 1, 0, 0};
    for (int a = 0; a < 4; a++)
        if (k->dims[a] != dims[a]) return false;
    int conv_e = -1, bias_e = -1, add_e = -1, relu_e = -1;
    for (int e = 0; e < k->nexprs; e++) {
        const tf_kexpr *x = &k->exprs[e];
        if (x->dtype != TF_DT_F32) return false;
        if (x->kind == TF_KX_LOAD) {
            const tf_value *v = root_of(k->bufs[x->buf].value);
            bool is_conv = v == cv && !memcmp(x->strides, contig, sizeof contig) && x->offset == 0 && conv_e < 0;
            bool is_bias = !is_conv && !memcmp(x->strides, chan, sizeof chan) && x->offset == 0 && numel(v) == g->O &&
                           v->type.dtype == TF_DT_F32 && bias_e < 0;
            if (is_conv) conv_e = e;
            else if (is_bias) bias_e = e;
            else return false;
        } else if (x->kind == TF_KX_OP && x->op == TF_OP_ADD && add_e < 0 && x->nargs == 2 && conv_e >= 0 && bias_e >= 0 &&
                   ((x->args[0] == conv_e && x->args[1] == bias_e) || (x->args[0] == bias_e && x->args[1] == conv_e))) {
            add_e = e;
        } else if (x->kind == TF_KX_OP && x->op == TF_OP_RELU && relu_e < 0 && add_e >= 0 && x->args[0] == add_e) {
            relu_e = e;
        } else {
            return false;
        }
    }
    int last = relu_e >= 0 ? relu_e : add_e;
    if (add_e < 0 || last != k->nexprs - 1 || k->stores[0].expr != last || k->stores[0].reduced_domain) return false;
    if (relu_e >= 0)   /* test_cpu_conv's NaN case: oneDNN 2.6's post-op gave 0 where relu(NaN) is NaN */
        return snprintf(why, n, "ReLU stays in the epilogue kernel: oneDNN's ReLU post-op turns NaN into 0, tfuse's relu keeps NaN"),
               false;
    const tf_value *yv = k->bufs[k->stores[0].buf].value, *bv = k->bufs[k->exprs[bias_e].buf].value;
    if (yv->type.dtype != TF_DT_F32 || numel(yv) != numel(cv)) return false;
    /* the convolution's own result: read by no other kernel, not an output */
    for (int i = 0; i < c->plan->nkernels; i++) {
        const tf_kernel *o = &c->plan->kernels[i];
        if (o == k) continue;
        for (int b = 0; b < o->nbufs; b++)
            if (root_of(o->bufs[b].value) == cv) return snprintf(why, n, "kernel %s reads the convolution's result", o->name), false;
        if (o->lib)
            for (int q = 0; q < o->lib->nin; q++)
                if (o->lib->in[q]->kind != TF_VAL_CONST && root_of(o->lib->in[q]) == cv)
                    return snprintf(why, n, "kernel %s reads the convolution's result", o->name), false;
    }
    for (int i = 0; i < m->noutputs + m->nupdates; i++) {
        const tf_value *v = i < m->noutputs ? m->outputs[i].value : m->updates[i - m->noutputs].value;
        if (v->kind != TF_VAL_CONST && root_of(v) == cv) return snprintf(why, n, "the convolution's result is an output"), false;
    }
    for (int q = 0; q < 2; q++)
        if (overlap(c, yv, nd->in[q]) || overlap(c, bv, yv))
            return snprintf(why, n, "the epilogue's result shares memory with the convolution's operands"), false;
    *bias = k->exprs[bias_e].buf;
    *out = k->stores[0].buf;
    *relu = relu_e >= 0;
    return true;
}

/* How a convolution node runs: oneDNN's primitives, made now, or im2col
 * (conv_why says why). */
void tf_cpu_conv_choose(tf_session_t *s, cpu *c, ckernel *ck)
{
    const tf_node *n = ck->k->lib;
    const tf_value *xv, *wv, *yv, *ov = n->out;
    if (ck->how == RUN_CONV) xv = n->in[0], wv = n->in[1], yv = ov;
    else if (ck->how == RUN_CONV_GI) xv = ov, wv = n->in[1], yv = n->in[0];
    else xv = n->in[0], wv = ov, yv = n->in[1];
    if (s->p->settings.cpu_conv_im2col) {
        snprintf(ck->conv_why, sizeof ck->conv_why, "--cpu-conv=im2col");
        return;
    }
    if (!tf_dnnl_available()) {
        snprintf(ck->conv_why, sizeof ck->conv_why, "this build has no oneDNN");
        return;
    }
    tf_conv_geom g;
    conv_geom(n, &xv->type, &wv->type, &yv->type, &g);
    bool relu = false, fuse = false;
    char epi_why[200] = "";
    if (ck->how == RUN_CONV) fuse = conv_epilogue(c, s->p->m, ck->k, &g, &ck->epi_bias, &ck->epi_out, &relu, epi_why, sizeof epi_why);
    tf_dnnl_dir dir = ck->how == RUN_CONV ? TF_DNNL_FWD : ck->how == RUN_CONV_GI ? TF_DNNL_BWD_DATA : TF_DNNL_BWD_WEIGHTS;
    /* oneDNN picks its layout (blocked nChw16c, or nhwc for brgconv) and each
     * piece reorders into it and back: on bench/models/resnet.ir that beat
     * tfuse's NCHW handed to oneDNN as is (its gemm implementation, no faster
     * than im2col) by about 2x (bench/RESULTS.md, 2026-11-24) */
    bool blocked = true;
    ck->dnnl = tf_dnnl_conv_create(dir, &g, fuse || n->nin > 2, relu, blocked, tf_pool_threads(c->pool), ck->conv_why,
                                   sizeof ck->conv_why);
    if (ck->dnnl && fuse) ck->epi_in_conv = true;
    else if (ck->dnnl && epi_why[0]) snprintf(ck->conv_why, sizeof ck->conv_why, "epilogue kept: %s", epi_why);
    /* inference whose weights only the state decides (a param, or computed from params alone): the reorder into the
     * primitive's layout is kept between steps and redone when the state changes, as packed GEMM weights are */
    const tf_value *wr = root_of(wv);
    bool steady = s->p->mode == TF_IR_INFER && !s->p->m->nupdates && !s->p->settings.cpu_state_every &&
                  (wr->kind == TF_VAL_PARAM || wr->kind == TF_VAL_BUFFER || wr->once);
    size_t kb = ck->dnnl && dir == TF_DNNL_FWD && steady ? tf_dnnl_conv_kept_bytes(ck->dnnl) : 0;
    if (kb) ck->kept = tf_cpu_own(c, kb + 64);   /* NULL (no memory): reordered every step, as before */
    if (ck->kept) ck->kept = (void *)(((uintptr_t)ck->kept + 63) / 64 * 64);
}

/* ---- pooling, gather and scatter_add, concat and slice_grad ---------------- */

void tf_cpu_run_pool(cpu *c, const tf_node *n, bool grad)
{
    const tf_value *big = grad ? n->out : n->in[0], *small = grad ? n->in[n->nin - 1] : n->out, *ov = n->out;
    tf_pool_geom g = {.planes = big->type.dims[0].n * big->type.dims[1].n, .H = big->type.dims[2].n, .W = big->type.dims[3].n,
                      .Ho = small->type.dims[2].n, .Wo = small->type.dims[3].n};
    tf_node_pair(n, "kernel", 1, 1, g.k);
    tf_node_pair(n, "stride", g.k[0], g.k[1], g.s);
    tf_node_pair(n, "padding", 0, 0, g.p);
    bool is_max = n->op == TF_OP_MAXPOOL2D || n->op == TF_OP_MAXPOOL2D_GRAD;
    size_t need = 1;
    for (int q = 0; q < n->nin; q++) need += n->in[q]->type.dtype != TF_DT_F32 ? (size_t)numel(n->in[q]) : 0;
    need += ov->type.dtype != TF_DT_F32 ? (size_t)numel(ov) : 0;
    float *at = tf_cpu_scratch(c, need);
    const float *in[2] = {0};
    for (int q = 0; q < n->nin; q++) {
        in[q] = tf_cpu_as_f32(c, n->in[q], at);
        if (in[q] == at) at += numel(n->in[q]);
    }
    float *out = ov->type.dtype == TF_DT_F32 ? storage(c, ov) : at;
    if (!grad) tf_cpu_pool2d(c->pool, &g, is_max, in[0], out);
    else tf_cpu_pool2d_grad(c->pool, &g, is_max, is_max ? in[0] : NULL, in[n->nin - 1], out);
    if (ov->type.dtype != TF_DT_F32) tf_cpu_from_f32(c, ov, out);
}

static int64_t id_at(const tf_value *ids, const void *p, int64_t i)
{
    return ids->type.dtype == TF_DT_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

/* gather (embedding): rows of the table by id; scatter_add: its gradient.
 * false when an id is out of range: the reference then runs the kernel and
 * reports it, with the op's location. */
bool tf_cpu_run_gather(cpu *c, const tf_node *n, bool scatter)
{
    const tf_value *ids = n->in[0], *tab = scatter ? n->out : n->in[1];
    int64_t V = tab->type.rank ? tab->type.dims[0].n : 1, rows = numel(ids);
    int64_t row = V > 0 ? numel(tab) / V : 0;
    const void *ip = storage(c, ids);
    for (int64_t i = 0; i < rows; i++)
        if (id_at(ids, ip, i) < 0 || id_at(ids, ip, i) >= V) return false;
    if (!scatter) {
        size_t rb = (size_t)row * (size_t)tf_dtype_bytes(tab->type.dtype);
        const char *src = storage(c, tab);
        char *dst = storage(c, n->out);
        for (int64_t i = 0; i < rows; i++) memcpy(dst + (size_t)i * rb, src + (size_t)id_at(ids, ip, i) * rb, rb);
        return true;
    }
    float *dst = storage(c, n->out);
    const float *dy = storage(c, n->in[1]);
    memset(dst, 0, value_bytes(n->out));
    for (int64_t i = 0; i < rows; i++) {
        float *d = dst + id_at(ids, ip, i) * row;
        const float *s = dy + i * row;
        for (int64_t j = 0; j < row; j++) d[j] += s[j];
    }
    return true;
}

/* concat: out as [outer, len, inner], operand i as [outer, len_i, inner]
 * placed at its offset along the axis. slice_grad: zeros, dy's rows at
 * start + j * step. Both move bytes, so any dtype; false for an axis the
 * verifier should have refused. */
bool tf_cpu_run_copy(cpu *c, const tf_node *n)
{
    const tf_value *out = n->out;
    int rank = out->type.rank, ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), rank, &ax)) return false;
    size_t es = (size_t)tf_dtype_bytes(out->type.dtype);
    int64_t outer = 1, inner = 1, len = out->type.dims[ax].n;
    for (int i = 0; i < ax; i++) outer *= out->type.dims[i].n;
    for (int i = ax + 1; i < rank; i++) inner *= out->type.dims[i].n;
    char *dst = storage(c, out);
    if (n->op == TF_OP_CONCAT) {
        int64_t pos = 0;
        for (int q = 0; q < n->nin; q++) {
            int64_t m = n->in[q]->type.dims[ax].n;
            const char *src = storage(c, n->in[q]);
            for (int64_t o = 0; o < outer; o++)
                memcpy(dst + (size_t)((o * len + pos) * inner) * es, src + (size_t)(o * m * inner) * es, (size_t)(m * inner) * es);
            pos += m;
        }
        return true;
    }
    int64_t m = n->in[0]->type.dims[ax].n, start = tf_node_int(n, "start"), step = tf_node_int(n, "step");
    tf_slice_bounds(len, start, len, &start, NULL);
    if (m > 0 && start + (m - 1) * step >= len) return false;
    const char *src = storage(c, n->in[0]);
    memset(dst, 0, value_bytes(out));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < m; j++)
            memcpy(dst + (size_t)((o * len + start + j * step) * inner) * es, src + (size_t)((o * m + j) * inner) * es,
                   (size_t)inner * es);
    return true;
}

#endif /* TFUSE_HAVE_LLVM */
