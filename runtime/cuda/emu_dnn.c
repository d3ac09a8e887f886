/* emu_dnn.c — cuDNN's convolution API on the host, for cuda-emu (emu.h):
 * every function of tf_cudnn_api, with cuDNN 9's statuses and the checks a
 * real cuDNN makes on its arguments.
 *
 *   - a handle, and each descriptor, is a small host struct (tf_malloc'd)
 *     with a tag, so that a descriptor of the wrong kind, a destroyed one or
 *     one never set is CUDNN_STATUS_BAD_PARAM rather than a crash;
 *   - tensors take any positive strides (SetTensor4dDescriptorEx; NCHW and
 *     NHWC for SetTensor4dDescriptor), filters are NCHW ([K, C, H, W]
 *     contiguous), data float, double, half or bfloat16 (x, w and y alike),
 *     the compute type float (also half for half data, double for double);
 *     convolution and cross-correlation modes, groups, dilation;
 *   - Find*Ex returns one algorithm with time 0: ALGO_WS (IMPLICIT_PRECOMP_GEMM
 *     forward, ALGO_1 backward) needing EMU_WORKSPACE bytes when that much
 *     workspace is offered, else algorithm 0 with none; like a real Find it
 *     overwrites the result operand (with 0xff bytes: NaN in every
 *     floating format), so a caller that expected it kept finds out;
 *     Get*WorkspaceSize says the same, and any other algorithm is
 *     CUDNN_STATUS_NOT_SUPPORTED;
 *   - the three convolutions compute on the host from the descriptors and
 *     the pointers (a device pointer is a host address), each through
 *     tf_cuda_emu_submit on the handle's stream (cudnnSetStream), so graph
 *     capture records them: every product is exact in double, the sums are
 *     double, out = alpha * sum + beta * out (out is not read when beta is
 *     0, as in cuDNN), rounded once to the output's type to nearest even.
 *     The math type is checked and otherwise ignored: no TF32, no fp32
 *     accumulation, the exact result. ALGO_WS fills its workspace with 0xa5
 *     first, so that workspace shared with live data shows. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "emu.h"

enum {
    EMU_VERSION = 91900,         /* the cuDNN whose headers it mirrors */
    EMU_WORKSPACE = 4096,        /* what ALGO_WS needs */
    ALGO_WS = 1,
    /* cudnnStatus_t (cuDNN 9) */
    ST_OK = 0, ST_NOT_INITIALIZED = 1001, ST_BAD_PARAM = 2000, ST_BAD_PARAM_NULL_POINTER = 2002, ST_NOT_SUPPORTED = 3000,
    ST_HOST_ALLOC = 4003, ST_EXECUTION_FAILED = 5000,
    /* cudnnDataType_t, cudnnTensorFormat_t, cudnnConvolutionMode_t, cudnnMathType_t */
    DT_FLOAT = 0, DT_DOUBLE = 1, DT_HALF = 2, DT_BFLOAT16 = 9,
    FMT_NCHW = 0, FMT_NHWC = 1,
    MODE_CONVOLUTION = 0, MODE_CROSS_CORRELATION = 1,
    MATH_MAX = 3,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
};

enum { TAG_HANDLE = 0x444e4e48, TAG_TENSOR = 0x444e4e54, TAG_FILTER = 0x444e4e46, TAG_CONV = 0x444e4e43 };

typedef struct emu_handle { uint32_t tag; tf_cu_stream stream; } emu_handle;
typedef struct emu_tensor { uint32_t tag; bool set; int dtype; int64_t n, c, h, w, ns, cs, hs, ws; } emu_tensor;
typedef struct emu_filter { uint32_t tag; bool set; int dtype; int64_t k, c, h, w; } emu_filter;
typedef struct emu_conv {
    uint32_t tag;
    bool set;
    int64_t pad[2], stride[2], dil[2];
    int mode, compute, math, groups;
} emu_conv;

