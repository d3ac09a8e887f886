/* emu_blas.c — cuda-emu's cuBLASLt (see emu.h): descriptors are host
 * structs holding what was set on them, the heuristic offers EMU_ALGOS
 * algorithms (distinct tags in data[0], one of them needing workspace, all
 * computing the same exact result) within the preference's workspace
 * limit, cublasLtMatmulAlgoCheck takes exactly those tags, and a matmul
 * (with any of them, or none) computes on the host, column-major as
 * cuBLASLt defines it: D = alpha * op(A) op(B) + beta * C, accumulated in
 * double and rounded once to D's type, then the epilogue the descriptor
 * names (bias, ReLU, GELU; their backward forms take the auxiliary buffer;
 * BGRADA/BGRADB: the bias gradient of op(A) or op(B), summed over k).
 * Attributes the stand-in does not know are refused, so that a descriptor
 * it would get wrong fails loudly.
 *
 * The auxiliary buffers follow cublasLt.h's rules, and a descriptor that
 * breaks one is refused (CUBLAS_STATUS_INVALID_VALUE) as a GPU would: ReLU's
 * is a bit mask, bit i + j * aux_ld for element (i, j) of the column-major
 * D, bit b in bit b % 8 of byte b / 8, aux_ld counted in bits, a multiple of
 * 128 and at least D's rows (a batch stride also a multiple of 128 bits);
 * GELU's holds D's type, aux_ld a multiple of 8 and at least D's rows. The
 * mask holds x > 0 (0 at exactly 0): what tf_gemm_relu_mask_probe checks a
 * GPU's cuBLASLt against, since cublasLt.h does not say. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "emu.h"
#include "ir.h"

enum {
    ST_OK = 0, ST_NOT_INITIALIZED = 1, ST_ALLOC_FAILED = 3, ST_INVALID_VALUE = 7, ST_NOT_SUPPORTED = 15,
    CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14,
    COMPUTE_32F = 68, COMPUTE_32F_FAST_TF32 = 77,
    DESC_COMPUTE_TYPE = 0, DESC_SCALE_TYPE = 1, DESC_POINTER_MODE = 2, DESC_TRANSA = 3, DESC_TRANSB = 4, DESC_TRANSC = 5,
    /* cublasLtMatmulDescAttributes_t as cublasLt.h numbers them (9 and 16 are unused) */
    DESC_EPILOGUE = 7, DESC_BIAS_POINTER = 8, DESC_BIAS_BATCH_STRIDE = 10, DESC_EPILOGUE_AUX_POINTER = 11, DESC_EPILOGUE_AUX_LD = 12,
    DESC_EPILOGUE_AUX_BATCH_STRIDE = 13, DESC_BIAS_DATA_TYPE = 26,
    LAYOUT_TYPE = 0, LAYOUT_ORDER = 1, LAYOUT_ROWS = 2, LAYOUT_COLS = 3, LAYOUT_LD = 4, LAYOUT_BATCH_COUNT = 5,
    LAYOUT_STRIDED_BATCH_OFFSET = 6,
    PREF_MAX_WORKSPACE_BYTES = 1,
    /* cublasLtEpilogue_t */
    EPI_DEFAULT = 1, EPI_RELU = 2, EPI_RELU_AUX = 130, EPI_BIAS = 4, EPI_RELU_BIAS = 6, EPI_RELU_AUX_BIAS = 134,
    EPI_DRELU = 136, EPI_DRELU_BGRAD = 152, EPI_GELU = 32, EPI_GELU_AUX = 160, EPI_GELU_BIAS = 36, EPI_GELU_AUX_BIAS = 164,
    EPI_DGELU = 192, EPI_DGELU_BGRAD = 208, EPI_BGRADA = 256, EPI_BGRADB = 512,
};

typedef struct lt_desc {
    int compute, scale;
    int32_t transa, transb;
    uint32_t epilogue;
    const void *bias;
    void *aux;
    int64_t aux_ld, aux_stride, bias_stride;
    int bias_type;               /* -1: D's type */
} lt_desc;

