/* test_cpu.c — the cpu target computes what the interpreter computes.
 *
 * Through the public API only, like a host program: one program, two
 * sessions with the same seed (interp, the float64 oracle, and cpu), the
 * same fresh random inputs bound to both.
 *
 *   - ops: a model per op family (every pointwise op, reductions, norms,
 *     GEMMs batched/transposed/broadcast, conv with stride, padding,
 *     dilation, groups and bias, pooling, layout ops, gathers, attention,
 *     losses) at odd sizes (1, primes, not multiples of a vector width), in
 *     fp32 storage and in f16/bf16 storage; inference compares every output,
 *     training one step compares the loss and every param and buffer after
 *     the update (so every backward kernel and the optimizer are in it);
 *   - each example model: one training step in fp32 and in its own mixed
 *     precision, and a 50-step fp32 loss curve that must follow the
 *     interpreter's.
 *
 * Tolerances by storage dtype, on the scale of the tensor (max |ref|):
 * fp32 results differ from float64 ones by fp32 GEMM accumulation; f16/bf16
 * ones by one rounding step of their format. States after an optimizer step
 * compare by relative L2 error (Adam's normalized step can turn a
 * negligible gradient difference into a visible one on a few elements). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime.h"
#include "testutil.h"
#include "tfuse.h"

static uint64_t g_seed;
static int g_cases;

static double tol_of(tf_dtype t)
{
    return t == TF_DTYPE_BF16 ? 1.0 / 64 : t == TF_DTYPE_F16 ? 1.0 / 256 : t == TF_DTYPE_F64 ? 1e-9 : 2e-5;
}

static int64_t numel(const tf_tensor_view *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++) n *= v->shape[i];
    return n;
}

/* Elementwise on the tensor's scale; returns the worst error / allowed. */
static double compare_elems(const tf_tensor_view *got, const tf_tensor_view *want, double tol)
{
    int64_t n = numel(want);
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double w = tf_elem_load((tf_dt)want->dtype, want->data, i);
        if (isfinite(w) && fabs(w) > scale) scale = fabs(w);
    }
    for (int64_t i = 0; i < n; i++) {
        double g = tf_elem_load((tf_dt)got->dtype, got->data, i), w = tf_elem_load((tf_dt)want->dtype, want->data, i);
        if (isnan(w) || isnan(g) || isinf(w) || isinf(g)) {
            if (!((isnan(w) && isnan(g)) || g == w)) return INFINITY;
            continue;
        }
        double r = fabs(g - w) / (tol * (fabs(w) + scale * 0.05) + 1e-30);
        if (r > worst) worst = r;
    }
    return worst;
}

