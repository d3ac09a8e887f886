/* cuda_gemm.c — the cuda target's matmuls through cuBLASLt (blas.c): a
 * kernel's matmul planned once (the fastest of the heuristic's algorithms,
 * timed once per shape and cached on disk), with its region's row bias and
 * ReLU as cuBLASLt's epilogue where that is all the region adds, and run
 * every step. The backward epilogues (bias gradients, ReLU's derivative)
 * are cuda_gemm_backward.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_session.h"

static const size_t GEMM_WORKSPACE = (size_t)32 << 20;  /* cuBLASLt's workspace: 32 MiB, what Hopper's kernels ask for */

/* ---- matmul through cuBLASLt ---------------------------------------------------- */

/* cuBLASLt when it loads and starts; its absence is no error (the host then
 * runs the GEMMs, counted as fallbacks), and lt.why says what happened. */
void tf_cuda_open_cublaslt(cuda_session *c)
{
    bool any = false;
    for (int i = 0; i < c->plan->nkernels && !any; i++) any = c->plan->kernels[i].lib && c->plan->kernels[i].lib->op == TF_OP_MATMUL;
    if (!any || c->fallback_all) {
        snprintf(c->lt.why, sizeof c->lt.why, any ? "--cuda-fallback=all" : "no matmul");
        return;
    }
    char err[1200];
    if (tf_cuda_libs_add(&c->libs, TF_CUDA_LIB_CUBLASLT, &c->search, err, sizeof err)) {
        set_text(c->lt.why, sizeof c->lt.why, c->libs.cublaslt_error);
        return;
    }
    tf_cublas_status r = c->libs.lt.Create(&c->lt.handle);
    if (r) {
        c->lt.handle = NULL;
        const char *name = c->libs.lt.GetStatusName(r);
        snprintf(c->lt.why, sizeof c->lt.why, "cublasLtCreate failed: %.200s (%.900s)", name ? name : "?", c->libs.cublaslt_path);
        return;
    }
    c->lt.ok = true;
    c->ws_bytes = GEMM_WORKSPACE;
}

static bool gemm_type(tf_dt t, tf_gemm_type *out)
{
    if (t == TF_DT_F32) *out = TF_GEMM_F32;
    else if (t == TF_DT_F16) *out = TF_GEMM_F16;
    else if (t == TF_DT_BF16) *out = TF_GEMM_BF16;
    else return false;
    return true;
}

void tf_cuda_gemm_call_free(cuda_session *c, gemm_call *mm)
{
    if (!mm) return;
    tf_gemm_free(&c->libs, &mm->g);
    if (mm->own) c->libs.cu.MemFree(mm->own);
    tf_free(mm->off_a);
    tf_free(mm->off_b);
    tf_free(mm);
}

/* ---- cuBLASLt epilogues ---------------------------------------------------------------- */

/* What a GEMM region's epilogue hands to cuBLASLt: a bias added along the
 * product's rows, and a ReLU after it, when the region computes exactly
 * that (the bias in the product's dtype, broadcast along every axis but the
 * last). The GEMM then writes the biased (and rectified) product straight
 * into the value the region stores it as, where that value overlaps no
 * other buffer of the kernel; what else the region computes from it stays
 * in the epilogue kernel, reading that value. cuBLASLt adds the bias before
 * rounding the product to a 16-bit type once, where the region rounds the
 * product and then the sum: a half-ulp apart at most. GELU is never handed
 * over: cuBLASLt's is the tanh approximation, tfuse's gelu is erf's. An
 * epi_plan (cuda_session.h) holds what is handed over. */

static int buf_index(const tf_kernel *k, const tf_value *v)
{
    for (int b = 0; b < k->nbufs; b++)
        if (k->bufs[b].value == v) return b;
    return -1;
}

bool tf_cuda_row_major_load(const tf_kernel *k, const tf_kexpr *x, int buf)
{
    if (x->kind != TF_KX_LOAD || x->buf != buf || x->offset) return false;
    int64_t s = 1;
    for (int a = k->rank - 1; a >= 0; a--) {
        if (k->dims[a] > 1 && x->strides[a] != s) return false;
        s *= k->dims[a];
    }
    return true;
}

