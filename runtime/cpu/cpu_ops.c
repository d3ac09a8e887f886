/* cpu_ops.c — see cpu_ops.h. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_ops.h"
#include "lowp.h"
#include "env.h"

#ifdef TFUSE_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>

/* OpenBLAS is opened on the first GEMM a process runs (or a cpu session's
 * start), not linked: a process that never multiplies on the cpu (a cuda
 * compile, the interpreter, `tfuse doctor`) neither pays for loading it nor
 * gets what it brings along: libgfortran's libquadmath, whose printf hooks
 * send every printf of the process down glibc's slow path, and OpenBLAS's
 * worker threads, which spin for a while after they start. The build still
 * needs its headers; a machine that lost the library runs built-in loops,
 * and says so once. */
#define BLAS_SONAME "libopenblas.so.0"
typedef void (*sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                         const float *, blasint, const float *, blasint, float, float *, blasint);
static sgemm_fn sgemm;
/* cblas_sbgemm (bf16 x bf16 -> f32): cblas.h declares it in every OpenBLAS,
 * but only a library built with BUILD_BFLOAT16 exports it (Debian 12's
 * 0.3.21 does not). */
typedef void (*sbgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                          const uint16_t *, blasint, const uint16_t *, blasint, float, float *, blasint);
static sbgemm_fn sbgemm;
static char blas_name[320] = "OpenBLAS";
static bool blas_missing;

static void blas_init_once(void)
{
    void *h = dlopen(BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
    void *f = h ? dlsym(h, "cblas_sgemm") : NULL;
    if (!f) {
        const char *e = dlerror();
        snprintf(blas_name, sizeof blas_name, "built-in loops (%s: %s)", h ? "OpenBLAS has no cblas_sgemm" : "cannot load " BLAS_SONAME,
                 e ? e : "?");
        blas_missing = true;   /* each session's context is warned (backend_cpu.c), not stderr from here */
        return;
    }
    void (*threads)(int) = NULL;
    *(void **)&threads = dlsym(h, "openblas_set_num_threads");   /* OpenBLAS's own: one thread, tfuse's pool splits the work */
    if (threads) threads(1);
    *(void **)&sbgemm = dlsym(h, "cblas_sbgemm");
    *(void **)&sgemm = f;
}
#endif

void tf_cpu_blas_init(void)
{
#ifdef TFUSE_HAVE_OPENBLAS
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_init_once);
#endif
}

bool tf_cpu_blas_warning(void)
{
#ifdef TFUSE_HAVE_OPENBLAS
    tf_cpu_blas_init();
    return blas_missing;
#else
    return false;   /* a build without OpenBLAS says so in doctor; its loops are the design, not a failure */
#endif
}

const char *tf_cpu_blas_name(void)
{
#ifdef TFUSE_HAVE_OPENBLAS
    tf_cpu_blas_init();
    return blas_name;
#else
    return "built-in loops (no OpenBLAS in this build)";
#endif
}

/* One block of rows [r0, r1) of C. */
static void gemm_rows(bool ta, bool tb, int64_t r0, int64_t r1, int64_t N, int64_t K, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    const float *a = ta ? A + r0 : A + r0 * lda;
    float *c = C + r0 * ldc;
    int64_t M = r1 - r0;
#ifdef TFUSE_HAVE_OPENBLAS
    tf_cpu_blas_init();
    if (sgemm) {
        sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, 1.0f, a,
              (blasint)lda, B, (blasint)ldb, accumulate ? 1.0f : 0.0f, c, (blasint)ldc);
        return;
    }
#endif
    for (int64_t i = 0; i < M; i++) {
        float *ci = c + i * ldc;
        if (!accumulate) memset(ci, 0, (size_t)N * sizeof *ci);
        for (int64_t k = 0; k < K; k++) {
            float aik = ta ? a[k * lda + i] : a[i * lda + k];
            if (tb)
                for (int64_t j = 0; j < N; j++) ci[j] += aik * B[j * ldb + k];
            else
                for (int64_t j = 0; j < N; j++) ci[j] += aik * B[k * ldb + j];
        }
    }
}

/* The same with bf16 operands, through the routine tf_cpu_bf16_gemm_kind names. */
static void gemm_rows_bf16(bool ta, bool tb, int64_t r0, int64_t r1, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                           const uint16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    const uint16_t *a = ta ? A + r0 : A + r0 * lda;
    float *c = C + r0 * ldc;
    int64_t M = r1 - r0;
#ifdef TFUSE_HAVE_OPENBLAS
    if (tf_cpu_bf16_gemm_kind() == TF_BF16_GEMM_SBGEMM) {
        sbgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
               (blasint)K, 1.0f, a, (blasint)lda, B, (blasint)ldb, accumulate ? 1.0f : 0.0f, c, (blasint)ldc);
        return;
    }
