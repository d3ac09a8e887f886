/* test_cuda_dnn.c — convolution plans (runtime/cuda/dnn.c) over the cuDNN
 * stand-in (runtime/cuda/emu_dnn.c), on host buffers: no GPU, no cuDNN.
 *
 *   - every direction (forward, gradient of the input, of the weight) in
 *     f32, f16 and bf16, for shapes with stride 2 and per-axis strides,
 *     padding, dilation, non-square kernels, batches above 1, groups and a
 *     depthwise conv, against a double-precision reference written here in
 *     the gather form of each direction (not the interpreter's scatter
 *     form). Inputs are multiples of 1/8 in [-2, 2]: every product and sum
 *     is exact in double in any order, so the result rounded once to its
 *     type must match the reference bit for bit;
 *   - the reference against the interpreter's conv2d, conv2d_grad_input and
 *     conv2d_grad_weight through the public API (an .ir model on the interp
 *     target), bit for bit;
 *   - the stand-in itself where dnn.c does not reach: alpha and beta, strided
 *     tensors (SetTensor4dDescriptorEx), the convolution mode (kernel
 *     flipped), a result never read when beta is 0, its workspace checks
 *     and its argument checks;
 *   - the algorithm cache on disk: a second plan reads it (no Find), a
 *     different math type or GPU finds again, a corrupted or truncated file
 *     is ignored and rewritten, a cached choice needing more workspace than
 *     allowed is found again, cached_only says it missed, no temporary file
 *     is left, and the default place is $TFUSE_CACHE_DIR/cuda;
 *   - plans refused with a reason: cuDNN not loaded, sizes beyond int, a
 *     workspace smaller than the algorithm needs. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "dnn.h"
#include "emu.h"
#include "runtime.h"
#include "testutil.h"
#include "tfuse.h"

static tf_cuda_libs g_libs;
static tf_cudnn_handle g_h;
static tf_cudnn_api g_emu;   /* the stand-in's own functions, under the counting wrappers */
static int g_finds;
static uint64_t g_rng;

/* ---- Find, counted ---- */

static tf_cudnn_status count_fwd(tf_cudnn_handle h, tf_cudnn_tensor xd, const void *x, tf_cudnn_filter wd, const void *w,
                                 tf_cudnn_conv cd, tf_cudnn_tensor yd, void *y, int req, int *got, tf_cudnn_algo_perf *perf,
                                 void *ws, size_t wsb)
{
    g_finds++;
    return g_emu.FindConvolutionForwardAlgorithmEx(h, xd, x, wd, w, cd, yd, y, req, got, perf, ws, wsb);
}
static tf_cudnn_status count_bwd_data(tf_cudnn_handle h, tf_cudnn_filter wd, const void *w, tf_cudnn_tensor dyd, const void *dy,
                                      tf_cudnn_conv cd, tf_cudnn_tensor dxd, void *dx, int req, int *got, tf_cudnn_algo_perf *perf,
                                      void *ws, size_t wsb)
{
    g_finds++;
    return g_emu.FindConvolutionBackwardDataAlgorithmEx(h, wd, w, dyd, dy, cd, dxd, dx, req, got, perf, ws, wsb);
}
static tf_cudnn_status count_bwd_filter(tf_cudnn_handle h, tf_cudnn_tensor xd, const void *x, tf_cudnn_tensor dyd, const void *dy,
                                        tf_cudnn_conv cd, tf_cudnn_filter dwd, void *dw, int req, int *got, tf_cudnn_algo_perf *perf,
                                        void *ws, size_t wsb)
{
    g_finds++;
    return g_emu.FindConvolutionBackwardFilterAlgorithmEx(h, xd, x, dyd, dy, cd, dwd, dw, req, got, perf, ws, wsb);
}

/* ---- cases and the reference ---- */

typedef struct ccase {
    int64_t N, C, H, W, O, KH, KW, s[2], p[2], d[2], g;
} ccase;

static const ccase cases[] = {
    {1, 1, 5, 5, 1, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1},    /* the plainest */
    {2, 3, 7, 6, 4, 3, 2, {2, 2}, {1, 1}, {1, 1}, 1},    /* stride 2, padding, a 3x2 kernel, batch 2 */
    {3, 4, 9, 8, 6, 2, 3, {2, 1}, {0, 2}, {2, 1}, 2},    /* per-axis stride, padding and dilation; 2 groups */
    {2, 6, 5, 5, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 6},    /* depthwise */
    {4, 2, 6, 10, 3, 1, 5, {1, 3}, {0, 2}, {1, 1}, 1},   /* a 1x5 kernel, batch 4 */
    {2, 4, 7, 6, 6, 3, 3, {2, 2}, {1, 1}, {1, 2}, 2},    /* target_cases.h's conv */
};
enum { NCASES = sizeof cases / sizeof *cases };

static int64_t out_dim(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) { return (in + 2 * p - (k - 1) * d - 1) / s + 1; }
static int64_t Ho(const ccase *k) { return out_dim(k->H, k->KH, k->s[0], k->p[0], k->d[0]); }
static int64_t Wo(const ccase *k) { return out_dim(k->W, k->KW, k->s[1], k->p[1], k->d[1]); }
static int64_t nx(const ccase *k) { return k->N * k->C * k->H * k->W; }
static int64_t nw(const ccase *k) { return k->O * (k->C / k->g) * k->KH * k->KW; }
static int64_t ny(const ccase *k) { return k->N * k->O * Ho(k) * Wo(k); }