/* A bias: the last axis at stride 1, every other at 0, a vector of that length. */
static bool bias_load(const tf_kernel *k, const tf_kexpr *x)
{
    if (x->kind != TF_KX_LOAD || x->offset || k->rank < 1 || k->bufs[x->buf].written) return false;
    for (int a = 0; a < k->rank - 1; a++)
        if (k->dims[a] > 1 && x->strides[a]) return false;
    int64_t n = k->dims[k->rank - 1];
    return (n == 1 || x->strides[k->rank - 1] == 1) && tf_type_numel(&k->bufs[x->buf].value->type) == n;
}

void tf_cuda_epi_free(tf_kernel *rest)
{
    if (!rest) return;
    tf_free(rest->exprs);
    tf_free(rest->stores);
    tf_free(rest);
}

/* The kernel applies a gelu (erf's: x/2 (1 + erf(x / sqrt 2)), as the op
 * lowers) to expression x, or to anything when x < 0. */
static bool has_gelu(const tf_kernel *k, int x)
{
    for (int i = 0; i < k->nexprs; i++) {
        const tf_kexpr *e = &k->exprs[i];
        if (e->kind == TF_KX_OP && e->op == TF_OP_GELU && (x < 0 || e->args[0] == x)) return true;
        if (e->kind != TF_KX_OP || e->op != TF_OP_ERF) continue;
        const tf_kexpr *m = &k->exprs[e->args[0]];
        if (m->kind != TF_KX_OP || m->op != TF_OP_MUL || m->nargs != 2) continue;
        for (int q = 0; q < 2; q++)
            if ((x < 0 || m->args[q] == x) && k->exprs[m->args[1 - q]].kind == TF_KX_CONST &&
                fabs(k->exprs[m->args[1 - q]].value - 0.70710678118654752) < 1e-6)
                return true;
    }
    return false;
}