static emu_handle *H(tf_cudnn_handle h) { emu_handle *e = (emu_handle *)h; return e && e->tag == TAG_HANDLE ? e : NULL; }
static emu_tensor *T(tf_cudnn_tensor t) { emu_tensor *e = (emu_tensor *)t; return e && e->tag == TAG_TENSOR ? e : NULL; }
static emu_filter *F(tf_cudnn_filter f) { emu_filter *e = (emu_filter *)f; return e && e->tag == TAG_FILTER ? e : NULL; }
static emu_conv *C(tf_cudnn_conv c) { emu_conv *e = (emu_conv *)c; return e && e->tag == TAG_CONV ? e : NULL; }

static bool known_type(int t) { return t == DT_FLOAT || t == DT_DOUBLE || t == DT_HALF || t == DT_BFLOAT16; }
static int type_bytes(int t) { return t == DT_DOUBLE ? 8 : t == DT_FLOAT ? 4 : 2; }

/* ---- 16-bit formats: exact decoding, encoding rounded to nearest even ---- */

static double decode16(uint16_t b, int man, int ebits)
{
    int bias = (1 << (ebits - 1)) - 1, e = (b >> man) & ((1 << ebits) - 1);
    uint32_t m = b & ((1u << man) - 1);
    double v;
    if (e == (1 << ebits) - 1) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, 1 - bias - man);
    else v = ldexp((double)(m | (1u << man)), e - bias - man);
    return (b & 0x8000) ? -v : v;
}

/* v in a 16-bit binary format with man fraction bits and ebits exponent
 * bits, rounded once, to nearest even, straight from the double. */
static uint16_t encode16(double v, int man, int ebits)
{
    int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias, emax = bias;
    uint16_t sign = signbit(v) ? 0x8000 : 0, inf = (uint16_t)(((1u << ebits) - 1) << man);
    if (isnan(v)) return (uint16_t)(sign | inf | (1u << (man - 1)));
    double a = fabs(v);
    if (isinf(a)) return sign | inf;
    if (a == 0) return sign;
    int e;
    frexp(a, &e);
    int ex = e - 1 < emin ? emin : e - 1;           /* a = 1.f * 2^(e-1); below emin the quantum stays that of emin */
    double q = ldexp(1.0, ex - man);                 /* the spacing of the format at a's exponent */
    double r = nearbyint(a / q) * q;                 /* a / q is exact; nearbyint rounds half to even */
    if (r >= ldexp(1.0, emax + 1)) return sign | inf;
    if (r == 0) return sign;
    frexp(r, &e);
    if (e - 1 < emin) return (uint16_t)(sign | (uint16_t)(r / ldexp(1.0, emin - man)));   /* subnormal */
    uint32_t mant = (uint32_t)(r / ldexp(1.0, e - 1 - man)) - (1u << man);
    return (uint16_t)(sign | (uint32_t)(e - 1 + bias) << man | mant);
}

static double load(int dt, const void *p, int64_t i)
{
    switch (dt) {
    case DT_FLOAT: { float f; memcpy(&f, (const char *)p + i * 4, 4); return f; }
    case DT_DOUBLE: { double d; memcpy(&d, (const char *)p + i * 8, 8); return d; }
    default: {
        uint16_t b;
        memcpy(&b, (const char *)p + i * 2, 2);
        return dt == DT_HALF ? decode16(b, 10, 5) : decode16(b, 7, 8);
    }
    }
}

static void store(int dt, void *p, int64_t i, double v)
{
    switch (dt) {
    case DT_FLOAT: { float f = (float)v; memcpy((char *)p + i * 4, &f, 4); return; }   /* C's conversion: to nearest even */
    case DT_DOUBLE: memcpy((char *)p + i * 8, &v, 8); return;
    default: {
        uint16_t b = dt == DT_HALF ? encode16(v, 10, 5) : encode16(v, 7, 8);
        memcpy((char *)p + i * 2, &b, 2);
        return;
    }
    }
}

