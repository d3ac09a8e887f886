/* blas.h — row-major GEMMs on the GPU through cuBLASLt (loaded by
 * loader.c with dlopen), for the cuda target's matmul kernels.
 *
 * tfuse's tensors are row-major; cuBLASLt's matrices are column-major. A
 * row-major C[M, N] = op(A) op(B) is the column-major C^T[N, M] =
 * op(B)^T op(A)^T, so a plan hands cuBLASLt B as its first operand and A as
 * its second, each with the layout its row-major storage has when read
 * column-major; nothing is copied or transposed in memory.
 *
 * A plan is made once per matmul when a session starts (descriptors and
 * the algorithm) and run every step; TF_CUDA_ERR_ARG from tf_gemm_plan
 * means cuBLASLt has no algorithm for the case, and err says why.
 *
 * The algorithm: cuBLASLt's heuristic is asked for up to TF_GEMM_CANDIDATES
 * algorithms for the sizes, types, transposes, alignments, epilogue and
 * workspace limit, and when the problem has not been seen before each
 * usable one is timed on the device (desc->warmup untimed runs, then
 * desc->runs between two events on desc->stream, on the buffers the desc
 * names: outside any graph capture, and C is overwritten); the fastest
 * wins. The choice is cached on disk beside the cubins and the cuDNN
 * algorithms, in $TFUSE_CACHE_DIR/cuda (default ~/.cache/tfuse/cuda): one
 * small text file per key, <hash>.cublaslt, where the key is everything the
 * choice depends on (A/B and C types, transposes, M, N, K, batch and
 * strides, alignments, epilogue, compute type (TF32 or not), workspace
 * limit, how many candidates were asked for, cuBLASLt's version and the
 * GPU's name). Each file holds its whole key and a checksum, and is
 * written to a temporary name and renamed.
 *
 * What is stored of the algorithm, and why: cublasLtMatmulAlgo_t is 8
 * uint64 words that cublasLt.h says "can be trivially serialized and later
 * restored for use with the same version of cuBLAS library" (hence the
 * version, and the GPU, in the key). The file records the chosen
 * algorithm's index among the heuristic's results and its 8 words; a read
 * is trusted only when the heuristic, asked again (it is cheap), returns
 * those very words at that index as a usable result and
 * cublasLtMatmulAlgoCheck accepts them within the workspace limit. A file
 * that fails any of this (corrupt, truncated, another key, an algorithm
 * cuBLASLt no longer lists or takes) is ignored, the candidates are timed
 * again and the file rewritten. Nothing to time on (desc->dev_a == 0, or no
 * driver) and nothing cached: the heuristic's first usable algorithm,
 * untimed and not written. A cache directory that cannot be made only
 * means every session times.
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

/* What cuBLASLt does beside the product (vectors are C's type: cuBLASLt's
 * "Bias Type" is C's for every type here; batch 1 for all but NONE):
 *
 *   BIAS            C = A B + bias, a vector of N added along C's rows;
 *   RELU_BIAS       C = relu(A B + bias);
 *   RELU_AUX_BIAS   that, and the ReLU bit mask of A B + bias into aux (below);
 *   DRELU           C = A B where the mask in aux is set, 0 elsewhere (the
 *                   mask a RELU_AUX_BIAS plan of the same M x N wrote);
 *   DRELU_BGRAD     that, and bias = the column sums of that C (N values:
 *                   C summed over its M rows);
 *   BGRAD_B         C = A B, and bias = B summed over K (N values): the bias
 *                   gradient of a weight gradient dW = X^T dY whose dY is B;
 *                   cuBLASLt's BGRADA, since B is cuBLASLt's first operand;
 *   BGRAD_A         C = A B, and bias = op(A) summed over K (M values);
 *                   cuBLASLt's BGRADB.
 *
 * The ReLU mask (cuBLASLt's aux for RELU_AUX_BIAS and DRELU*): one bit per
 * element of cuBLASLt's column-major D, that is per element of our row-major
 * C[M, N] at (i, j): bit j + i * aux_ld, where aux_ld (bits) is N rounded up
 * to a multiple of 128 (cublasLt.h: "ReLu bit-mask matrix leading dimension
 * in elements (i.e. bits) ... Must be divisible by 128 and be no less than
 * the number of rows in the output matrix"); bit b is bit b % 8 of byte
 * b / 8 (little-endian words, lowest bit first: how code that writes masks
 * for cuBLASLt's DRELU reads them). tf_gemm_relu_mask_ld and _bytes give the
 * sizes. Which value the mask holds at exactly 0 is not documented:
 * tf_gemm_relu_mask_probe finds out on the device. */
