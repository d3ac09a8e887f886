/* blas.c — row-major GEMM plans over cuBLASLt, with the algorithm timed
 * once per problem and cached on disk (see blas.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blas.h"
#include "cache_file.h"

/* The values of the cuBLASLt and CUDA enumerations used here, as CUDA 13's
 * cublasLt.h, cublas_api.h and library_types.h define them (unchanged since
 * CUDA 11). */
enum {
    CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14,                     /* cudaDataType_t */
    CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77,           /* cublasComputeType_t */
    CUBLAS_OP_N = 0, CUBLAS_OP_T = 1,                                     /* cublasOperation_t */
    CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4,     /* int32_t each */
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7, CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8, /* uint32_t, void * */
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,                       /* void * */
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,                            /* int64_t */
    CUBLASLT_EPILOGUE_BIAS = 4, CUBLASLT_EPILOGUE_RELU_BIAS = 6,          /* cublasLtEpilogue_t */
    CUBLASLT_EPILOGUE_RELU_AUX_BIAS = 134, CUBLASLT_EPILOGUE_DRELU = 136, CUBLASLT_EPILOGUE_DRELU_BGRAD = 152,
    CUBLASLT_EPILOGUE_BGRADA = 256, CUBLASLT_EPILOGUE_BGRADB = 512,
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

static const char *type_name(tf_gemm_type t) { return t == TF_GEMM_F32 ? "f32" : t == TF_GEMM_F16 ? "f16" : "bf16"; }
const char *tf_gemm_epilogue_name(tf_gemm_epilogue e)
{
    switch (e) {
    case TF_GEMM_EPI_BIAS: return "BIAS";
    case TF_GEMM_EPI_RELU_BIAS: return "RELU_BIAS";
    case TF_GEMM_EPI_RELU_AUX_BIAS: return "RELU_AUX_BIAS";
    case TF_GEMM_EPI_DRELU: return "DRELU";
    case TF_GEMM_EPI_DRELU_BGRAD: return "DRELU_BGRAD";
    case TF_GEMM_EPI_BGRAD_B: return "BGRADA";
    case TF_GEMM_EPI_BGRAD_A: return "BGRADB";
    case TF_GEMM_EPI_NONE: break;
    }
    return "none";
}
static const char *epi_name(tf_gemm_epilogue e) { return tf_gemm_epilogue_name(e); }

int64_t tf_gemm_relu_mask_ld(int64_t N) { return (N + 127) / 128 * 128; }
size_t tf_gemm_relu_mask_bytes(int64_t M, int64_t N) { return (size_t)(tf_gemm_relu_mask_ld(N) / 8) * (size_t)M; }

static bool has_bias(tf_gemm_epilogue e) { return e != TF_GEMM_EPI_NONE && e != TF_GEMM_EPI_DRELU; }
static bool has_aux(tf_gemm_epilogue e)
{
    return e == TF_GEMM_EPI_RELU_AUX_BIAS || e == TF_GEMM_EPI_DRELU || e == TF_GEMM_EPI_DRELU_BGRAD;
}
static uint32_t lt_epilogue(tf_gemm_epilogue e)
{
    switch (e) {
    case TF_GEMM_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case TF_GEMM_EPI_RELU_BIAS: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case TF_GEMM_EPI_RELU_AUX_BIAS: return CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    case TF_GEMM_EPI_DRELU: return CUBLASLT_EPILOGUE_DRELU;
    case TF_GEMM_EPI_DRELU_BGRAD: return CUBLASLT_EPILOGUE_DRELU_BGRAD;
    case TF_GEMM_EPI_BGRAD_B: return CUBLASLT_EPILOGUE_BGRADA;   /* our B is cuBLASLt's A */
    case TF_GEMM_EPI_BGRAD_A: return CUBLASLT_EPILOGUE_BGRADB;
    case TF_GEMM_EPI_NONE: break;
    }
    return 1;   /* CUBLASLT_EPILOGUE_DEFAULT */
}

/* ---- the disk cache (as dnn.c's) ---- */

static const char HEADER[] = "tfuse cublaslt algorithm 1\n";

/* The cache key: everything the choice depends on, on one line. */
static void cache_key(const tf_cuda_libs *l, const tf_gemm_desc *d, int compute, char *key, size_t n)
{
    char gpu[256];
    tf_cache_key_field(d->gpu, gpu, sizeof gpu);
    bool batched = d->batch > 1;   /* strides mean nothing to one GEMM */
    snprintf(key, n,
             "gemm ab=%s c=%s ta=%d tb=%d M=%lld N=%lld K=%lld batch=%lld stride_a=%lld stride_b=%lld stride_c=%lld align=%u/%u/%u "
             "epilogue=%s compute=%s workspace=%zu candidates=%d cublaslt=%zu gpu=%s",
             type_name(d->ab), type_name(d->c), d->ta, d->tb, (long long)d->M, (long long)d->N, (long long)d->K, (long long)d->batch,
             (long long)(batched ? d->stride_a : 0), (long long)(batched ? d->stride_b : 0), (long long)(batched ? d->stride_c : 0),
             d->align_a, d->align_b, d->align_c, epi_name(d->epilogue), compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? "32F_FAST_TF32" : "32F",
             d->max_workspace, (int)TF_GEMM_CANDIDATES, l->cublaslt_version, gpu);
}

typedef struct record {
    int index;                  /* among the heuristic's results */
    tf_cublaslt_algo algo;
    size_t workspace;
    float ms;
    int candidates, timed;
} record;

/* The record of key at path, when it is whole (cache_file.h) and sane. */
static bool cache_read(const char *path, const char *key, record *r)
{
    char body[4096];
    if (!tf_record_read(path, HEADER, key, body, sizeof body)) return false;
    unsigned long long *w = r->algo.data;
    int end = 0;
    if (sscanf(body, "index: %d\nalgo: %llx %llx %llx %llx %llx %llx %llx %llx\nworkspace: %zu\nms: %f\ncandidates: %d\ntimed: %d\n%n",
               &r->index, &w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6], &w[7], &r->workspace, &r->ms, &r->candidates, &r->timed,
               &end) != 13 ||
        end <= 0 || body[end])
        return false;
    return r->index >= 0 && r->index < TF_GEMM_CANDIDATES;
}