typedef struct lt_layout {
    int type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
} lt_layout;

static int g_handle_token;

static tf_dt dt_of(int cuda_type)
{
    return cuda_type == CUDA_R_32F ? TF_DT_F32 : cuda_type == CUDA_R_16F ? TF_DT_F16 : cuda_type == CUDA_R_16BF ? TF_DT_BF16 : TF_DT_BOOL;
}

static tf_cublas_status lt_create(tf_cublaslt_handle *h) { *h = (tf_cublaslt_handle)&g_handle_token; return ST_OK; }
static tf_cublas_status lt_destroy(tf_cublaslt_handle h) { return h == (tf_cublaslt_handle)&g_handle_token ? ST_OK : ST_NOT_INITIALIZED; }
static size_t lt_version(void) { return 130000; }
static const char *lt_status_name(tf_cublas_status s)
{
    switch (s) {
    case ST_OK: return "CUBLAS_STATUS_SUCCESS";
    case ST_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case ST_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case ST_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case ST_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_EXECUTION_FAILED";
    }
}
static const char *lt_status_string(tf_cublas_status s)
{
    return s == ST_NOT_SUPPORTED ? "cuda-emu's cuBLASLt does not take this descriptor" : s ? "cuda-emu's cuBLASLt refused the call" : "success";
}

static tf_cublas_status desc_create(tf_cublaslt_matmul_desc *d, int compute, int scale)
{
    if (compute != COMPUTE_32F && compute != COMPUTE_32F_FAST_TF32) return ST_NOT_SUPPORTED;
    if (scale != CUDA_R_32F) return ST_NOT_SUPPORTED;
    lt_desc *x = tf_calloc(1, sizeof *x);
    if (!x) return ST_ALLOC_FAILED;
    x->compute = compute;
    x->scale = scale;
    x->epilogue = EPI_DEFAULT;
    x->bias_type = -1;
    *d = (tf_cublaslt_matmul_desc)x;
    return ST_OK;
}
static tf_cublas_status desc_destroy(tf_cublaslt_matmul_desc d) { tf_free(d); return ST_OK; }

static bool take(void *dst, size_t want, const void *buf, size_t size)
{
    if (size != want) return false;
    memcpy(dst, buf, want);
    return true;
}

static tf_cublas_status desc_set(tf_cublaslt_matmul_desc dd, int attr, const void *buf, size_t size)
{
    lt_desc *d = (lt_desc *)dd;
    bool ok;
    switch (attr) {
    case DESC_TRANSA: ok = take(&d->transa, 4, buf, size) && (d->transa == 0 || d->transa == 1); break;
    case DESC_TRANSB: ok = take(&d->transb, 4, buf, size) && (d->transb == 0 || d->transb == 1); break;
    case DESC_EPILOGUE: ok = take(&d->epilogue, 4, buf, size); break;
    case DESC_BIAS_POINTER: ok = take(&d->bias, sizeof d->bias, buf, size); break;
    case DESC_EPILOGUE_AUX_POINTER: ok = take(&d->aux, sizeof d->aux, buf, size); break;
    case DESC_EPILOGUE_AUX_LD: ok = take(&d->aux_ld, 8, buf, size); break;
    case DESC_EPILOGUE_AUX_BATCH_STRIDE: ok = take(&d->aux_stride, 8, buf, size); break;
    case DESC_BIAS_BATCH_STRIDE: ok = take(&d->bias_stride, 8, buf, size); break;
    case DESC_BIAS_DATA_TYPE: ok = take(&d->bias_type, 4, buf, size); break;
    default: return ST_NOT_SUPPORTED;
    }
    return ok ? ST_OK : ST_INVALID_VALUE;
}

