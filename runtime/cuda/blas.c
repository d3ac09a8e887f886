/* blas.c — row-major GEMM plans over cuBLASLt (see blas.h). */
#include <stdio.h>
#include <string.h>

#include "blas.h"

/* The values of the cuBLASLt and CUDA enumerations used here, as CUDA 13's
 * cublasLt.h, cublas_api.h and library_types.h define them (unchanged since
 * CUDA 11). */
enum {
    CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14,                     /* cudaDataType_t */
    CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77,           /* cublasComputeType_t */
    CUBLAS_OP_N = 0, CUBLAS_OP_T = 1,                                     /* cublasOperation_t */
    CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4,     /* int32_t each */
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7, CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8, /* uint32_t, void * */
    CUBLASLT_EPILOGUE_BIAS = 4, CUBLASLT_EPILOGUE_RELU_BIAS = 6,          /* cublasLtEpilogue_t */
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,                               /* int32_t */
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,                      /* int64_t */
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,                         /* uint64_t */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,                       /* uint32_t each, A..D */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

_Static_assert(sizeof(tf_cublaslt_algo) == 64, "cublasLtMatmulAlgo_t is 8 uint64_t");
_Static_assert(sizeof(tf_cublaslt_heuristic) == 96, "cublasLtMatmulHeuristicResult_t is 96 bytes");

static int cuda_type(tf_gemm_type t) { return t == TF_GEMM_F32 ? CUDA_R_32F : t == TF_GEMM_F16 ? CUDA_R_16F : CUDA_R_16BF; }

static tf_cuda_status lt_check(const tf_cuda_libs *l, tf_cublas_status r, const char *call, char *err, size_t n)
{
    if (!r) return TF_CUDA_OK;
    const char *name = l->lt.GetStatusName ? l->lt.GetStatusName(r) : NULL, *str = l->lt.GetStatusString ? l->lt.GetStatusString(r) : NULL;
    snprintf(err, n, "cublasLt%s failed: %s (%s)", call, name ? name : "cuBLAS error", str ? str : "no description");
    return r == 15 ? TF_CUDA_ERR_ARG : TF_CUDA_ERR_DRIVER;   /* 15: CUBLAS_STATUS_NOT_SUPPORTED */
}
#define LT_CALL(call, args) lt_check(l, l->lt.call args, #call, err, n)

unsigned tf_gemm_alignment(uint64_t address)
{
    unsigned a = 1;
    while (a < 256 && !(address & a)) a <<= 1;
    return a;
}

void tf_gemm_free(const tf_cuda_libs *l, tf_gemm *g)
{
    if (!g) return;
    if (g->la) l->lt.MatrixLayoutDestroy(g->la);
    if (g->lb) l->lt.MatrixLayoutDestroy(g->lb);
    if (g->lc) l->lt.MatrixLayoutDestroy(g->lc);
    if (g->op) l->lt.MatmulDescDestroy(g->op);
    memset(g, 0, sizeof *g);
}

/* A column-major layout of rows x cols with leading dimension ld, batched. */
static tf_cuda_status layout(const tf_cuda_libs *l, tf_cublaslt_layout *out, tf_gemm_type t, int64_t rows, int64_t cols,
                             int64_t ld, int32_t batch, int64_t stride, char *err, size_t n)
{
    tf_cuda_status st = LT_CALL(MatrixLayoutCreate, (out, cuda_type(t), (unsigned long long)rows, (unsigned long long)cols, ld));
    if (!st && batch > 1) {
        st = LT_CALL(MatrixLayoutSetAttribute, (*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
        if (!st) st = LT_CALL(MatrixLayoutSetAttribute, (*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
    return st;
}

tf_cuda_status tf_gemm_plan(const tf_cuda_libs *l, tf_cublaslt_handle h, const tf_gemm_desc *d, tf_gemm *g, char *err, size_t n)
{
    memset(g, 0, sizeof *g);
    if (!(l->loaded & TF_CUDA_LIB_CUBLASLT)) {
        snprintf(err, n, "cuBLASLt is not loaded: %s", l->cublaslt_error[0] ? l->cublaslt_error : "it was not asked for");
        return TF_CUDA_ERR_NOT_FOUND;
    }
    if (d->M < 1 || d->N < 1 || d->K < 1 || d->batch < 1 || d->batch > INT32_MAX) {
        snprintf(err, n, "a %lld x %lld x %lld GEMM in a batch of %lld is outside what cuBLASLt takes", (long long)d->M,
                 (long long)d->N, (long long)d->K, (long long)d->batch);
        return TF_CUDA_ERR_ARG;
    }
    if (d->c != d->ab && d->c != TF_GEMM_F32) {
        snprintf(err, n, "a GEMM of 16-bit operands writes the same type or f32");
        return TF_CUDA_ERR_ARG;
    }
    int compute = d->ab == TF_GEMM_F32 && d->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    int32_t op_first = d->tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = d->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int32_t batch = (int32_t)d->batch;
    tf_cuda_status st = LT_CALL(MatmulDescCreate, (&g->op, compute, CUDA_R_32F));
    if (!st) st = LT_CALL(MatmulDescSetAttribute, (g->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
    if (!st) st = LT_CALL(MatmulDescSetAttribute, (g->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
    if (!st && d->epilogue != TF_GEMM_EPI_NONE) {
        /* the bias runs along our C's columns, which are cuBLASLt's rows: what its bias epilogues add to */
        uint32_t epi = d->epilogue == TF_GEMM_EPI_RELU_BIAS ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
        const void *bias = (const void *)(uintptr_t)d->bias;
        if (d->batch != 1 || !bias) {
            snprintf(err, n, "a bias epilogue takes one GEMM and a bias");
            st = TF_CUDA_ERR_ARG;
        }
        if (!st) st = LT_CALL(MatmulDescSetAttribute, (g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        if (!st) st = LT_CALL(MatmulDescSetAttribute, (g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    /* cuBLASLt's first operand is our B read column-major: B [K, N] is N x K
     * (ld N), used as is; B stored [N, K] is K x N (ld K), transposed. */
    if (!st)
        st = d->tb ? layout(l, &g->la, d->ab, d->K, d->N, d->K, batch, d->stride_b, err, n)
                   : layout(l, &g->la, d->ab, d->N, d->K, d->N, batch, d->stride_b, err, n);
    /* the second is our A: [M, K] is K x M (ld K); stored [K, M] it is M x K (ld M), transposed */
    if (!st)
        st = d->ta ? layout(l, &g->lb, d->ab, d->M, d->K, d->M, batch, d->stride_a, err, n)
                   : layout(l, &g->lb, d->ab, d->K, d->M, d->K, batch, d->stride_a, err, n);
    /* the result C [M, N] is N x M (ld N) */
    if (!st) st = layout(l, &g->lc, d->c, d->N, d->M, d->N, batch, d->stride_c, err, n);
    tf_cublaslt_pref pref = NULL;
    if (!st) st = LT_CALL(MatmulPreferenceCreate, (&pref));
    uint64_t ws = d->max_workspace;
    uint32_t al_first = d->align_b, al_second = d->align_a, al_c = d->align_c;
    if (!st) st = LT_CALL(MatmulPreferenceSetAttribute, (pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    if (!st) st = LT_CALL(MatmulPreferenceSetAttribute, (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_first, sizeof al_first));
    if (!st) st = LT_CALL(MatmulPreferenceSetAttribute, (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_second, sizeof al_second));
    if (!st) st = LT_CALL(MatmulPreferenceSetAttribute, (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    if (!st) st = LT_CALL(MatmulPreferenceSetAttribute, (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    tf_cublaslt_heuristic res[4];
    int got = 0;
    memset(res, 0, sizeof res);
    if (!st) st = LT_CALL(MatmulAlgoGetHeuristic, (h, g->op, g->la, g->lb, g->lc, g->lc, pref, 4, res, &got));
    if (pref) l->lt.MatmulPreferenceDestroy(pref);
    int pick = -1;
    for (int i = 0; !st && i < got && pick < 0; i++)
        if (res[i].state == 0 && res[i].workspace_size <= d->max_workspace) pick = i;
    if (!st && pick < 0) {
        snprintf(err, n, "cuBLASLt has no algorithm for a %s%s x %s%s -> %s GEMM of %lld x %lld x %lld (batch %lld, alignments %u/%u/%u bytes)",
                 d->ab == TF_GEMM_F32 ? "f32" : d->ab == TF_GEMM_F16 ? "f16" : "bf16", d->ta ? "^T" : "",
                 d->ab == TF_GEMM_F32 ? "f32" : d->ab == TF_GEMM_F16 ? "f16" : "bf16", d->tb ? "^T" : "",
                 d->c == TF_GEMM_F32 ? "f32" : d->c == TF_GEMM_F16 ? "f16" : "bf16", (long long)d->M, (long long)d->N,
                 (long long)d->K, (long long)d->batch, d->align_a, d->align_b, d->align_c);
        st = TF_CUDA_ERR_ARG;
    }
    if (st) {
        tf_gemm_free(l, g);
        return st;
    }
    g->algo = res[pick].algo;
    g->workspace = res[pick].workspace_size;
    return TF_CUDA_OK;
}

tf_cuda_status tf_gemm_run(const tf_cuda_libs *l, tf_cublaslt_handle h, const tf_gemm *g, tf_cu_deviceptr a, tf_cu_deviceptr b,
                           tf_cu_deviceptr c, tf_cu_deviceptr ws, size_t ws_bytes, tf_cu_stream s, char *err, size_t n)
{
    const float one = 1.0f, zero = 0.0f;
    if (ws_bytes < g->workspace) {
        snprintf(err, n, "cuBLASLt's algorithm needs %zu bytes of workspace, %zu were given", g->workspace, ws_bytes);
        return TF_CUDA_ERR_ARG;
    }
    return LT_CALL(Matmul, (h, g->op, &one, (const void *)(uintptr_t)b, g->la, (const void *)(uintptr_t)a, g->lb, &zero,
                            (const void *)(uintptr_t)c, g->lc, (void *)(uintptr_t)c, g->lc, &g->algo,
                            g->workspace ? (void *)(uintptr_t)ws : NULL, g->workspace, s));
}
