/* test_cpu_conv.c — the cpu target's oneDNN paths against the interpreter:
 * its two convolution paths (oneDNN, where the build has it, and im2col +
 * GEMM) and its GEMMs with packed weights (oneDNN, or OpenBLAS).
 *
 *   - which path runs: with oneDNN in the build every conv kernel's profile
 *     `how` says ".onednn" (forward, input and weight gradients), and with
 *     --cpu-conv=im2col (tf_compile_options.cpu_conv_im2col) none does;
 *   - odd geometries (groups, dilation, stride, asymmetric padding, 1x1,
 *     batch 1, a batch the pieces do not divide, weights that outnumber the
 *     images, split by channels unevenly), one training step each
 *     (forward, both gradients, the update) on both paths against the
 *     float64 interpreter, at test_cpu's tolerances;
 *   - inference through a chain of convolutions whose activations stay in
 *     oneDNN's nChw16c between them, bit for bit what NCHW gives;
 *   - the inference patterns conv + batchnorm (folded into a bias, which
 *     the oneDNN primitive adds itself) and conv + batchnorm + relu (the
 *     epilogue kernel keeps relu: oneDNN's ReLU post-op turned NaN into 0):
 *     a NaN in the image stays NaN wherever the interpreter has one;
 *   - inference GEMMs whose weights the step never writes: with oneDNN in
 *     the build every such kernel's `how` says "gemm.onednn" (packed
 *     weights), with --cpu-gemm=openblas none does, and a training step's
 *     GEMMs never do; shapes whose rows the pieces do not divide, fewer rows
 *     than a piece, a batched left operand, either operand transposed, bf16
 *     operands (oneDNN's bf16 matmul where the CPU has one) and f16 ones
 *     (widened to f32) with weights cast from f32 once per state;
 *     after tf_session_set_state gives a weight new values, the next run
 *     uses them (the packed copy is made again). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/conv_dnnl.h"
#include "runtime.h"
#include "target_cases.h"
#include "testutil.h"
#include "tfuse.h"

static uint64_t g_seed;
static bool g_conv_plain;   /* pair_make_with: --cpu-conv-layout=plain */

typedef struct pair {
    tf_context_t *ctx;
    tf_model_t *m;
    tf_program_t *p;
    tf_session_t *ref, *cpu;
    void *data[8];
} pair;

static void pair_free(pair *q)
{
    for (int i = 0; i < 8; i++) free(q->data[i]);
    tf_session_free(q->ref);
    tf_session_free(q->cpu);
    tf_program_free(q->p);
    tf_model_free(q->m);
    tf_context_free(q->ctx);
}

/* Compile for cpu (im2col or not), an interp and a cpu session with the
 * same seed, the same random inputs; nan_at >= 0 puts a NaN there in the
 * first input. */
static bool pair_make_with(pair *q, const char *label, const char *text, tf_mode mode, bool im2col, bool openblas, int64_t nan_at)
{
    memset(q, 0, sizeof *q);
    tf_context_create(&q->ctx);
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = mode;
    o.target = TF_TARGET_CPU;
    o.cpu_conv_im2col = im2col;
    o.cpu_gemm_openblas = openblas;
    o.cpu_conv_plain = g_conv_plain;
    if (tf_model_parse_string(q->ctx, label, text, strlen(text), NULL, 0, &q->m) || tf_program_compile(q->ctx, q->m, &o, &q->p) ||
        tf_session_create(q->ctx, q->p, TF_TARGET_INTERP, g_seed, &q->ref) ||
        tf_session_create(q->ctx, q->p, TF_TARGET_CPU, g_seed, &q->cpu)) {
        CHECK(0, "%s: %s", label, tf_context_last_error(q->ctx));
        return false;
    }
    tf_session_set_profiling(q->cpu, true);
    uint64_t s = g_seed ^ 0x9e3779b9u;
    for (size_t i = 0; i < tf_program_io_count(q->p, TF_IO_INPUT) && i < 8; i++) {
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8], n = 1;
        tf_program_io(q->p, TF_IO_INPUT, i, &name, &dt, &rank, shape);
        for (int k = 0; k < rank; k++) n *= shape[k];
        void *d = calloc((size_t)(n ? n : 1), 8);   /* in the input's dtype (f32, or 16-bit) */
        q->data[i] = d;
        for (int64_t k = 0; k < n; k++) tf_elem_store((tf_dt)dt, d, k, tf_dtype_round((tf_dt)dt, 4 * test_rnd(&s) - 2));
        if (i == 0 && nan_at >= 0 && nan_at < n) tf_elem_store((tf_dt)dt, d, nan_at, NAN);
        if (tf_session_bind(q->ref, name, dt, shape, rank, d) || tf_session_bind(q->cpu, name, dt, shape, rank, d)) {
            CHECK(0, "%s: bind %s: %s", label, name, tf_context_last_error(q->ctx));
            return false;
        }
    }
    if (tf_session_run(q->ref) || tf_session_run(q->cpu)) {
        CHECK(0, "%s: run: %s", label, tf_context_last_error(q->ctx));
        return false;
    }
    return true;
}