/* ---- the library's own ---- */

static size_t emu_GetVersion(void) { return EMU_VERSION; }

static const char *emu_GetErrorString(tf_cudnn_status s)
{
    switch (s) {
    case ST_OK: return "CUDNN_STATUS_SUCCESS";
    case ST_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case ST_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case ST_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case ST_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case ST_HOST_ALLOC: return "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED";
    case ST_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_UNKNOWN (cuda-emu)";
    }
}

static tf_cudnn_status emu_Create(tf_cudnn_handle *h)
{
    if (!h) return ST_BAD_PARAM_NULL_POINTER;
    emu_handle *e = tf_calloc(1, sizeof *e);
    if (!e) return ST_HOST_ALLOC;
    e->tag = TAG_HANDLE;
    *h = (tf_cudnn_handle)e;
    return ST_OK;
}

static tf_cudnn_status emu_Destroy(tf_cudnn_handle h)
{
    emu_handle *e = H(h);
    if (!e) return ST_BAD_PARAM;
    e->tag = 0;
    tf_free(e);
    return ST_OK;
}

static tf_cudnn_status emu_SetStream(tf_cudnn_handle h, tf_cu_stream s)
{
    emu_handle *e = H(h);
    if (!e) return ST_BAD_PARAM;
    e->stream = s;
    return ST_OK;
}

/* ---- descriptors ---- */

static tf_cudnn_status emu_CreateTensorDescriptor(tf_cudnn_tensor *d)
{
    if (!d) return ST_BAD_PARAM_NULL_POINTER;
    emu_tensor *e = tf_calloc(1, sizeof *e);
    if (!e) return ST_HOST_ALLOC;
    e->tag = TAG_TENSOR;
    *d = (tf_cudnn_tensor)e;
    return ST_OK;
}

static tf_cudnn_status emu_SetTensor4dDescriptorEx(tf_cudnn_tensor d, int dt, int n, int c, int h, int w, int ns, int cs, int hs, int ws)
{
    emu_tensor *e = T(d);
    if (!e || n < 1 || c < 1 || h < 1 || w < 1 || ns < 1 || cs < 1 || hs < 1 || ws < 1) return ST_BAD_PARAM;
    if (!known_type(dt)) return ST_NOT_SUPPORTED;
    *e = (emu_tensor){TAG_TENSOR, true, dt, n, c, h, w, ns, cs, hs, ws};
    return ST_OK;
}

static tf_cudnn_status emu_SetTensor4dDescriptor(tf_cudnn_tensor d, int format, int dt, int n, int c, int h, int w)
{
    if (format != FMT_NCHW && format != FMT_NHWC) return ST_BAD_PARAM;
    if (n < 1 || c < 1 || h < 1 || w < 1 || (double)n * c * h * w > INT32_MAX) return ST_BAD_PARAM;
    if (format == FMT_NCHW) return emu_SetTensor4dDescriptorEx(d, dt, n, c, h, w, c * h * w, h * w, w, 1);
    return emu_SetTensor4dDescriptorEx(d, dt, n, c, h, w, h * w * c, 1, w * c, c);
}

static tf_cudnn_status emu_DestroyTensorDescriptor(tf_cudnn_tensor d)
{
    emu_tensor *e = T(d);
    if (!e) return d ? ST_BAD_PARAM : ST_OK;
    e->tag = 0;
    tf_free(e);
    return ST_OK;
}

static tf_cudnn_status emu_CreateFilterDescriptor(tf_cudnn_filter *d)
{
    if (!d) return ST_BAD_PARAM_NULL_POINTER;
    emu_filter *e = tf_calloc(1, sizeof *e);
    if (!e) return ST_HOST_ALLOC;
    e->tag = TAG_FILTER;
    *d = (tf_cudnn_filter)e;
    return ST_OK;
}