/* Multiples of 1/8 in [-2, 2]: exact in every format here. */
static void fill(double *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) v[i] = (double)((int)(test_rnd(&g_rng) * 33) - 16) / 8;
}

/* The definition of each direction, as a gather over its result. */
static void reference(const ccase *k, tf_conv_dir dir, const double *x, const double *w, const double *dy, double *out)
{
    int64_t Cg = k->C / k->g, Og = k->O / k->g, oh_n = Ho(k), ow_n = Wo(k);
#define X(n, c, h, ww) x[(((n) * k->C + (c)) * k->H + (h)) * k->W + (ww)]
#define WT(o, c, h, ww) w[(((o) * Cg + (c)) * k->KH + (h)) * k->KW + (ww)]
#define DY(n, o, h, ww) dy[(((n) * k->O + (o)) * oh_n + (h)) * ow_n + (ww)]
    if (dir == TF_CONV_FORWARD) {
        for (int64_t n = 0; n < k->N; n++)
            for (int64_t o = 0; o < k->O; o++)
                for (int64_t oh = 0; oh < oh_n; oh++)
                    for (int64_t ow = 0; ow < ow_n; ow++) {
                        double s = 0;
                        for (int64_t c = 0; c < Cg; c++)
                            for (int64_t kh = 0; kh < k->KH; kh++)
                                for (int64_t kw = 0; kw < k->KW; kw++) {
                                    int64_t ih = oh * k->s[0] - k->p[0] + kh * k->d[0], iw = ow * k->s[1] - k->p[1] + kw * k->d[1];
                                    if (ih >= 0 && ih < k->H && iw >= 0 && iw < k->W) s += X(n, o / Og * Cg + c, ih, iw) * WT(o, c, kh, kw);
                                }
                        *out++ = s;
                    }
    } else if (dir == TF_CONV_GRAD_INPUT) {
        for (int64_t n = 0; n < k->N; n++)
            for (int64_t ci = 0; ci < k->C; ci++)
                for (int64_t ih = 0; ih < k->H; ih++)
                    for (int64_t iw = 0; iw < k->W; iw++) {
                        double s = 0;
                        int64_t g = ci / Cg;
                        for (int64_t o = g * Og; o < (g + 1) * Og; o++)
                            for (int64_t kh = 0; kh < k->KH; kh++)
                                for (int64_t kw = 0; kw < k->KW; kw++) {
                                    int64_t th = ih + k->p[0] - kh * k->d[0], tw = iw + k->p[1] - kw * k->d[1];
                                    if (th < 0 || tw < 0 || th % k->s[0] || tw % k->s[1]) continue;
                                    int64_t oh = th / k->s[0], ow = tw / k->s[1];
                                    if (oh < oh_n && ow < ow_n) s += DY(n, o, oh, ow) * WT(o, ci - g * Cg, kh, kw);
                                }
                        *out++ = s;
                    }
    } else {
        for (int64_t o = 0; o < k->O; o++)
            for (int64_t c = 0; c < Cg; c++)
                for (int64_t kh = 0; kh < k->KH; kh++)
                    for (int64_t kw = 0; kw < k->KW; kw++) {
                        double s = 0;
                        for (int64_t n = 0; n < k->N; n++)
                            for (int64_t oh = 0; oh < oh_n; oh++)
                                for (int64_t ow = 0; ow < ow_n; ow++) {
                                    int64_t ih = oh * k->s[0] - k->p[0] + kh * k->d[0], iw = ow * k->s[1] - k->p[1] + kw * k->d[1];
                                    if (ih >= 0 && ih < k->H && iw >= 0 && iw < k->W) s += X(n, o / Og * Cg + c, ih, iw) * DY(n, o, oh, ow);
                                }
                        *out++ = s;
                    }
    }
#undef X
#undef WT
#undef DY
}

static tf_dt dt_of(tf_conv_type t) { return t == TF_CONV_F32 ? TF_DT_F32 : t == TF_CONV_F16 ? TF_DT_F16 : TF_DT_BF16; }
static const char *type_name(tf_conv_type t) { return t == TF_CONV_F32 ? "f32" : t == TF_CONV_F16 ? "f16" : "bf16"; }

static void *to_storage(tf_dt t, const double *v, int64_t n)
{
    void *b = malloc((size_t)n * (size_t)tf_dtype_bytes(t));
    for (int64_t i = 0; i < n; i++) tf_elem_store(t, b, i, v[i]);
    return b;
}

static tf_conv_desc desc_of(const ccase *k, tf_conv_dir dir, tf_conv_type t, const char *cache)
{
    tf_conv_desc d;
    memset(&d, 0, sizeof d);
    d.dir = dir;
    d.type = t;
    d.N = k->N, d.C = k->C, d.H = k->H, d.W = k->W, d.O = k->O, d.KH = k->KH, d.KW = k->KW, d.Ho = Ho(k), d.Wo = Wo(k);
    for (int a = 0; a < 2; a++) d.stride[a] = k->s[a], d.pad[a] = k->p[a], d.dilation[a] = k->d[a];
    d.groups = k->g;
    d.tf32 = true;
    d.gpu = "cuda-emu";
    d.cache_dir = cache;
    return d;
}

static unsigned char g_ws[1 << 16];   /* the "device" workspace */