#endif
    tf_cpu_bf16_gemm_kernel(ta, tb, M, N, K, a, lda, B, ldb, c, ldc, accumulate);
}

/* A GEMM's pieces depend on its shape and the machine, never on the
 * number of threads a session runs: BLAS kernels may add up a dot product
 * in another order for another block shape (OpenBLAS has separate
 * small-matrix kernels), so a split that followed the thread count would
 * make results depend on it. A GEMM too small to be worth splitting is one
 * piece; a larger one is cut along the longer side of C into at most
 * gemm_pieces() blocks of at least GEMM_MIN_BLOCK rows or columns (columns
 * in multiples of 16), and the pool hands whole pieces to its threads; one
 * thread runs them in turn. Each piece is a BLAS call that packs the whole
 * shared operand again, so pieces cost: with 16 of them OpenBLAS ran gpt's
 * GEMMs 8-34% slower on one core than with 1, with 4 of them 0-10% slower
 * (bench/RESULTS.md, 2026-11-24). So twice the machine's CPUs, 4 to 16. */
enum { GEMM_MIN_PIECES = 4, GEMM_MAX_PIECES = 16, GEMM_MIN_BLOCK = 64 };

static int64_t g_gemm_pieces;
static pthread_once_t g_gemm_once = PTHREAD_ONCE_INIT;

static void gemm_pieces_once(void)
{
    int64_t n = 2 * (int64_t)tf_cpu_count();   /* the CPUs this process may use */
    g_gemm_pieces = n < GEMM_MIN_PIECES ? GEMM_MIN_PIECES : n > GEMM_MAX_PIECES ? GEMM_MAX_PIECES : n;
}

int64_t tf_cpu_gemm_pieces(void)
{
    pthread_once(&g_gemm_once, gemm_pieces_once);
    return g_gemm_pieces;
}

static int64_t gemm_pieces(void) { return tf_cpu_gemm_pieces(); }

typedef struct gemm_job {
    bool ta, tb, accumulate, by_cols, bf16;
    int64_t M, N, K, lda, ldb, ldc;
    int64_t block, pieces;   /* rows or columns per piece; how many */
    const void *A, *B;       /* float, or uint16_t bf16 bits when bf16 */
    float *C;
} gemm_job;

static void job_rows(const gemm_job *j, int64_t r0, int64_t r1, int64_t N, const void *B, float *C)
{
    if (j->bf16) gemm_rows_bf16(j->ta, j->tb, r0, r1, N, j->K, j->A, j->lda, B, j->ldb, C, j->ldc, j->accumulate);
    else gemm_rows(j->ta, j->tb, r0, r1, N, j->K, j->A, j->lda, B, j->ldb, C, j->ldc, j->accumulate);
}

/* Pieces [lo, hi): each one GEMM over its block of rows or columns of C. */
static void gemm_piece(void *arg, int64_t lo, int64_t hi)
{
    const gemm_job *j = arg;
    size_t es = j->bf16 ? 2 : 4;
    for (int64_t p = lo; p < hi; p++) {
        int64_t side = j->by_cols ? j->N : j->M, c0 = p * j->block, c1 = c0 + j->block < side ? c0 + j->block : side;
        if (c0 >= c1) continue;
        if (!j->by_cols) {
            job_rows(j, c0, c1, j->N, j->B, j->C);
            continue;
        }
        const char *b = (const char *)j->B + (size_t)(j->tb ? c0 * j->ldb : c0) * es;
        job_rows(j, 0, j->M, c1 - c0, b, j->C + c0);
    }
}

static void gemm_run(tf_pool *pool, gemm_job *j)
{
    int64_t M = j->M, N = j->N, K = j->K;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!j->accumulate)
            for (int64_t i = 0; i < M; i++) memset(j->C + i * j->ldc, 0, (size_t)N * sizeof *j->C);
        return;
    }
    j->by_cols = N > M;
    int64_t side = j->by_cols ? N : M;
    j->block = side;
    j->pieces = 1;
    if (M * N * K >= 32768 && !(M < 32 && N < 64)) {
        /* split the longer side: each piece keeps a good shape (BLAS kernels
         * lose efficiency on thin blocks) */
        int64_t np = gemm_pieces(), block = (side + np - 1) / np;
        if (block < GEMM_MIN_BLOCK) block = GEMM_MIN_BLOCK;
        if (j->by_cols) block = (block + 15) / 16 * 16;
        j->block = block;
        j->pieces = (side + block - 1) / block;
    }
    if ((double)M * (double)N * (double)K < TF_CPU_GEMM_POOL_MIN_MACS) gemm_piece(j, 0, j->pieces);
    else tf_pool_run(pool, j->pieces, gemm_piece, j);
}

