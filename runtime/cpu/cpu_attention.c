/* cpu_attention.c — flash_attention and flash_attention_grad on the cpu
 * target: attention over tiles, with no [Tq, Tk] tensor in memory
 * (ir/attention.c defines what they compute).
 *
 * Forward: a task per (batch, head, block of ATT_BQ query rows); for each
 * block of ATT_BK keys, S = Q K^T (an sgemm on the calling thread), then
 * per row the scale, mask and causal cut, the online softmax (running max
 * m and sum l; the accumulator rescaled by exp(m_old - m_new) when the max
 * moves), dropout, and O += P V (an sgemm accumulating). Blocks of keys
 * past the last query's position are skipped when causal. O = acc / l,
 * LSE = m + log l.
 *
 * Backward: a task per (batch, key/value head) does every query head of
 * its group in turn, so dK and dV sum over the group in a fixed order with
 * no atomics and no partial copies; per block of keys and block of
 * queries: S, P = exp(S - LSE), dV += (P Z)^T dO, dP = dO V^T, dS = P (dP Z
 * - D), dQ += dS K, dK += dS^T Q (five sgemms, S recomputed once), with D =
 * rowsum(dO O) - dLSE computed once per row.
 *
 * Tasks split over the pool in fixed pieces and each writes only its own
 * rows, so the result does not depend on the thread count. f16 storage is
 * widened to f32 per tile (per head in the backward); bf16, where the CPU
 * has a bf16 GEMM (AVX512-BF16 or OpenBLAS's sbgemm), multiplies in bf16
 * from storage where a sum does not cancel: Q K^T (exact products) and
 * the products with P (P, and dO, rounded to bf16 for them, as
 * ir/attention.c defines); dP, dQ and dK stay f32. The softmax is f32
 * throughout. exp runs 16 lanes wide on AVX-512 (a degree-7
 * polynomial after reduction by ln 2, 2^n by vscalefps: within 2 ulp of
 * expf), else through expf. */
#include <math.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_ops.h"
#include "lowp.h"

#ifdef TFUSE_HAVE_LLVM

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f")))
#endif

enum { ATT_BQ = 64, ATT_BK = 256, ATT_BWD_BQ = 64, ATT_BWD_BK = 128 };

/* ---- vector helpers: a row of scores ---- */

static bool g_avx512;

static float row_max_c(const float *s, int64_t n)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    return m;
}

/* s[j] = exp(s[j] - m); returns the sum. */
static float exp_sum_c(float *s, int64_t n, float m)
{
    float sum = 0;
    for (int64_t j = 0; j < n; j++) sum += s[j] = expf(s[j] - m);
    return sum;
}

#if defined(__x86_64__)
AVX512 static __m512 exp16(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.33654f);
    __mmask16 zero = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);   /* exp underflows (and -inf): 0 */
    x = _mm512_min_ps(_mm512_set1_ps(88.37626f), x);   /* (a NaN, the second operand, stays NaN: exp(NaN) is NaN) */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps((__mmask16)~zero, _mm512_scalef_ps(p, n));
}

AVX512 static float row_max_512(const float *s, int64_t n)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    /* NaN scores are passed over, as row_max_c (and the interpreter) pass them: vmaxps returns its
     * second operand, the running max, when either is NaN */
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(s + j), m);
    if (j < n) m = _mm512_mask_max_ps(m, (__mmask16)((1u << (n - j)) - 1), _mm512_maskz_loadu_ps((__mmask16)((1u << (n - j)) - 1), s + j), m);
    return _mm512_reduce_max_ps(m);
}

AVX512 static float exp_sum_512(float *s, int64_t n, float mx)
{
    __m512 m = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
        _mm512_storeu_ps(s + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), m)));
        _mm512_mask_storeu_ps(s + j, k, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}
#endif

static float row_max(const float *s, int64_t n)
{
#if defined(__x86_64__)
    if (g_avx512) return row_max_512(s, n);
#endif
    return row_max_c(s, n);
}