static void cache_write(const char *path, const char *key, const record *r, const void *tag)
{
    char body[1024];
    const unsigned long long *w = r->algo.data;
    snprintf(body, sizeof body,
             "index: %d\nalgo: %016llx %016llx %016llx %016llx %016llx %016llx %016llx %016llx\nworkspace: %zu\nms: %.9g\n"
             "candidates: %d\ntimed: %d\n",
             r->index, w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], r->workspace, (double)r->ms, r->candidates, r->timed);
    tf_record_write(path, HEADER, key, body, tag);
}

/* ---- timing ---- */

/* One candidate (g->algo, g->workspace) on the desc's buffers: warmup
 * untimed runs, then runs between two events; *ms per run. *ran is false
 * when cuBLASLt refused to run it (err says why); any other failure is the
 * status returned. */
static tf_cuda_status time_one(const tf_cuda_libs *l, tf_cublaslt_handle h, const tf_gemm *g, const tf_gemm_desc *d,
                               tf_cu_event ev[2], int warmup, int runs, float *ms, bool *ran, char *err, size_t n)
{
    *ran = false;
    *ms = 0;
    tf_cuda_status st = TF_CUDA_OK;
    for (int i = 0; i < warmup + runs; i++) {
        if (i == warmup) st = TF_CU_CALL(l, err, n, EventRecord(ev[0], d->stream));
        if (st) return st;
        if (tf_gemm_run(l, h, g, d->dev_a, d->dev_b, d->dev_c, d->dev_ws, d->max_workspace, d->stream, err, n)) {
            l->cu.StreamSynchronize(d->stream);   /* what was enqueued finishes before the next candidate */
            return TF_CUDA_OK;
        }
    }
    st = TF_CU_CALL(l, err, n, EventRecord(ev[1], d->stream));
    if (!st) st = TF_CU_CALL(l, err, n, StreamSynchronize(d->stream));
    if (!st) st = TF_CU_CALL(l, err, n, EventElapsedTime(ms, ev[0], ev[1]));
    if (st) return st;
    *ms /= (float)runs;
    *ran = true;
    return TF_CUDA_OK;
}

/* Time every usable candidate (ok[i]); *pick is the fastest (ties: the
 * heuristic's order), -1 when none ran (err: the last refusal). */