void tf_cpu_gemm(tf_pool *pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    gemm_job j = {.ta = ta, .tb = tb, .accumulate = accumulate, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
                  .A = A, .B = B, .C = C};
    gemm_run(pool, &j);
}

void tf_cpu_gemm_tile(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                      int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof *C);
        return;
    }
    gemm_rows(ta, tb, 0, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

void tf_cpu_gemm_tile_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                           const uint16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof *C);
        return;
    }
    gemm_rows_bf16(ta, tb, 0, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

void tf_cpu_gemm_bf16(tf_pool *pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                      const uint16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
    gemm_job j = {.ta = ta, .tb = tb, .accumulate = accumulate, .bf16 = true, .M = M, .N = N, .K = K, .lda = lda,
                  .ldb = ldb, .ldc = ldc, .A = A, .B = B, .C = C};
    gemm_run(pool, &j);
}

/* ---- which bf16 GEMM: TFUSE_CPU_BF16_GEMM=sbgemm|avx512|off, else the best
 * that is here and passes the probe ---------------------------------------- */

static uint16_t probe_bf16(uint32_t *st)
{
    *st = *st * 1664525u + 1013904223u;
    uint32_t x = *st >> 9;   /* 23 bits */
    float f = ((float)(x & 0xffff) / 65536.0f - 0.5f) * 4.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);   /* truncation: any bf16 will do */
}

static double bf16d(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One routine on odd shapes, both transposes, with and without
 * accumulate, against a float64 sum: within f32 accumulation error. */
static bool probe_passes(tf_bf16_gemm_kind kind)
{
    (void)kind;
    enum { PM = 37, PN = 45, PK = 83 };
    static uint16_t A[PM * PK], B[PK * PN];
    static float C[PM * PN];
    uint32_t st = 12345;
    for (int i = 0; i < PM * PK; i++) A[i] = probe_bf16(&st);
    for (int i = 0; i < PK * PN; i++) B[i] = probe_bf16(&st);
    for (int v = 0; v < 8; v++) {
        bool ta = v & 1, tb = v & 2, acc = v & 4;
        for (int i = 0; i < PM * PN; i++) C[i] = acc ? (float)(i % 7) : 1e30f;
#ifdef TFUSE_HAVE_OPENBLAS
        if (kind == TF_BF16_GEMM_SBGEMM)
            sbgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, PM, PN, PK, 1.0f, A,
                   ta ? PM : PK, B, tb ? PK : PN, acc ? 1.0f : 0.0f, C, PN);
        else
#endif
            tf_cpu_bf16_gemm_kernel(ta, tb, PM, PN, PK, A, ta ? PM : PK, B, tb ? PK : PN, C, PN, acc);
        for (int i = 0; i < PM; i++)
            for (int j = 0; j < PN; j++) {
                double s = acc ? (double)((i * PN + j) % 7) : 0, mag = fabs(s);
                for (int k = 0; k < PK; k++) {
                    double p = bf16d(A[ta ? k * PM + i : i * PK + k]) * bf16d(B[tb ? j * PK + k : k * PN + j]);
                    s += p, mag += fabs(p);
                }
                if (!(fabs(C[i * PN + j] - s) <= mag * (PK + 2) * 0x1p-24)) return false;
            }
    }
    return true;
}

static tf_bf16_gemm_kind bf16_kind = TF_BF16_GEMM_NONE;

static void bf16_pick(void)
{
    const char *e = tf_env("TFUSE_CPU_BF16_GEMM");
    bool want_sb = !e || !*e || !strcmp(e, "sbgemm"), want_avx = !e || !*e || !strcmp(e, "avx512");
#ifdef TFUSE_HAVE_OPENBLAS
    tf_cpu_blas_init();
    if (want_sb && sbgemm && probe_passes(TF_BF16_GEMM_SBGEMM)) {
        bf16_kind = TF_BF16_GEMM_SBGEMM;
        return;
    }
#else
    (void)want_sb;
#endif
    if (want_avx && tf_cpu_has_avx512_bf16() && probe_passes(TF_BF16_GEMM_AVX512)) bf16_kind = TF_BF16_GEMM_AVX512;
}