static float exp_sum(float *s, int64_t n, float m)
{
#if defined(__x86_64__)
    if (g_avx512) return exp_sum_512(s, n, m);
#endif
    return exp_sum_c(s, n, m);
}

/* ---- the job ---- */

typedef struct attn_job {
    tf_attn_geom g;
    tf_dt dt;                  /* q, k, v */
    const void *q, *k, *v;
    const void *mask;
    tf_dt mdt;
    void *out;                 /* forward: the result ([.., Dv] in dt, or f32 [.., Dv + 1]); backward: f32 dq | dk | dv */
    int64_t ow;                /* forward: out's row width */
    const float *o;            /* backward: the forward's f32 result with its LSE column */
    const void *dout;
    tf_dt ddt;
    int64_t dw;                /* dout's row width: Dv, or Dv + 1 with the LSE's gradient */
    bool drop;                 /* dropout applies (train mode, p > 0) */
    uint64_t seed, stream;
    float keep_scale;          /* (float)(1 / (1 - p)) */
    int64_t nqb;               /* forward: query blocks per head */
    bool bf16;                 /* bf16 storage and a bf16 GEMM here: tiles multiply in bf16 (P rounded to bf16) */
    bool failed;               /* out of memory in some task */
} attn_job;

static inline float load(tf_dt t, const void *p, int64_t i)
{
    switch (t) {
    case TF_DT_F32: return ((const float *)p)[i];
    case TF_DT_F64: return (float)((const double *)p)[i];
    case TF_DT_BOOL: return ((const unsigned char *)p)[i] ? 1.0f : 0.0f;
    default: return (float)tf_elem_load(t, p, i);
    }
}

/* rows [r0, r0 + n) of a [rows, cols] matrix of dtype t as f32: the storage itself, or widened into buf. */
static const float *rows_f32(tf_dt t, const void *base, int64_t r0, int64_t n, int64_t cols, float *buf)
{
    if (t == TF_DT_F32) return (const float *)base + r0 * cols;
    const uint16_t *s = (const uint16_t *)base + r0 * cols;
    if (t == TF_DT_BF16) tf_cpu_bf16_to_f32(s, buf, n * cols);
    else if (t == TF_DT_F16) tf_cpu_f16_to_f32(s, buf, n * cols);
    else for (int64_t i = 0; i < n * cols; i++) buf[i] = load(t, base, r0 * cols + i);
    return buf;
}

/* Score row i (query block row) over keys [j0, j0 + n): scaled, masked, causal; -inf where not visible. */
static void prepare_row(const attn_job *J, int64_t b, int64_t h, int64_t i, int64_t j0, float *s, int64_t n)
{
    const tf_attn_geom *g = &J->g;
    float sc = (float)g->scale;
    for (int64_t j = 0; j < n; j++) s[j] *= sc;
    if (J->mask) {
        int64_t base = b * g->mstride[0] + h * g->mstride[1] + i * g->mstride[2], st = g->mstride[3];
        if (g->mask_bool) {
            const unsigned char *mk = (const unsigned char *)J->mask + base;
            for (int64_t j = 0; j < n; j++)
                if (!mk[(j0 + j) * st]) s[j] = -INFINITY;
        } else {
            for (int64_t j = 0; j < n; j++) s[j] += load(J->mdt, J->mask, base + (j0 + j) * st);
        }
    }
    if (g->causal)
        for (int64_t j = i + 1 - j0 > 0 ? i + 1 - j0 : 0; j < n; j++) s[j] = -INFINITY;
}

/* P_ij times its dropout factor, in place, for row i (flat row index fr of [B, H, Tq]) over keys [j0, j0 + n). */
static void drop_row(const attn_job *J, int64_t fr, int64_t j0, float *p, int64_t n)
{
    uint64_t base = (uint64_t)fr * (uint64_t)J->g.Tk + (uint64_t)j0;
    for (int64_t j = 0; j < n; j++)
        if (p[j] != 0) p[j] *= tf_rng_uniform(J->seed, J->stream, base + (uint64_t)j) >= J->g.dropout ? J->keep_scale : 0.0f;
}

