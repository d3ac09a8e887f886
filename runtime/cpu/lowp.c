/* lowp.c — see lowp.h. */
#include <pthread.h>
#include <stdalign.h>
#include <string.h>

#include "lowp.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TF_LOWP_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define TF_LOWP_X86 0
#endif

/* ---- plain C: the definition every vector path must match ----------------- */

static float f16_to_f32_1(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023, u;
    float f;
    if (e == 0) {   /* zero or subnormal: m * 2^-24, exact */
        f = (float)m * 0x1p-24f;
        return s ? -f : f;
    }
    if (e == 31) u = s | 0x7f800000u | (m << 13);   /* inf, NaN */
    else u = s | ((e + 112) << 23) | (m << 13);
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_f16_1(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7e00;              /* NaN: tf_elem_store's quiet NaN */
    if (u >= 0x477ff000u) return s | 0x7c00;         /* >= 65520 rounds to inf */
    if (u < 0x38800000u) {                           /* below 2^-14: f16 subnormal or zero */
        if (u <= 0x33000000u) return s;              /* <= 2^-25: 0 (2^-25 is a tie, to even) */
        uint32_t m = (u & 0x7fffffu) | 0x800000u, sh = 126 - (u >> 23);   /* 14..24 */
        uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(s | q);
    }
    uint32_t r = u - 0x38000000u;                    /* exponent rebiased by 127 - 15 */
    r += 0xfffu + ((r >> 13) & 1);                   /* nearest even on the 13 dropped bits */
    return (uint16_t)(s | (r >> 13));
}

static uint16_t f32_to_bf16_1(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static void f16_to_f32_c(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32_1(src[i]);
}

static void bf16_to_f32_c(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {   /* a loop the compiler vectorizes */
        uint32_t w = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &w, 4);
    }
}

static void f32_to_f16_c(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = f32_to_f16_1(src[i]);
}

static void f32_to_bf16_c(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16_1(src[i]);
}

/* ---- vector paths ---------------------------------------------------------- */

#if TF_LOWP_X86
#define AVX512 __attribute__((target("avx512f")))
#define F16C __attribute__((target("avx,f16c")))

AVX512 static void f16_to_f32_avx512(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    f16_to_f32_c(src + i, dst + i, n - i);
}

AVX512 static void bf16_to_f32_avx512(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(w, 16));
    }
    bf16_to_f32_c(src + i, dst + i, n - i);
}

AVX512 static void f32_to_f16_avx512(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    const __m512 qnan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000));   /* -> 0x7e00 */
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(src + i);
        x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), qnan);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    f32_to_f16_c(src + i, dst + i, n - i);
}

AVX512 static void f32_to_bf16_avx512(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), qnan = _mm512_set1_epi32(0x7fc0);
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(src + i);
        __m512i u = _mm512_castps_si512(x);
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
        r = _mm512_srli_epi32(r, 16);
        r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), qnan);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
    }
    f32_to_bf16_c(src + i, dst + i, n - i);
}

F16C static void f16_to_f32_f16c(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    f16_to_f32_c(src + i, dst + i, n - i);
}

F16C static void f32_to_f16_f16c(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        x = _mm256_blendv_ps(x, qnan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    f32_to_f16_c(src + i, dst + i, n - i);
}
#endif

/* ---- dispatch ---------------------------------------------------------------- */

typedef struct lowp_impl {
    const char *name;
    void (*f16_to_f32)(const uint16_t *, float *, int64_t);
    void (*bf16_to_f32)(const uint16_t *, float *, int64_t);
    void (*f32_to_f16)(const float *, uint16_t *, int64_t);
    void (*f32_to_bf16)(const float *, uint16_t *, int64_t);
} lowp_impl;

static const lowp_impl impl_c = {"scalar", f16_to_f32_c, bf16_to_f32_c, f32_to_f16_c, f32_to_bf16_c};
#if TF_LOWP_X86
static const lowp_impl impl_avx512 = {"avx512", f16_to_f32_avx512, bf16_to_f32_avx512, f32_to_f16_avx512, f32_to_bf16_avx512};
static const lowp_impl impl_f16c = {"f16c", f16_to_f32_f16c, bf16_to_f32_c, f32_to_f16_f16c, f32_to_bf16_c};
#endif

static const lowp_impl *best;
static bool has_bf16_dot;
static _Atomic bool force_scalar;

static void detect(void)
{
    best = &impl_c;
#if TF_LOWP_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) best = &impl_avx512;
    unsigned a, b, c, d;   /* F16C: CPUID.1:ECX bit 29 (not every compiler's __builtin_cpu_supports knows it) */
    if (best == &impl_c && __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C)) best = &impl_f16c;
    has_bf16_dot = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
#endif
}

static const lowp_impl *impl(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, detect);
    return force_scalar ? &impl_c : best;
}