tf_bf16_gemm_kind tf_cpu_bf16_gemm_kind(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, bf16_pick);
    return bf16_kind;
}

const char *tf_cpu_bf16_gemm_name(void)
{
    switch (tf_cpu_bf16_gemm_kind()) {
    case TF_BF16_GEMM_SBGEMM: return "OpenBLAS cblas_sbgemm";
    case TF_BF16_GEMM_AVX512: return "AVX512-BF16 kernel";
    default: return "none (bf16 widened to f32, sgemm)";
    }
}

/* ---- convolution ---------------------------------------------------------- */

int64_t tf_conv_scratch(const tf_conv_geom *g) { return g->Cg * g->KH * g->KW * g->Ho * g->Wo; }

/* Stride 1 along the width: output columns [lo, hi) read input columns
 * ow + off inside the row. */
static void unit_range(const tf_conv_geom *g, int64_t off, int64_t *lo, int64_t *hi)
{
    *lo = off < 0 ? -off : 0;
    *hi = g->W - off < g->Wo ? g->W - off : g->Wo;
    if (*lo > g->Wo) *lo = g->Wo;
    if (*hi < *lo) *hi = *lo;
}

/* col[(c*KH + kh)*KW + kw][oh*Wo + ow] = x[c0 + c][ih][iw] or 0 outside. */
static void im2col(const tf_conv_geom *g, const float *x, int64_t c0, float *col)
{
    int64_t HW = g->Ho * g->Wo;
    for (int64_t c = 0; c < g->Cg; c++) {
        const float *xc = x + (c0 + c) * g->H * g->W;
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) {
                float *row = col + ((c * g->KH + kh) * g->KW + kw) * HW;
                for (int64_t oh = 0; oh < g->Ho; oh++) {
                    int64_t ih = oh * g->s[0] - g->p[0] + kh * g->dl[0];
                    float *r = row + oh * g->Wo;
                    if (ih < 0 || ih >= g->H) {
                        memset(r, 0, (size_t)g->Wo * sizeof *r);
                        continue;
                    }
                    const float *xr = xc + ih * g->W;
                    if (g->s[1] == 1) {   /* a shifted copy: zeros where the window leaves the row */
                        int64_t off = kw * g->dl[1] - g->p[1], lo, hi;
                        unit_range(g, off, &lo, &hi);
                        if (lo > 0) memset(r, 0, (size_t)lo * sizeof *r);
                        if (hi > lo) memcpy(r + lo, xr + lo + off, (size_t)(hi - lo) * sizeof *r);
                        if (hi < g->Wo) memset(r + hi, 0, (size_t)(g->Wo - hi) * sizeof *r);
                        continue;
                    }
                    for (int64_t ow = 0; ow < g->Wo; ow++) {
                        int64_t iw = ow * g->s[1] - g->p[1] + kw * g->dl[1];
                        r[ow] = iw >= 0 && iw < g->W ? xr[iw] : 0.0f;
                    }
                }
            }
    }
}

/* dx[c0 + c][ih][iw] += col[...]: the adjoint of im2col. */
static void col2im(const tf_conv_geom *g, const float *col, int64_t c0, float *dx)
{
    int64_t HW = g->Ho * g->Wo;
    for (int64_t c = 0; c < g->Cg; c++) {
        float *xc = dx + (c0 + c) * g->H * g->W;
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) {
                const float *row = col + ((c * g->KH + kh) * g->KW + kw) * HW;
                for (int64_t oh = 0; oh < g->Ho; oh++) {
                    int64_t ih = oh * g->s[0] - g->p[0] + kh * g->dl[0];
                    if (ih < 0 || ih >= g->H) continue;
                    float *xr = xc + ih * g->W;
                    const float *r = row + oh * g->Wo;
                    if (g->s[1] == 1) {
                        int64_t off = kw * g->dl[1] - g->p[1], lo, hi;
                        unit_range(g, off, &lo, &hi);
                        for (int64_t ow = lo; ow < hi; ow++) xr[ow + off] += r[ow];
                        continue;
                    }
                    for (int64_t ow = 0; ow < g->Wo; ow++) {
                        int64_t iw = ow * g->s[1] - g->p[1] + kw * g->dl[1];
                        if (iw >= 0 && iw < g->W) xr[iw] += r[ow];
                    }
                }
            }
    }
}