/* ---- forward ---- */

static void store_row(const attn_job *J, int64_t fr, const float *acc, float l, float m, float *tmp)
{
    const tf_attn_geom *g = &J->g;
    float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int64_t e = 0; e < g->Dv; e++) tmp[e] = acc[e] * inv;
    if (g->lse) tmp[g->Dv] = l > 0 ? m + logf(l) : -INFINITY;
    void *dst = J->out;
    tf_dt t = g->lse ? TF_DT_F32 : J->dt;
    int64_t at = fr * J->ow;
    if (t == TF_DT_F32) memcpy((float *)dst + at, tmp, (size_t)J->ow * sizeof *tmp);
    else if (t == TF_DT_BF16) tf_cpu_f32_to_bf16(tmp, (uint16_t *)dst + at, J->ow);
    else if (t == TF_DT_F16) tf_cpu_f32_to_f16(tmp, (uint16_t *)dst + at, J->ow);
    else for (int64_t e = 0; e < J->ow; e++) tf_elem_store(t, dst, at + e, tmp[e]);
}

static void forward_task(const attn_job *J, int64_t task, float *w)
{
    const tf_attn_geom *g = &J->g;
    int64_t bh = task / J->nqb, b = bh / g->H, h = bh % g->H, hk = h / (g->H / g->Hk);
    int64_t i0 = task % J->nqb * ATT_BQ, bq = g->Tq - i0 < ATT_BQ ? g->Tq - i0 : ATT_BQ;
    int64_t D = g->D, Dv = g->Dv, kend = g->causal && i0 + bq < g->Tk ? i0 + bq : g->Tk;
    float *qb = w, *kb = qb + ATT_BQ * D, *vb = kb + ATT_BK * D, *S = vb + ATT_BK * Dv, *acc = S + ATT_BQ * ATT_BK;
    float *m = acc + ATT_BQ * Dv, *l = m + ATT_BQ, *tmp = l + ATT_BQ;
    uint16_t *pb = (uint16_t *)(tmp + g->Dv + 1);
    const float *Q = J->bf16 ? NULL : rows_f32(J->dt, J->q, bh * g->Tq + i0, bq, D, qb);
    const uint16_t *Qh = (const uint16_t *)J->q + (bh * g->Tq + i0) * D;
    for (int64_t r = 0; r < bq; r++) m[r] = -INFINITY, l[r] = 0;
    memset(acc, 0, (size_t)(bq * Dv) * sizeof *acc);
    for (int64_t j0 = 0; j0 < kend; j0 += ATT_BK) {
        int64_t bk = kend - j0 < ATT_BK ? kend - j0 : ATT_BK;
        int64_t kr = (b * g->Hk + hk) * g->Tk + j0;
        const float *K = J->bf16 ? NULL : rows_f32(J->dt, J->k, kr, bk, D, kb);
        const float *V = J->bf16 ? NULL : rows_f32(J->dt, J->v, kr, bk, Dv, vb);
        if (J->bf16)
            tf_cpu_gemm_tile_bf16(false, true, bq, bk, D, Qh, D, (const uint16_t *)J->k + kr * D, D, S, ATT_BK, false);
        else
            tf_cpu_gemm_tile(false, true, bq, bk, D, Q, D, K, D, S, ATT_BK, false);
        for (int64_t r = 0; r < bq; r++) {
            float *s = S + r * ATT_BK;
            prepare_row(J, b, h, i0 + r, j0, s, bk);
            float mx = row_max(s, bk), mn = mx > m[r] ? mx : m[r];
            if (mn == -INFINITY) {   /* no visible key yet: P is 0 */
                memset(s, 0, (size_t)bk * sizeof *s);
                continue;
            }
            float alpha = expf(m[r] - mn);
            l[r] = l[r] * alpha + exp_sum(s, bk, mn);
            if (alpha != 1.0f)
                for (int64_t e = 0; e < Dv; e++) acc[r * Dv + e] *= alpha;
            m[r] = mn;
            if (J->drop) drop_row(J, bh * g->Tq + i0 + r, j0, s, bk);
        }
        if (J->bf16) {   /* P rounded to bf16, as the decomposed form's probabilities before their matmul */
            for (int64_t r = 0; r < bq; r++) tf_cpu_f32_to_bf16(S + r * ATT_BK, pb + r * ATT_BK, bk);
            tf_cpu_gemm_tile_bf16(false, false, bq, Dv, bk, pb, ATT_BK, (const uint16_t *)J->v + kr * Dv, Dv, acc, Dv, true);
        } else {
            tf_cpu_gemm_tile(false, false, bq, Dv, bk, S, ATT_BK, V, Dv, acc, Dv, true);
        }
    }
    for (int64_t r = 0; r < bq; r++) store_row(J, bh * g->Tq + i0 + r, acc + r * Dv, l[r], m[r], tmp);
}