/* Plan and run one direction; compare with the reference, bit for bit. */
static void run_case(const ccase *k, int ki, tf_conv_dir dir, tf_conv_type t, const char *cache)
{
    tf_dt dt = dt_of(t);
    int64_t n_x = nx(k), n_w = nw(k), n_y = ny(k);
    double *x = malloc((size_t)n_x * sizeof *x), *w = malloc((size_t)n_w * sizeof *w), *dy = malloc((size_t)n_y * sizeof *dy);
    fill(x, n_x);
    fill(w, n_w);
    fill(dy, n_y);
    int64_t n_out = dir == TF_CONV_FORWARD ? n_y : dir == TF_CONV_GRAD_INPUT ? n_x : n_w;
    double *ref = malloc((size_t)n_out * sizeof *ref);
    reference(k, dir, x, w, dy, ref);
    void *bx = to_storage(dt, x, n_x), *bw = to_storage(dt, w, n_w), *by = to_storage(dt, dy, n_y);
    void *res = dir == TF_CONV_FORWARD ? by : dir == TF_CONV_GRAD_INPUT ? bx : bw;
    size_t res_bytes = (size_t)n_out * (size_t)tf_dtype_bytes(dt);
    tf_conv_desc d = desc_of(k, dir, t, cache);
    d.x = (uintptr_t)bx, d.w = (uintptr_t)bw, d.y = (uintptr_t)by;
    d.ws = (uintptr_t)g_ws;
    d.max_workspace = sizeof g_ws;
    tf_conv c;
    char err[2048] = "";
    tf_cuda_status st = tf_conv_plan(&g_libs, g_h, &d, &c, err, sizeof err);
    CHECK(!st, "case %d %s %s: plan: %s", ki, tf_conv_dir_name(dir), type_name(t), err);
    if (!st) {
        memset(res, 0xff, res_bytes);   /* NaN: beta = 0 must not read it */
        st = tf_conv_run(&g_libs, g_h, &c, d.x, d.w, d.y, d.ws, sizeof g_ws, err, sizeof err);
        CHECK(!st, "case %d %s %s: run: %s", ki, tf_conv_dir_name(dir), type_name(t), err);
        int bad = 0;
        int64_t first = -1;
        for (int64_t i = 0; i < n_out; i++) {
            double got = tf_elem_load(dt, res, i), want = tf_dtype_round(dt, ref[i]);
            if (!(got == want) && bad++ == 0) first = i;
        }
        CHECK(!st && bad == 0, "case %d %s %s: %d of %lld elements differ from the reference (first at %lld: %g, want %g)", ki,
              tf_conv_dir_name(dir), type_name(t), bad, (long long)n_out, (long long)first,
              first >= 0 ? tf_elem_load(dt, res, first) : 0.0, first >= 0 ? tf_dtype_round(dt, ref[first]) : 0.0);
        tf_conv_free(&g_libs, &c);
    }
    free(x), free(w), free(dy), free(ref), free(bx), free(bw), free(by);
}

/* ---- the reference against the interpreter ---- */

static void against_interp(int ki)
{
    const ccase *k = &cases[ki];
    char text[2048];
    snprintf(text, sizeof text,
             "input x : f32[%lld, %lld, %lld, %lld]\ninput w : f32[%lld, %lld, %lld, %lld]\ninput dy : f32[%lld, %lld, %lld, %lld]\n"
             "y = conv2d(x, w, stride=[%lld, %lld], padding=[%lld, %lld], dilation=[%lld, %lld], groups=%lld)\n"
             "dx = conv2d_grad_input(dy, w, stride=[%lld, %lld], padding=[%lld, %lld], dilation=[%lld, %lld], groups=%lld, "
             "shape=[%lld, %lld, %lld, %lld])\n"
             "dw = conv2d_grad_weight(x, dy, stride=[%lld, %lld], padding=[%lld, %lld], dilation=[%lld, %lld], groups=%lld, "
             "shape=[%lld, %lld, %lld, %lld])\noutput y\noutput dx\noutput dw\n",
             (long long)k->N, (long long)k->C, (long long)k->H, (long long)k->W, (long long)k->O, (long long)(k->C / k->g),
             (long long)k->KH, (long long)k->KW, (long long)k->N, (long long)k->O, (long long)Ho(k), (long long)Wo(k),
             (long long)k->s[0], (long long)k->s[1], (long long)k->p[0], (long long)k->p[1], (long long)k->d[0], (long long)k->d[1],
             (long long)k->g, (long long)k->s[0], (long long)k->s[1], (long long)k->p[0], (long long)k->p[1], (long long)k->d[0],
             (long long)k->d[1], (long long)k->g, (long long)k->N, (long long)k->C, (long long)k->H, (long long)k->W,
             (long long)k->s[0], (long long)k->s[1], (long long)k->p[0], (long long)k->p[1], (long long)k->d[0], (long long)k->d[1],
             (long long)k->g, (long long)k->O, (long long)(k->C / k->g), (long long)k->KH, (long long)k->KW);
    tf_context_t *ctx = NULL;
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_session_t *s = NULL;
    tf_context_create(&ctx);
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = TF_TARGET_INTERP;
    bool ok = !tf_model_parse_string(ctx, "conv", text, strlen(text), NULL, 0, &m) && !tf_program_compile(ctx, m, &o, &p) &&
              !tf_session_create(ctx, p, TF_TARGET_INTERP, 1, &s);
    CHECK(ok, "case %d: the interpreter's model: %s", ki, tf_context_last_error(ctx));
    if (ok) {
        int64_t n_x = nx(k), n_w = nw(k), n_y = ny(k);
        double *x = malloc((size_t)n_x * sizeof *x), *w = malloc((size_t)n_w * sizeof *w), *dy = malloc((size_t)n_y * sizeof *dy);
        fill(x, n_x);
        fill(w, n_w);
        fill(dy, n_y);
        float *fx = to_storage(TF_DT_F32, x, n_x), *fw = to_storage(TF_DT_F32, w, n_w), *fdy = to_storage(TF_DT_F32, dy, n_y);
        int64_t sx[4] = {k->N, k->C, k->H, k->W}, sw[4] = {k->O, k->C / k->g, k->KH, k->KW}, sy[4] = {k->N, k->O, Ho(k), Wo(k)};
        ok = !tf_session_bind(s, "x", TF_DTYPE_F32, sx, 4, fx) && !tf_session_bind(s, "w", TF_DTYPE_F32, sw, 4, fw) &&
             !tf_session_bind(s, "dy", TF_DTYPE_F32, sy, 4, fdy) && !tf_session_run(s);
        CHECK(ok, "case %d: the interpreter's run: %s", ki, tf_context_last_error(ctx));
        static const char *const names[] = {"y", "dx", "dw"};
        for (int dir = 0; ok && dir < 3; dir++) {
            int64_t n_out = dir == TF_CONV_FORWARD ? n_y : dir == TF_CONV_GRAD_INPUT ? n_x : n_w;
            double *ref = malloc((size_t)n_out * sizeof *ref);
            reference(k, (tf_conv_dir)dir, x, w, dy, ref);
            tf_tensor_view v;
            int bad = 0;
            if (tf_session_output(s, names[dir], &v)) {
                bad = -1;
            } else {
                for (int64_t i = 0; i < n_out; i++) bad += ((const float *)v.data)[i] != (float)ref[i];
            }
            CHECK(bad == 0, "case %d: the reference and the interpreter's %s agree bit for bit (%d differ)", ki, names[dir], bad);
            free(ref);
        }
        free(x), free(w), free(dy), free(fx), free(fw), free(fdy);
    }
    tf_session_free(s);
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
}