static tf_cublas_status layout_create(tf_cublaslt_layout *l, int type, unsigned long long rows, unsigned long long cols, long long ld)
{
    if (dt_of(type) == TF_DT_BOOL) return ST_NOT_SUPPORTED;
    if ((long long)rows > ld || ld < 1) return ST_INVALID_VALUE;   /* column-major: ld >= rows */
    lt_layout *x = tf_calloc(1, sizeof *x);
    if (!x) return ST_ALLOC_FAILED;
    *x = (lt_layout){type, rows, cols, ld, 1, 0};
    *l = (tf_cublaslt_layout)x;
    return ST_OK;
}
static tf_cublas_status layout_destroy(tf_cublaslt_layout l) { tf_free(l); return ST_OK; }
static tf_cublas_status layout_set(tf_cublaslt_layout ll, int attr, const void *buf, size_t size)
{
    lt_layout *l = (lt_layout *)ll;
    switch (attr) {
    case LAYOUT_BATCH_COUNT: return take(&l->batch, 4, buf, size) && l->batch >= 1 ? ST_OK : ST_INVALID_VALUE;
    case LAYOUT_STRIDED_BATCH_OFFSET: return take(&l->stride, 8, buf, size) ? ST_OK : ST_INVALID_VALUE;
    default: return ST_NOT_SUPPORTED;
    }
}

/* A preference: the workspace limit (cuBLASLt's default is none); the
 * alignments and other attributes are taken and not used. */
typedef struct lt_pref { uint64_t max_ws; } lt_pref;
static tf_cublas_status pref_create(tf_cublaslt_pref *p)
{
    lt_pref *x = tf_calloc(1, sizeof *x);
    if (!x) return ST_ALLOC_FAILED;
    *p = (tf_cublaslt_pref)x;
    return ST_OK;
}
static tf_cublas_status pref_destroy(tf_cublaslt_pref p) { tf_free(p); return ST_OK; }
static tf_cublas_status pref_set(tf_cublaslt_pref p, int attr, const void *buf, size_t size)
{
    if (!p || !buf) return ST_INVALID_VALUE;
    if (attr == PREF_MAX_WORKSPACE_BYTES) return take(&((lt_pref *)p)->max_ws, 8, buf, size) ? ST_OK : ST_INVALID_VALUE;
    return ST_OK;
}

/* The stand-in's algorithms: a tag in data[0] (the other words zero) and
 * the workspace each needs, in the heuristic's order. */
enum { EMU_ALGOS = 4 };
static const unsigned long long algo_tag[EMU_ALGOS] = {0x7465, 0x7466, 0x7467, 0x7468};
static const size_t algo_ws[EMU_ALGOS] = {0, 0, 4096, 0};

/* The index of one of the stand-in's algorithms, -1 for anything else. */
static int algo_index(const tf_cublaslt_algo *a)
{
    for (int w = 1; w < 8; w++)
        if (a->data[w]) return -1;
    for (int i = 0; i < EMU_ALGOS; i++)
        if (a->data[0] == algo_tag[i]) return i;
    return -1;
}

/* The shapes agree: op(A) is m x k, op(B) k x n, C and D m x n, one batch count. */
static bool shapes(const lt_desc *d, const lt_layout *a, const lt_layout *b, const lt_layout *c, const lt_layout *dd, uint64_t *m,
                   uint64_t *n, uint64_t *k)
{
    *m = d->transa ? a->cols : a->rows;
    *k = d->transa ? a->rows : a->cols;
    uint64_t kb = d->transb ? b->cols : b->rows;
    *n = d->transb ? b->rows : b->cols;
    return kb == *k && c->rows == *m && c->cols == *n && dd->rows == *m && dd->cols == *n && a->type == b->type &&
           a->batch == b->batch && a->batch == c->batch && c->batch == dd->batch && c->type == dd->type &&
           (dd->type == a->type || dd->type == CUDA_R_32F);
}

