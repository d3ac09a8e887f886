/* cpu_ops.h — the cpu target's library kernels on float32 arrays: GEMM
 * through OpenBLAS (or a plain loop nest when the build has no BLAS), and
 * conv2d forward and backward as im2col + GEMM.
 *
 * Parallelism is ours, not BLAS's: OpenBLAS runs single-threaded and the
 * pool splits a GEMM by rows of C and a convolution by images, so one pool
 * owns the cores and BLAS threads never oversubscribe them.
 *
 * Results never depend on the number of threads: every split that could
 * change how a sum is added up (a GEMM's blocks, the weight gradient's
 * groups of images) is fixed by the shape (and, for a GEMM's blocks, the
 * machine's CPU count, read once), and threads only share out the fixed
 * pieces. The same inputs give the same bits on 1 or 64 threads.
 *
 * Where the build has oneDNN, the backend runs convolutions through it
 * instead (conv_dnnl.h) under the same rule: each oneDNN primitive runs on
 * one thread over a piece of the batch fixed by the shape, so its bits do
 * not depend on the thread count either (test_threads checks it). They do
 * differ from the im2col path's (another summation order, within the
 * tolerances of the interpreter comparison); --cpu-conv=im2col
 * (TFUSE_CPU_CONV=im2col) forces this file's path. */
#ifndef TF_RUNTIME_CPU_OPS_H
#define TF_RUNTIME_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "pool.h"

/* Set BLAS to one thread; call once before any GEMM. */
void tf_cpu_blas_init(void);
/* Whether this build has OpenBLAS but could not load it (GEMMs run through
 * the built-in loops): the cpu backend warns each session's context. */
bool tf_cpu_blas_warning(void);
/* "OpenBLAS" or "built-in loops", for `tfuse doctor`-style reports. */
const char *tf_cpu_blas_name(void);

/* The most pieces a GEMM is cut into: twice the machine's CPUs, 4 to 16
 * (fixed by the machine, never by a session's thread count). */
/* Below this many multiply-adds a GEMM's pieces run one after the other on
 * the calling thread: waking the pool costs more than the second thread
 * saves (bench/RESULTS.md, 2026-11-28, small GEMMs: 128x128x128 took 1.42x
 * as long on 2 threads as on 1, 128x512x128 0.79x). The pieces, and so the
 * bits, are the same either way. */
enum { TF_CPU_GEMM_POOL_MIN_MACS = 4 << 20 };
int64_t tf_cpu_gemm_pieces(void);

/* C[M,N] = op(A) op(B) (+ C when accumulate), row-major; op(A) is A[M,K]
 * (lda >= K) or, when ta, A[K,M] read transposed (lda >= M); likewise B.
 * Split by rows of C, or by columns when C is wider than tall, into pieces
 * fixed by M, N and K, which the pool's threads share out. */
void tf_cpu_gemm(tf_pool *pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate);

/* The same in one piece on the calling thread: for a kernel that tiles and
 * splits its own work (attention), each tile one BLAS call. */
void tf_cpu_gemm_tile(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                      int64_t ldb, float *C, int64_t ldc, bool accumulate);

/* The same with bf16 operands (their storage bits) and an f32 C, where
 * tf_cpu_bf16_gemm_kind() is not NONE: products of bf16 values are exact in
 * f32, so it sums the numbers an sgemm on the widened operands sums; split
 * into the same pieces, fixed by the shape. */
typedef enum tf_bf16_gemm_kind {
    TF_BF16_GEMM_NONE,     /* callers widen to f32 and call tf_cpu_gemm */
    TF_BF16_GEMM_AVX512,   /* lowp.c's vdpbf16ps kernel (the CPU has AVX512-BF16) */
    TF_BF16_GEMM_SBGEMM    /* OpenBLAS's cblas_sbgemm, where the library exports it */
} tf_bf16_gemm_kind;
/* Picked once per process: $TFUSE_CPU_BF16_GEMM=sbgemm|avx512|off, else
 * sbgemm where exported, else the AVX512-BF16 kernel where the CPU has it;
 * a routine is used only after it computes a probe GEMM (odd sizes, every
 * transpose, accumulate) within f32 rounding of a float64 sum. */
tf_bf16_gemm_kind tf_cpu_bf16_gemm_kind(void);
const char *tf_cpu_bf16_gemm_name(void);
/* One tile on the calling thread, as tf_cpu_gemm_tile (bf16 operands). */
void tf_cpu_gemm_tile_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                           const uint16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate);
void tf_cpu_gemm_bf16(tf_pool *pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                      const uint16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate);

typedef struct tf_conv_geom {
    int64_t N, C, H, W, O, Cg, KH, KW, Ho, Wo, Og, G;
    int64_t s[2], p[2], dl[2];
} tf_conv_geom;

/* Floats of scratch one thread needs for any of the three below. */
int64_t tf_conv_scratch(const tf_conv_geom *g);

/* y[N,O,Ho,Wo] = conv(x[N,C,H,W], w[O,Cg,KH,KW]) + bias[O] (bias may be NULL).
 * scratch: pool threads * tf_conv_scratch floats. */
void tf_cpu_conv2d(tf_pool *pool, const tf_conv_geom *g, const float *x, const float *w, const float *bias, float *y,
                   float *scratch);
/* dx[N,C,H,W] from dy and w. */
void tf_cpu_conv2d_grad_input(tf_pool *pool, const tf_conv_geom *g, const float *dy, const float *w, float *dx,
                              float *scratch);
/* dw[O,Cg,KH,KW] from x and dy; partials: tf_conv_grad_weight_groups(g) *
 * O*Cg*KH*KW floats (a partial sum per fixed group of images). */
int64_t tf_conv_grad_weight_groups(const tf_conv_geom *g);
void tf_cpu_conv2d_grad_weight(tf_pool *pool, const tf_conv_geom *g, const float *x, const float *dy, float *dw,
                               float *scratch, float *partials);

typedef struct tf_pool_geom {
    int64_t planes, H, W, Ho, Wo;
    int64_t k[2], s[2], p[2];
} tf_pool_geom;

/* maxpool2d/avgpool2d of x[planes, H, W] into y[planes, Ho, Wo]; the
 * interpreter's rules (windows clipped, NaN propagates, first max wins,
 * average over the whole window). */
void tf_cpu_pool2d(tf_pool *pool, const tf_pool_geom *g, bool is_max, const float *x, float *y);
/* Their gradients into dx[planes, H, W] (x: the forward input, maxpool only). */
void tf_cpu_pool2d_grad(tf_pool *pool, const tf_pool_geom *g, bool is_max, const float *x, const float *dy, float *dx);

#endif