static tf_cudnn_status emu_SetFilter4dDescriptor(tf_cudnn_filter d, int dt, int format, int k, int c, int h, int w)
{
    emu_filter *e = F(d);
    if (!e || k < 1 || c < 1 || h < 1 || w < 1 || (double)k * c * h * w > INT32_MAX) return ST_BAD_PARAM;
    if (!known_type(dt) || format != FMT_NCHW) return ST_NOT_SUPPORTED;
    *e = (emu_filter){TAG_FILTER, true, dt, k, c, h, w};
    return ST_OK;
}

static tf_cudnn_status emu_DestroyFilterDescriptor(tf_cudnn_filter d)
{
    emu_filter *e = F(d);
    if (!e) return d ? ST_BAD_PARAM : ST_OK;
    e->tag = 0;
    tf_free(e);
    return ST_OK;
}

static tf_cudnn_status emu_CreateConvolutionDescriptor(tf_cudnn_conv *d)
{
    if (!d) return ST_BAD_PARAM_NULL_POINTER;
    emu_conv *e = tf_calloc(1, sizeof *e);
    if (!e) return ST_HOST_ALLOC;
    e->tag = TAG_CONV;
    e->groups = 1;
    *d = (tf_cudnn_conv)e;
    return ST_OK;
}

static tf_cudnn_status emu_SetConvolution2dDescriptor(tf_cudnn_conv d, int ph, int pw, int sh, int sw, int dh, int dw, int mode, int compute)
{
    emu_conv *e = C(d);
    if (!e || ph < 0 || pw < 0 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || (mode != MODE_CONVOLUTION && mode != MODE_CROSS_CORRELATION))
        return ST_BAD_PARAM;
    if (!known_type(compute)) return ST_NOT_SUPPORTED;
    e->pad[0] = ph, e->pad[1] = pw, e->stride[0] = sh, e->stride[1] = sw, e->dil[0] = dh, e->dil[1] = dw;
    e->mode = mode;
    e->compute = compute;
    e->set = true;
    return ST_OK;
}

static tf_cudnn_status emu_SetConvolutionMathType(tf_cudnn_conv d, int math)
{
    emu_conv *e = C(d);
    if (!e || math < 0 || math > MATH_MAX) return ST_BAD_PARAM;
    e->math = math;
    return ST_OK;
}

static tf_cudnn_status emu_SetConvolutionGroupCount(tf_cudnn_conv d, int groups)
{
    emu_conv *e = C(d);
    if (!e || groups < 1) return ST_BAD_PARAM;
    e->groups = groups;
    return ST_OK;
}

static tf_cudnn_status emu_DestroyConvolutionDescriptor(tf_cudnn_conv d)
{
    emu_conv *e = C(d);
    if (!e) return d ? ST_BAD_PARAM : ST_OK;
    e->tag = 0;
    tf_free(e);
    return ST_OK;
}

/* ---- convolutions ---- */

typedef enum dir { FWD, BWD_DATA, BWD_FILTER } dir;

/* One convolution, by value: what a recorded graph replays needs no
 * descriptor to outlive the call. */
typedef struct conv_work {
    dir dir;
    emu_tensor x, y;
    emu_filter w;
    emu_conv cv;
    const void *xp, *wp, *yp;    /* the operands; the result is out */
    void *out;
    double alpha, beta;
    int algo;
    void *ws;
} conv_work;