void tf_cpu_f16_to_f32(const uint16_t *src, float *dst, int64_t n) { impl()->f16_to_f32(src, dst, n); }
void tf_cpu_bf16_to_f32(const uint16_t *src, float *dst, int64_t n) { impl()->bf16_to_f32(src, dst, n); }
void tf_cpu_f32_to_f16(const float *src, uint16_t *dst, int64_t n) { impl()->f32_to_f16(src, dst, n); }
void tf_cpu_f32_to_bf16(const float *src, uint16_t *dst, int64_t n) { impl()->f32_to_bf16(src, dst, n); }
const char *tf_cpu_lowp_isa(void) { return impl()->name; }
void tf_cpu_lowp_force_scalar(bool on) { force_scalar = on; }

bool tf_cpu_has_avx512_bf16(void)
{
    (void)impl();
    return has_bf16_dot;
}

/* ---- bf16 GEMM: packed panels and a vdpbf16ps micro-kernel -------------------
 *
 * Blocking (per call, on the calling thread): K in blocks of KC, N in blocks
 * of NC, M in blocks of MC. B's block is packed into panels of NR = 32
 * columns, each k-pair row of a panel the two zmm registers vdpbf16ps reads
 * (column j's (k, k+1) in 32-bit lane j); A's block into panels of MR rows,
 * each k-pair of a row one 32-bit word to broadcast. Odd K and the edges are
 * padded with zeros; tiles store only their real rows and columns. C gets
 * each K block's sum in turn (the first one stored, the rest added), so the
 * order of additions is fixed by the shape alone. */

enum { MR = 8, NR = 32, KC = 256, NC = 256, MC = 128 };
_Static_assert(MR == 8, "pack_a packs 8 rows with 256-bit vectors");

static inline uint16_t at16(const uint16_t *X, int64_t ld, bool t, int64_t r, int64_t c)
{
    return t ? X[c * ld + r] : X[r * ld + c];
}

#if TF_LOWP_X86
#define BF16K __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

BF16K static inline __m512i lane16(void) { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

/* B's block: rows [k0, k0+kc) x columns [j0, j0+nc) of op(B) into panels. */
BF16K static void pack_b(bool tb, const uint16_t *B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0, int64_t nc, uint16_t *dst)
{
    int64_t kp = (kc + 1) / 2;
    for (int64_t p = 0; p * NR < nc; p++) {
        uint16_t *pan = dst + p * kp * 2 * NR;
        int64_t jb = j0 + p * NR, cols = nc - p * NR < NR ? nc - p * NR : NR;
        for (int64_t q = 0; q < kp; q++) {
            int64_t k = k0 + 2 * q;
            bool two = 2 * q + 1 < kc;
            uint16_t *row = pan + q * 2 * NR;
            if (!tb && two && cols == NR) {   /* two rows of 32 columns, interleaved */
                const uint16_t *r0 = B + k * ldb + jb, *r1 = r0 + ldb;
                for (int h = 0; h < 2; h++) {
                    __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + 16 * h)));
                    __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + 16 * h)));
                    _mm512_storeu_si512(row + 32 * h, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
                }
                continue;
            }
            if (tb && two && cols == NR) {   /* column j's pair is one 32-bit word of B's row jb + j */
                const int *base = (const int *)(const void *)(B + jb * ldb + k);
                for (int h = 0; h < 2; h++) {
                    __m512i idx = _mm512_mullo_epi32(_mm512_add_epi32(_mm512_set1_epi32(16 * h), lane16()),
                                                     _mm512_set1_epi32((int)(ldb * 2)));
                    _mm512_storeu_si512(row + 32 * h, _mm512_i32gather_epi32(idx, base, 1));
                }
                continue;
            }
            for (int64_t j = 0; j < NR; j++) {
                bool in = j < cols;
                row[2 * j] = in ? at16(B, ldb, !tb, jb + j, k) : 0;   /* op(B)[k][j] */
                row[2 * j + 1] = in && two ? at16(B, ldb, !tb, jb + j, k + 1) : 0;
            }
        }
    }
}
#endif

#if TF_LOWP_X86
/* A's block: rows [i0, i0+mc) x columns [k0, k0+kc) of op(A) into MR-row
 * panels: row r's pair (k, k+1) is the word q * MR + r, k in the low half. */
static void pack_a_c(bool ta, const uint16_t *A, int64_t lda, int64_t i0, int64_t mc, int64_t k0, int64_t kc, uint32_t *dst)
{
    int64_t kp = (kc + 1) / 2;
    for (int64_t p = 0; p * MR < mc; p++) {
        uint32_t *pan = dst + p * kp * MR;
        for (int64_t r = 0; r < MR; r++) {
            int64_t i = i0 + p * MR + r;
            bool in = p * MR + r < mc;
            for (int64_t q = 0; q < kp; q++) {
                int64_t k = k0 + 2 * q;
                pan[q * MR + r] = !in ? 0 : at16(A, lda, ta, i, k) | (2 * q + 1 < kc ? (uint32_t)at16(A, lda, ta, i, k + 1) << 16 : 0);
            }
        }
    }
}