/* false (with why) when the region is not a bias add (and ReLU) cuBLASLt can do. */
bool tf_cuda_plan_epilogue(const tf_kernel *k, epi_plan *e, bool *oom, char *why, size_t n)
{
    memset(e, 0, sizeof *e);
    *oom = false;
    const tf_value *out = k->lib->out;
    tf_dt dt = out->type.dtype;
    int ob = buf_index(k, out);
    if (!k->nexprs || !k->nstores) return snprintf(why, n, "the region has no epilogue"), false;
    if (k->nreds || ob < 0 || (dt != TF_DT_F32 && dt != TF_DT_F16 && dt != TF_DT_BF16))
        return snprintf(why, n, "the epilogue is not a bias add"), false;
    int add = -1;
    for (int i = 0; i < k->nexprs && add < 0; i++) {
        const tf_kexpr *x = &k->exprs[i];
        if (x->kind != TF_KX_OP || x->op != TF_OP_ADD || x->nargs != 2 || x->dtype != dt) continue;
        for (int q = 0; q < 2 && add < 0; q++) {
            const tf_kexpr *p = &k->exprs[x->args[q]], *b = &k->exprs[x->args[1 - q]];
            if (tf_cuda_row_major_load(k, p, ob) && bias_load(k, b) && k->bufs[b->buf].value->type.dtype == dt && b->buf != ob) {
                add = i;
                e->bias_buf = b->buf;
            }
        }
    }
    if (add < 0) return snprintf(why, n, "the epilogue has no bias add along the product's rows"), false;
    /* the product is read by the bias add alone */
    for (int i = 0; i < k->nexprs; i++) {
        const tf_kexpr *x = &k->exprs[i];
        bool prod = x->kind == TF_KX_LOAD && x->buf == ob;
        for (int q = 0; prod && q < k->nexprs; q++)
            for (int a = 0; a < k->exprs[q].nargs && a < 3; a++)
                if (k->exprs[q].args[a] == i && q != add) return snprintf(why, n, "the epilogue reads the product apart from its bias add"), false;
        for (int s = 0; prod && s < k->nstores; s++)
            if (k->stores[s].expr == i) return snprintf(why, n, "the epilogue stores the product itself"), false;
    }
    int relu = -1, users = 0;
    e->gelu = has_gelu(k, add);
    for (int i = 0; i < k->nexprs; i++)
        for (int a = 0; a < k->exprs[i].nargs && a < 3; a++)
            if (k->exprs[i].args[a] == add) {
                users++;
                if (k->exprs[i].kind == TF_KX_OP && k->exprs[i].op == TF_OP_RELU && k->exprs[i].dtype == dt) relu = i;
            }
    /* a value the GEMM can write: the region's store of `expr`, of the product's dtype and size, overlapping nothing */
    int d_store = -1, act_store = -1;
    for (int s = 0; s < k->nstores; s++) {
        const tf_kbuf *b = &k->bufs[k->stores[s].buf];
        bool fits = b->disjoint && b->value->type.dtype == dt && tf_type_numel(&b->value->type) == tf_type_numel(&out->type) &&
                    !k->stores[s].reduced_domain;
        if (fits && k->stores[s].expr == add && d_store < 0) d_store = s;
        if (fits && relu >= 0 && k->stores[s].expr == relu) act_store = s;
    }
    e->d_buf = ob;
    if (k->nstores == 1 && act_store == 0 && users == 1) {   /* relu(x @ w + b) alone: nothing left to do */
        e->kind = TF_GEMM_EPI_RELU_BIAS;
        e->d_buf = k->stores[0].buf;
        return true;
    }
    e->kind = TF_GEMM_EPI_BIAS;
    if (k->nstores == 1 && d_store == 0 && !users) {   /* x @ w + b alone */
        e->d_buf = k->stores[0].buf;
        return true;
    }
    if (k->exprs[add].wide)   /* the GEMM would store it rounded to its 16-bit dtype */
        return snprintf(why, n, "the bias add's value stays in the region at f32 (numerics=fast): the GEMM would round it to %s",
                        tf_dtype_name(dt)), false;
    /* the rest stays: the bias add becomes a load of what the GEMM wrote */
    tf_kernel *r = tf_calloc(1, sizeof *r);
    if (r) *r = *k;
    if (!r || !(r->exprs = tf_malloc((size_t)k->nexprs * sizeof *r->exprs)) ||
        !(r->stores = tf_malloc((size_t)k->nstores * sizeof *r->stores))) {
        if (r) tf_free(r->exprs);
        tf_free(r);
        *oom = true;
        return false;
    }
    memcpy(r->exprs, k->exprs, (size_t)k->nexprs * sizeof *r->exprs);
    r->nstores = 0;
    if (d_store >= 0) e->d_buf = k->stores[d_store].buf;
    for (int s = 0; s < k->nstores; s++)
        if (s != d_store) r->stores[r->nstores++] = k->stores[s];
    tf_kexpr *x = &r->exprs[add];
    const tf_node *node = x->node;
    memset(x, 0, sizeof *x);
    x->kind = TF_KX_LOAD;
    x->dtype = dt;
    x->buf = e->d_buf;
    x->node = node;
    int64_t st = 1;
    for (int a = k->rank - 1; a >= 0; a--) {
        x->strides[a] = k->dims[a] > 1 ? st : 0;
        st *= k->dims[a];
    }
    if (!r->nstores) {   /* never: a region stores something */
        tf_cuda_epi_free(r);
        r = NULL;
    }
    e->rest = r;
    return true;
}

/* What tf_gemm_plan needs to time the candidates of an uncached problem:
 * the session's stream, its workspace and the GEMM's own buffers (the first
 * call's, when it takes several). Nothing has run yet, so the product it
 * overwrites holds nothing. On cuda-emu, one warm-up and one timed run: the
 * host's times say nothing about a GPU, and every run is a full host GEMM. */
static void gemm_timing(const cuda_session *c, tf_gemm_desc *d, tf_cu_deviceptr a, tf_cu_deviceptr b, tf_cu_deviceptr out)
{
    d->gpu = c->gpu;
    d->stream = c->stream;
    d->dev_a = a, d->dev_b = b, d->dev_c = out;
    d->dev_ws = c->ws_dev;
    if (c->emu) d->warmup = d->runs = 1;
}

