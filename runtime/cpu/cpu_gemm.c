/* cpu_gemm.c — the cpu target's matmuls. When a session starts it plans
 * them: which f16/bf16 operands get a float32 copy of their own, widened
 * once a run for every GEMM that reads them, and which f32 GEMMs multiply
 * weights oneDNN packed once (gemm_dnnl.h); each run then multiplies
 * through OpenBLAS, the bf16 GEMM (cpu_ops.h) or oneDNN, one GEMM for the
 * whole batch where the shapes allow, else one per batch index. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_ops.h"
#include "env.h"
#include "gemm_dnnl.h"

#ifdef TFUSE_HAVE_LLVM

/* ---- planning, when a session starts -------------------------------------- */

/* $name in MiB (a number, 0 or more; 0: none), else dflt, as bytes; a value
 * that is no such number is an error, not a silent default. */
static tf_status env_mib(tf_session_t *s, const char *name, double dflt, double *bytes)
{
    const char *e = tf_env(name);
    double v = dflt;
    if (e && *e) {
        char *end;
        errno = 0;
        v = strtod(e, &end);
        if (errno || *end || !(v >= 0) || v > 1e9)
            return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "error: %s=%.100s: expected a number of MiB, 0 or more (e.g. %s=512)",
                                name, e, name);
    }
    *bytes = v * 1048576.0;
    return TF_OK;
}

/* bf16 x bf16 matmuls go to tf_cpu_gemm_bf16 where this machine has one;
 * the f16/bf16 operands still widened that two or more GEMMs of a run read
 * get a float32 copy of their own (gemm_operand), made once per run, up to
 * $TFUSE_CPU_WIDE_CACHE_MB MiB in all (default 256; 0: none), in the
 * order the plan first reads them. */
tf_status tf_cpu_plan_gemm_operands(tf_session_t *s, cpu *c)
{
    const tf_module *m = s->p->m;
    int V = m->next_id > 0 ? m->next_id : 1;
    bool bf16_gemm = tf_cpu_bf16_gemm_kind() != TF_BF16_GEMM_NONE;
    double budget;
    tf_status st = env_mib(s, "TFUSE_CPU_WIDE_CACHE_MB", 256.0, &budget);
    if (st) return st;
    unsigned char *uses = tf_calloc((size_t)V, 1);
    if (!uses) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    bool any = false;
    for (int i = 0; i < c->plan->nkernels; i++) {
        ckernel *ck = &c->ks[i];
        if (ck->how != RUN_MATMUL) continue;
        const tf_node *n = ck->k->lib;
        if (bf16_gemm && n->in[0]->type.dtype == TF_DT_BF16 && n->in[1]->type.dtype == TF_DT_BF16) {
            ck->how = RUN_MATMUL_BF16;
            continue;
        }
        for (int q = 0; q < 2; q++) {
            const tf_value *r = root_of(n->in[q]);
            if (is_float16(n->in[q]->type.dtype) && r->kind != TF_VAL_CONST && uses[r->id] < 2) any |= ++uses[r->id] == 2;
        }
    }
    if (any && budget > 0) {
        c->wide = tf_calloc((size_t)V, sizeof *c->wide);
        c->wide_gen = tf_calloc((size_t)V, sizeof *c->wide_gen);
        if (!c->wide || !c->wide_gen) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
        for (int i = 0; !st && i < c->plan->nkernels; i++) {
            if (c->ks[i].how != RUN_MATMUL) continue;
            for (int q = 0; !st && q < 2; q++) {
                const tf_value *v = c->ks[i].k->lib->in[q], *r = root_of(v);
                if (!is_float16(v->type.dtype) || r->kind == TF_VAL_CONST || uses[r->id] < 2 || c->wide[r->id]) continue;
                size_t bytes = (size_t)numel(v) * sizeof(float);
                if ((double)(c->wide_bytes + bytes) > budget) continue;
                if (!(c->wide[r->id] = tf_cpu_own(c, bytes))) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
                c->wide_bytes += bytes;
            }
        }
    }
    tf_free(uses);
    return st;
}

/* Whether state value r is ever written by the step (an update's target). */
static bool step_writes(const tf_module *m, const tf_value *r)
{
    for (int i = 0; i < m->nupdates; i++)
        if (m->updates[i].buffer == r) return true;
    return false;
}