/* ---- the stand-in where dnn.c does not reach ---- */

static void emu_direct(void)
{
    const tf_cudnn_api *a = &g_emu;
    const ccase *k = &cases[2];
    int64_t n_x = nx(k), n_w = nw(k), n_y = ny(k), oh = Ho(k), ow = Wo(k);
    double *x = malloc((size_t)n_x * sizeof *x), *w = malloc((size_t)n_w * sizeof *w), *y0 = malloc((size_t)n_y * sizeof *y0),
           *ref = malloc((size_t)n_y * sizeof *ref);
    fill(x, n_x);
    fill(w, n_w);
    fill(y0, n_y);
    reference(k, TF_CONV_FORWARD, x, w, NULL, ref);
    /* x stored NHWC and described by its strides; y NCHW with a padded row */
    int64_t ystride_h = ow + 3;
    float *xs = malloc((size_t)n_x * sizeof *xs), *ws = malloc((size_t)n_w * sizeof *ws);
    float *ys = malloc((size_t)(k->N * k->O * oh * ystride_h) * sizeof *ys);
    for (int64_t n = 0; n < k->N; n++)
        for (int64_t c = 0; c < k->C; c++)
            for (int64_t h = 0; h < k->H; h++)
                for (int64_t ww = 0; ww < k->W; ww++)
                    xs[((n * k->H + h) * k->W + ww) * k->C + c] = (float)x[((n * k->C + c) * k->H + h) * k->W + ww];
    for (int64_t i = 0; i < n_w; i++) ws[i] = (float)w[i];
    for (int64_t n = 0; n < k->N; n++)
        for (int64_t o = 0; o < k->O; o++)
            for (int64_t h = 0; h < oh; h++)
                for (int64_t ww = 0; ww < ystride_h; ww++)
                    ys[((n * k->O + o) * oh + h) * ystride_h + ww] = ww < ow ? (float)y0[((n * k->O + o) * oh + h) * ow + ww] : 7.0f;
    tf_cudnn_tensor xd = NULL, yd = NULL;
    tf_cudnn_filter wd = NULL;
    tf_cudnn_conv cd = NULL;
    tf_cudnn_status r = a->CreateTensorDescriptor(&xd);
    r |= a->SetTensor4dDescriptorEx(xd, 0, (int)k->N, (int)k->C, (int)k->H, (int)k->W, (int)(k->H * k->W * k->C), 1, (int)(k->W * k->C),
                                    (int)k->C);
    r |= a->CreateTensorDescriptor(&yd);
    r |= a->SetTensor4dDescriptorEx(yd, 0, (int)k->N, (int)k->O, (int)oh, (int)ow, (int)(k->O * oh * ystride_h), (int)(oh * ystride_h),
                                    (int)ystride_h, 1);
    r |= a->CreateFilterDescriptor(&wd);
    r |= a->SetFilter4dDescriptor(wd, 0, 0, (int)k->O, (int)(k->C / k->g), (int)k->KH, (int)k->KW);
    r |= a->CreateConvolutionDescriptor(&cd);
    r |= a->SetConvolution2dDescriptor(cd, (int)k->p[0], (int)k->p[1], (int)k->s[0], (int)k->s[1], (int)k->d[0], (int)k->d[1], 1, 0);
    r |= a->SetConvolutionGroupCount(cd, (int)k->g);
    CHECK(r == 0, "the stand-in's descriptors: strided x and y");
    /* y = 2 * conv + (-0.5) * y */
    float alpha = 2, beta = -0.5f;
    r = a->ConvolutionForward(g_h, &alpha, xd, xs, wd, ws, cd, 0, NULL, 0, &beta, yd, ys);
    int bad = 0, pad_touched = 0;
    for (int64_t n = 0; n < k->N; n++)
        for (int64_t o = 0; o < k->O; o++)
            for (int64_t h = 0; h < oh; h++)
                for (int64_t ww = 0; ww < ystride_h; ww++) {
                    float got = ys[((n * k->O + o) * oh + h) * ystride_h + ww];
                    if (ww >= ow) {
                        pad_touched += got != 7.0f;
                        continue;
                    }
                    int64_t i = ((n * k->O + o) * oh + h) * ow + ww;
                    bad += got != (float)(2 * ref[i] - 0.5 * y0[i]);
                }
    CHECK(r == 0 && bad == 0 && pad_touched == 0, "alpha 2, beta -0.5, NHWC x, padded y rows: %d wrong, %d padding elements written (%d)",
          bad, pad_touched, r);
    /* convolution mode: the kernel flipped, i.e. cross-correlation with a flipped w */
    float *wf = malloc((size_t)n_w * sizeof *wf), *y1 = malloc((size_t)(k->N * k->O * oh * ystride_h) * sizeof *y1),
          *y2 = malloc((size_t)(k->N * k->O * oh * ystride_h) * sizeof *y2);
    int64_t Cg = k->C / k->g;
    for (int64_t o = 0; o < k->O; o++)
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t h = 0; h < k->KH; h++)
                for (int64_t ww = 0; ww < k->KW; ww++)
                    wf[((o * Cg + c) * k->KH + h) * k->KW + ww] = ws[((o * Cg + c) * k->KH + (k->KH - 1 - h)) * k->KW + (k->KW - 1 - ww)];
    float one = 1, zero = 0;
    r = a->ConvolutionForward(g_h, &one, xd, xs, wd, wf, cd, 0, NULL, 0, &zero, yd, y1);
    r |= a->SetConvolution2dDescriptor(cd, (int)k->p[0], (int)k->p[1], (int)k->s[0], (int)k->s[1], (int)k->d[0], (int)k->d[1], 0, 0);
    r |= a->ConvolutionForward(g_h, &one, xd, xs, wd, ws, cd, 0, NULL, 0, &zero, yd, y2);
    bad = 0;
    for (int64_t n = 0; n < k->N; n++)
        for (int64_t o = 0; o < k->O; o++)
            for (int64_t h = 0; h < oh; h++)
                for (int64_t ww = 0; ww < ow; ww++) bad += y1[((n * k->O + o) * oh + h) * ystride_h + ww] != y2[((n * k->O + o) * oh + h) * ystride_h + ww];
    CHECK(r == 0 && bad == 0, "CUDNN_CONVOLUTION is cross-correlation with the kernel flipped (%d differ, status %d)", bad, r);
    /* the workspace its algorithm 1 needs, and the argument checks */
    size_t need = 0;
    CHECK(a->GetConvolutionForwardWorkspaceSize(g_h, xd, wd, cd, yd, 1, &need) == 0 && need > 0, "algorithm 1 needs workspace (%zu)", need);
    CHECK(a->ConvolutionForward(g_h, &one, xd, xs, wd, ws, cd, 1, NULL, 0, &zero, yd, y2) == 2000, "no workspace: BAD_PARAM");
    CHECK(a->ConvolutionForward(g_h, &one, xd, xs, wd, ws, cd, 1, g_ws, need - 1, &zero, yd, y2) == 2000, "too little: BAD_PARAM");
    memset(g_ws, 0, sizeof g_ws);
    CHECK(a->ConvolutionForward(g_h, &one, xd, xs, wd, ws, cd, 1, g_ws, need, &zero, yd, y2) == 0 && g_ws[0] == 0xa5 && g_ws[need - 1] == 0xa5 &&
              g_ws[need] == 0,
          "algorithm 1 uses exactly its workspace");
    CHECK(a->GetConvolutionForwardWorkspaceSize(g_h, xd, wd, cd, yd, 5, &need) == 3000, "an algorithm it lacks: NOT_SUPPORTED");
    CHECK(a->ConvolutionForward(g_h, &one, xd, xs, wd, ws, cd, 0, NULL, 0, &zero, xd, y2) == 2000, "y's shape wrong: BAD_PARAM");
    CHECK(a->ConvolutionForward(g_h, &one, xd, xs, wd, ws, (tf_cudnn_conv)(void *)xd, 0, NULL, 0, &zero, yd, y2) == 2000,
          "a tensor descriptor for a convolution one: BAD_PARAM");
    CHECK(a->SetConvolutionMathType(cd, 4) == 2000 && a->SetConvolutionGroupCount(cd, 0) == 2000, "bad math type and group count");
    CHECK(a->SetTensor4dDescriptor(yd, 0, 3, 1, 1, 1, 1) == 3000, "int8 data: NOT_SUPPORTED");
    CHECK(a->SetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, 1, 2) == 0 &&
              a->ConvolutionForward(g_h, &one, xd, xs, wd, ws, cd, 0, NULL, 0, &zero, yd, y2) == 3000,
          "float data with a half compute type: NOT_SUPPORTED");
    CHECK(!strcmp(a->GetErrorString(3000), "CUDNN_STATUS_NOT_SUPPORTED"), "status names");
    a->DestroyTensorDescriptor(xd);
    a->DestroyTensorDescriptor(yd);
    a->DestroyFilterDescriptor(wd);
    a->DestroyConvolutionDescriptor(cd);
    free(x), free(w), free(y0), free(ref), free(xs), free(ws), free(ys), free(wf), free(y1), free(y2);
}