typedef enum tf_gemm_epilogue {
    TF_GEMM_EPI_NONE, TF_GEMM_EPI_BIAS, TF_GEMM_EPI_RELU_BIAS,
    TF_GEMM_EPI_RELU_AUX_BIAS, TF_GEMM_EPI_DRELU, TF_GEMM_EPI_DRELU_BGRAD, TF_GEMM_EPI_BGRAD_B, TF_GEMM_EPI_BGRAD_A,
} tf_gemm_epilogue;

/* The epilogue's name, cuBLASLt's (BGRAD_B: "BGRADA", BGRAD_A: "BGRADB"). */
const char *tf_gemm_epilogue_name(tf_gemm_epilogue e);
/* The ReLU mask of an M x N result: its leading dimension in bits, its bytes. */
int64_t tf_gemm_relu_mask_ld(int64_t N);
size_t tf_gemm_relu_mask_bytes(int64_t M, int64_t N);

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
    tf_gemm_epilogue epilogue;     /* but NONE: batch 1 */
    uint64_t bias;                 /* the bias's (or bias gradient's) device address, epilogues with one */
    uint64_t aux;                  /* the ReLU mask's device address (RELU_AUX_BIAS, DRELU, DRELU_BGRAD) */
    /* choosing the algorithm (see above) */
    const char *gpu;               /* the GPU's name (part of the cache key); NULL: "" */
    const char *cache_dir;         /* NULL: $TFUSE_CACHE_DIR/cuda, else ~/.cache/tfuse/cuda; "": no disk cache */
    tf_cu_stream stream;           /* where candidates are timed (needs the driver in the libs) */
    tf_cu_deviceptr dev_a, dev_b, dev_c;   /* device buffers the timing runs on, as tf_gemm_run takes them (dev_c is
                                            * overwritten); dev_a == 0: nothing is timed */
    tf_cu_deviceptr dev_ws;        /* max_workspace bytes for the timing runs (0: candidates needing workspace are not timed) */
    int warmup, runs;              /* per candidate: untimed runs, then timed runs (<= 0: 2 and 5) */
} tf_gemm_desc;

enum { TF_GEMM_CANDIDATES = 8 };   /* algorithms asked of cuBLASLt's heuristic */

typedef struct tf_gemm {
    tf_cublaslt_matmul_desc op;
    tf_cublaslt_layout la, lb, lc;  /* cuBLASLt's first operand (our B), second (our A), C = D */
    tf_cublaslt_algo algo;
    size_t workspace;               /* what the algorithm needs, <= max_workspace */
    /* how it was chosen (--cuda-explain) */
    int choice;                     /* its index among the heuristic's results */
    int candidates;                 /* the heuristic's usable results */
    int timed;                      /* candidates this plan timed (0: from the cache, or nothing to time on) */
    float ms;                       /* its time per run (the cache's record when from_cache; 0: untimed) */
    bool from_cache;                /* the algorithm came from the disk cache: nothing was timed */
    char cache_file[4200];          /* the file that holds the choice; "" without a cache */
} tf_gemm;

/* Plan a problem; *g is usable (and must be freed) only on TF_CUDA_OK.
 * When it times candidates it synchronizes desc->stream. */
tf_cuda_status tf_gemm_plan(const tf_cuda_libs *l, tf_cublaslt_handle h, const tf_gemm_desc *desc, tf_gemm *g, char *err,
                            size_t n);
/* Enqueue it on stream s (device pointers; ws: workspace of at least g->workspace bytes). */
tf_cuda_status tf_gemm_run(const tf_cuda_libs *l, tf_cublaslt_handle h, const tf_gemm *g, tf_cu_deviceptr a, tf_cu_deviceptr b,
                           tf_cu_deviceptr c, tf_cu_deviceptr ws, size_t ws_bytes, tf_cu_stream s, char *err, size_t n);
void tf_gemm_free(const tf_cuda_libs *l, tf_gemm *g);

/* How g's algorithm was chosen, for --cuda-explain: which of the
 * heuristic's candidates, its time, timed now or from the cache (and the
 * file). */
void tf_gemm_explain(const tf_gemm *g, char *out, size_t n);

/* Whether cuBLASLt's ReLU mask is what the ReLU gradient rule computes,
 * x > 0 (0 at exactly 0), in the layout above: one RELU_AUX_BIAS GEMM of f32
 * with products -1, 0 and 1 in known places (M = 3, N = 130, so that the
 * mask has two 128-bit columns per row), the mask read back, then one DRELU
 * GEMM on it. TF_CUDA_OK and *same says whether both hold (why says what
 * differs); an error when it could not run (no device memory, a failed call). */
tf_cuda_status tf_gemm_relu_mask_probe(const tf_cuda_libs *l, tf_cublaslt_handle h, tf_cu_stream s, tf_cu_deviceptr ws,
                                       size_t ws_bytes, bool *same, char *why, size_t n);

/* The largest power of two (<= 256) dividing a byte address or offset. */
unsigned tf_gemm_alignment(uint64_t address);

#endif