static double rel_l2(const tf_tensor_view *got, const tf_tensor_view *want)
{
    int64_t n = numel(want);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = tf_elem_load((tf_dt)got->dtype, got->data, i), w = tf_elem_load((tf_dt)want->dtype, want->data, i);
        num += (g - w) * (g - w);
        den += w * w;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct pair {
    tf_context_t *ctx;
    tf_model_t *m;
    tf_program_t *p;
    tf_session_t *ref, *cpu;
    void *data[32];
} pair;

static void pair_free(pair *q)
{
    for (int i = 0; i < 32; i++) free(q->data[i]);
    tf_session_free(q->ref);
    tf_session_free(q->cpu);
    tf_program_free(q->p);
    tf_model_free(q->m);
    tf_context_free(q->ctx);
}

/* Parse, compile, make both sessions, bind fresh inputs. */
static bool pair_make(pair *q, const char *label, const char *text, tf_mode mode, const char *precision,
                      const tf_dim_override *dims, size_t nd)
{
    memset(q, 0, sizeof *q);
    tf_context_create(&q->ctx);
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = mode;
    o.target = TF_TARGET_CPU;
    o.precision = precision;
    if (tf_model_parse_string(q->ctx, label, text, strlen(text), dims, nd, &q->m) ||
        tf_program_compile(q->ctx, q->m, &o, &q->p) || tf_session_create(q->ctx, q->p, TF_TARGET_INTERP, g_seed, &q->ref) ||
        tf_session_create(q->ctx, q->p, TF_TARGET_CPU, g_seed, &q->cpu)) {
        CHECK(0, "%s: %s", label, tf_context_last_error(q->ctx));
        return false;
    }
    uint64_t s = g_seed ^ 0x5bd1e995u;
    for (size_t i = 0; i < tf_program_io_count(q->p, TF_IO_INPUT) && i < 32; i++) {
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8], n = 1, bound = 0;
        tf_program_io(q->p, TF_IO_INPUT, i, &name, &dt, &rank, shape);
        tf_program_input_bound(q->p, i, &bound);
        for (int k = 0; k < rank; k++) n *= shape[k];
        q->data[i] = calloc((size_t)(n ? n : 1), (size_t)tf_dtype_size(dt));
        for (int64_t k = 0; k < n; k++) {
            double u = test_rnd(&s);
            bool fl = dt == TF_DTYPE_F32 || dt == TF_DTYPE_F64 || dt == TF_DTYPE_F16 || dt == TF_DTYPE_BF16;
            double x = fl ? 4 * u - 2 : (double)(int64_t)(u * (double)(bound > 0 ? bound : 2));
            tf_elem_store((tf_dt)dt, q->data[i], k, x);
        }
        if (tf_session_bind(q->ref, name, dt, shape, rank, q->data[i]) || tf_session_bind(q->cpu, name, dt, shape, rank, q->data[i])) {
            CHECK(0, "%s: bind %s: %s", label, name, tf_context_last_error(q->ctx));
            return false;
        }
    }
    return true;
}

static bool pair_step(pair *q, const char *label)
{
    if (tf_session_run(q->ref) || tf_session_run(q->cpu)) {
        CHECK(0, "%s: run: %s", label, tf_context_last_error(q->ctx));
        return false;
    }
    return true;
}

/* Every output elementwise; after training, every param and buffer. */
/* prec_tol: the mixed precision's rounding (0 in fp32), which every f32
 * result computed through 16-bit activations carries. */
static void pair_compare(pair *q, const char *label, bool state, double state_tol, double prec_tol)
{
    for (size_t i = 0; i < tf_program_io_count(q->p, TF_IO_OUTPUT); i++) {
        const char *name;
        tf_tensor_view a, b;
        tf_program_io(q->p, TF_IO_OUTPUT, i, &name, NULL, NULL, NULL);
        tf_session_output(q->ref, name, &a);
        tf_session_output(q->cpu, name, &b);
        double r = compare_elems(&b, &a, fmax(tol_of(a.dtype), prec_tol));
        CHECK(r <= 1, "%s: output %s (%s): error %.3g x the tolerance (seed %llu)", label, name, tf_dtype_str(a.dtype), r,
              (unsigned long long)g_seed);
    }
    for (int kind = TF_IO_PARAM; state && kind <= TF_IO_BUFFER; kind++)
        for (size_t i = 0; i < tf_program_io_count(q->p, (tf_io_kind)kind); i++) {
            const char *name;
            tf_tensor_view a, b;
            tf_dtype dt;
            int rank;
            int64_t shape[8], n = 1;
            tf_program_io(q->p, (tf_io_kind)kind, i, &name, &dt, &rank, shape);
            for (int k = 0; k < rank; k++) n *= shape[k];
            a.data = malloc((size_t)(n ? n : 1) * (size_t)tf_dtype_size(dt));
            b.data = malloc((size_t)(n ? n : 1) * (size_t)tf_dtype_size(dt));
            if (!a.data || !b.data || tf_session_get_state(q->ref, name, &a) || tf_session_get_state(q->cpu, name, &b)) {
                CHECK(0, "%s: state %s: %s", label, name, tf_context_last_error(q->ctx));
                free(a.data);
                free(b.data);
                continue;
            }
            double e = rel_l2(&b, &a), t = fmax(a.dtype == TF_DTYPE_F32 || a.dtype == TF_DTYPE_F64 ? state_tol : tol_of(a.dtype), prec_tol);
            CHECK(e <= t, "%s: state %s (%s): relative L2 error %.3g > %.3g (seed %llu)", label, name, tf_dtype_str(a.dtype), e, t,
                  (unsigned long long)g_seed);
            free(a.data);
            free(b.data);
        }
}