/* Whether x, w, y and the convolution make one problem cuDNN runs. */
static tf_cudnn_status check(const emu_tensor *x, const emu_filter *w, const emu_conv *cv, const emu_tensor *y)
{
    if (!x || !w || !cv || !y || !x->set || !w->set || !cv->set || !y->set) return ST_BAD_PARAM;
    if (x->dtype != w->dtype || x->dtype != y->dtype) return ST_BAD_PARAM;
    int dt = x->dtype, ct = cv->compute;
    bool ok = dt == DT_DOUBLE ? ct == DT_DOUBLE : dt == DT_HALF ? ct == DT_FLOAT || ct == DT_HALF : ct == DT_FLOAT;
    if (!ok) return ST_NOT_SUPPORTED;
    int64_t g = cv->groups;
    if (x->c != w->c * g || w->k % g || y->n != x->n || y->c != w->k) return ST_BAD_PARAM;
    int64_t in[2] = {x->h, x->w}, k[2] = {w->h, w->w}, out[2] = {y->h, y->w};
    for (int a = 0; a < 2; a++) {
        int64_t span = (k[a] - 1) * cv->dil[a] + 1;
        if (in[a] + 2 * cv->pad[a] < span || (in[a] + 2 * cv->pad[a] - span) / cv->stride[a] + 1 != out[a]) return ST_BAD_PARAM;
    }
    return ST_OK;
}

/* Element (n, c, h, w) of a tensor, by its strides. */
static int64_t at(const emu_tensor *t, int64_t n, int64_t c, int64_t h, int64_t w) { return n * t->ns + c * t->cs + h * t->hs + w * t->ws; }

static int run_conv(void *arg)
{
    const conv_work *j = arg;
    const emu_tensor *x = &j->x, *y = &j->y;
    const emu_filter *w = &j->w;
    const emu_conv *cv = &j->cv;
    int dt = x->dtype;
    int64_t G = cv->groups, Cg = w->c, Og = w->k / G;
    int64_t count = j->dir == FWD ? y->n * y->c * y->h * y->w : j->dir == BWD_DATA ? x->n * x->c * x->h * x->w : w->k * w->c * w->h * w->w;
    double *acc = tf_calloc((size_t)count, sizeof *acc);
    if (!acc) return CUDA_ERROR_OUT_OF_MEMORY;
    if (j->algo == ALGO_WS) memset(j->ws, 0xa5, EMU_WORKSPACE);   /* the algorithm's scratch */
    bool flip = cv->mode == MODE_CONVOLUTION;
    for (int64_t n = 0; n < x->n; n++)
        for (int64_t o = 0; o < w->k; o++) {
            int64_t c0 = (o / Og) * Cg;
            for (int64_t oh = 0; oh < y->h; oh++)
                for (int64_t ow = 0; ow < y->w; ow++) {
                    int64_t yi = at(y, n, o, oh, ow), ya = ((n * y->c + o) * y->h + oh) * y->w + ow;
                    double dy = j->dir == FWD ? 0 : load(dt, j->yp, yi), sum = 0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t kh = 0; kh < w->h; kh++) {
                            int64_t ih = oh * cv->stride[0] - cv->pad[0] + kh * cv->dil[0];
                            if (ih < 0 || ih >= x->h) continue;
                            for (int64_t kw = 0; kw < w->w; kw++) {
                                int64_t iw = ow * cv->stride[1] - cv->pad[1] + kw * cv->dil[1];
                                if (iw < 0 || iw >= x->w) continue;
                                int64_t wa = ((o * Cg + c) * w->h + (flip ? w->h - 1 - kh : kh)) * w->w + (flip ? w->w - 1 - kw : kw);
                                int64_t xi = at(x, n, c0 + c, ih, iw);
                                if (j->dir == FWD) sum += load(dt, j->xp, xi) * load(dt, j->wp, wa);
                                else if (j->dir == BWD_DATA) acc[((n * x->c + c0 + c) * x->h + ih) * x->w + iw] += dy * load(dt, j->wp, wa);
                                else acc[wa] += dy * load(dt, j->xp, xi);
                            }
                        }
                    if (j->dir == FWD) acc[ya] = sum;
                }
        }
    /* out = alpha * acc + beta * out, in the result's layout */
    for (int64_t i = 0; i < count; i++) {
        int64_t oi;
        if (j->dir == BWD_FILTER) {
            oi = i;
        } else {
            const emu_tensor *t = j->dir == FWD ? y : x;
            int64_t ww = i % t->w, hh = i / t->w % t->h, cc = i / (t->w * t->h) % t->c, nn = i / (t->w * t->h * t->c);
            oi = at(t, nn, cc, hh, ww);
        }
        double v = j->alpha * acc[i];
        if (j->beta != 0) v += j->beta * load(dt, j->out, oi);
        store(dt, j->out, oi, v);
    }
    tf_free(acc);
    return 0;
}