static bool pair_make(pair *q, const char *label, const char *text, tf_mode mode, bool im2col, int64_t nan_at)
{
    return pair_make_with(q, label, text, mode, im2col, false, nan_at);
}

/* Outputs elementwise (test_cpu's bounds: 2e-5 of the tensor's scale in
 * fp32, 2^-8 in f16, 2^-6 in bf16: a few units of their rounding), params
 * after the step by relative L2 error (1e-4, test_cpu's). */
static void pair_compare(pair *q, const char *label)
{
    for (size_t i = 0; i < tf_program_io_count(q->p, TF_IO_OUTPUT); i++) {
        const char *name;
        tf_tensor_view a, b;
        tf_program_io(q->p, TF_IO_OUTPUT, i, &name, NULL, NULL, NULL);
        tf_session_output(q->ref, name, &a);
        tf_session_output(q->cpu, name, &b);
        double r = tc_compare_elems(&b, &a, a.dtype == TF_DTYPE_BF16 ? 1.0 / 64 : a.dtype == TF_DTYPE_F16 ? 1.0 / 256 : 2e-5);
        CHECK(r <= 1, "%s: output %s: error %.3g x the tolerance (seed %llu)", label, name, r, (unsigned long long)g_seed);
    }
    for (size_t i = 0; i < tf_program_io_count(q->p, TF_IO_PARAM); i++) {
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8], n = 1;
        tf_program_io(q->p, TF_IO_PARAM, i, &name, &dt, &rank, shape);
        for (int k = 0; k < rank; k++) n *= shape[k];
        size_t bytes = (size_t)n * (size_t)tf_dtype_size(dt);
        tf_tensor_view a = {0}, b = {0};
        a.data = malloc(bytes), b.data = malloc(bytes);
        if (tf_session_get_state(q->ref, name, &a, bytes) || tf_session_get_state(q->cpu, name, &b, bytes)) {
            CHECK(0, "%s: state %s: %s", label, name, tf_context_last_error(q->ctx));
        } else {
            double e = tc_rel_l2(&b, &a);
            CHECK(e <= 1e-4, "%s: param %s: relative L2 error %.3g > 1e-4 (seed %llu)", label, name, e, (unsigned long long)g_seed);
        }
        free(a.data);
        free(b.data);
    }
}

/* How many conv kernels ran, and how many of them through oneDNN. */
static void conv_hows(pair *q, int *convs, int *onednn)
{
    *convs = *onednn = 0;
    for (size_t i = 0; i < tf_session_profile_count(q->cpu); i++) {
        tf_kernel_profile kp;
        tf_session_profile(q->cpu, i, &kp);
        if (strncmp(kp.how, "conv", 4)) continue;
        ++*convs;
        *onednn += strstr(kp.how, ".onednn") != NULL;
    }
}

typedef struct geom {
    const char *label;
    int n, c, h, w, o, kh, kw, groups, sh, sw, ph, pw, dh, dw;
    bool bias;
} geom;