/* The weight gradient's fixed groups of images (at most this many): more
 * would let more threads work on it, at one partial sum of the weights'
 * size each. */
enum { CONV_GW_GROUPS = 4 };

typedef struct conv_job {
    const tf_conv_geom *g;
    const float *x, *w, *bias, *dy;
    float *y, *dx, *dw, *scratch, *partials;
    int threads;
    int which;   /* 0 forward, 1 grad input, 2 grad weight */
} conv_job;

/* Images [i0, i1) with scratch col; for the weight gradient, accumulated
 * into dwp (zeroed first). Each image's GEMM is one BLAS call whatever the
 * thread count (a worker runs whole images), so it needs none of
 * tf_cpu_gemm's pieces. */
static void conv_images(const conv_job *j, int64_t i0, int64_t i1, float *col, float *dwp)
{
    const tf_conv_geom *g = j->g;
    int64_t HW = g->Ho * g->Wo, CKK = g->Cg * g->KH * g->KW;
    if (dwp) memset(dwp, 0, (size_t)(g->O * CKK) * sizeof *dwp);
    for (int64_t n = i0; n < i1; n++)
        for (int64_t gi = 0; gi < g->G; gi++) {
            int64_t c0 = gi * g->Cg, o0 = gi * g->Og;
            const float *wg = j->w ? j->w + o0 * CKK : NULL;
            if (j->which == 0) {
                float *yg = j->y + (n * g->O + o0) * HW;
                im2col(g, j->x + n * g->C * g->H * g->W, c0, col);
                gemm_rows(false, false, 0, g->Og, HW, CKK, wg, CKK, col, HW, yg, HW, false);
                if (j->bias)
                    for (int64_t o = 0; o < g->Og; o++)
                        for (int64_t i = 0; i < HW; i++) yg[o * HW + i] += j->bias[o0 + o];
            } else if (j->which == 1) {
                const float *dyg = j->dy + (n * g->O + o0) * HW;
                gemm_rows(true, false, 0, CKK, HW, g->Og, wg, CKK, dyg, HW, col, HW, false);
                col2im(g, col, c0, j->dx + n * g->C * g->H * g->W);
            } else {
                const float *dyg = j->dy + (n * g->O + o0) * HW;
                im2col(g, j->x + n * g->C * g->H * g->W, c0, col);
                gemm_rows(false, true, 0, g->Og, CKK, HW, dyg, HW, col, HW, dwp + o0 * CKK, CKK, true);
            }
        }
}

/* Worker t of `threads`, with scratch t. The forward and input gradient
 * compute each image on its own, so any split gives the same numbers: the
 * workers take contiguous images. The weight gradient adds over images, so
 * its grouping is fixed by the shape alone (tf_conv_grad_weight_groups):
 * group q sums images [N*q/Q, N*(q+1)/Q) in order into partial q, the
 * workers share out whole groups, and the partials are added in order. */
static void conv_piece(void *arg, int64_t lo, int64_t hi)
{
    const conv_job *j = arg;
    const tf_conv_geom *g = j->g;
    for (int64_t t = lo; t < hi; t++) {
        float *col = j->scratch + t * tf_conv_scratch(g);
        if (j->which != 2) {
            conv_images(j, g->N * t / j->threads, g->N * (t + 1) / j->threads, col, NULL);
            continue;
        }
        int64_t Q = tf_conv_grad_weight_groups(g), wsize = g->O * g->Cg * g->KH * g->KW;
        for (int64_t q = Q * t / j->threads; q < Q * (t + 1) / j->threads; q++)
            conv_images(j, g->N * q / Q, g->N * (q + 1) / Q, col, j->partials + q * wsize);
    }
}

int64_t tf_conv_grad_weight_groups(const tf_conv_geom *g) { return g->N < CONV_GW_GROUPS ? g->N : CONV_GW_GROUPS; }

static void conv_run(tf_pool *pool, conv_job *j)
{
    int64_t most = j->which == 2 ? tf_conv_grad_weight_groups(j->g) : j->g->N;
    j->threads = tf_pool_threads(pool);
    if (j->threads > most) j->threads = (int)most;
    if (j->threads < 1) j->threads = 1;
    if (j->threads == 1) conv_piece(j, 0, 1);
    else tf_pool_run(pool, j->threads, conv_piece, j);
}