/* The number of bytes a tensor's elements span (the largest offset + 1). */
static size_t span_bytes(const emu_tensor *t)
{
    int64_t last = (t->n - 1) * t->ns + (t->c - 1) * t->cs + (t->h - 1) * t->hs + (t->w - 1) * t->ws;
    return (size_t)(last + 1) * (size_t)type_bytes(t->dtype);
}

static size_t filter_bytes(const emu_filter *f) { return (size_t)(f->k * f->c * f->h * f->w) * (size_t)type_bytes(f->dtype); }

static tf_cudnn_status workspace_of(int algo, size_t *bytes)
{
    if (!bytes) return ST_BAD_PARAM_NULL_POINTER;
    if (algo != 0 && algo != ALGO_WS) return ST_NOT_SUPPORTED;
    *bytes = algo == ALGO_WS ? EMU_WORKSPACE : 0;
    return ST_OK;
}

/* Find*Ex: one algorithm, measured at 0 ms; the result operand overwritten. */
static tf_cudnn_status find(emu_handle *h, const emu_tensor *x, const emu_filter *w, const emu_conv *cv, const emu_tensor *y,
                            void *result, size_t result_bytes, const void *a, const void *b, int requested, int *returned,
                            tf_cudnn_algo_perf *perf, void *ws, size_t ws_bytes)
{
    if (!h) return ST_BAD_PARAM;
    tf_cudnn_status st = check(x, w, cv, y);
    if (st) return st;
    if (!returned || !perf || !result || !a || !b) return ST_BAD_PARAM_NULL_POINTER;
    if (requested < 1) return ST_BAD_PARAM;
    bool room = ws && ws_bytes >= EMU_WORKSPACE;
    memset(result, 0xff, result_bytes);
    memset(perf, 0, sizeof *perf);
    perf->algo = room ? ALGO_WS : 0;
    perf->status = ST_OK;
    perf->time = 0;
    perf->memory = room ? EMU_WORKSPACE : 0;
    perf->determinism = 1;
    perf->math_type = cv->math;
    *returned = 1;
    return ST_OK;
}

static tf_cudnn_status emu_FindConvolutionForwardAlgorithmEx(tf_cudnn_handle h, tf_cudnn_tensor xd, const void *x, tf_cudnn_filter wd,
                                                             const void *w, tf_cudnn_conv cd, tf_cudnn_tensor yd, void *y, int requested,
                                                             int *returned, tf_cudnn_algo_perf *perf, void *ws, size_t ws_bytes)
{
    emu_tensor *yt = T(yd);
    return find(H(h), T(xd), F(wd), C(cd), yt, y, yt && yt->set ? span_bytes(yt) : 0, x, w, requested, returned, perf, ws, ws_bytes);
}

static tf_cudnn_status emu_FindConvolutionBackwardDataAlgorithmEx(tf_cudnn_handle h, tf_cudnn_filter wd, const void *w,
                                                                  tf_cudnn_tensor dyd, const void *dy, tf_cudnn_conv cd,
                                                                  tf_cudnn_tensor dxd, void *dx, int requested, int *returned,
                                                                  tf_cudnn_algo_perf *perf, void *ws, size_t ws_bytes)
{
    emu_tensor *xt = T(dxd);
    return find(H(h), xt, F(wd), C(cd), T(dyd), dx, xt && xt->set ? span_bytes(xt) : 0, w, dy, requested, returned, perf, ws, ws_bytes);
}