/* Inference: fp32, then the same model with every f32 narrowed to bf16 and
 * f16 (storage and math of the model in 16 bits). Training: fp32 and the
 * mixed precisions (f32 params, 16-bit activations through amp). */
static void op_case(const char *label, const char *text, tf_mode mode)
{
    static const char *precisions[] = {"fp32", "bf16", "fp16"};
    for (int pi = 0; pi < 3; pi++) {
        size_t n = strlen(text);
        char *u = malloc(n * 2 + 1), *w = u;
        for (const char *p = text; *p; p++) {
            if (pi && mode == TF_MODE_INFER && !strncmp(p, "f32", 3)) {
                const char *to = pi == 1 ? "bf16" : "f16";
                memcpy(w, to, strlen(to));
                w += strlen(to);
                p += 2;
                continue;
            }
            *w++ = *p;
        }
        *w = 0;
        char lab[256];
        snprintf(lab, sizeof lab, "%s [%s]", label, precisions[pi]);
        pair q;
        if (pair_make(&q, lab, u, mode, mode == TF_MODE_TRAIN ? precisions[pi] : NULL, NULL, 0) && pair_step(&q, lab)) {
            pair_compare(&q, lab, mode == TF_MODE_TRAIN, 1e-4, mode == TF_MODE_TRAIN && pi ? tol_of(pi == 1 ? TF_DTYPE_BF16 : TF_DTYPE_F16) : 0);
            g_cases++;
        }
        pair_free(&q);
        free(u);
    }
}

#define TRAIN_SGD "train {\n  optimizer = sgd(lr=0.1, momentum=0.9)\n}\n"