void tf_cpu_conv2d(tf_pool *pool, const tf_conv_geom *g, const float *x, const float *w, const float *bias, float *y,
                   float *scratch)
{
    conv_job j = {.g = g, .x = x, .w = w, .bias = bias, .y = y, .scratch = scratch, .which = 0};
    conv_run(pool, &j);
}

void tf_cpu_conv2d_grad_input(tf_pool *pool, const tf_conv_geom *g, const float *dy, const float *w, float *dx,
                              float *scratch)
{
    memset(dx, 0, (size_t)(g->N * g->C * g->H * g->W) * sizeof *dx);
    conv_job j = {.g = g, .dy = dy, .w = w, .dx = dx, .scratch = scratch, .which = 1};
    conv_run(pool, &j);
}

void tf_cpu_conv2d_grad_weight(tf_pool *pool, const tf_conv_geom *g, const float *x, const float *dy, float *dw,
                               float *scratch, float *partials)
{
    conv_job j = {.g = g, .x = x, .dy = dy, .scratch = scratch, .partials = partials, .which = 2};
    conv_run(pool, &j);
    int64_t wsize = g->O * g->Cg * g->KH * g->KW, Q = tf_conv_grad_weight_groups(g);
    memcpy(dw, partials, (size_t)wsize * sizeof *dw);
    for (int64_t q = 1; q < Q; q++)
        for (int64_t i = 0; i < wsize; i++) dw[i] += partials[q * wsize + i];
}

/* ---- pooling ----------------------------------------------------------------
 * The interpreter's semantics exactly: windows clipped to the input (padding
 * reads nothing), max propagates NaN and keeps the first of equal values,
 * avg divides by the full window, and a max gradient goes to the element the
 * forward selected. Planes (N*C) split over the pool. */

typedef struct pool_job {
    const tf_pool_geom *g;
    const float *x, *dy;
    float *y, *dx;
    bool is_max, backward;
} pool_job;

static void pool_piece(void *arg, int64_t lo, int64_t hi)
{
    const pool_job *j = arg;
    const tf_pool_geom *g = j->g;
    int64_t HW = g->H * g->W, HoWo = g->Ho * g->Wo;
    float inv = (float)(1.0 / (double)(g->k[0] * g->k[1]));
    for (int64_t pl = lo; pl < hi; pl++) {
        const float *px = j->x ? j->x + pl * HW : NULL;
        if (j->backward) memset(j->dx + pl * HW, 0, (size_t)HW * sizeof *j->dx);
        for (int64_t oh = 0; oh < g->Ho; oh++)
            for (int64_t ow = 0; ow < g->Wo; ow++) {
                float acc = j->is_max ? -INFINITY : 0.0f, gy = j->backward ? j->dy[pl * HoWo + oh * g->Wo + ow] : 0;
                int64_t at = -1;
                for (int64_t kh = 0; kh < g->k[0]; kh++) {
                    int64_t ih = oh * g->s[0] - g->p[0] + kh;
                    if (ih < 0 || ih >= g->H) continue;
                    for (int64_t kw = 0; kw < g->k[1]; kw++) {
                        int64_t iw = ow * g->s[1] - g->p[1] + kw, i = ih * g->W + iw;
                        if (iw < 0 || iw >= g->W) continue;
                        if (!j->is_max) {
                            if (j->backward) j->dx[pl * HW + i] += gy * inv;
                            else acc += px[i];
                            continue;
                        }
                        float v = px[i];
                        if (j->backward ? (at < 0 || (acc == acc && (v != v || v > acc))) : (acc == acc && (v != v || v > acc))) {
                            acc = v;
                            at = i;
                        }
                    }
                }
                if (j->backward) {
                    if (j->is_max && at >= 0) j->dx[pl * HW + at] += gy;
                } else {
                    j->y[pl * HoWo + oh * g->Wo + ow] = j->is_max ? acc : acc * inv;
                }
            }
    }
}

void tf_cpu_pool2d(tf_pool *pool, const tf_pool_geom *g, bool is_max, const float *x, float *y)
{
    pool_job j = {.g = g, .x = x, .y = y, .is_max = is_max};
    tf_pool_run(pool, g->planes, pool_piece, &j);
}

void tf_cpu_pool2d_grad(tf_pool *pool, const tf_pool_geom *g, bool is_max, const float *x, const float *dy, float *dx)
{
    pool_job j = {.g = g, .x = x, .dy = dy, .dx = dx, .is_max = is_max, .backward = true};
    tf_pool_run(pool, g->planes, pool_piece, &j);
}