/* The stand-in's 16-bit output of a 1x1 convolution over C channels: the
 * sum of x[c] * w[c] (16-bit values), exact in double, rounded once. */
static uint16_t sum16(int cudnn_dt, tf_dt dt, const double *xv, const double *wv, int C, float alpha)
{
    const tf_cudnn_api *a = &g_emu;
    uint16_t xb[8], wb[8], out = 0x1234;
    for (int c = 0; c < C; c++) tf_elem_store(dt, xb, c, xv[c]), tf_elem_store(dt, wb, c, wv[c]);
    tf_cudnn_tensor xd = NULL, yd = NULL;
    tf_cudnn_filter wd = NULL;
    tf_cudnn_conv cd = NULL;
    float zero = 0;
    int r = a->CreateTensorDescriptor(&xd) | a->SetTensor4dDescriptor(xd, 0, cudnn_dt, 1, C, 1, 1) | a->CreateTensorDescriptor(&yd) |
            a->SetTensor4dDescriptor(yd, 0, cudnn_dt, 1, 1, 1, 1) | a->CreateFilterDescriptor(&wd) |
            a->SetFilter4dDescriptor(wd, cudnn_dt, 0, 1, C, 1, 1) | a->CreateConvolutionDescriptor(&cd) |
            a->SetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, 1, 0) |
            a->ConvolutionForward(g_h, &alpha, xd, xb, wd, wb, cd, 0, NULL, 0, &zero, yd, &out);
    a->DestroyTensorDescriptor(xd);
    a->DestroyTensorDescriptor(yd);
    a->DestroyFilterDescriptor(wd);
    a->DestroyConvolutionDescriptor(cd);
    return r ? 0xdead : out;
}