static tf_cuda_status time_candidates(const tf_cuda_libs *l, tf_cublaslt_handle h, tf_gemm *g, const tf_gemm_desc *d,
                                      const tf_cublaslt_heuristic *res, const bool *ok, int got, int *pick, float *best, char *err,
                                      size_t n)
{
    int warmup = d->warmup > 0 ? d->warmup : 2, runs = d->runs > 0 ? d->runs : 5;
    tf_cu_event ev[2] = {NULL, NULL};
    tf_cuda_status st = TF_CU_CALL(l, err, n, EventCreate(&ev[0], 0));
    if (!st) st = TF_CU_CALL(l, err, n, EventCreate(&ev[1], 0));
    *pick = -1;
    *best = 0;
    for (int i = 0; !st && i < got; i++) {
        if (!ok[i] || (res[i].workspace_size && !d->dev_ws)) continue;
        g->algo = res[i].algo;
        g->workspace = res[i].workspace_size;
        float ms = 0;
        bool ran = false;
        st = time_one(l, h, g, d, ev, warmup, runs, &ms, &ran, err, n);
        if (st || !ran) continue;
        g->timed++;
        if (*pick < 0 || ms < *best) *pick = i, *best = ms;
    }
    for (int i = 0; i < 2; i++)
        if (ev[i]) l->cu.EventDestroy(ev[i]);
    return st;
}

/* The workspace a chosen algorithm runs with, the same whether it was timed
 * now or read from the cache: the larger of what the heuristic said and
 * what cublasLtMatmulAlgoCheck says, when that fits. On the first GPU run
 * (bench/results/2026-11-28-1718-h200-session) a session that timed its
 * TF32 GEMMs and later sessions that read the same algorithms from the
 * cache computed a few states differently in the last bits; the timed
 * path gave the heuristic's workspace and the cached one this larger one,
 * the only difference between them. false when the check refuses it. */
static bool checked_workspace(const tf_cuda_libs *l, tf_cublaslt_handle h, const tf_gemm *g, const tf_gemm_desc *d,
                              const tf_cublaslt_heuristic *res, size_t *ws)
{
    tf_cublaslt_heuristic chk;
    memset(&chk, 0, sizeof chk);
    if (l->lt.MatmulAlgoCheck(h, g->op, g->la, g->lb, g->lc, g->lc, &res->algo, &chk) || chk.state != 0 ||
        chk.workspace_size > d->max_workspace)
        return false;
    *ws = chk.workspace_size > res->workspace_size ? chk.workspace_size : res->workspace_size;
    return true;
}

static void describe(const tf_gemm_desc *d, char *out, size_t n)
{
    snprintf(out, n, "%s%s x %s%s -> %s GEMM of %lld x %lld x %lld (batch %lld, alignments %u/%u/%u bytes, epilogue %s)",
             type_name(d->ab), d->ta ? "^T" : "", type_name(d->ab), d->tb ? "^T" : "", type_name(d->c), (long long)d->M,
             (long long)d->N, (long long)d->K, (long long)d->batch, d->align_a, d->align_b, d->align_c, epi_name(d->epilogue));
}