static void ops(void)
{
    op_case("unary", "input x : f32[7, 13]\n"
            "a = neg(x)\nb = abs(x)\nc = exp(x)\nl1 = add(b, 1.0)\nd = log(l1)\ne = sqrt(b)\nf = rsqrt(l1)\ng = tanh(x)\n"
            "h = sigmoid(x)\ni = relu(x)\nj = sin(x)\nk = cos(x)\nm = erf(x)\nn = silu(x)\no = gelu(x)\n"
            "output a\noutput b\noutput c\noutput d\noutput e\noutput f\noutput g\noutput h\noutput i\noutput j\noutput k\n"
            "output m\noutput n\noutput o\n", TF_MODE_INFER);
    op_case("binary", "input x : f32[3, 1, 17]\ninput y : f32[5, 17]\nb = abs(x)\nl = add(b, 0.5)\n"
            "a = sub(x, y)\nc = div(x, l)\nd = pow(l, y)\ne = maximum(x, y)\nf = minimum(x, y)\ng = lt(x, y)\n"
            "h = where(g, x, y)\ni = ge(x, 0.25)\nj = cast(i, to=f32)\nk = mul(j, y)\n"
            "output a\noutput c\noutput d\noutput e\noutput f\noutput h\noutput k\n", TF_MODE_INFER);
    op_case("reductions", "input x : f32[5, 1, 19]\n"
            "a = reduce_sum(x, axes=[2])\nb = reduce_mean(x, axes=[0], keepdims=true)\nc = reduce_max(x, axes=[0, 2])\n"
            "d = sum(x, axes=[0, 1, 2])\ne = softmax(x)\nf = log_softmax(x, axis=0)\n"
            "output a\noutput b\noutput c\noutput d\noutput e\noutput f\n", TF_MODE_INFER);
    op_case("gemm", "input a : f32[3, 7, 5]\ninput b : f32[5, 11]\ninput c : f32[1, 11, 5]\ninput d : f32[7, 3]\n"
            "x = matmul(a, b)\ny = matmul(a, c, transpose_b=true)\nz = matmul(d, a, transpose_a=true)\n"
            "output x\noutput y\noutput z\n", TF_MODE_INFER);
    op_case("conv", "input x : f32[2, 4, 7, 6]\ninput w : f32[6, 2, 3, 3]\ninput b : f32[6]\n"
            "y = conv2d(x, w, b, stride=2, padding=1, dilation=[1, 2], groups=2)\nz = conv2d(x, w, padding=[0, 1], groups=2)\n"
            "output y\noutput z\n", TF_MODE_INFER);
    op_case("pool and layout", "input x : f32[2, 3, 7, 5]\n"
            "a = maxpool2d(x, kernel=3, stride=2, padding=1)\nb = avgpool2d(x, kernel=2)\nc = global_avgpool(x)\n"
            "d = transpose(x, perm=[3, 1, 0, 2])\ne = slice(x, axis=2, start=1, end=-1, step=2)\nf = concat(x, x, axis=1)\n"
            "g = broadcast(c, shape=[5, 2, 3])\nh = reshape(x, shape=[6, 35])\nk = flatten(x)\n"
            "output a\noutput b\noutput c\noutput d\noutput e\noutput f\noutput g\noutput h\noutput k\n", TF_MODE_INFER);
    op_case("gather and norms", "input i : i64[3, 5]\ninput t : f32[11, 7]\ninput g : f32[7]\ninput bb : f32[7]\n"
            "e = embedding(i, t)\nn = layernorm(e, g, bb)\no = one_hot(i, depth=11)\nr = gather(i, t)\n"
            "output n\noutput o\noutput r\n", TF_MODE_INFER);
    op_case("attention", "input q : f32[2, 3, 5, 4]\ninput k : f32[2, 3, 5, 4]\ninput v : f32[2, 3, 5, 4]\n"
            "a = attention(q, k, v, causal=true)\nb = attention(q, k, v)\noutput a\noutput b\n", TF_MODE_INFER);
    /* training: the backward kernels and the optimizer */
    op_case("train conv, pools, bias", "input x : f32[2, 4, 7, 6]\nparam w : f32[6, 2, 3, 3] = uniform()\nparam b : f32[6] = uniform()\n"
            "y = conv2d(x, w, b, stride=2, padding=1, dilation=[1, 2], groups=2)\np = maxpool2d(y, kernel=3, stride=2, padding=1)\n"
            "q = avgpool2d(y, kernel=2)\ns = mul(p, p)\nt = mean(s, axes=[0, 1, 2, 3])\nu = mean(q, axes=[0, 1, 2, 3])\n"
            "loss = add(t, u)\noutput loss\n" TRAIN_SGD, TF_MODE_TRAIN);
    op_case("train gemm, norms, gathers", "input i : i64[3, 5]\ninput y : i64[3, 5]\nparam t : f32[11, 7] = normal()\n"
            "param w : f32[7, 11] = uniform()\nparam g : f32[7] = ones()\nparam bb : f32[7] = zeros()\n"
            "e = embedding(i, t)\nn = layernorm(e, g, bb)\nh = gelu(n)\nl = linear(h, w)\nloss = cross_entropy(l, y)\n"
            "output loss\ntrain {\n  optimizer = adamw(lr=0.01)\n}\n", TF_MODE_TRAIN);
    op_case("train batchnorm, slice, concat", "input x : f32[3, 4, 5, 5]\ninput z : f32[3]\nparam w : f32[4, 4, 3, 3] = uniform()\n"
            "param g : f32[4] = ones()\nparam b : f32[4] = zeros()\nbuffer rm : f32[4] = zeros()\nbuffer rv : f32[4] = ones()\n"
            "c = conv2d(x, w, padding=1)\nn = batchnorm(c, g, b, rm, rv)\ns = slice(n, axis=1, start=1, end=3)\n"
            "k = concat(s, n, axis=1)\nr = relu(k)\nt = reduce_sum(r, axes=[1, 2, 3])\nloss = mse_loss(t, z)\n"
            "output loss\n" TRAIN_SGD, TF_MODE_TRAIN);
    op_case("train attention", "input x : f32[2, 5, 8]\nparam wq : f32[8, 8] = uniform()\nparam wv : f32[8, 8] = uniform()\n"
            "q = linear(x, wq)\nv = linear(x, wv)\nq4 = reshape(q, shape=[2, 5, 2, 4])\nv4 = reshape(v, shape=[2, 5, 2, 4])\n"
            "qh = transpose(q4, perm=[0, 2, 1, 3])\nvh = transpose(v4, perm=[0, 2, 1, 3])\n"
            "a = attention(qh, qh, vh, causal=true)\ns = mul(a, a)\nloss = mean(s, axes=[0, 1, 2, 3])\noutput loss\n" TRAIN_SGD,
            TF_MODE_TRAIN);
}