/* Plan kernel gk's matmul; false with the reason in gk->why when cuBLASLt
 * cannot take it (the host then runs it). */
bool tf_cuda_gemm_setup(cuda_session *c, gkernel *gk, const epi_plan *ep, bool *oom_out)
{
    const tf_node *n = gk->k->lib;
    const tf_value *av = n->in[0], *bv = n->in[1], *ov = n->out;
    tf_gemm_desc d = {0};
    *oom_out = false;
    if (!c->lt.ok) {
        set_text(gk->why, sizeof gk->why, c->lt.why);
        return false;
    }
    if (av->kind == TF_VAL_CONST || bv->kind == TF_VAL_CONST || av->type.dtype != bv->type.dtype || !gemm_type(av->type.dtype, &d.ab) ||
        !gemm_type(ov->type.dtype, &d.c) || (d.c != d.ab && d.c != TF_GEMM_F32)) {
        snprintf(gk->why, sizeof gk->why, "matmul of %s x %s -> %s: cuBLASLt is used for f32, f16 and bf16 operands of one type",
                 tf_dtype_name(av->type.dtype), tf_dtype_name(bv->type.dtype), tf_dtype_name(ov->type.dtype));
        return false;
    }
    d.ta = tf_node_bool(n, "transpose_a");
    d.tb = tf_node_bool(n, "transpose_b");
    int ra = av->type.rank - 2, rb = bv->type.rank - 2, r = ov->type.rank - 2;
    if (ra < 0 || rb < 0 || r < 0) {
        snprintf(gk->why, sizeof gk->why, "matmul of a rank below 2");
        return false;
    }
    d.M = ov->type.dims[r].n;
    d.N = ov->type.dims[r + 1].n;
    d.K = av->type.dims[d.ta ? ra : ra + 1].n;
    d.tf32 = c->tf32;
    d.max_workspace = c->ws_bytes;
    int64_t nb = 1;
    for (int i = 0; i < r; i++) nb *= ov->type.dims[i].n;
    bool a_full = ra == r;   /* a has every batch axis, unbroadcast */
    for (int i = 0; a_full && i < r; i++) a_full = av->type.dims[i].n == ov->type.dims[i].n;
    gemm_call *mm = tf_calloc(1, sizeof *mm);
    if (!mm) {
        *oom_out = true;
        return false;
    }
    mm->esz_ab = (size_t)tf_dtype_bytes(av->type.dtype);
    mm->esz_c = (size_t)tf_dtype_bytes(ov->type.dtype);
    mm->calls = 1;
    mm->step_c = d.M * d.N;
    tf_cu_deviceptr pa = dev_of(c, av), pb = dev_of(c, bv), pc = dev_of(c, ov);
    if (ep && ep->kind != TF_GEMM_EPI_NONE) pc = ep->d_dev ? ep->d_dev : dev_of(c, gk->k->bufs[ep->d_buf].value);
    mm->d = pc;
    mm->n = n;
    uint64_t mix_a = pa, mix_b = pb, mix_c = pc;
    d.batch = 1;
    if (rb == 0 && !d.ta && a_full) {
        d.M *= nb;   /* [.., M, K] x [K, N]: one GEMM of nb * M rows */
    } else if (nb > 1) {
        /* per output batch index: element strides of a and b (0 on broadcast axes) */
        int64_t sa[TF_MAX_RANK] = {0}, sb[TF_MAX_RANK] = {0}, idx[TF_MAX_RANK] = {0};
        int64_t st = d.M * d.K;
        for (int i = ra - 1, j = r - 1; i >= 0; i--, j--) {
            sa[j] = av->type.dims[i].n == 1 ? 0 : st;
            st *= av->type.dims[i].n;
        }
        st = d.K * d.N;
        for (int i = rb - 1, j = r - 1; i >= 0; i--, j--) {
            sb[j] = bv->type.dims[i].n == 1 ? 0 : st;
            st *= bv->type.dims[i].n;
        }
        mm->off_a = tf_malloc((size_t)nb * sizeof *mm->off_a);
        mm->off_b = tf_malloc((size_t)nb * sizeof *mm->off_b);
        if (!mm->off_a || !mm->off_b) {
            tf_cuda_gemm_call_free(c, mm);
            *oom_out = true;
            return false;
        }
        for (int64_t bi = 0; bi < nb; bi++) {
            int64_t oa = 0, ob = 0;
            for (int i = 0; i < r; i++) oa += idx[i] * sa[i], ob += idx[i] * sb[i];
            mm->off_a[bi] = oa;
            mm->off_b[bi] = ob;
            for (int i = r - 1; i >= 0; i--) {
                if (++idx[i] < ov->type.dims[i].n) break;
                idx[i] = 0;
            }
        }
        bool even = mm->off_a[1] != 0 && mm->off_b[1] != 0;   /* one strided-batched call */
        for (int64_t bi = 2; even && bi < nb; bi++) even = mm->off_a[bi] == bi * mm->off_a[1] && mm->off_b[bi] == bi * mm->off_b[1];
        if (even && nb <= INT32_MAX) {
            d.batch = nb;
            d.stride_a = mm->off_a[1];
            d.stride_b = mm->off_b[1];
            d.stride_c = mm->step_c;
            mix_a |= (uint64_t)d.stride_a * mm->esz_ab;
            mix_b |= (uint64_t)d.stride_b * mm->esz_ab;
            mix_c |= (uint64_t)d.stride_c * mm->esz_c;
            tf_free(mm->off_a);
            tf_free(mm->off_b);
            mm->off_a = mm->off_b = NULL;
        } else {   /* broadcast batch axes: one call per batch index */
            mm->calls = nb;
            for (int64_t bi = 0; bi < nb; bi++) {
                mix_a |= (uint64_t)mm->off_a[bi] * mm->esz_ab;
                mix_b |= (uint64_t)mm->off_b[bi] * mm->esz_ab;
                mix_c |= (uint64_t)(bi * mm->step_c) * mm->esz_c;
            }
        }
    }
    d.align_a = tf_gemm_alignment(mix_a);
    d.align_b = tf_gemm_alignment(mix_b);
    d.align_c = tf_gemm_alignment(mix_c);
    char err[400];
    if (ep && ep->kind != TF_GEMM_EPI_NONE) {
        if (d.batch != 1 || mm->calls != 1) {
            tf_cuda_gemm_call_free(c, mm);
            snprintf(gk->why, sizeof gk->why, "a batched GEMM");
            return false;
        }
        d.epilogue = ep->kind;
        d.bias = ep->bias_dev ? ep->bias_dev : ep->kind == TF_GEMM_EPI_DRELU ? 0 : dev_of(c, gk->k->bufs[ep->bias_buf].value);
        d.aux = ep->aux_dev;
    }
    gemm_timing(c, &d, pa, pb, pc);
    tf_cuda_status st = tf_gemm_plan(&c->libs, c->lt.handle, &d, &mm->g, err, sizeof err);
    if (st) {
        set_text(gk->why, sizeof gk->why, err);
        *oom_out = st == TF_CUDA_ERR_OOM;
        tf_cuda_gemm_call_free(c, mm);
        return false;
    }
    gk->mm = mm;
    return true;
}