/* Packed weights: a GEMM whose right operand is a param or buffer the step
 * never writes, or a value computed from them alone (inference) runs
 * through oneDNN with that operand packed once into the kernel's layout
 * (gemm_dnnl.h), up to $TFUSE_CPU_PACKED_MB MiB of packed copies in all
 * (default 1024; 0: none), in plan order. f32 and bf16 operands go to
 * oneDNN as they are (bf16 with an f32 or bf16 result); f16 ones (this
 * oneDNN has no f16 matmul on most CPUs) are widened to f32, the weights
 * once when they are packed, and an f16 result rounded from f32, as
 * tf_cpu_run_matmul does. A training step rewrites its weights every step,
 * so its GEMMs stay on OpenBLAS and tf_cpu_gemm_bf16. */
tf_status tf_cpu_plan_packed_gemms(tf_session_t *s, cpu *c)
{
    const tf_module *m = s->p->m;
    double budget;
    tf_status st = env_mib(s, "TFUSE_CPU_PACKED_MB", 1024.0, &budget);
    if (st) return st;
    size_t scratch = 0;
    c->state_gen = 1;
    for (int i = 0; i < c->plan->nkernels; i++) {
        ckernel *ck = &c->ks[i];
        if (ck->how != RUN_MATMUL && ck->how != RUN_MATMUL_BF16) continue;
        const tf_node *n = ck->k->lib;
        const tf_value *av = n->in[0], *bv = n->in[1], *ov = n->out, *r = root_of(bv);
        tf_dt at = av->type.dtype, bt = bv->type.dtype, ot = ov->type.dtype;
        bool f32ish_a = at == TF_DT_F32 || at == TF_DT_F16, f32ish_b = bt == TF_DT_F32 || bt == TF_DT_F16;
        bool bf16 = at == TF_DT_BF16 && bt == TF_DT_BF16 && (ot == TF_DT_BF16 || ot == TF_DT_F32);
        bool f32 = f32ish_a && f32ish_b && (ot == TF_DT_F32 || ot == TF_DT_F16);   /* f16 widened to f32 */
        bool ta = tf_node_bool(n, "transpose_a"), tb = tf_node_bool(n, "transpose_b");
        int ra = av->type.rank - 2, rk = ov->type.rank - 2;
        bool a_full = ra == rk;
        for (int d = 0; a_full && d < rk; d++) a_full = av->type.dims[d].n == ov->type.dims[d].n;
        char *why = ck->gemm_why;
        size_t wn = sizeof ck->gemm_why;
        if (s->p->settings.cpu_gemm_openblas) snprintf(why, wn, "--cpu-gemm=openblas");
        else if (!bf16 && !f32)
            snprintf(why, wn, "operands %s x %s giving %s (oneDNN here: f32 or f16 widened, or bf16 x bf16)", tf_dtype_name(at),
                     tf_dtype_name(bt), tf_dtype_name(ot));
        else if (r->kind != TF_VAL_PARAM && r->kind != TF_VAL_BUFFER && !r->once)
            snprintf(why, wn, "the right operand is computed in the step, not a weight");
        else if (step_writes(m, r)) snprintf(why, wn, "the step updates its weights (%s)", r->name ? r->name : "?");
        else if (bv->type.rank != 2 || (rk > 0 && (ta || !a_full))) snprintf(why, wn, "a batched GEMM");
        else {
            int64_t N = ov->type.dims[rk + 1].n, K = av->type.dims[ta ? ra : ra + 1].n, M = numel(ov) / (N ? N : 1);
            bool oom = false;
            ck->dgemm_widen = f32 && (at != TF_DT_F32 || bt != TF_DT_F32 || ot != TF_DT_F32);
            if (!(ck->dgemm = tf_dnnl_gemm_create(M, N, K, ta, tb, bf16, bf16 && ot == TF_DT_BF16, tf_pool_threads(c->pool), &oom,
                                                  why, wn))) {
                if (oom) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
                continue;
            }
            size_t bytes = tf_dnnl_gemm_packed_bytes(ck->dgemm);
            if ((double)(c->packed_bytes + bytes) > budget) {
                snprintf(why, wn, "packed weights over $TFUSE_CPU_PACKED_MB (%.0f MiB)", budget / 1048576.0);
                tf_dnnl_gemm_free(ck->dgemm);
                ck->dgemm = NULL;
                continue;
            }
            if (!(ck->packed = tf_cpu_own(c, bytes))) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
            c->packed_bytes += bytes;
            if (tf_dnnl_gemm_scratch_bytes(ck->dgemm) > scratch) scratch = tf_dnnl_gemm_scratch_bytes(ck->dgemm);
        }
    }
    if (scratch && !(c->gemm_scratch = tf_malloc_aligned(64, (scratch + 63) / 64 * 64)))
        return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    c->gemm_scratch_bytes = scratch ? (scratch + 63) / 64 * 64 : 0;
    return TF_OK;
}