void tf_gemm_explain(const tf_gemm *g, char *out, size_t n)
{
    if (g->from_cache)
        snprintf(out, n, "heuristic candidate %d of %d (%.3f ms when timed), %zu bytes of workspace, from the algorithm cache %.4000s",
                 g->choice, g->candidates, (double)g->ms, g->workspace, g->cache_file);
    else if (g->timed)
        snprintf(out, n, "heuristic candidate %d of %d, the fastest of %d timed now (%.3f ms), %zu bytes of workspace, %s%.4000s", g->choice,
                 g->candidates, g->timed, (double)g->ms, g->workspace, g->cache_file[0] ? "cached in " : "no disk cache", g->cache_file);
    else
        snprintf(out, n, "heuristic candidate %d of %d, untimed (nothing to time on), %zu bytes of workspace", g->choice, g->candidates,
                 g->workspace);
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
        /* the bias runs along our C's columns, which are cuBLASLt's rows: what its bias epilogues add to, and
         * what BGRADA and DRELU_BGRAD write (one per row of cuBLASLt's D); BGRADB's are cuBLASLt's columns */
        uint32_t epi = lt_epilogue(d->epilogue);
        const void *bias = (const void *)(uintptr_t)d->bias, *aux = (const void *)(uintptr_t)d->aux;
        int64_t aux_ld = tf_gemm_relu_mask_ld(d->N);
        if (d->batch != 1 || (has_bias(d->epilogue) && !bias) || (has_aux(d->epilogue) && !aux)) {
            snprintf(err, n, "the %s epilogue takes one GEMM%s%s", epi_name(d->epilogue), has_bias(d->epilogue) ? " and a bias vector" : "",
                     has_aux(d->epilogue) ? " and a ReLU mask" : "");
            st = TF_CUDA_ERR_ARG;
        }
        if (!st) st = LT_CALL(MatmulDescSetAttribute, (g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        if (!st && has_bias(d->epilogue))
            st = LT_CALL(MatmulDescSetAttribute, (g->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        if (!st && has_aux(d->epilogue)) st = LT_CALL(MatmulDescSetAttribute, (g->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        if (!st && has_aux(d->epilogue))
            st = LT_CALL(MatmulDescSetAttribute, (g->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
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
    tf_cublaslt_heuristic res[TF_GEMM_CANDIDATES];
    int got = 0;
    memset(res, 0, sizeof res);
    if (!st) st = LT_CALL(MatmulAlgoGetHeuristic, (h, g->op, g->la, g->lb, g->lc, g->lc, pref, TF_GEMM_CANDIDATES, res, &got));
    if (pref) l->lt.MatmulPreferenceDestroy(pref);
    if (got > TF_GEMM_CANDIDATES) got = TF_GEMM_CANDIDATES;
    if (got < 0) got = 0;
    bool ok[TF_GEMM_CANDIDATES] = {false};
    int first = -1;
    for (int i = 0; !st && i < got; i++) {
        ok[i] = res[i].state == 0 && res[i].workspace_size <= d->max_workspace;
        if (ok[i]) g->candidates++;
        if (ok[i] && first < 0) first = i;
    }
    char what[400];
    describe(d, what, sizeof what);
    if (!st && first < 0) {
        snprintf(err, n, "cuBLASLt has no algorithm for a %s within %zu bytes of workspace", what, d->max_workspace);
        st = TF_CUDA_ERR_ARG;
    }
    if (st) {
        tf_gemm_free(l, g);
        return st;
    }
    /* the cache: the same words at the same index of the heuristic's answer, and cuBLASLt still takes them */
    char key[1024], dir[4100];
    record rec;
    cache_key(l, d, compute, key, sizeof key);
    if (tf_cache_dir_or(d->cache_dir, "cuda", dir, sizeof dir))
        snprintf(g->cache_file, sizeof g->cache_file, "%.4000s/%016llx.cublaslt", dir, (unsigned long long)tf_fnv1a(TF_FNV_BASIS, key, strlen(key)));
    if (g->cache_file[0] && cache_read(g->cache_file, key, &rec) && rec.index < got && ok[rec.index] &&
        !memcmp(&res[rec.index].algo, &rec.algo, sizeof rec.algo)) {
        size_t ws = 0;
        if (checked_workspace(l, h, g, d, &res[rec.index], &ws)) {
            g->algo = rec.algo;
            g->workspace = ws;
            g->choice = rec.index;
            g->ms = rec.ms;
            g->from_cache = true;
            return TF_CUDA_OK;
        }
    }
    /* nothing to time on: the heuristic's first */
    if (!d->dev_a || !d->dev_b || !d->dev_c || !(l->loaded & TF_CUDA_LIB_DRIVER)) {
        g->algo = res[first].algo;
        if (!checked_workspace(l, h, g, d, &res[first], &g->workspace)) g->workspace = res[first].workspace_size;
        g->choice = first;
        return TF_CUDA_OK;
    }
    int pick = -1;
    float best = 0;
    if (n) err[0] = 0;
    st = time_candidates(l, h, g, d, res, ok, got, &pick, &best, err, n);
    if (!st && pick < 0) {
        char why[600];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, n, "no cuBLASLt algorithm of %d ran the %s: %s", g->candidates, what,
                 why[0] ? why : "each needs workspace, and none was given to time them on");
        st = TF_CUDA_ERR_ARG;
    }
    if (st) {
        if (st != TF_CUDA_ERR_ARG) {
            size_t at = strlen(err);
            snprintf(err + at, n > at ? n - at : 0, " timing cuBLASLt's algorithms for the %s", what);
        }
        tf_gemm_free(l, g);
        return st;
    }
    g->algo = res[pick].algo;
    /* the workspace a later session reading the cache will give it: the same bits either way */
    if (!checked_workspace(l, h, g, d, &res[pick], &g->workspace)) g->workspace = res[pick].workspace_size;
    g->choice = pick;
    g->ms = best;
    rec = (record){pick, res[pick].algo, g->workspace, best, g->candidates, g->timed};
    if (g->cache_file[0]) cache_write(g->cache_file, key, &rec, g);
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

/* ---- the ReLU mask, as cuBLASLt writes it ---- */

tf_cuda_status tf_gemm_relu_mask_probe(const tf_cuda_libs *l, tf_cublaslt_handle h, tf_cu_stream s, tf_cu_deviceptr ws,
                                       size_t ws_bytes, bool *same, char *why, size_t n)
{
    enum { M = 3, N = 130 };
    /* A [M, 1] = (1, -1, 0), B [1, N] = (1, -1, 1/2, 1, -1, 1/2, ...): products of every sign, exact zeros in row 2 */
    float a[M] = {1, -1, 0}, b[N], c[M * N], ones[M > N ? M : N], zero_bias[N];
    for (int j = 0; j < N; j++) b[j] = j % 3 == 0 ? 1.0f : j % 3 == 1 ? -1.0f : 0.5f, zero_bias[j] = 0;
    for (int j = 0; j < (M > N ? M : N); j++) ones[j] = 1;
    size_t mask_bytes = tf_gemm_relu_mask_bytes(M, N);
    unsigned char mask[M * 256 / 8];
    tf_cu_deviceptr da = 0, db = 0, dc = 0, dbias = 0, dmask = 0, d1a = 0, d1b = 0;
    tf_gemm g;
    memset(&g, 0, sizeof g);
    *same = false;
    if (n) why[0] = 0;
    char err[2048] = "";
    tf_cuda_status st = TF_CU_CALL(l, err, sizeof err, MemAlloc(&da, sizeof a));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemAlloc(&db, sizeof b));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemAlloc(&dc, sizeof c));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemAlloc(&dbias, sizeof zero_bias));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemAlloc(&dmask, mask_bytes));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemAlloc(&d1a, M * sizeof(float)));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemAlloc(&d1b, N * sizeof(float)));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemcpyHtoD(da, a, sizeof a));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemcpyHtoD(db, b, sizeof b));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemcpyHtoD(dbias, zero_bias, sizeof zero_bias));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemcpyHtoD(d1a, ones, M * sizeof(float)));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemcpyHtoD(d1b, ones, N * sizeof(float)));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemsetD8Async(dmask, 0xa5, mask_bytes, s));   /* not a mask of either kind */
    tf_gemm_desc d;
    memset(&d, 0, sizeof d);
    d.ab = d.c = TF_GEMM_F32;
    d.M = M, d.N = N, d.K = 1, d.batch = 1;
    d.align_a = d.align_b = d.align_c = 4;   /* what every pointer here is aligned to, at least */
    d.max_workspace = ws ? ws_bytes : 0;
    d.cache_dir = "";
    d.epilogue = TF_GEMM_EPI_RELU_AUX_BIAS;
    d.bias = dbias, d.aux = dmask;
    bool forward_ok = false;
    if (!st) st = tf_gemm_plan(l, h, &d, &g, err, sizeof err);
    if (!st) st = tf_gemm_run(l, h, &g, da, db, dc, ws, ws_bytes, s, err, sizeof err);
    if (!st) st = TF_CU_CALL(l, err, sizeof err, StreamSynchronize(s));
    if (!st) st = TF_CU_CALL(l, err, sizeof err, MemcpyDtoH(mask, dmask, mask_bytes));
    tf_gemm_free(l, &g);
    if (!st) {
        forward_ok = true;
        int64_t ld = tf_gemm_relu_mask_ld(N);
        for (int i = 0; forward_ok && i < M; i++)
            for (int j = 0; forward_ok && j < N; j++) {
                int64_t bit = j + i * ld;
                bool got = (mask[bit / 8] >> (bit % 8)) & 1, want = a[i] * b[j] > 0;
                if (got != want) {
                    snprintf(why, n, "cuBLASLt's ReLU mask holds %d for the product %g at row %d, column %d (bit %lld), where x > 0 is %d",
                             got, (double)(a[i] * b[j]), i, j, (long long)bit, want);
                    forward_ok = false;
                }
            }
    }
    /* DRELU reads it back: a product of 1 everywhere, kept where the mask is set */
    if (!st && forward_ok) {
        d.epilogue = TF_GEMM_EPI_DRELU;
        d.bias = 0;
        st = tf_gemm_plan(l, h, &d, &g, err, sizeof err);
        if (!st) st = tf_gemm_run(l, h, &g, d1a, d1b, dc, ws, ws_bytes, s, err, sizeof err);
        if (!st) st = TF_CU_CALL(l, err, sizeof err, StreamSynchronize(s));
        if (!st) st = TF_CU_CALL(l, err, sizeof err, MemcpyDtoH(c, dc, sizeof c));
        tf_gemm_free(l, &g);
        for (int i = 0; !st && i < M * N && !why[0]; i++)
            if (c[i] != (a[i / N] * b[i % N] > 0 ? 1.0f : 0.0f))
                snprintf(why, n, "cuBLASLt's DRELU wrote %g at row %d, column %d of a product of 1 where the ReLU input was %g",
                         (double)c[i], i / N, i % N, (double)(a[i / N] * b[i % N]));
        *same = !st && !why[0];
    }
    if (st) snprintf(why, n, "%s", err);
    tf_cu_deviceptr all[] = {da, db, dc, dbias, dmask, d1a, d1b};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i]) l->cu.MemFree(all[i]);
    return st;
}