/* Kernel gk's matmul, with its region's bias (and ReLU) as cuBLASLt's
 * epilogue where it can take them: *ek is the code still to emit (the
 * kernel, what the epilogue leaves of it, or NULL), *done whether cuBLASLt
 * runs the matmul (else the library op finds another way). */
tf_status tf_cuda_plan_matmul(tf_session_t *s, cuda_session *c, gkernel *gk, const tf_kernel **ek, bool *done)
{
    const tf_kernel *k = gk->k;
    *ek = k;
    *done = false;
    if (!k->lib || k->lib->op != TF_OP_MATMUL) return TF_OK;
    if (gk->preplanned) {   /* its backward epilogue planned: the region as it is, or nothing */
        if (gk->no_code) *ek = NULL;
        *done = true;
        return TF_OK;
    }
    if (!c->lt.ok) return TF_OK;
    epi_plan ep;
    char why[200];
    bool oom_hit = false;
    bool use = tf_cuda_plan_epilogue(k, &ep, &oom_hit, why, sizeof why);
    static const char gelu_why[] = "; GELU stays in the epilogue kernel: cuBLASLt's GELU is the tanh approximation, this model's gelu is erf's";
    if (use && tf_cuda_gemm_setup(c, gk, &ep, &oom_hit)) {
        snprintf(gk->epi, sizeof gk->epi, "%s (bias %.60s, written to %.60s)%s%s", tf_gemm_epilogue_name(ep.kind),
                 k->bufs[ep.bias_buf].value->name ? k->bufs[ep.bias_buf].value->name : "?",
                 k->bufs[ep.d_buf].value->name ? k->bufs[ep.d_buf].value->name : "?",
                 ep.rest ? "; the rest of the region in its epilogue kernel" : "; no epilogue kernel", ep.gelu ? gelu_why : "");
        gk->rest = ep.rest;
        *ek = ep.rest;
        *done = true;
    } else {
        tf_cuda_epi_free(ep.rest);
        if (use && !oom_hit) snprintf(why, sizeof why, "cuBLASLt takes no bias epilogue here (%.150s)", gk->why);
        if (!gk->epi_note[0] && k->lib->backward && !use)
            snprintf(gk->epi_note, sizeof gk->epi_note, "no kernel only sums one of its operands over K (BGRAD), no ReLU backward reads "
                     "its result alone (DRELU)");
        snprintf(gk->epi, sizeof gk->epi, "none: %.200s%s%.420s%s", why, gk->epi_note[0] ? "; " : "", gk->epi_note, ep.gelu ? gelu_why : "");
        gk->why[0] = 0;
        *done = !oom_hit && tf_cuda_gemm_setup(c, gk, NULL, &oom_hit);
    }
    if (oom_hit) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory planning the GEMM of kernel %s", k->name);
    if (*done) gk->how = RUN_GEMM;
    return TF_OK;
}