static tf_cublas_status heuristic(tf_cublaslt_handle h, tf_cublaslt_matmul_desc op, tf_cublaslt_layout a, tf_cublaslt_layout b,
                                  tf_cublaslt_layout c, tf_cublaslt_layout d, tf_cublaslt_pref pref, int requested,
                                  tf_cublaslt_heuristic *res, int *returned)
{
    uint64_t m, n, k;
    *returned = 0;
    if (h != (tf_cublaslt_handle)&g_handle_token) return ST_NOT_INITIALIZED;
    if (requested < 1 || !pref || !res) return ST_INVALID_VALUE;
    if (!shapes((lt_desc *)op, (lt_layout *)a, (lt_layout *)b, (lt_layout *)c, (lt_layout *)d, &m, &n, &k)) return ST_INVALID_VALUE;
    int got = 0;
    for (int i = 0; i < EMU_ALGOS && got < requested; i++) {
        if (algo_ws[i] > ((lt_pref *)pref)->max_ws) continue;
        memset(&res[got], 0, sizeof res[got]);
        res[got].algo.data[0] = algo_tag[i];
        res[got].workspace_size = algo_ws[i];
        res[got].waves_count = 1;
        got++;
    }
    *returned = got;
    return got ? ST_OK : ST_NOT_SUPPORTED;
}

static tf_cublas_status algo_check(tf_cublaslt_handle h, tf_cublaslt_matmul_desc op, tf_cublaslt_layout a, tf_cublaslt_layout b,
                                   tf_cublaslt_layout c, tf_cublaslt_layout d, const tf_cublaslt_algo *algo, tf_cublaslt_heuristic *res)
{
    uint64_t m, n, k;
    if (h != (tf_cublaslt_handle)&g_handle_token) return ST_NOT_INITIALIZED;
    if (!op || !a || !b || !c || !d || !algo || !res) return ST_INVALID_VALUE;
    if (!shapes((lt_desc *)op, (lt_layout *)a, (lt_layout *)b, (lt_layout *)c, (lt_layout *)d, &m, &n, &k)) return ST_INVALID_VALUE;
    int i = algo_index(algo);
    if (i < 0) return ST_INVALID_VALUE;
    /* algo may point to res->algo, which is never written */
    res->workspace_size = algo_ws[i];
    res->state = ST_OK;
    res->waves_count = 1;
    memset(res->reserved, 0, sizeof res->reserved);
    return ST_OK;
}

typedef struct mm_arg {
    lt_desc d;
    lt_layout a, b, c, dl;
    float alpha, beta;
    const void *pa, *pb, *pc;
    void *pd;
    void *ws;                    /* the algorithm's workspace, filled with 0xa5 (what it "uses") */
    size_t ws_need;
} mm_arg;

static double gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double dgelu(double x) { return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * 3.14159265358979323846); }