/* ---- running ------------------------------------------------------------- */

/* A GEMM operand as float32: tf_cpu_as_f32, except that an f16/bf16 value several
 * GEMMs read is widened once per run into its own copy, which the later
 * GEMMs reuse (a weight read by the forward GEMM and the input-gradient
 * GEMM, an activation read by the next layer's GEMM and a weight-gradient
 * GEMM). A value is written once per run, so a copy made this run is current. */
static const float *gemm_operand(cpu *c, const tf_value *v, float *dst)
{
    const tf_value *r = root_of(v);
    float *w = r->kind != TF_VAL_CONST && c->wide ? c->wide[r->id] : NULL;
    if (!w) return tf_cpu_as_f32(c, v, dst);
    if (c->wide_gen[r->id] != c->gen) {
        tf_cpu_convert(c, v->type.dtype, true, storage(c, v), w, tf_type_numel(&v->type));
        c->wide_gen[r->id] = c->gen;
    }
    return w;
}

/* Batched matmul: batch indices [lo, hi), each GEMM on the pool (pool set)
 * or on the calling thread (pool NULL: the batches are what is split). */
typedef struct batch_job {
    tf_pool *pool;
    bool ta, tb, bf16;   /* bf16: A and B are bf16 bits, through tf_cpu_gemm_bf16 */
    int64_t M, N, K;
    int r;
    int64_t sa[TF_MAX_RANK], sb[TF_MAX_RANK], dims[TF_MAX_RANK];
    const void *A, *B;
    float *C;
} batch_job;

static void batch_piece(void *arg, int64_t lo, int64_t hi)
{
    const batch_job *j = arg;
    for (int64_t bi = lo; bi < hi; bi++) {
        int64_t oa = 0, ob = 0, rest = bi;
        for (int i = j->r - 1; i >= 0; i--) {
            int64_t ix = rest % j->dims[i];
            rest /= j->dims[i];
            oa += ix * j->sa[i], ob += ix * j->sb[i];
        }
        if (j->bf16)
            tf_cpu_gemm_bf16(j->pool, j->ta, j->tb, j->M, j->N, j->K, (const uint16_t *)j->A + oa, j->ta ? j->M : j->K,
                             (const uint16_t *)j->B + ob, j->tb ? j->K : j->N, j->C + bi * j->M * j->N, j->N, false);
        else
            tf_cpu_gemm(j->pool, j->ta, j->tb, j->M, j->N, j->K, (const float *)j->A + oa, j->ta ? j->M : j->K,
                        (const float *)j->B + ob, j->tb ? j->K : j->N, j->C + bi * j->M * j->N, j->N, false);
    }
}

/* A GEMM with packed weights: repacked first when they are older than the
 * last state write. false when oneDNN failed. */
bool tf_cpu_run_packed(cpu *c, ckernel *ck)
{
    const tf_node *n = ck->k->lib;
    const tf_value *av = n->in[0], *bv = n->in[1], *ov = n->out;
    if (ck->packed_gen != c->state_gen) {
        const void *B = storage(c, bv);
        if (ck->dgemm_widen && bv->type.dtype != TF_DT_F32) B = tf_cpu_as_f32(c, bv, tf_cpu_scratch(c, (size_t)numel(bv)));
        if (!tf_dnnl_gemm_pack(ck->dgemm, B, ck->packed)) return false;
        ck->packed_gen = c->state_gen;
    }
    const void *A = storage(c, av);
    void *C = storage(c, ov);
    float *at = NULL;
    if (ck->dgemm_widen) {   /* f16 in or out: through f32 */
        bool wa = av->type.dtype != TF_DT_F32, wc = ov->type.dtype != TF_DT_F32;
        size_t need = (size_t)((wa ? numel(av) : 0) + (wc ? numel(ov) : 0));
        at = tf_cpu_scratch(c, need ? need : 1);
        if (wa) {
            A = gemm_operand(c, av, at);
            if (A == at) at += numel(av);
        }
        if (wc) C = at;
        else at = NULL;
    }
    if (!tf_dnnl_gemm_run(ck->dgemm, c->pool, A, ck->packed, C, c->gemm_scratch)) return false;
    if (at) tf_cpu_from_f32(c, ov, at);
    return true;
}