static int64_t forward_floats(const tf_attn_geom *g)
{
    return ATT_BQ * g->D + ATT_BK * (g->D + g->Dv) + ATT_BQ * ATT_BK + ATT_BQ * g->Dv + 2 * ATT_BQ + g->Dv + 1 +
           ATT_BQ * ATT_BK / 2 + 16;
}

static void forward_piece(void *arg, int64_t lo, int64_t hi)
{
    attn_job *J = arg;
    float *w = tf_malloc_aligned(64, (size_t)forward_floats(&J->g) * sizeof(float));
    if (!w) {
        J->failed = true;
        return;
    }
    for (int64_t t = lo; t < hi; t++) forward_task(J, t, w);
    tf_free_aligned(w);
}

/* ---- backward ---- */

/* One query head h of task (b, hk): its dQ, and its part of dK and dV. */
static void backward_head(const attn_job *J, int64_t b, int64_t h, int64_t hk, float *w)
{
    const tf_attn_geom *g = &J->g;
    int64_t D = g->D, Dv = g->Dv, Tq = g->Tq, Tk = g->Tk, bh = b * g->H + h, kv = b * g->Hk + hk;
    int64_t nq = g->B * g->H * Tq * D, nk = g->B * g->Hk * Tk * D;
    float *qw = w, *kw = qw + Tq * D, *vw = kw + Tk * D, *dow = vw + Tk * Dv, *Drow = dow + Tq * Dv, *P = Drow + Tq;
    float *PZ = P + ATT_BWD_BQ * ATT_BWD_BK, *dP = PZ + ATT_BWD_BQ * ATT_BWD_BK;
    /* bf16: S = Q K^T and dV += (P Z)^T dO multiply in bf16 (P Z and dO rounded to bf16 for it); dP, dQ
     * and dK stay f32: dS = P (dP - D) cancels along each row, and rounding its terms would not */
    bool hb = J->bf16;
    const uint16_t *Qh = (const uint16_t *)J->q + bh * Tq * D, *Kh = (const uint16_t *)J->k + kv * Tk * D;
    uint16_t *dOb = (uint16_t *)(dP + ATT_BWD_BQ * ATT_BWD_BK), *Pb = dOb + Tq * Dv;
    const float *Q = rows_f32(J->dt, J->q, bh * Tq, Tq, D, qw);
    const float *K = rows_f32(J->dt, J->k, kv * Tk, Tk, D, kw);
    const float *V = rows_f32(J->dt, J->v, kv * Tk, Tk, Dv, vw);
    /* dO: rows of width dw in dout; f32 storage is read in place (lda dw) */
    const float *dO;
    int64_t ldo = J->dw;
    if (J->ddt == TF_DT_F32) {
        dO = (const float *)J->dout + bh * Tq * J->dw;
    } else {
        for (int64_t i = 0; i < Tq; i++)
            for (int64_t e = 0; e < Dv; e++) dow[i * Dv + e] = load(J->ddt, J->dout, (bh * Tq + i) * J->dw + e);
        dO = dow, ldo = Dv;
    }
    const float *O = J->o + bh * Tq * (Dv + 1);
    for (int64_t i = 0; i < Tq; i++) {
        float d = 0;
        for (int64_t e = 0; e < Dv; e++) d += dO[i * ldo + e] * O[i * (Dv + 1) + e];
        Drow[i] = J->dw > Dv ? d - load(J->ddt, J->dout, (bh * Tq + i) * J->dw + Dv) : d;
        if (hb) tf_cpu_f32_to_bf16(dO + i * ldo, dOb + i * Dv, Dv);
    }
    float *dQ = (float *)J->out + bh * Tq * D, *dK = (float *)J->out + nq + kv * Tk * D, *dV = (float *)J->out + nq + nk + kv * Tk * Dv;
    float sc = (float)g->scale;
    for (int64_t j0 = 0; j0 < Tk; j0 += ATT_BWD_BK) {
        int64_t bk = Tk - j0 < ATT_BWD_BK ? Tk - j0 : ATT_BWD_BK;
        for (int64_t i0 = g->causal ? j0 / ATT_BWD_BQ * ATT_BWD_BQ : 0; i0 < Tq; i0 += ATT_BWD_BQ) {
            int64_t bq = Tq - i0 < ATT_BWD_BQ ? Tq - i0 : ATT_BWD_BQ;
            if (hb) tf_cpu_gemm_tile_bf16(false, true, bq, bk, D, Qh + i0 * D, D, Kh + j0 * D, D, P, ATT_BWD_BK, false);
            else tf_cpu_gemm_tile(false, true, bq, bk, D, Q + i0 * D, D, K + j0 * D, D, P, ATT_BWD_BK, false);
            for (int64_t r = 0; r < bq; r++) {
                float *p = P + r * ATT_BWD_BK, lse = O[(i0 + r) * (Dv + 1) + Dv];
                prepare_row(J, b, h, i0 + r, j0, p, bk);
                if (lse == -INFINITY) memset(p, 0, (size_t)bk * sizeof *p);
                else exp_sum(p, bk, lse);
                if (!J->drop) continue;
                memcpy(PZ + r * ATT_BWD_BK, p, (size_t)bk * sizeof *p);
                drop_row(J, bh * Tq + i0 + r, j0, PZ + r * ATT_BWD_BK, bk);
            }
            /* dV += (P Z)^T dO; dP = dO V^T; dS = P (Z dP - D) scale = (PZ dP - P D) scale */
            if (hb) {
                for (int64_t r = 0; r < bq; r++) tf_cpu_f32_to_bf16((J->drop ? PZ : P) + r * ATT_BWD_BK, Pb + r * ATT_BWD_BK, bk);
                tf_cpu_gemm_tile_bf16(true, false, bk, Dv, bq, Pb, ATT_BWD_BK, dOb + i0 * Dv, Dv, dV + j0 * Dv, Dv, true);
            } else {
                tf_cpu_gemm_tile(true, false, bk, Dv, bq, J->drop ? PZ : P, ATT_BWD_BK, dO + i0 * ldo, ldo, dV + j0 * Dv, Dv, true);
            }
            tf_cpu_gemm_tile(false, true, bq, bk, Dv, dO + i0 * ldo, ldo, V + j0 * Dv, Dv, dP, ATT_BWD_BK, false);
            for (int64_t r = 0; r < bq; r++) {
                float *p = P + r * ATT_BWD_BK, *pz = J->drop ? PZ + r * ATT_BWD_BK : p, *dp = dP + r * ATT_BWD_BK, d = Drow[i0 + r];
                for (int64_t j = 0; j < bk; j++) p[j] = (pz[j] * dp[j] - p[j] * d) * sc;
            }
            /* P holds dS (times the scale): dQ += dS K, dK += dS^T Q */
            tf_cpu_gemm_tile(false, false, bq, D, bk, P, ATT_BWD_BK, K + j0 * D, D, dQ + i0 * D, D, true);
            tf_cpu_gemm_tile(true, false, bk, D, bq, P, ATT_BWD_BK, Q + i0 * D, D, dK + j0 * D, D, true);
        }
    }
}