/* f16 and bf16 results rounded to nearest even straight from the double
 * sum: ties, a tie broken by a bit a float would drop, overflow, subnormals. */
static void rounding16(void)
{
    static const struct { int cdt; int C; double x[3], w[3]; float alpha; uint16_t bits; const char *what; } r[] = {
        {2, 2, {1, 1}, {1, 0x1p-11}, 1, 0x3c00, "f16 1 + 2^-11: a tie, to even (down)"},
        {2, 2, {1, 1}, {1 + 0x1p-10, 0x1p-11}, 1, 0x3c02, "f16 1 + 3 * 2^-11: a tie, to even (up)"},
        {2, 3, {1, 1, 0x1p-10}, {1, 0x1p-11, 0x1p-24}, 1, 0x3c01, "f16 1 + 2^-11 + 2^-34: above the tie (a float would drop it)"},
        {2, 2, {1, 1}, {65504, 16}, 1, 0x7c00, "f16 65520: max + half an ulp is inf"},
        {2, 2, {1, 1}, {65504, 15}, 1, 0x7bff, "f16 65519: max"},
        {2, 1, {1}, {-0x1p-24}, 1, 0x8001, "f16 -2^-24: the smallest subnormal"},
        {2, 1, {0.5}, {0x1p-24}, 1, 0x0000, "f16 2^-25: a tie at zero, to even"},
        {2, 1, {1.5}, {0x1p-24}, 1, 0x0002, "f16 1.5 * 2^-24: a tie between subnormals, to even"},
        {2, 1, {1}, {1 + 0x1p-10}, 0.5f, 0x3801, "f16 alpha 0.5"},
        {9, 2, {1, 1}, {1, 0x1p-8}, 1, 0x3f80, "bf16 1 + 2^-8: a tie, to even"},
        {9, 3, {1, 1, 0x1p-10}, {1, 0x1p-8, 0x1p-30}, 1, 0x3f81, "bf16 1 + 2^-8 + 2^-40: above the tie"},
        {9, 2, {1, 1}, {0x1.fep127, 0x1.fep127}, 1, 0x7f80, "bf16 2 * max: inf"},
        {9, 1, {1}, {-0x1p-133}, 1, 0x8001, "bf16 -2^-133: the smallest subnormal"},
    };
    for (size_t i = 0; i < sizeof r / sizeof *r; i++) {
        uint16_t got = sum16(r[i].cdt, r[i].cdt == 2 ? TF_DT_F16 : TF_DT_BF16, r[i].x, r[i].w, r[i].C, r[i].alpha);
        CHECK(got == r[i].bits, "%s: 0x%04x, want 0x%04x", r[i].what, got, r[i].bits);
    }
}

/* ---- the algorithm cache ---- */