static void examples(void)
{
    static const struct { const char *file; tf_dim_override dims[3]; size_t nd; } models[] = {
        {"mlp.ir", {{"B", 8}, {"F", 20}}, 2},
        {"cnn.ir", {{"N", 2}, {"C", 4}}, 2},
        {"transformer.ir", {{"B", 2}, {"T", 5}, {"V", 10}}, 3},
    };
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char path[4096];
        char *text = test_read_example(models[i].file, path, sizeof path);
        CHECK(text != NULL, "cannot read %s", path);
        if (!text) continue;
        /* one step in the model's own mixed precision and in fp32 */
        for (int fp32 = 0; fp32 < 2; fp32++) {
            char lab[4200];
            snprintf(lab, sizeof lab, "%s train step [%s]", path, fp32 ? "fp32" : "model precision");
            pair q;
            if (pair_make(&q, lab, text, TF_MODE_TRAIN, fp32 ? "fp32" : NULL, models[i].dims, models[i].nd) && pair_step(&q, lab))
                pair_compare(&q, lab, true, 1e-4, fp32 ? 0 : tol_of(TF_DTYPE_BF16));
            pair_free(&q);
        }
        /* 50 steps in fp32: the loss curves agree */
        char lab[4200];
        snprintf(lab, sizeof lab, "%s 50 steps", path);
        pair q;
        if (pair_make(&q, lab, text, TF_MODE_TRAIN, "fp32", models[i].dims, models[i].nd)) {
            double first = 0, last = 0, worst = 0;
            for (int step = 0; step < 50 && pair_step(&q, lab); step++) {
                tf_tensor_view a, b;
                tf_session_output(q.ref, "loss", &a);
                tf_session_output(q.cpu, "loss", &b);
                double la = *(const float *)a.data, lb = *(const float *)b.data;
                double e = fabs(la - lb) / (1 + fabs(la));
                if (e > worst) worst = e;
                if (!step) first = la;
                last = la;
            }
            printf("%s: loss %.5f -> %.5f, worst relative difference cpu vs interp %.3g\n", lab, first, last, worst);
            CHECK(worst <= 1e-3, "%s: loss curves differ by %.3g (seed %llu)", lab, worst, (unsigned long long)g_seed);
            CHECK(last < first, "%s: the loss went down (%g -> %g)", lab, first, last);
        }
        pair_free(&q);
        free(text);
    }
}

int main(void)
{
    g_seed = test_seed();
    if (tf_backend_cpu.unavailable()) {   /* a build without LLVM: the target says why, and nothing runs */
        tf_context_t *ctx;
        tf_context_create(&ctx);
        tf_model_t *m = NULL;
        tf_program_t *p = NULL;
        tf_session_t *s = NULL;
        const char *t = "input x : f32[2]\ny = relu(x)\noutput y\n";
        tf_model_parse_string(ctx, "t", t, strlen(t), NULL, 0, &m);
        tf_program_compile(ctx, m, NULL, &p);
        CHECK(tf_session_create(ctx, p, TF_TARGET_CPU, 1, &s) == TF_ERR_UNAVAILABLE && strstr(tf_context_last_error(ctx), "no LLVM"),
              "cpu without LLVM says why: %s", tf_context_last_error(ctx));
        CHECK(tf_default_target() == TF_TARGET_INTERP, "the default target without LLVM is interp");
        tf_session_free(s);
        tf_program_free(p);
        tf_model_free(m);
        tf_context_free(ctx);
        return check_report();
    }
    CHECK(tf_default_target() == TF_TARGET_CPU, "the default target with LLVM and no GPU is cpu");
    ops();
    examples();
    printf("cpu: %d op cases against the interpreter\n", g_cases);
    return check_report();
}