static int64_t backward_floats(const tf_attn_geom *g)
{
    return g->Tq * g->D + g->Tk * (g->D + g->Dv) + g->Tq * g->Dv + g->Tq + 3 * ATT_BWD_BQ * ATT_BWD_BK +
           (g->Tq * g->Dv + 1) / 2 + ATT_BWD_BQ * ATT_BWD_BK / 2 + 16;   /* and the bf16 dO and P Z */
}

static void backward_piece(void *arg, int64_t lo, int64_t hi)
{
    attn_job *J = arg;
    const tf_attn_geom *g = &J->g;
    float *w = tf_malloc_aligned(64, (size_t)backward_floats(g) * sizeof(float));
    if (!w) {
        J->failed = true;
        return;
    }
    int64_t nq = g->B * g->H * g->Tq * g->D, nk = g->B * g->Hk * g->Tk * g->D;
    for (int64_t t = lo; t < hi; t++) {
        int64_t b = t / g->Hk, hk = t % g->Hk, G = g->H / g->Hk;
        float *out = J->out;
        memset(out + nq + t * g->Tk * g->D, 0, (size_t)(g->Tk * g->D) * sizeof(float));
        memset(out + nq + nk + t * g->Tk * g->Dv, 0, (size_t)(g->Tk * g->Dv) * sizeof(float));
        for (int64_t h = hk * G; h < (hk + 1) * G; h++) {
            memset(out + (b * g->H + h) * g->Tq * g->D, 0, (size_t)(g->Tq * g->D) * sizeof(float));
            backward_head(J, b, h, hk, w);
        }
    }
    tf_free_aligned(w);
}