/* A plan of case 1 forward f32; its Find count and whether it came from the cache. */
static tf_cuda_status plan_once(const char *cache, bool tf32, const char *gpu, size_t max_ws, bool cached_only, tf_conv *c, char *err,
                                size_t n)
{
    const ccase *k = &cases[1];
    static float bx[1024], bw[1024], by[1024];
    tf_conv_desc d = desc_of(k, TF_CONV_FORWARD, TF_CONV_F32, cache);
    d.tf32 = tf32;
    d.gpu = gpu;
    d.x = (uintptr_t)bx, d.w = (uintptr_t)bw, d.y = (uintptr_t)by, d.ws = (uintptr_t)g_ws;
    d.max_workspace = max_ws;
    d.cached_only = cached_only;
    return tf_conv_plan(&g_libs, g_h, &d, c, err, n);
}

static void cache_tests(const char *root)
{
    char dir[4200], err[2048];
    snprintf(dir, sizeof dir, "%s/algos", root);
    tf_conv c;
    int f0 = g_finds;
    tf_cuda_status st = plan_once(dir, true, "gpu A", sizeof g_ws, false, &c, err, sizeof err);
    CHECK(!st && g_finds == f0 + 1 && !c.from_cache && c.cache_file[0] && test_count_files(dir, ".cudnn") == 1,
          "a first plan finds and writes one file (%s; %d finds, %d files)", err, g_finds - f0, test_count_files(dir, ".cudnn"));
    int algo = c.algo;
    size_t ws = c.workspace;
    char file[4200];
    snprintf(file, sizeof file, "%s", c.cache_file);
    CHECK(algo == 1 && ws > 0 && c.math == 0 && c.deterministic, "the stand-in's algorithm 1 with its workspace, default math (%d, %zu, %d)",
          algo, ws, c.math);
    tf_conv_free(&g_libs, &c);
    st = plan_once(dir, true, "gpu A", sizeof g_ws, false, &c, err, sizeof err);
    CHECK(!st && g_finds == f0 + 1 && c.from_cache && c.algo == algo && c.workspace == ws, "a second plan reads the cache (%d finds)",
          g_finds - f0);
    tf_conv_free(&g_libs, &c);
    st = plan_once(dir, true, "gpu A", sizeof g_ws, true, &c, err, sizeof err);
    CHECK(!st && c.from_cache, "cached_only with the choice cached: planned");
    tf_conv_free(&g_libs, &c);
    /* another math type, another GPU: other keys */
    st = plan_once(dir, false, "gpu A", sizeof g_ws, false, &c, err, sizeof err);
    CHECK(!st && g_finds == f0 + 2 && !c.from_cache && c.math == 3 && test_count_files(dir, ".cudnn") == 2,
          "no TF32 is another key, with FMA math (%d finds, math %d)", g_finds - f0, c.math);
    tf_conv_free(&g_libs, &c);
    st = plan_once(dir, true, "gpu B", sizeof g_ws, true, &c, err, sizeof err);
    CHECK(st == TF_CUDA_ERR_NOT_FOUND && c.cache_miss && g_finds == f0 + 2 && strstr(err, "no cached cuDNN algorithm"),
          "cached_only on another GPU: a miss, no Find (%s)", err);
    /* corrupted: a flipped byte, then a truncated file, then garbage; each ignored and rewritten */
    const char *damage[] = {"flip", "truncate", "garbage", "empty"};
    for (int i = 0; i < 4; i++) {
        char *t = test_read_file(file);
        FILE *f = fopen(file, "wb");
        if (t && f) {
            size_t len = strlen(t);
            if (i == 0) t[len / 2] ^= 0x04, fwrite(t, 1, len, f);
            else if (i == 1) fwrite(t, 1, len - 10, f);
            else if (i == 2) fputs("algo: 1\nsum: 0\n", f);
        }
        if (f) fclose(f);
        free(t);
        int before = g_finds;
        st = plan_once(dir, true, "gpu A", sizeof g_ws, true, &c, err, sizeof err);
        CHECK(st == TF_CUDA_ERR_NOT_FOUND && c.cache_miss, "%s file: not used (%d)", damage[i], st);
        st = plan_once(dir, true, "gpu A", sizeof g_ws, false, &c, err, sizeof err);
        CHECK(!st && !c.from_cache && g_finds == before + 1 && c.algo == algo, "%s file: found again (%s)", damage[i], err);
        tf_conv_free(&g_libs, &c);
        st = plan_once(dir, true, "gpu A", sizeof g_ws, false, &c, err, sizeof err);
        CHECK(!st && c.from_cache && g_finds == before + 1, "%s file: rewritten, then read", damage[i]);
        tf_conv_free(&g_libs, &c);
    }
    /* a cached choice that needs more workspace than this plan allows: found again within the limit */
    int before = g_finds;
    st = plan_once(dir, true, "gpu A", ws - 1, false, &c, err, sizeof err);
    CHECK(!st && !c.from_cache && g_finds == before + 1 && c.algo == 0 && c.workspace == 0,
          "less workspace allowed: found again, an algorithm without workspace (%s; algo %d)", err, c.algo);
    tf_conv_free(&g_libs, &c);
    CHECK(test_count_files(dir, "") == test_count_files(dir, ".cudnn"), "no temporary file left (%d files, %d .cudnn)", test_count_files(dir, ""),
          test_count_files(dir, ".cudnn"));
    /* the default place: $TFUSE_CACHE_DIR/cuda, made when missing */
    char env[4200], expect[4300];
    snprintf(env, sizeof env, "%s/env", root);
    const char *saved = getenv("TFUSE_CACHE_DIR");
    char *keep = saved ? strdup(saved) : NULL;
    setenv("TFUSE_CACHE_DIR", env, 1);
    st = plan_once(NULL, true, "gpu A", sizeof g_ws, false, &c, err, sizeof err);
    snprintf(expect, sizeof expect, "%s/cuda/", env);
    CHECK(!st && !strncmp(c.cache_file, expect, strlen(expect)) && access(c.cache_file, R_OK) == 0,
          "NULL cache_dir: the file is under $TFUSE_CACHE_DIR/cuda (%s)", c.cache_file);
    tf_conv_free(&g_libs, &c);
    if (keep) setenv("TFUSE_CACHE_DIR", keep, 1);
    else unsetenv("TFUSE_CACHE_DIR");
    free(keep);
    /* no disk cache at all: "" */
    before = g_finds;
    st = plan_once("", true, "gpu A", sizeof g_ws, false, &c, err, sizeof err);
    CHECK(!st && !c.from_cache && !c.cache_file[0] && g_finds == before + 1, "cache_dir \"\": no file, a Find every time");
    tf_conv_free(&g_libs, &c);
}