static int run_matmul(void *argp)
{
    mm_arg *x = argp;
    uint64_t m, n, k;
    shapes(&x->d, &x->a, &x->b, &x->c, &x->dl, &m, &n, &k);
    tf_dt ta = dt_of(x->a.type), tc = dt_of(x->c.type), td = dt_of(x->dl.type);
    tf_dt tbias = x->d.bias_type < 0 ? td : dt_of(x->d.bias_type);
    uint32_t epi = x->d.epilogue;
    bool bias = epi == EPI_BIAS || epi == EPI_RELU_BIAS || epi == EPI_RELU_AUX_BIAS || epi == EPI_GELU_BIAS || epi == EPI_GELU_AUX_BIAS;
    bool relu = epi == EPI_RELU || epi == EPI_RELU_AUX || epi == EPI_RELU_BIAS || epi == EPI_RELU_AUX_BIAS;
    bool gel = epi == EPI_GELU || epi == EPI_GELU_AUX || epi == EPI_GELU_BIAS || epi == EPI_GELU_AUX_BIAS;
    bool aux_out = epi == EPI_RELU_AUX || epi == EPI_RELU_AUX_BIAS || epi == EPI_GELU_AUX || epi == EPI_GELU_AUX_BIAS;
    bool drelu = epi == EPI_DRELU || epi == EPI_DRELU_BGRAD, dgel = epi == EPI_DGELU || epi == EPI_DGELU_BGRAD;
    bool bgrad = epi == EPI_DRELU_BGRAD || epi == EPI_DGELU_BGRAD;
    bool mask = (relu && aux_out) || drelu;   /* the aux is ReLU's bit mask */
    int64_t aux_ld = x->d.aux_ld;
    if (x->ws_need) memset(x->ws, 0xa5, x->ws_need);
    if (epi == EPI_BGRADA || epi == EPI_BGRADB) {   /* op(A) (m x k) summed over k: m values; op(B) (k x n): n values */
        bool first = epi == EPI_BGRADA;
        uint64_t len = first ? m : n;
        for (uint64_t r = 0; r < len; r++) {
            double s = 0;
            for (int32_t bi = 0; bi < x->a.batch; bi++) {
                const char *A = (const char *)x->pa + (size_t)(bi * x->a.stride) * (size_t)tf_dtype_bytes(ta);
                const char *B = (const char *)x->pb + (size_t)(bi * x->b.stride) * (size_t)tf_dtype_bytes(ta);
                for (uint64_t q = 0; q < k; q++)
                    s += first ? tf_elem_load(ta, A, (int64_t)(x->d.transa ? q + r * (uint64_t)x->a.ld : r + q * (uint64_t)x->a.ld))
                               : tf_elem_load(ta, B, (int64_t)(x->d.transb ? r + q * (uint64_t)x->b.ld : q + r * (uint64_t)x->b.ld));
            }
            tf_elem_store(tbias, (void *)x->d.bias, (int64_t)r, s);
        }
    }
    for (int32_t bi = 0; bi < x->a.batch; bi++) {
        const char *A = (const char *)x->pa + (size_t)(bi * x->a.stride) * (size_t)tf_dtype_bytes(ta);
        const char *B = (const char *)x->pb + (size_t)(bi * x->b.stride) * (size_t)tf_dtype_bytes(ta);
        const char *C = (const char *)x->pc + (size_t)(bi * x->c.stride) * (size_t)tf_dtype_bytes(tc);
        char *D = (char *)x->pd + (size_t)(bi * x->dl.stride) * (size_t)tf_dtype_bytes(td);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                double acc = 0;
                for (uint64_t q = 0; q < k; q++) {
                    double av = tf_elem_load(ta, A, (int64_t)(x->d.transa ? q + i * (uint64_t)x->a.ld : i + q * (uint64_t)x->a.ld));
                    double bv = tf_elem_load(ta, B, (int64_t)(x->d.transb ? j + q * (uint64_t)x->b.ld : q + j * (uint64_t)x->b.ld));
                    acc += av * bv;
                }
                double v = x->alpha * acc;
                if (x->beta != 0) v += x->beta * tf_elem_load(tc, C, (int64_t)(i + j * (uint64_t)x->c.ld));
                if (bias) v += tf_elem_load(tbias, x->d.bias, (int64_t)i);
                int64_t ai = (int64_t)(i + j * (uint64_t)aux_ld) + bi * x->d.aux_stride;
                unsigned char *bits = x->d.aux;
                if (aux_out && mask) bits[ai / 8] = (unsigned char)((bits[ai / 8] & ~(1u << (ai % 8))) | (unsigned)(v > 0) << (ai % 8));
                else if (aux_out) tf_elem_store(td, x->d.aux, ai, v);
                if (relu) v = v > 0 ? v : 0;
                if (gel) v = gelu(v);
                if (drelu) v = (bits[ai / 8] >> (ai % 8)) & 1 ? v : 0;
                if (dgel) v *= dgelu(tf_elem_load(td, x->d.aux, ai));
                tf_elem_store(td, D, (int64_t)(i + j * (uint64_t)x->dl.ld), v);
            }
    }
    if (bgrad) {   /* the bias gradient: D's rows summed over its columns (and batches) */
        for (uint64_t i = 0; i < m; i++) {
            double s = 0;
            for (int32_t bi = 0; bi < x->a.batch; bi++) {
                const char *D = (const char *)x->pd + (size_t)(bi * x->dl.stride) * (size_t)tf_dtype_bytes(td);
                for (uint64_t j = 0; j < n; j++) s += tf_elem_load(td, D, (int64_t)(i + j * (uint64_t)x->dl.ld));
            }
            tf_elem_store(tbias, (void *)x->d.bias, (int64_t)i, s);
        }
    }
    return 0;
}