/* ---- entry ---- */

bool tf_cpu_attention_supported(const tf_node *n)
{
    for (int k = 0; k < 3; k++)
        if (n->in[k]->type.dtype == TF_DT_F64 || n->in[k]->kind == TF_VAL_CONST) return false;
    for (int k = 3; k < n->nin; k++)
        if (n->in[k]->kind == TF_VAL_CONST) return false;
    return n->out->type.dtype != TF_DT_F64;
}

bool tf_cpu_run_attention(cpu *c, const tf_node *n, bool train)
{
#if defined(__x86_64__)
    static bool probed;
    if (!probed) {
        g_avx512 = __builtin_cpu_supports("avx512f");
        probed = true;
    }
#endif
    attn_job J = {.dt = n->in[0]->type.dtype, .q = storage(c, n->in[0]), .k = storage(c, n->in[1]), .v = storage(c, n->in[2]),
                  .out = storage(c, n->out), .seed = c->rt[0]};
    tf_attn_geom_of(n, &J.g);
    const tf_attn_geom *g = &J.g;
    if (g->mask >= 0) J.mask = storage(c, n->in[g->mask]), J.mdt = n->in[g->mask]->type.dtype;
    J.drop = train && g->dropout > 0;
    J.stream = tf_dropout_stream(c->rt[1], g->salt);
    J.keep_scale = (float)(1.0 / (1.0 - g->dropout));
    J.bf16 = J.dt == TF_DT_BF16 && tf_cpu_bf16_gemm_kind() != TF_BF16_GEMM_NONE;
    if (n->op == TF_OP_FLASH_ATTENTION) {
        J.ow = n->out->type.dims[3].n;
        J.nqb = (g->Tq + ATT_BQ - 1) / ATT_BQ;
        tf_pool_run(c->pool, g->B * g->H * J.nqb, forward_piece, &J);
    } else {
        J.o = storage(c, n->in[3]);
        J.dout = storage(c, n->in[4]), J.ddt = n->in[4]->type.dtype, J.dw = n->in[4]->type.dims[3].n;
        tf_pool_run(c->pool, g->B * g->Hk, backward_piece, &J);
    }
    return !J.failed;
}

#endif