static tf_cudnn_status emu_FindConvolutionBackwardFilterAlgorithmEx(tf_cudnn_handle h, tf_cudnn_tensor xd, const void *x,
                                                                    tf_cudnn_tensor dyd, const void *dy, tf_cudnn_conv cd,
                                                                    tf_cudnn_filter dwd, void *dw, int requested, int *returned,
                                                                    tf_cudnn_algo_perf *perf, void *ws, size_t ws_bytes)
{
    emu_filter *wf = F(dwd);
    return find(H(h), T(xd), wf, C(cd), T(dyd), dw, wf && wf->set ? filter_bytes(wf) : 0, x, dy, requested, returned, perf, ws, ws_bytes);
}

static tf_cudnn_status emu_GetConvolutionForwardWorkspaceSize(tf_cudnn_handle h, tf_cudnn_tensor xd, tf_cudnn_filter wd, tf_cudnn_conv cd,
                                                              tf_cudnn_tensor yd, int algo, size_t *bytes)
{
    tf_cudnn_status st = H(h) ? check(T(xd), F(wd), C(cd), T(yd)) : ST_BAD_PARAM;
    return st ? st : workspace_of(algo, bytes);
}

static tf_cudnn_status emu_GetConvolutionBackwardDataWorkspaceSize(tf_cudnn_handle h, tf_cudnn_filter wd, tf_cudnn_tensor dyd,
                                                                   tf_cudnn_conv cd, tf_cudnn_tensor dxd, int algo, size_t *bytes)
{
    tf_cudnn_status st = H(h) ? check(T(dxd), F(wd), C(cd), T(dyd)) : ST_BAD_PARAM;
    return st ? st : workspace_of(algo, bytes);
}

static tf_cudnn_status emu_GetConvolutionBackwardFilterWorkspaceSize(tf_cudnn_handle h, tf_cudnn_tensor xd, tf_cudnn_tensor dyd,
                                                                     tf_cudnn_conv cd, tf_cudnn_filter dwd, int algo, size_t *bytes)
{
    tf_cudnn_status st = H(h) ? check(T(xd), F(dwd), C(cd), T(dyd)) : ST_BAD_PARAM;
    return st ? st : workspace_of(algo, bytes);
}

/* Check a convolution call and hand it to the handle's stream. */
static tf_cudnn_status submit(tf_cudnn_handle hd, dir d, const void *alpha, const emu_tensor *x, const void *xp, const emu_filter *w,
                              const void *wp, const emu_conv *cv, int algo, void *ws, size_t ws_bytes, const void *beta,
                              const emu_tensor *y, const void *yp, void *out)
{
    emu_handle *h = H(hd);
    if (!h) return ST_BAD_PARAM;
    tf_cudnn_status st = check(x, w, cv, y);
    if (st) return st;
    if (!alpha || !beta || !xp || !wp || !yp) return ST_BAD_PARAM_NULL_POINTER;
    size_t need = 0;
    if ((st = workspace_of(algo, &need))) return st;
    if (need && (!ws || ws_bytes < need)) return ST_BAD_PARAM;
    conv_work j = {.dir = d, .x = *x, .y = *y, .w = *w, .cv = *cv, .xp = xp, .wp = wp, .yp = yp, .out = out, .algo = algo, .ws = ws};
    if (x->dtype == DT_DOUBLE) {
        memcpy(&j.alpha, alpha, sizeof j.alpha);
        memcpy(&j.beta, beta, sizeof j.beta);
    } else {
        float a, b;
        memcpy(&a, alpha, sizeof a);
        memcpy(&b, beta, sizeof b);
        j.alpha = a;
        j.beta = b;
    }
    int r = tf_cuda_emu_submit(h->stream, run_conv, &j, sizeof j);
    return r == 0 ? ST_OK : r == CUDA_ERROR_OUT_OF_MEMORY ? ST_HOST_ALLOC : ST_EXECUTION_FAILED;
}

