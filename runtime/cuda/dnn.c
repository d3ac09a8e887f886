/* dnn.c — 2-D convolution plans over cuDNN, with the algorithm choice
 * cached on disk (see dnn.h). */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_file.h"
#include "dnn.h"

/* The values of the cuDNN enumerations used here, as cuDNN 9.19's
 * cudnn_graph.h and cudnn_ops.h define them (the same in cuDNN 8). */
enum {
    CUDNN_DATA_FLOAT = 0, CUDNN_DATA_HALF = 2, CUDNN_DATA_BFLOAT16 = 9,          /* cudnnDataType_t */
    CUDNN_TENSOR_NCHW = 0,                                                       /* cudnnTensorFormat_t */
    CUDNN_CROSS_CORRELATION = 1,                                                 /* cudnnConvolutionMode_t */
    CUDNN_DEFAULT_MATH = 0, CUDNN_TENSOR_OP_MATH = 1,                            /* cudnnMathType_t */
    CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2, CUDNN_FMA_MATH = 3,
    CUDNN_DETERMINISTIC = 1,                                                     /* cudnnDeterminism_t */
    ALGOS = 8,   /* the most algorithms of a direction: CUDNN_CONVOLUTION_FWD_ALGO_COUNT */
};

_Static_assert(sizeof(tf_cudnn_algo_perf) == 48 && offsetof(tf_cudnn_algo_perf, memory) == 16 &&
                   offsetof(tf_cudnn_algo_perf, determinism) == 24 && offsetof(tf_cudnn_algo_perf, reserved) == 32,
               "cudnnConvolution*AlgoPerf_t: int algo, int status, float time, size_t memory, int determinism, int mathType, int reserved[3]");