static const geom geoms[] = {
    {"3x3 pad 1", 2, 5, 7, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
    {"groups 3, stride 2, dilation [1, 2]", 3, 6, 9, 8, 9, 3, 3, 3, 2, 2, 1, 2, 1, 2, true},
    {"depthwise 5x5 stride [2, 1]", 2, 4, 11, 7, 4, 5, 5, 4, 2, 1, 2, 2, 1, 1, false},
    {"1x1 stride 2", 5, 7, 9, 9, 11, 1, 1, 1, 2, 2, 0, 0, 1, 1, true},
    {"batch 1, 3x1 pad [1, 0]", 1, 3, 8, 5, 5, 3, 1, 1, 1, 1, 1, 0, 1, 1, true},
    {"batch 19 (pieces of 2 and 1), 2x3 no pad", 19, 3, 6, 7, 4, 2, 3, 1, 1, 2, 0, 0, 1, 1, false},
    {"dilation 3, pad 3, groups 2", 2, 4, 10, 9, 6, 3, 3, 2, 1, 1, 3, 3, 3, 3, true},
    /* weights outnumbering the images: split by channels (split_by_channel) */
    {"3x3 images, 64 -> 100 channels", 3, 64, 3, 3, 100, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
    {"2x2 images, 32 -> 64 channels, stride 2", 2, 32, 2, 2, 64, 3, 3, 1, 2, 2, 1, 1, 1, 1, false},
    {"2x2 images, 100 -> 64 channels", 2, 100, 2, 2, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
};

/* One training step of conv(x * xs, w, b) -> mean(y * y): the forward, the
 * input gradient (xs is a param) and the weight gradient all run. */
static void geometry_case(const geom *g, bool im2col)
{
    char text[2048], label[256], bline[128] = "";
    snprintf(label, sizeof label, "%s [%s]", g->label, im2col ? "im2col" : "default");
    if (g->bias) snprintf(bline, sizeof bline, "param b : f32[%d] = uniform()\n", g->o);
    snprintf(text, sizeof text,
             "input x : f32[%d, %d, %d, %d]\nparam xs : f32[1, %d, 1, 1] = uniform()\nparam w : f32[%d, %d, %d, %d] = uniform()\n"
             "%sxi = mul(x, xs)\ny = conv2d(xi, w%s, stride=[%d, %d], padding=[%d, %d], dilation=[%d, %d], groups=%d)\n"
             "s = mul(y, y)\nloss = mean(s, axes=[0, 1, 2, 3])\noutput loss\n" TC_TRAIN_SGD,
             g->n, g->c, g->h, g->w, g->c, g->o, g->c / g->groups, g->kh, g->kw, bline, g->bias ? ", b" : "", g->sh, g->sw, g->ph,
             g->pw, g->dh, g->dw, g->groups);
    pair q;
    if (pair_make(&q, label, text, TF_MODE_TRAIN, im2col, -1)) {
        pair_compare(&q, label);
        int convs, onednn;
        conv_hows(&q, &convs, &onednn);
        CHECK(convs == 3, "%s: %d conv kernels ran, expected 3 (forward, input and weight gradients)", label, convs);
        if (im2col || !tf_dnnl_available())
            CHECK(onednn == 0, "%s: %d conv kernels went through oneDNN with --cpu-conv=im2col or no oneDNN", label, onednn);
        else
            CHECK(onednn == convs, "%s: only %d of %d conv kernels went through oneDNN, which this build has", label, onednn, convs);
    }
    pair_free(&q);
}

static bool rerun_with_new_w(pair *q, const char *label);

/* conv + batchnorm + relu in inference: batchnorm folds into the weights
 * and a per-channel bias, fuse makes conv's region with the epilogue
 * relu(conv + bias), which the oneDNN primitive writes itself. `deep`: 64
 * -> 100 channels at 2x2, whose forward splits by output channels (pieces
 * of 34 and 33, each with its slice of the weights kept in oneDNN's layout
 * and its slice of the bias); after set_state gives the weights new values
 * the next run uses them. */
static void epilogue_case(bool im2col, bool relu, bool deep)
{
    char text[1024], label[160];
    int n = deep ? 2 : 3, c = deep ? 64 : 4, o = deep ? 100 : 6, h = deep ? 2 : 9, w = deep ? 2 : 8;
    snprintf(text, sizeof text, "input x : f32[%d, %d, %d, %d]\nparam w : f32[%d, %d, 3, 3] = uniform()\nparam g : f32[%d] = uniform()\n"
             "param b : f32[%d] = uniform()\nbuffer m : f32[%d] = uniform()\nbuffer v : f32[%d] = ones()\n"
             "c = conv2d(x, w, padding=1)\nn = batchnorm(c, g, b, m, v)\n%s\noutput r\n", n, c, h, w, o, c, o, o, o, o,
             relu ? "r = relu(n)" : "r = mul(n, 1.0)");
    snprintf(label, sizeof label, "conv %d -> %d at %dx%d + batchnorm%s, NaN in the image [%s]", c, o, h, w, relu ? " + relu" : "",
             im2col ? "im2col" : "default");
    pair q;
    if (pair_make(&q, label, text, TF_MODE_INFER, im2col, 2 * h * w + (h / 2) * w + w / 2)) {   /* image 0, channel 2, the middle */
        pair_compare(&q, label);
        if (deep) rerun_with_new_w(&q, label);
        tf_tensor_view a, b;
        tf_session_output(q.ref, "r", &a);
        tf_session_output(q.cpu, "r", &b);
        int nans_ref = 0, nans_cpu = 0;
        for (int64_t i = 0; i < tc_numel(&a); i++) {
            nans_ref += isnan(((const float *)a.data)[i]);
            nans_cpu += isnan(((const float *)b.data)[i]);
        }
        CHECK(nans_ref > 0 && nans_cpu == nans_ref, "%s: %d NaNs on cpu, %d in the interpreter", label, nans_cpu, nans_ref);
        int convs, onednn;
        conv_hows(&q, &convs, &onednn);
        CHECK(convs == 1 && onednn == (im2col || !tf_dnnl_available() ? 0 : 1), "%s: %d conv kernels, %d through oneDNN", label,
              convs, onednn);
    }
    pair_free(&q);
}

/* Inference through a chain of convolutions whose activations stay in
 * nChw16c between them (cpu_layout.c): a bias + ReLU epilogue and a 1x1
 * convolution's scaling over the blocked layout, a residual add of two
 * blocked values, an add of an NCHW input into a blocked value, and a
 * global mean that needs NCHW again; one NaN in the image. Against the
 * interpreter, and bit for bit against the same program with every value
 * in NCHW (--cpu-conv-layout=plain): the layout moves values, it does not
 * change one. */
static void layout_chain_case(void)
{
    const char *text =
        "input x : f32[4, 16, 8, 8]\ninput y : f32[4, 32, 8, 8]\n"
        "param w1 : f32[32, 16, 3, 3] = uniform()\nparam b1 : f32[32] = uniform()\n"
        "param w2 : f32[32, 32, 3, 3] = uniform()\nparam w3 : f32[32, 32, 1, 1] = uniform()\n"
        "param w4 : f32[48, 32, 3, 3] = uniform()\n"
        "c1 = conv2d(x, w1, b1, padding=1)\nr1 = relu(c1)\nc2 = conv2d(r1, w2, padding=1)\ns = add(c2, r1)\nr2 = relu(s)\n"
        "c3 = conv2d(r2, w3)\nm = mul(c3, 0.5)\nt = add(m, y)\nc4 = conv2d(t, w4, padding=1)\ng = mean(c4, axes=[2, 3])\n"
        "output g\n";
    const char *label = "a chain of convolutions in nChw16c";
    pair blocked, plain;
    bool ok = pair_make(&blocked, label, text, TF_MODE_INFER, false, 3 * 64 + 27);   /* image 0, channel 3, (3, 3) */
    g_conv_plain = true;
    ok = pair_make(&plain, "the chain in NCHW", text, TF_MODE_INFER, false, 3 * 64 + 27) && ok;
    g_conv_plain = false;
    if (ok) {
        pair_compare(&blocked, label);
        tf_tensor_view a, b, r;
        tf_session_output(blocked.cpu, "g", &a);
        tf_session_output(plain.cpu, "g", &b);
        tf_session_output(blocked.ref, "g", &r);
        CHECK(memcmp(a.data, b.data, (size_t)tc_numel(&a) * sizeof(float)) == 0,
              "%s: the result differs from the same program's with every value in NCHW", label);
        int nans = 0;
        for (int64_t i = 0; i < tc_numel(&a); i++) nans += isnan(((const float *)a.data)[i]) && isnan(((const float *)r.data)[i]);
        CHECK(nans > 0, "%s: the image's NaN did not reach the result as it does in the interpreter", label);
    }
    pair_free(&blocked);
    pair_free(&plain);
}

/* How many GEMM kernels ran, and how many of them with packed weights. */
static void gemm_hows(pair *q, int *gemms, int *packed)
{
    *gemms = *packed = 0;
    for (size_t i = 0; i < tf_session_profile_count(q->cpu); i++) {
        tf_kernel_profile kp;
        tf_session_profile(q->cpu, i, &kp);
        if (strncmp(kp.how, "gemm", 4)) continue;
        ++*gemms;
        *packed += !strcmp(kp.how, "gemm.onednn");
    }
}

typedef struct gemm_shape {
    const char *label, *text;
    int gemms;
    bool bf16;   /* packed only where oneDNN has a bf16 matmul of its own (fast_bf16) */
} gemm_shape;

static bool fast_bf16(void);

static const gemm_shape gemm_shapes[] = {
    {"37 rows (pieces of 16, 16 and 5), bias + relu, a second layer",
     "input x : f32[37, 20]\nparam w : f32[20, 29] = uniform()\nparam b : f32[29] = uniform()\nparam w2 : f32[29, 5] = uniform()\n"
     "h = linear(x, w, b)\na = relu(h)\ny = matmul(a, w2)\noutput y\n", 2, false},
    {"5 rows (fewer than a piece)", "input x : f32[5, 8]\nparam w : f32[8, 3] = uniform()\ny = matmul(x, w)\noutput y\n", 1, false},
    {"batched left operand [3, 7, 12] x [12, 9]",
     "input x : f32[3, 7, 12]\nparam w : f32[12, 9] = uniform()\ny = matmul(x, w)\noutput y\n", 1, false},
    {"transposed weights [21, 12] x [9, 12]^T",
     "input x : f32[21, 12]\nparam w : f32[9, 12] = uniform()\ny = matmul(x, w, transpose_b=true)\noutput y\n", 1, false},
    {"transposed left operand [12, 21]^T x [12, 9]",
     "input x : f32[12, 21]\nparam w : f32[12, 9] = uniform()\ny = matmul(x, w, transpose_a=true)\noutput y\n", 1, false},
    /* 16-bit inference (mixed precision's pattern): f32 weights cast once per state */
    {"bf16: 37 rows, weights cast from f32, bf16 result",
     "input x : bf16[37, 20]\nparam w : f32[20, 29] = uniform()\nwc = cast(w, to=bf16)\ny = matmul(x, wc)\noutput y\n", 1, true},
    {"f16 (through f32): 37 rows, transposed weights cast from f32, f16 result",
     "input x : f16[37, 20]\nparam w : f32[29, 20] = uniform()\nwc = cast(w, to=f16)\ny = matmul(x, wc, transpose_b=true)\noutput y\n",
     1, false},
};

/* Whether oneDNN has more than its reference bf16 matmul here (AVX-512 BF16): gemm_dnnl.c refuses the reference. */
static bool fast_bf16(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

/* New values for param name in both sessions: its current ones times -1.5
 * plus 0.25. */
static void rewrite_param(pair *q, const char *name)
{
    tf_tensor_view t = {0};
    enum { MOST = 65536 };
    float *buf = malloc(MOST * sizeof *buf);
    t.data = buf;
    if (!buf || tf_session_get_state(q->cpu, name, &t, MOST * sizeof *buf)) {
        CHECK(0, "get_state %s: %s", name, tf_context_last_error(q->ctx));
        free(buf);
        return;
    }
    for (int64_t i = 0; i < tc_numel(&t); i++) buf[i] = buf[i] * -1.5f + 0.25f;
    CHECK(!tf_session_set_state(q->cpu, name, &t) && !tf_session_set_state(q->ref, name, &t), "set_state %s: %s", name,
          tf_context_last_error(q->ctx));
    free(buf);
}

/* Param w rewritten in both sessions, both run again and compared; false
 * when a run failed (reported). */
static bool rerun_with_new_w(pair *q, const char *label)
{
    rewrite_param(q, "w");
    if (tf_session_run(q->ref) || tf_session_run(q->cpu)) {
        CHECK(0, "%s: second run: %s", label, tf_context_last_error(q->ctx));
        return false;
    }
    char l2[300];
    snprintf(l2, sizeof l2, "%s, after set_state(w)", label);
    pair_compare(q, l2);
    return true;
}

static void gemm_case(const gemm_shape *g, bool openblas)
{
    char label[256];
    snprintf(label, sizeof label, "GEMM %s [%s]", g->label, openblas ? "--cpu-gemm=openblas" : "default");
    pair q;
    if (pair_make_with(&q, label, g->text, TF_MODE_INFER, false, openblas, -1)) {
        pair_compare(&q, label);
        int gemms, packed;
        gemm_hows(&q, &gemms, &packed);
        CHECK(gemms == g->gemms, "%s: %d GEMM kernels ran, expected %d", label, gemms, g->gemms);
        int want = openblas || !tf_dnnl_available() || (g->bf16 && !fast_bf16()) ? 0 : g->gemms;
        CHECK(packed == want, "%s: %d of %d GEMM kernels ran with packed weights, expected %d", label, packed, gemms, want);
        /* the weights change: the next run multiplies by the new ones */
        tf_tensor_view before;
        tf_session_output(q.cpu, "y", &before);
        unsigned char first[4] = {0};   /* the first element's bytes, whatever its dtype */
        size_t esz = before.dtype == TF_DTYPE_F32 ? 4 : 2;
        memcpy(first, before.data, esz);
        if (rerun_with_new_w(&q, label)) {
            tf_tensor_view after;
            tf_session_output(q.cpu, "y", &after);
            CHECK(memcmp(after.data, first, esz) != 0, "%s, after set_state(w): the output did not change", label);
        }
    }
    pair_free(&q);
}

/* A training step updates its weights every step: no packed GEMM. */
static void gemm_train_case(void)
{
    const char *label = "GEMM in a training step";
    pair q;
    if (pair_make_with(&q, label, "input x : f32[37, 20]\nparam w : f32[20, 29] = uniform()\nh = matmul(x, w)\n"
                                  "s = mul(h, h)\nloss = mean(s, axes=[0, 1])\noutput loss\n" TC_TRAIN_SGD,
                       TF_MODE_TRAIN, false, false, -1)) {
        pair_compare(&q, label);
        int gemms, packed;
        gemm_hows(&q, &gemms, &packed);
        CHECK(gemms >= 2 && packed == 0, "%s: %d GEMM kernels, %d with packed weights (expected none)", label, gemms, packed);
    }
    pair_free(&q);
}

/* The forward convolution asks oneDNN for nChw16c (its float32 sums are
 * PyTorch's accuracy there, conv_dnnl.c), but never takes oneDNN's reference
 * code for it: a grouped convolution such as ResNeXt's (128 channels in 32
 * groups) has fast code only in oneDNN's own layout, and ran 150x slower. */
static void no_reference_code(void)
{
    if (!tf_dnnl_available()) return;
    static const struct { int c, o, groups; } cases[] = {{128, 128, 32}, {64, 128, 1}, {32, 32, 32}, {48, 96, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tf_conv_geom g = {.N = 4, .C = cases[i].c, .H = 16, .W = 16, .O = cases[i].o, .KH = 3, .KW = 3, .Ho = 16, .Wo = 16,
                          .G = cases[i].groups, .s = {1, 1}, .p = {1, 1}, .dl = {1, 1}};
        g.Cg = g.C / g.G, g.Og = g.O / g.G;
        char why[256] = "", how[512] = "";
        tf_dnnl_conv *c = tf_dnnl_conv_create(TF_DNNL_FWD, &g, false, false, true, 1, why, sizeof why);
        CHECK(c != NULL, "conv %d -> %d in %d groups: %s", cases[i].c, cases[i].o, cases[i].groups, why);
        if (!c) continue;
        tf_dnnl_conv_explain(c, how, sizeof how);
        CHECK(!strstr(how, "ref:"), "conv %d -> %d in %d groups runs oneDNN's reference code: %s", cases[i].c, cases[i].o,
              cases[i].groups, how);
        if (cases[i].groups == 1)
            CHECK(strstr(how, "abcd16b") != NULL, "conv %d -> %d: not in nChw16c: %s", cases[i].c, cases[i].o, how);
        tf_dnnl_conv_free(c);
    }
}

/* A convolution whose weights outnumber its input (a deep layer at small
 * images) is split by channels over the whole batch, in pieces the shape
 * alone decides (of 34 and 33 channels for 100): the forward and the weight
 * gradient by output channels, the input gradient by input channels; one
 * whose input is larger by images, and grouped ones always by images. The
 * geometry cases above check both against the interpreter. */
static void split_by_channel(void)
{
    if (!tf_dnnl_available()) return;
    static const struct { tf_dnnl_dir dir; int n, c, hw, o, groups; const char *want; } cases[] = {
        {TF_DNNL_BWD_WEIGHTS, 3, 64, 3, 100, 1, "3 pieces of 34 or fewer output channels over the whole batch"},
        {TF_DNNL_BWD_WEIGHTS, 4, 512, 2, 512, 1, "16 pieces of 32 output channels over the whole batch"},
        {TF_DNNL_BWD_WEIGHTS, 2, 32, 2, 64, 1, "2 pieces of 32 output channels"},
        {TF_DNNL_BWD_WEIGHTS, 4, 64, 16, 64, 1, "4 pieces of 1 image(s)"},       /* input 65536 > weights 36864 */
        {TF_DNNL_BWD_WEIGHTS, 4, 64, 2, 128, 2, "4 pieces of 1 image(s)"},       /* grouped */
        {TF_DNNL_BWD_WEIGHTS, 2, 64, 2, 32, 1, "2 pieces of 1 image(s)"},        /* too few channels to split */
        {TF_DNNL_FWD, 2, 64, 2, 100, 1, "3 pieces of 34 or fewer output channels over the whole batch"},
        {TF_DNNL_FWD, 4, 64, 16, 64, 1, "4 pieces of 1 image(s)"},
        {TF_DNNL_BWD_DATA, 2, 100, 2, 64, 1, "3 pieces of 34 or fewer input channels over the whole batch"},
        {TF_DNNL_BWD_DATA, 2, 32, 2, 64, 1, "2 pieces of 1 image(s)"},           /* 32 input channels: too few */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tf_conv_geom g = {.N = cases[i].n, .C = cases[i].c, .H = cases[i].hw, .W = cases[i].hw, .O = cases[i].o, .KH = 3,
                          .KW = 3, .Ho = cases[i].hw, .Wo = cases[i].hw, .G = cases[i].groups, .s = {1, 1}, .p = {1, 1},
                          .dl = {1, 1}};
        g.Cg = g.C / g.G, g.Og = g.O / g.G;
        char why[256] = "", how[512] = "";
        tf_dnnl_conv *c = tf_dnnl_conv_create(cases[i].dir, &g, false, false, true, 2, why, sizeof why);
        CHECK(c != NULL, "conv (direction %d) %d -> %d at %dx%d: %s", cases[i].dir, cases[i].c, cases[i].o, cases[i].hw, cases[i].hw,
              why);
        if (!c) continue;
        tf_dnnl_conv_explain(c, how, sizeof how);
        CHECK(strstr(how, cases[i].want) != NULL, "conv (direction %d) %d -> %d at %dx%d, batch %d: expected '%s' in: %s",
              cases[i].dir, cases[i].c, cases[i].o, cases[i].hw, cases[i].hw, cases[i].n, cases[i].want, how);
        tf_dnnl_conv_free(c);
    }
}

int main(void)
{
    g_seed = test_seed();
    if (tf_backend_cpu.unavailable()) {
        printf("cpu target unavailable in this build: nothing to test\n");
        return check_report();
    }
    char lib[256];
    tf_dnnl_describe(lib, sizeof lib);
    printf("convolutions: %s\n", lib);
    for (int im2col = 0; im2col < 2; im2col++) {
        for (size_t i = 0; i < sizeof geoms / sizeof *geoms; i++) geometry_case(&geoms[i], im2col);
        epilogue_case(im2col, true, false);
        epilogue_case(im2col, false, false);
        epilogue_case(im2col, true, true);
    }
    for (int openblas = 0; openblas < 2; openblas++)
        for (size_t i = 0; i < sizeof gemm_shapes / sizeof *gemm_shapes; i++) gemm_case(&gemm_shapes[i], openblas != 0);
    gemm_train_case();
    no_reference_code();
    split_by_channel();
    layout_chain_case();
    return check_report();
}