static tf_cublas_status matmul(tf_cublaslt_handle h, tf_cublaslt_matmul_desc op, const void *alpha, const void *a, tf_cublaslt_layout adesc,
                               const void *b, tf_cublaslt_layout bdesc, const void *beta, const void *c, tf_cublaslt_layout cdesc,
                               void *d, tf_cublaslt_layout ddesc, const tf_cublaslt_algo *algo, void *ws, size_t ws_bytes,
                               tf_cu_stream stream)
{
    uint64_t m, n, k;
    if (h != (tf_cublaslt_handle)&g_handle_token) return ST_NOT_INITIALIZED;
    if (!op || !a || !b || !d || !adesc || !bdesc || !cdesc || !ddesc || !alpha || !beta) return ST_INVALID_VALUE;
    int ai = algo ? algo_index(algo) : 0;   /* no algorithm: the stand-in's first */
    if (ai < 0) return ST_INVALID_VALUE;
    if (algo_ws[ai] && (!ws || ws_bytes < algo_ws[ai])) return ST_INVALID_VALUE;
    mm_arg x;
    memset(&x, 0, sizeof x);
    x.d = *(lt_desc *)op;
    x.a = *(lt_layout *)adesc, x.b = *(lt_layout *)bdesc, x.c = *(lt_layout *)cdesc, x.dl = *(lt_layout *)ddesc;
    if (!shapes(&x.d, &x.a, &x.b, &x.c, &x.dl, &m, &n, &k)) return ST_INVALID_VALUE;
    uint32_t e = x.d.epilogue;
    bool relu_aux = e == EPI_RELU_AUX || e == EPI_RELU_AUX_BIAS || e == EPI_DRELU || e == EPI_DRELU_BGRAD;
    bool gelu_aux = e == EPI_GELU_AUX || e == EPI_GELU_AUX_BIAS || e == EPI_DGELU || e == EPI_DGELU_BGRAD;
    bool wants_bias = e == EPI_BIAS || e == EPI_RELU_BIAS || e == EPI_RELU_AUX_BIAS || e == EPI_GELU_BIAS || e == EPI_GELU_AUX_BIAS ||
                      e == EPI_DRELU_BGRAD || e == EPI_DGELU_BGRAD || e == EPI_BGRADA || e == EPI_BGRADB;
    int64_t unit = relu_aux ? 128 : 8;   /* bits for ReLU's mask, elements for GELU's input */
    if ((relu_aux || gelu_aux) && (!x.d.aux || x.d.aux_ld < (int64_t)m || x.d.aux_ld % unit || x.d.aux_stride % unit ||
                                   (x.dl.batch > 1 && x.d.aux_stride < x.d.aux_ld * (int64_t)n)))
        return ST_INVALID_VALUE;
    if (wants_bias && !x.d.bias) return ST_INVALID_VALUE;
    if (e != EPI_DEFAULT && e != EPI_RELU && e != EPI_GELU && !relu_aux && !gelu_aux && !wants_bias) return ST_NOT_SUPPORTED;
    memcpy(&x.alpha, alpha, 4);
    memcpy(&x.beta, beta, 4);
    if (x.beta != 0 && !c) return ST_INVALID_VALUE;
    x.pa = a, x.pb = b, x.pc = c, x.pd = d;
    x.ws = ws, x.ws_need = algo_ws[ai];
    return tf_cuda_emu_submit(stream, run_matmul, &x, sizeof x) ? ST_INVALID_VALUE : ST_OK;
}

void tf_cuda_emu_lt_fill(tf_cublaslt_api *api)
{
    *api = (tf_cublaslt_api){lt_create, lt_destroy, lt_version, lt_status_name, lt_status_string, desc_create, desc_destroy, desc_set,
                             layout_create, layout_destroy, layout_set, pref_create, pref_destroy, pref_set, heuristic, matmul,
                             algo_check};
}