static const char *const fwd_algos[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                        "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
static const char *const bwd_data_algos[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
static const char *const bwd_filter_algos[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};

const char *tf_conv_dir_name(tf_conv_dir dir)
{
    return dir == TF_CONV_FORWARD ? "forward" : dir == TF_CONV_GRAD_INPUT ? "grad_input" : "grad_weight";
}

const char *tf_conv_algo_name(tf_conv_dir dir, int algo)
{
    const char *const *names = dir == TF_CONV_FORWARD ? fwd_algos : dir == TF_CONV_GRAD_INPUT ? bwd_data_algos : bwd_filter_algos;
    int count = dir == TF_CONV_FORWARD ? 8 : dir == TF_CONV_GRAD_INPUT ? 6 : 7;
    return algo >= 0 && algo < count ? names[algo] : "unknown";
}

const char *tf_conv_math_name(int math)
{
    switch (math) {
    case CUDNN_DEFAULT_MATH: return "default math (TF32 allowed for f32)";
    case CUDNN_TENSOR_OP_MATH: return "tensor-op math";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor-op math with conversions";
    case CUDNN_FMA_MATH: return "FMA math (no tensor cores)";
    default: return "unknown math";
    }
}

static const char *type_name(tf_conv_type t) { return t == TF_CONV_F32 ? "f32" : t == TF_CONV_F16 ? "f16" : "bf16"; }

/* ---- statuses ---- */

/* cuDNN 9 numbers its statuses by category (2000 bad parameter, 3000 not
 * supported, 4003/4004 allocation failed); cuDNN 8 counted 0..14. */
static tf_cuda_status classify(const tf_cuda_libs *l, tf_cudnn_status r)
{
    if (l->cudnn_version && l->cudnn_version < 90000)
        return r == 2 ? TF_CUDA_ERR_OOM : r == 3 || r == 9 ? TF_CUDA_ERR_ARG : TF_CUDA_ERR_DRIVER;
    if (r == 4003 || r == 4004) return TF_CUDA_ERR_OOM;
    return r / 1000 == 2 || r / 1000 == 3 ? TF_CUDA_ERR_ARG : TF_CUDA_ERR_DRIVER;
}

static tf_cuda_status dnn_check(const tf_cuda_libs *l, tf_cudnn_status r, const char *call, char *err, size_t n)
{
    if (!r) return TF_CUDA_OK;
    const char *s = l->dnn.GetErrorString ? l->dnn.GetErrorString(r) : NULL;
    snprintf(err, n, "cudnn%s failed: %s (status %d)", call, s ? s : "cuDNN error", r);
    return classify(l, r);
}
#define DNN_CALL(call, args) dnn_check(l, l->dnn.call args, #call, err, n)

static void *ptr(tf_cu_deviceptr p) { return (void *)(uintptr_t)p; }

/* ---- the disk cache ---- */

static const char HEADER[] = "tfuse cudnn algorithm 1\n";

/* The cache key: everything the choice depends on, on one line. */
static void cache_key(const tf_cuda_libs *l, const tf_conv_desc *d, int math, char *key, size_t n)
{
    char gpu[256];
    tf_cache_key_field(d->gpu, gpu, sizeof gpu);
    snprintf(key, n,
             "conv2d %s %s x=[%lld,%lld,%lld,%lld] w=[%lld,%lld,%lld,%lld] y=[%lld,%lld,%lld,%lld] stride=[%lld,%lld] "
             "padding=[%lld,%lld] dilation=[%lld,%lld] groups=%lld math=%d cudnn=%zu gpu=%s",
             tf_conv_dir_name(d->dir), type_name(d->type), (long long)d->N, (long long)d->C, (long long)d->H, (long long)d->W,
             (long long)d->O, (long long)(d->C / d->groups), (long long)d->KH, (long long)d->KW, (long long)d->N, (long long)d->O,
             (long long)d->Ho, (long long)d->Wo, (long long)d->stride[0], (long long)d->stride[1], (long long)d->pad[0],
             (long long)d->pad[1], (long long)d->dilation[0], (long long)d->dilation[1], (long long)d->groups, math,
             l->cudnn_version, gpu);
}

typedef struct record { int algo, math, deterministic; size_t workspace; float ms; } record;

/* The record of key at path, when it is whole (cache_file.h) and sane. */
static bool cache_read(const char *path, const char *key, record *r)
{
    char body[4096];
    if (!tf_record_read(path, HEADER, key, body, sizeof body)) return false;
    int end = 0;
    if (sscanf(body, "algo: %d\nmath: %d\ndeterministic: %d\nworkspace: %zu\nms: %f\n%n", &r->algo, &r->math, &r->deterministic,
               &r->workspace, &r->ms, &end) != 5 || end <= 0 || body[end])
        return false;
    return r->algo >= 0 && r->algo < ALGOS && r->math >= 0 && r->math <= CUDNN_FMA_MATH;
}

static void cache_write(const char *path, const char *key, const record *r, const void *tag)
{
    char body[1024];
    snprintf(body, sizeof body, "algo: %d\nmath: %d\ndeterministic: %d\nworkspace: %zu\nms: %.9g\n", r->algo, r->math, r->deterministic,
             r->workspace, (double)r->ms);
    tf_record_write(path, HEADER, key, body, tag);
}

/* ---- plans ---- */

void tf_conv_free(const tf_cuda_libs *l, tf_conv *c)
{
    if (!c) return;
    if (c->xd) l->dnn.DestroyTensorDescriptor(c->xd);
    if (c->yd) l->dnn.DestroyTensorDescriptor(c->yd);
    if (c->wd) l->dnn.DestroyFilterDescriptor(c->wd);
    if (c->cd) l->dnn.DestroyConvolutionDescriptor(c->cd);
    c->xd = c->yd = NULL;
    c->wd = NULL;
    c->cd = NULL;
}

/* The workspace algo needs with the descriptors as they are. */
static tf_cuda_status workspace_of(const tf_cuda_libs *l, tf_cudnn_handle h, const tf_conv *c, int algo, size_t *bytes, char *err,
                                   size_t n)
{
    *bytes = 0;
    switch (c->dir) {
    case TF_CONV_FORWARD: return DNN_CALL(GetConvolutionForwardWorkspaceSize, (h, c->xd, c->wd, c->cd, c->yd, algo, bytes));
    case TF_CONV_GRAD_INPUT: return DNN_CALL(GetConvolutionBackwardDataWorkspaceSize, (h, c->wd, c->yd, c->cd, c->xd, algo, bytes));
    case TF_CONV_GRAD_WEIGHT: return DNN_CALL(GetConvolutionBackwardFilterWorkspaceSize, (h, c->xd, c->yd, c->cd, c->wd, algo, bytes));
    }
    return TF_CUDA_ERR_ARG;
}

/* Take algo with math type math when cuDNN says it runs the case within
 * the workspace allowed. */
static bool take(const tf_cuda_libs *l, tf_cudnn_handle h, const tf_conv_desc *d, tf_conv *c, int algo, int math)
{
    char why[256];
    size_t ws = 0;
    if (l->dnn.SetConvolutionMathType(c->cd, math) || workspace_of(l, h, c, algo, &ws, why, sizeof why) || ws > d->max_workspace)
        return false;
    c->algo = algo;
    c->math = math;
    c->workspace = ws;
    return true;
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

static tf_cuda_status check_desc(const tf_conv_desc *d, char *err, size_t n)
{
    int64_t v[] = {d->N, d->C, d->H, d->W, d->O, d->KH, d->KW, d->Ho, d->Wo, d->stride[0], d->stride[1], d->dilation[0], d->dilation[1], d->groups};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        if (v[i] < 1 || !fits_int(v[i])) {
            snprintf(err, n, "a convolution with a size, stride, dilation or group count of %lld is outside what cuDNN takes",
                     (long long)v[i]);
            return TF_CUDA_ERR_ARG;
        }
    if (!fits_int(d->pad[0]) || !fits_int(d->pad[1]) || d->C % d->groups || d->O % d->groups) {
        snprintf(err, n, "a convolution with padding [%lld, %lld], %lld input and %lld output channels in %lld groups is not one "
                 "cuDNN takes", (long long)d->pad[0], (long long)d->pad[1], (long long)d->C, (long long)d->O, (long long)d->groups);
        return TF_CUDA_ERR_ARG;
    }
    /* cuDNN's 4-d descriptors take int strides: every tensor below 2^31 elements */
    double nx = (double)d->N * (double)d->C * (double)d->H * (double)d->W, ny = (double)d->N * (double)d->O * (double)d->Ho * (double)d->Wo,
           nw = (double)d->O * (double)(d->C / d->groups) * (double)d->KH * (double)d->KW;
    if (nx > INT_MAX || ny > INT_MAX || nw > INT_MAX) {
        snprintf(err, n, "a convolution over tensors of %.0f, %.0f and %.0f elements: cuDNN's 4-d descriptors take fewer than 2^31 each",
                 nx, nw, ny);
        return TF_CUDA_ERR_ARG;
    }
    for (int a = 0; a < 2; a++) {
        int64_t in = a ? d->W : d->H, k = a ? d->KW : d->KH, out = a ? d->Wo : d->Ho;
        int64_t span = (k - 1) * d->dilation[a] + 1;
        if (in + 2 * d->pad[a] < span || (in + 2 * d->pad[a] - span) / d->stride[a] + 1 != out) {
            snprintf(err, n, "a convolution whose output %s %lld is not what input %lld, kernel %lld, stride %lld, padding %lld and "
                     "dilation %lld give", a ? "width" : "height", (long long)out, (long long)in, (long long)k,
                     (long long)d->stride[a], (long long)d->pad[a], (long long)d->dilation[a]);
            return TF_CUDA_ERR_ARG;
        }
    }
    return TF_CUDA_OK;
}

static tf_cuda_status find(const tf_cuda_libs *l, tf_cudnn_handle h, const tf_conv_desc *d, tf_conv *c, tf_cudnn_algo_perf *perf,
                           int *got, char *err, size_t n)
{
    void *x = ptr(d->x), *w = ptr(d->w), *y = ptr(d->y), *ws = d->max_workspace ? ptr(d->ws) : NULL;
    switch (d->dir) {
    case TF_CONV_FORWARD:
        return DNN_CALL(FindConvolutionForwardAlgorithmEx, (h, c->xd, x, c->wd, w, c->cd, c->yd, y, ALGOS, got, perf, ws, d->max_workspace));
    case TF_CONV_GRAD_INPUT:
        return DNN_CALL(FindConvolutionBackwardDataAlgorithmEx, (h, c->wd, w, c->yd, y, c->cd, c->xd, x, ALGOS, got, perf, ws, d->max_workspace));
    case TF_CONV_GRAD_WEIGHT:
        return DNN_CALL(FindConvolutionBackwardFilterAlgorithmEx,
                        (h, c->xd, x, c->yd, y, c->cd, c->wd, w, ALGOS, got, perf, ws, d->max_workspace));
    }
    return TF_CUDA_ERR_ARG;
}

static void describe(const tf_conv_desc *d, char *out, size_t n)
{
    snprintf(out, n, "%s %s conv2d of x [%lld, %lld, %lld, %lld], w [%lld, %lld, %lld, %lld], stride [%lld, %lld], padding [%lld, %lld], "
             "dilation [%lld, %lld], groups %lld", type_name(d->type), tf_conv_dir_name(d->dir), (long long)d->N, (long long)d->C,
             (long long)d->H, (long long)d->W, (long long)d->O, (long long)(d->C / (d->groups ? d->groups : 1)), (long long)d->KH,
             (long long)d->KW, (long long)d->stride[0], (long long)d->stride[1], (long long)d->pad[0], (long long)d->pad[1],
             (long long)d->dilation[0], (long long)d->dilation[1], (long long)d->groups);
}

tf_cuda_status tf_conv_plan(const tf_cuda_libs *l, tf_cudnn_handle h, const tf_conv_desc *d, tf_conv *c, char *err, size_t n)
{
    memset(c, 0, sizeof *c);
    c->dir = d->dir;
    c->algo = -1;
    if (!(l->loaded & TF_CUDA_LIB_CUDNN)) {
        snprintf(err, n, "cuDNN is not loaded: %s", l->cudnn_error[0] ? l->cudnn_error : "it was not asked for");
        return TF_CUDA_ERR_NOT_FOUND;
    }
    tf_cuda_status st = check_desc(d, err, n);
    if (st) return st;
    int dt = d->type == TF_CONV_F32 ? CUDNN_DATA_FLOAT : d->type == TF_CONV_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
    bool fma = d->type == TF_CONV_F32 && !d->tf32;   /* full fp32: no tensor cores whatever Find reports */
    int math = d->type != TF_CONV_F32 ? CUDNN_TENSOR_OP_MATH : fma ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
    st = DNN_CALL(CreateTensorDescriptor, (&c->xd));
    if (!st) st = DNN_CALL(SetTensor4dDescriptor, (c->xd, CUDNN_TENSOR_NCHW, dt, (int)d->N, (int)d->C, (int)d->H, (int)d->W));
    if (!st) st = DNN_CALL(CreateTensorDescriptor, (&c->yd));
    if (!st) st = DNN_CALL(SetTensor4dDescriptor, (c->yd, CUDNN_TENSOR_NCHW, dt, (int)d->N, (int)d->O, (int)d->Ho, (int)d->Wo));
    if (!st) st = DNN_CALL(CreateFilterDescriptor, (&c->wd));
    if (!st) st = DNN_CALL(SetFilter4dDescriptor, (c->wd, dt, CUDNN_TENSOR_NCHW, (int)d->O, (int)(d->C / d->groups), (int)d->KH, (int)d->KW));
    if (!st) st = DNN_CALL(CreateConvolutionDescriptor, (&c->cd));
    if (!st)   /* accumulate in fp32 for every operand type */
        st = DNN_CALL(SetConvolution2dDescriptor, (c->cd, (int)d->pad[0], (int)d->pad[1], (int)d->stride[0], (int)d->stride[1],
                                                   (int)d->dilation[0], (int)d->dilation[1], CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    if (!st && d->groups > 1) st = DNN_CALL(SetConvolutionGroupCount, (c->cd, (int)d->groups));
    if (!st) st = DNN_CALL(SetConvolutionMathType, (c->cd, math));
    if (st) {
        tf_conv_free(l, c);
        return st;
    }
    /* the cache */
    char key[1024], dir[4100];
    record rec;
    cache_key(l, d, math, key, sizeof key);
    if (tf_cache_dir_or(d->cache_dir, "cuda", dir, sizeof dir))
        snprintf(c->cache_file, sizeof c->cache_file, "%.4000s/%016llx.cudnn", dir, (unsigned long long)tf_fnv1a(TF_FNV_BASIS, key, strlen(key)));
    if (c->cache_file[0] && cache_read(c->cache_file, key, &rec) && take(l, h, d, c, rec.algo, fma ? CUDNN_FMA_MATH : rec.math)) {
        c->deterministic = rec.deterministic == CUDNN_DETERMINISTIC;
        c->ms = rec.ms;
        c->from_cache = true;
        return TF_CUDA_OK;
    }
    char what[512];
    describe(d, what, sizeof what);
    if (d->cached_only) {
        tf_conv_free(l, c);
        c->cache_miss = true;
        snprintf(err, n, "no cached cuDNN algorithm for the %s", what);
        return TF_CUDA_ERR_NOT_FOUND;
    }
    /* Find: every algorithm measured on the caller's buffers, fastest first */
    l->dnn.SetConvolutionMathType(c->cd, math);
    tf_cudnn_algo_perf perf[ALGOS];
    int got = 0;
    memset(perf, 0, sizeof perf);
    st = find(l, h, d, c, perf, &got, err, n);
    if (st) {
        size_t at = strlen(err);
        snprintf(err + at, n > at ? n - at : 0, " finding an algorithm for the %s", what);
        tf_conv_free(l, c);
        return st;
    }
    if (got > ALGOS) got = ALGOS;
    int pick = -1;
    for (int pass = 0; pass < 2 && pick < 0; pass++)   /* deterministic first */
        for (int i = 0; i < got && pick < 0; i++)
            if (perf[i].status == 0 && perf[i].memory <= d->max_workspace && (pass || perf[i].determinism == CUDNN_DETERMINISTIC) &&
                take(l, h, d, c, perf[i].algo, fma ? CUDNN_FMA_MATH : perf[i].math_type))
                pick = i;
    if (pick < 0) {
        int at = snprintf(err, n, "cuDNN has no algorithm for the %s within %zu bytes of workspace (", what, d->max_workspace);
        for (int i = 0; i < got && at > 0 && (size_t)at < n; i++)
            at += snprintf(err + at, n - (size_t)at, "%s%s: status %d, %zu bytes", i ? "; " : "", tf_conv_algo_name(d->dir, perf[i].algo),
                           perf[i].status, perf[i].memory);
        if (at > 0 && (size_t)at < n) snprintf(err + at, n - (size_t)at, "%s)", got ? "" : "none returned");
        tf_conv_free(l, c);
        return TF_CUDA_ERR_ARG;
    }
    c->deterministic = perf[pick].determinism == CUDNN_DETERMINISTIC;
    c->ms = perf[pick].time;
    rec = (record){c->algo, c->math, perf[pick].determinism, c->workspace, c->ms};
    if (c->cache_file[0]) cache_write(c->cache_file, key, &rec, c);
    return TF_CUDA_OK;
}

tf_cuda_status tf_conv_run(const tf_cuda_libs *l, tf_cudnn_handle h, const tf_conv *c, tf_cu_deviceptr x, tf_cu_deviceptr w,
                           tf_cu_deviceptr y, tf_cu_deviceptr ws, size_t ws_bytes, char *err, size_t n)
{
    const float one = 1.0f, zero = 0.0f;
    if (ws_bytes < c->workspace || (c->workspace && !ws)) {
        snprintf(err, n, "cuDNN's %s algorithm %s needs %zu bytes of workspace, %zu were given", tf_conv_dir_name(c->dir),
                 tf_conv_algo_name(c->dir, c->algo), c->workspace, ws ? ws_bytes : 0);
        return TF_CUDA_ERR_ARG;
    }
    void *wsp = c->workspace ? ptr(ws) : NULL;
    switch (c->dir) {
    case TF_CONV_FORWARD:
        return DNN_CALL(ConvolutionForward, (h, &one, c->xd, ptr(x), c->wd, ptr(w), c->cd, c->algo, wsp, c->workspace, &zero, c->yd, ptr(y)));
    case TF_CONV_GRAD_INPUT:
        return DNN_CALL(ConvolutionBackwardData,
                        (h, &one, c->wd, ptr(w), c->yd, ptr(y), c->cd, c->algo, wsp, c->workspace, &zero, c->xd, ptr(x)));
    case TF_CONV_GRAD_WEIGHT:
        return DNN_CALL(ConvolutionBackwardFilter,
                        (h, &one, c->xd, ptr(x), c->yd, ptr(y), c->cd, c->algo, wsp, c->workspace, &zero, c->wd, ptr(w)));
    }
    snprintf(err, n, "a convolution of no known direction");
    return TF_CUDA_ERR_ARG;
}