/* ---- refusals ---- */

static void refusals(const char *root)
{
    char err[2048];
    tf_conv c;
    tf_cuda_libs none;
    memset(&none, 0, sizeof none);
    tf_conv_desc d = desc_of(&cases[0], TF_CONV_FORWARD, TF_CONV_F32, root);
    CHECK(tf_conv_plan(&none, NULL, &d, &c, err, sizeof err) == TF_CUDA_ERR_NOT_FOUND && strstr(err, "cuDNN is not loaded"),
          "cuDNN not loaded: %s", err);
    d.N = (int64_t)1 << 31;
    CHECK(tf_conv_plan(&g_libs, g_h, &d, &c, err, sizeof err) == TF_CUDA_ERR_ARG && strstr(err, "outside what cuDNN takes"),
          "a batch of 2^31: %s", err);
    d = desc_of(&cases[0], TF_CONV_FORWARD, TF_CONV_F32, root);
    d.N = 1 << 20, d.C = 1 << 12;
    CHECK(tf_conv_plan(&g_libs, g_h, &d, &c, err, sizeof err) == TF_CUDA_ERR_ARG && strstr(err, "2^31"), "2^32 elements: %s", err);
    d = desc_of(&cases[0], TF_CONV_FORWARD, TF_CONV_F32, root);
    d.Ho = 4;
    CHECK(tf_conv_plan(&g_libs, g_h, &d, &c, err, sizeof err) == TF_CUDA_ERR_ARG && strstr(err, "output height"), "a wrong Ho: %s", err);
    /* a workspace smaller than the plan's algorithm needs, at run time */
    static float bx[64], bw[64], by[64];
    d = desc_of(&cases[0], TF_CONV_FORWARD, TF_CONV_F32, root);
    d.x = (uintptr_t)bx, d.w = (uintptr_t)bw, d.y = (uintptr_t)by, d.ws = (uintptr_t)g_ws, d.max_workspace = sizeof g_ws;
    tf_cuda_status st = tf_conv_plan(&g_libs, g_h, &d, &c, err, sizeof err);
    CHECK(!st && c.workspace > 0, "planned with workspace (%s)", err);
    if (!st) {
        CHECK(tf_conv_run(&g_libs, g_h, &c, d.x, d.w, d.y, d.ws, c.workspace - 1, err, sizeof err) == TF_CUDA_ERR_ARG &&
                  strstr(err, "bytes of workspace"),
              "too little workspace: %s", err);
        tf_conv_free(&g_libs, &c);
    }
    CHECK(!strcmp(tf_conv_algo_name(TF_CONV_FORWARD, 1), "IMPLICIT_PRECOMP_GEMM") && !strcmp(tf_conv_algo_name(TF_CONV_GRAD_WEIGHT, 3), "ALGO_3") &&
              !strcmp(tf_conv_algo_name(TF_CONV_GRAD_INPUT, 9), "unknown"),
          "algorithm names");
}

int main(void)
{
    g_rng = test_seed() | 1;
    memset(&g_libs, 0, sizeof g_libs);
    tf_cuda_emu_dnn_fill(&g_libs.dnn);
    g_libs.loaded |= TF_CUDA_LIB_CUDNN;
    g_libs.cudnn_version = g_libs.dnn.GetVersion();
    g_emu = g_libs.dnn;
    g_libs.dnn.FindConvolutionForwardAlgorithmEx = count_fwd;
    g_libs.dnn.FindConvolutionBackwardDataAlgorithmEx = count_bwd_data;
    g_libs.dnn.FindConvolutionBackwardFilterAlgorithmEx = count_bwd_filter;
    CHECK(g_libs.dnn.Create(&g_h) == 0 && g_libs.dnn.SetStream(g_h, NULL) == 0, "the stand-in's handle");
    char root[] = "/tmp/tfuse_test_cuda_dnn.XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    for (int ki = 0; ki < NCASES; ki++)
        for (int dir = 0; dir < 3; dir++)
            for (int t = 0; t < 3; t++) run_case(&cases[ki], ki, (tf_conv_dir)dir, (tf_conv_type)t, root);
    for (int ki = 0; ki < NCASES; ki++) against_interp(ki);
    emu_direct();
    rounding16();
    cache_tests(root);
    refusals(root);
    g_libs.dnn.Destroy(g_h);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return check_report();
}