static tf_cudnn_status emu_ConvolutionForward(tf_cudnn_handle h, const void *alpha, tf_cudnn_tensor xd, const void *x, tf_cudnn_filter wd,
                                              const void *w, tf_cudnn_conv cd, int algo, void *ws, size_t ws_bytes, const void *beta,
                                              tf_cudnn_tensor yd, void *y)
{
    return submit(h, FWD, alpha, T(xd), x, F(wd), w, C(cd), algo, ws, ws_bytes, beta, T(yd), y, y);
}

static tf_cudnn_status emu_ConvolutionBackwardData(tf_cudnn_handle h, const void *alpha, tf_cudnn_filter wd, const void *w,
                                                   tf_cudnn_tensor dyd, const void *dy, tf_cudnn_conv cd, int algo, void *ws,
                                                   size_t ws_bytes, const void *beta, tf_cudnn_tensor dxd, void *dx)
{
    return submit(h, BWD_DATA, alpha, T(dxd), dx, F(wd), w, C(cd), algo, ws, ws_bytes, beta, T(dyd), dy, dx);
}

static tf_cudnn_status emu_ConvolutionBackwardFilter(tf_cudnn_handle h, const void *alpha, tf_cudnn_tensor xd, const void *x,
                                                     tf_cudnn_tensor dyd, const void *dy, tf_cudnn_conv cd, int algo, void *ws,
                                                     size_t ws_bytes, const void *beta, tf_cudnn_filter dwd, void *dw)
{
    return submit(h, BWD_FILTER, alpha, T(xd), x, F(dwd), dw, C(cd), algo, ws, ws_bytes, beta, T(dyd), dy, dw);
}

void tf_cuda_emu_dnn_fill(tf_cudnn_api *api)
{
    memset(api, 0, sizeof *api);
    api->GetVersion = emu_GetVersion;
    api->GetErrorString = emu_GetErrorString;
    api->Create = emu_Create;
    api->Destroy = emu_Destroy;
    api->SetStream = emu_SetStream;
    api->CreateTensorDescriptor = emu_CreateTensorDescriptor;
    api->SetTensor4dDescriptor = emu_SetTensor4dDescriptor;
    api->SetTensor4dDescriptorEx = emu_SetTensor4dDescriptorEx;
    api->DestroyTensorDescriptor = emu_DestroyTensorDescriptor;
    api->CreateFilterDescriptor = emu_CreateFilterDescriptor;
    api->SetFilter4dDescriptor = emu_SetFilter4dDescriptor;
    api->DestroyFilterDescriptor = emu_DestroyFilterDescriptor;
    api->CreateConvolutionDescriptor = emu_CreateConvolutionDescriptor;
    api->SetConvolution2dDescriptor = emu_SetConvolution2dDescriptor;
    api->SetConvolutionMathType = emu_SetConvolutionMathType;
    api->SetConvolutionGroupCount = emu_SetConvolutionGroupCount;
    api->DestroyConvolutionDescriptor = emu_DestroyConvolutionDescriptor;
    api->FindConvolutionForwardAlgorithmEx = emu_FindConvolutionForwardAlgorithmEx;
    api->FindConvolutionBackwardDataAlgorithmEx = emu_FindConvolutionBackwardDataAlgorithmEx;
    api->FindConvolutionBackwardFilterAlgorithmEx = emu_FindConvolutionBackwardFilterAlgorithmEx;
    api->GetConvolutionForwardWorkspaceSize = emu_GetConvolutionForwardWorkspaceSize;
    api->GetConvolutionBackwardDataWorkspaceSize = emu_GetConvolutionBackwardDataWorkspaceSize;
    api->GetConvolutionBackwardFilterWorkspaceSize = emu_GetConvolutionBackwardFilterWorkspaceSize;
    api->ConvolutionForward = emu_ConvolutionForward;
    api->ConvolutionBackwardData = emu_ConvolutionBackwardData;
    api->ConvolutionBackwardFilter = emu_ConvolutionBackwardFilter;
}