/* bf16: both operands bf16, multiplied as they are stored (RUN_MATMUL_BF16). */
void tf_cpu_run_matmul(cpu *c, const tf_node *n, bool bf16)
{
    const tf_value *av = n->in[0], *bv = n->in[1], *ov = n->out;
    bool ta = tf_node_bool(n, "transpose_a"), tb = tf_node_bool(n, "transpose_b");
    int ra = av->type.rank - 2, rb = bv->type.rank - 2, r = ov->type.rank - 2;
    int64_t M = ov->type.dims[r].n, N = ov->type.dims[r + 1].n, K = av->type.dims[ta ? ra : ra + 1].n;
    bool wa = !bf16 && av->type.dtype != TF_DT_F32, wb = !bf16 && bv->type.dtype != TF_DT_F32;   /* widened here */
    size_t need = (size_t)((wa ? numel(av) : 0) + (wb ? numel(bv) : 0) + (ov->type.dtype != TF_DT_F32 ? numel(ov) : 0));
    float *sc = tf_cpu_scratch(c, need ? need : 1), *at = sc;
    const void *A = storage(c, av), *B = storage(c, bv);
    if (wa) {
        A = gemm_operand(c, av, at);
        if (A == at) at += numel(av);
    }
    if (wb) {
        B = gemm_operand(c, bv, at);
        if (B == at) at += numel(bv);
    }
    float *C = ov->type.dtype == TF_DT_F32 ? storage(c, ov) : at;
    int64_t nb = 1;
    for (int i = 0; i < r; i++) nb *= ov->type.dims[i].n;
    bool a_full = ra == r;   /* a has every batch axis, unbroadcast */
    for (int i = 0; a_full && i < r; i++) a_full = av->type.dims[i].n == ov->type.dims[i].n;
    if (rb == 0 && !ta && a_full) {   /* [.., M, K] x [K, N]: one GEMM of nb*M rows */
        if (bf16) tf_cpu_gemm_bf16(c->pool, false, tb, nb * M, N, K, A, K, B, tb ? K : N, C, N, false);
        else tf_cpu_gemm(c->pool, false, tb, nb * M, N, K, A, K, B, tb ? K : N, C, N, false);
    } else {
        batch_job j = {.ta = ta, .tb = tb, .bf16 = bf16, .M = M, .N = N, .K = K, .r = r, .A = A, .B = B, .C = C};
        int64_t s = M * K;
        for (int i = ra - 1, k = r - 1; i >= 0; i--, k--) {
            j.sa[k] = av->type.dims[i].n == 1 ? 0 : s;
            s *= av->type.dims[i].n;
        }
        s = K * N;
        for (int i = rb - 1, k = r - 1; i >= 0; i--, k--) {
            j.sb[k] = bv->type.dims[i].n == 1 ? 0 : s;
            s *= bv->type.dims[i].n;
        }
        for (int i = 0; i < r; i++) j.dims[i] = ov->type.dims[i].n;
        /* many small GEMMs (attention's heads): whole GEMMs per thread; few
         * big ones: each GEMM split over the threads */
        if (nb >= 2 * tf_pool_threads(c->pool) && M * N * K < (int64_t)1 << 22) {
            tf_pool_run(c->pool, nb, batch_piece, &j);
        } else {
            j.pool = c->pool;
            batch_piece(&j, 0, nb);
        }
    }
    if (ov->type.dtype != TF_DT_F32) tf_cpu_from_f32(c, ov, C);
}

#endif /* TFUSE_HAVE_LLVM */