tf_status tf_cuda_run_gemm(tf_session_t *s, cuda_session *c, gkernel *gk)
{
    gemm_call *mm = gk->mm;
    const tf_node *n = mm->n;
    tf_cu_deviceptr pa = dev_of(c, n->in[0]), pb = dev_of(c, n->in[1]), pc = mm->d;
    char err[600];
    for (int64_t i = 0; i < mm->calls; i++) {
        tf_cu_deviceptr a = pa + (mm->off_a ? (tf_cu_deviceptr)mm->off_a[i] * mm->esz_ab : 0);
        tf_cu_deviceptr b = pb + (mm->off_b ? (tf_cu_deviceptr)mm->off_b[i] * mm->esz_ab : 0);
        tf_cu_deviceptr o = pc + (tf_cu_deviceptr)(i * mm->step_c) * mm->esz_c;
        if (tf_gemm_run(&c->libs, c->lt.handle, &mm->g, a, b, o, c->ws_dev, c->ws_bytes, c->stream, err, sizeof err))
            return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: cuda: kernel %s (matmul %s): %s", gk->k->name, n->out->name ? n->out->name : "?", err);
    }
    return TF_OK;
}

/* --cuda-explain: the cuBLASLt algorithm each GEMM got: which of the
 * heuristic's candidates, its time, timed now or from the disk cache. */
void tf_cuda_explain_gemms(FILE *f, const cuda_session *c)
{
    char how[4600];
    for (int i = 0; i < c->plan->nkernels; i++) {
        if (c->ks[i].how == RUN_NOTHING && c->ks[i].preplanned)
            fprintf(f, "cuda: kernel %s does not run: %s\n", c->ks[i].k->name, c->ks[i].why);
        if (c->ks[i].how != RUN_GEMM) continue;
        tf_gemm_explain(&c->ks[i].mm->g, how, sizeof how);
        fprintf(f, "cuda: kernel %s: cuBLASLt algorithm: %s\n", c->ks[i].k->name, how);
    }
}
