/* blas.h — row-major GEMMs on the GPU through cuBLASLt (loaded by
 * loader.c with dlopen), for the cuda target's matmul kernels.
 *
 * tfuse's tensors are row-major; cuBLASLt's matrices are column-major. A
 * row-major C[M, N] = op(A) op(B) is the column-major C^T[N, M] =
 * op(B)^T op(A)^T, so a plan hands cuBLASLt B as its first operand and A as
 * its second, each with the layout its row-major storage has when read
 * column-major; nothing is copied or transposed in memory.
 *
 * A plan is made once per matmul when a session starts (descriptors, and the
 * algorithm cuBLASLt's heuristic picks for those sizes, alignments and
 * workspace) and run every step; TF_CUDA_ERR_ARG from tf_gemm_plan means
 * cuBLASLt has no algorithm for the case, and err says why.
 *
 * Numbers: f32 operands use TF32 tensor cores when gemm->tf32 (10-bit
 * mantissa inputs, fp32 accumulation), else full fp32; f16/bf16 operands
 * accumulate in fp32; alpha = 1, beta = 0 in fp32. */
#ifndef TF_RUNTIME_CUDA_BLAS_H
#define TF_RUNTIME_CUDA_BLAS_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_libs.h"

typedef enum tf_gemm_type { TF_GEMM_F32, TF_GEMM_F16, TF_GEMM_BF16 } tf_gemm_type;

/* What cuBLASLt applies to the product before it writes C: nothing, a bias
 * added along C's rows (a vector of N, C's type), or that and ReLU. */
typedef enum tf_gemm_epilogue { TF_GEMM_EPI_NONE, TF_GEMM_EPI_BIAS, TF_GEMM_EPI_RELU_BIAS } tf_gemm_epilogue;

/* One row-major problem: C[b] (M x N) = op(A[b]) (M x K) * op(B[b]) (K x N)
 * for b < batch, operands stride_* elements apart (0: the same matrix for
 * every b). lda/ldb/ldc are the row-major leading dimensions. */
typedef struct tf_gemm_desc {
    tf_gemm_type ab, c;            /* A and B share a type; C is that type or f32 */
    bool ta, tb;                   /* A is stored [K, M] / B is stored [N, K] */
    int64_t M, N, K;
    int64_t batch;
    int64_t stride_a, stride_b, stride_c;
    unsigned align_a, align_b, align_c;   /* bytes every pointer passed to tf_gemm_run is aligned to */
    bool tf32;
    size_t max_workspace;          /* bytes of workspace tf_gemm_run will be given */
    tf_gemm_epilogue epilogue;     /* with a bias: batch 1 */
    uint64_t bias;                 /* the bias's device address (epilogues with a bias) */
} tf_gemm_desc;

typedef struct tf_gemm {
    tf_cublaslt_matmul_desc op;
    tf_cublaslt_layout la, lb, lc;  /* cuBLASLt's first operand (our B), second (our A), C = D */
    tf_cublaslt_algo algo;
    size_t workspace;               /* what the algorithm needs, <= max_workspace */
} tf_gemm;

/* Plan a problem; *g is usable (and must be freed) only on TF_CUDA_OK. */
tf_cuda_status tf_gemm_plan(const tf_cuda_libs *l, tf_cublaslt_handle h, const tf_gemm_desc *desc, tf_gemm *g, char *err,
                            size_t n);
/* Enqueue it on stream s (device pointers; ws: workspace of at least g->workspace bytes). */
tf_cuda_status tf_gemm_run(const tf_cuda_libs *l, tf_cublaslt_handle h, const tf_gemm *g, tf_cu_deviceptr a, tf_cu_deviceptr b,
                           tf_cu_deviceptr c, tf_cu_deviceptr ws, size_t ws_bytes, tf_cu_stream s, char *err, size_t n);
void tf_gemm_free(const tf_cuda_libs *l, tf_gemm *g);

/* The largest power of two (<= 256) dividing a byte address or offset. */
unsigned tf_gemm_alignment(uint64_t address);

#endif