/* The same, 8 rows (MR) at a time where the panel is full. */
BF16K static void pack_a(bool ta, const uint16_t *A, int64_t lda, int64_t i0, int64_t mc, int64_t k0, int64_t kc, uint32_t *dst)
{
    int64_t kp = (kc + 1) / 2, full = kc / 2;
    int64_t p = 0;
    for (; (p + 1) * MR <= mc; p++) {
        uint32_t *pan = dst + p * kp * MR;
        int64_t ib = i0 + p * MR;
        if (ta) {   /* rows k and k+1 of A hold the panel's 8 values each */
            for (int64_t q = 0; q < full; q++) {
                const uint16_t *r0 = A + (k0 + 2 * q) * lda + ib;
                __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)r0));
                __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(r0 + lda)));
                _mm256_storeu_si256((__m256i *)(pan + q * MR), _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16)));
            }
        } else {    /* row i's pair is one 32-bit word */
            const int *base = (const int *)(const void *)(A + ib * lda + k0);
            __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)(lda * 2)));
            for (int64_t q = 0; q < full; q++)
                _mm256_storeu_si256((__m256i *)(pan + q * MR), _mm256_i32gather_epi32(base + q, idx, 1));
        }
        for (int64_t q = full; q < kp; q++)   /* odd kc: the last k alone */
            for (int64_t r = 0; r < MR; r++) pan[q * MR + r] = at16(A, lda, ta, ib + r, k0 + 2 * q);
    }
    if (p * MR < mc) pack_a_c(ta, A, lda, i0 + p * MR, mc - p * MR, k0, kc, dst + p * kp * MR);
}
#endif

#if TF_LOWP_X86
/* One MR x NR tile of C: rows < `rows`, columns < `cols` stored (added when add). */
BF16K static void tile(int64_t kp, const uint32_t *ap, const uint16_t *bp, float *C, int64_t ldc, int rows, int cols, bool add)
{
    __m512 acc[MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t q = 0; q < kp; q++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + q * 2 * NR), b1 = (__m512bh)_mm512_loadu_si512(bp + q * 2 * NR + 32);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[q * MR + r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
        }
    }
    __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
    __mmask16 m1 = cols >= 32 ? 0xffff : cols > 16 ? (__mmask16)((1u << (cols - 16)) - 1) : 0;
    for (int r = 0; r < rows; r++) {
        float *c = C + r * ldc;
        __m512 x0 = acc[r][0], x1 = acc[r][1];
        if (add) {
            x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, c));
            x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, c + 16));
        }
        _mm512_mask_storeu_ps(c, m0, x0);
        _mm512_mask_storeu_ps(c + 16, m1, x1);
    }
}

BF16K static void bf16_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                            const uint16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    alignas(64) uint16_t bpack[KC * NC];
    alignas(64) uint32_t apack[KC / 2 * MC];
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        int64_t kc = K - k0 < KC ? K - k0 : KC, kp = (kc + 1) / 2;
        bool add = accumulate || k0 > 0;
        for (int64_t j0 = 0; j0 < N; j0 += NC) {
            int64_t nc = N - j0 < NC ? N - j0 : NC;
            pack_b(tb, B, ldb, k0, kc, j0, nc, bpack);
            for (int64_t i0 = 0; i0 < M; i0 += MC) {
                int64_t mc = M - i0 < MC ? M - i0 : MC;
                pack_a(ta, A, lda, i0, mc, k0, kc, apack);
                for (int64_t p = 0; p * NR < nc; p++) {
                    int cols = (int)(nc - p * NR < NR ? nc - p * NR : NR);
                    for (int64_t ir = 0; ir * MR < mc; ir++) {
                        int rows = (int)(mc - ir * MR < MR ? mc - ir * MR : MR);
                        tile(kp, apack + ir * kp * MR, bpack + p * kp * 2 * NR, C + (i0 + ir * MR) * ldc + j0 + p * NR, ldc,
                             rows, cols, add);
                    }
                }
            }
        }
    }
}
#endif

void tf_cpu_bf16_gemm_kernel(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                             const uint16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
#if TF_LOWP_X86
    if (tf_cpu_has_avx512_bf16()) {
        bf16_gemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
        return;
    }
#endif
    /* not reached where callers check tf_cpu_has_avx512_bf16(); plain loops otherwise */
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float s = 0;
            for (int64_t k = 0; k < K; k++) {
                uint32_t a = (uint32_t)at16(A, lda, ta, i, k) << 16, b = (uint32_t)at16(B, ldb, tb, k, j) << 16;
                float fa, fb;
                memcpy(&fa, &a, 4);
                memcpy(&fb, &b, 4);
                s += fa * fb;
            }
            C[i * ldc + j] = accumulate ? C[i * ldc + j] + s : s;
        }
}
