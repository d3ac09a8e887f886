/* test_gpu.c — the cuda target computes what the interpreter computes.
 *
 *   test_gpu                 on a machine with an NVIDIA GPU (tests/gpu/run.sh)
 *   test_gpu --fake DIR      anywhere: DIR holds fake_libcuda.c built as
 *                            libcuda.so.1 (host memory for device memory, no
 *                            kernels), and every kernel runs through the
 *                            target's host fallback (TFUSE_CUDA_FALLBACK=all)
 *   test_gpu --emu           anywhere: the cuda-emu target, the cuda target's
 *                            code over emu.h's stand-ins: every generated
 *                            kernel runs, every thread of every block
 *
 * Through the public API, like test_cpu.c for the cpu target: one program,
 * two sessions with the same seed (interp, the float64 oracle, and cuda),
 * the same fresh random inputs bound to both:
 *
 *   - ops: a model per op family (test_cpu.c's), at odd sizes, in fp32
 *     storage and in f16/bf16 storage; inference compares every output,
 *     training one step compares the loss and every param and buffer after
 *     the update (every backward kernel and the optimizer are in it);
 *   - each example: one training step in fp32 and in its own mixed
 *     precision, and a 50-step fp32 loss curve that must follow the
 *     interpreter's and go down;
 *   - asynchronous steps: steps run back to back from one caller buffer
 *     refilled (and spoiled) as soon as run returns, with nothing read in
 *     between, compute bit for bit what steps waited for one by one do,
 *     with graphs and with launches; an output read twice is the same; on
 *     cuda-emu, a fault while a step runs (injected) is reported by the call
 *     that waits, and the session fails cleanly after;
 *   - the session's contract: info, profiles, state in and out, the step,
 *     a second session served by the disk cache, out of memory said with
 *     the numbers and a remedy, and nothing left on the device afterwards.
 *
 * Tolerances, on the scale of the tensor (max |ref|), by storage dtype:
 * bf16 1/64 and f16 1/256 (one rounding of the format, as test_cpu);
 * fp32 1e-4 with TFUSE_NO_TF32=1 (float accumulation in reductions where
 * the interpreter uses double, the GPU's expf/tanhf within a few ulp), and
 * 1/128 by default, when fp32 GEMMs run on TF32 tensor cores: TF32 keeps 11
 * significant bits of each operand, so each product is off by up to 2^-10
 * relative and a K-term dot product by about 2^-10 of its magnitude, which
 * near-zero elements see against the tensor's scale. States after an
 * optimizer step compare by relative L2 error: 1e-3 in fp32 (Adam's
 * normalized step turns a float-sized gradient difference into a visible
 * one on a few elements), 1e-2 with TF32; 50-step loss curves within 1e-3
 * (2e-2 with TF32). With --fake every kernel is the interpreter's own, so
 * every comparison is exact (tolerance 0). With --emu the GEMMs are exact
 * (the stand-in accumulates in double) and the tolerances are fp32's. */
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "emu.h"
#include "runtime.h"
#include "target_cases.h"
#include "testutil.h"
#include "tfuse.h"

extern const tf_backend tf_backend_cuda;

/* LeakSanitizer (sanitizer builds): cuBLASLt keeps an allocation when
 * cublasLtCreate fails, as it does over the fake driver; not ours to free. */
const char *__lsan_default_suppressions(void) __attribute__((used));
const char *__lsan_default_suppressions(void) { return "leak:libcublasLt\n"; }

static uint64_t g_seed;
static int g_cases;
static bool g_fake, g_emu, g_tf32;
static tf_target g_target = TF_TARGET_CUDA;   /* the device sessions' */
static int g_opt = 1;                       /* pair_make's options: --O0, passes left out */
static bool g_no_graphs;                    /* pair_make: --cuda-graphs=off */
static const char *const *g_disable;
static size_t g_ndisable;
static void *g_fake_lib;   /* the fake driver, for its counters */

static double tol_of(tf_dtype t)
{
    if (g_fake) return 0;   /* the interpreter's own kernels on the host: bit for bit */
    return t == TF_DTYPE_BF16 ? 1.0 / 64 : t == TF_DTYPE_F16 ? 1.0 / 256 : t == TF_DTYPE_F64 ? 1e-9 : g_tf32 ? 1.0 / 128 : 1e-4;
}
static double state_tol(void) { return g_fake ? 0 : g_tf32 ? 1e-2 : 1e-3; }
static double curve_tol(void) { return g_fake ? 0 : g_tf32 ? 2e-2 : 1e-3; }

static int fake_counter(const char *name)
{
    int (*f)(void) = NULL;
    void *p = g_fake_lib ? dlsym(g_fake_lib, name) : NULL;
    memcpy(&f, &p, sizeof p);
    return f ? f() : -1;
}

/* ---- cuda sessions ------------------------------------------------------------ */

/* The target the programs are compiled for: cuda once api.c knows it. */
static tf_target compile_target(void) { return tf_backend_for(g_target) ? g_target : TF_TARGET_INTERP; }

/* A cuda session through tf_session_create once api.c has the target; until
 * then built here the way tf_session_create builds one. */
static tf_status cuda_session(tf_context_t *ctx, const tf_program_t *p, uint64_t seed, tf_session_t **out)
{
    if (tf_backend_for(g_target)) return tf_session_create(ctx, p, g_target, seed, out);
    *out = NULL;
    const char *why = tf_backend_cuda.unavailable();
    if (why) return tf_set_error(ctx, TF_ERR_UNAVAILABLE, "error: target 'cuda' cannot run here: %s", why);
    tf_session_t *s = calloc(1, sizeof *s);
    if (!s) return TF_ERR_OOM;
    s->ctx = ctx;
    s->p = p;
    s->be = &tf_backend_cuda;
    s->seed = seed;
    s->bound = calloc((size_t)(p->inputs.n ? p->inputs.n : 1), sizeof *s->bound);
    s->out = calloc((size_t)(p->m->noutputs ? p->m->noutputs : 1), sizeof *s->out);
    for (int i = 0; s->out && i < p->m->noutputs; i++) {
        const tf_type *t = &p->m->outputs[i].value->type;
        s->out[i] = malloc((size_t)tf_type_numel(t) * (size_t)tf_dtype_bytes(t->dtype) + 1);
    }
    tf_status st = s->bound && s->out ? tf_backend_cuda.session_create(s) : TF_ERR_OOM;
    if (st) {
        s->be = NULL;
        tf_session_free(s);
        return st;
    }
    *out = s;
    return TF_OK;
}

typedef struct pair {
    tf_context_t *ctx;
    tf_model_t *m;
    tf_program_t *p;
    tf_session_t *ref, *dev;
    void *data[32];
} pair;

static void pair_free(pair *q)
{
    for (int i = 0; i < 32; i++) free(q->data[i]);
    tf_session_free(q->ref);
    tf_session_free(q->dev);
    tf_program_free(q->p);
    tf_model_free(q->m);
    tf_context_free(q->ctx);
}

static bool g_data_parallel;   /* pair_make compiles with data_parallel */

static bool pair_make(pair *q, const char *label, const char *text, tf_mode mode, const char *precision,
                      const tf_dim_override *dims, size_t nd)
{
    memset(q, 0, sizeof *q);
    tf_context_create(&q->ctx);
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = mode;
    o.target = compile_target();
    if (precision) tf_precision_parse(precision, &o.precision);   /* NULL: the train block's */
    o.opt_level = g_opt;
    o.cuda_no_graphs = g_no_graphs;
    o.data_parallel = g_data_parallel;
    o.disable_passes = g_disable;
    o.ndisable_passes = g_ndisable;
    if (tf_model_parse_string(q->ctx, label, text, strlen(text), dims, nd, &q->m) || tf_program_compile(q->ctx, q->m, &o, &q->p) ||
        tf_session_create(q->ctx, q->p, TF_TARGET_INTERP, g_seed, &q->ref) || cuda_session(q->ctx, q->p, g_seed, &q->dev)) {
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
        if (tf_session_bind(q->ref, name, dt, shape, rank, q->data[i]) || tf_session_bind(q->dev, name, dt, shape, rank, q->data[i])) {
            CHECK(0, "%s: bind %s: %s", label, name, tf_context_last_error(q->ctx));
            return false;
        }
    }
    return true;
}

static bool pair_step(pair *q, const char *label)
{
    if (tf_session_run(q->ref) || tf_session_run(q->dev)) {
        CHECK(0, "%s: run: %s", label, tf_context_last_error(q->ctx));
        return false;
    }
    return true;
}

/* Every output elementwise; after training, every param and buffer.
 * prec_tol: the mixed precision's rounding (0 in fp32). */
static void pair_compare(pair *q, const char *label, bool state, double stol, double prec_tol)
{
    for (size_t i = 0; i < tf_program_io_count(q->p, TF_IO_OUTPUT); i++) {
        const char *name;
        tf_tensor_view a, b;
        tf_program_io(q->p, TF_IO_OUTPUT, i, &name, NULL, NULL, NULL);
        tf_session_output(q->ref, name, &a);
        tf_session_output(q->dev, name, &b);
        double tol = fmax(tol_of(a.dtype), prec_tol), r = tc_compare_elems(&b, &a, tol), l2 = tc_rel_l2_floor(&b, &a, 1e-30);
        /* A 16-bit step's outputs: the GPU's reductions add in float where the interpreter adds in double,
         * so now and then an intermediate value rounds to the neighbouring 16-bit number, and downstream
         * (softmax, layernorm) one output element can move a few 16-bit ulps: transformer.ir fp16 with
         * seed 1795525055, one logit at 1.86 x the element bound while the relative L2 error was 3e-4,
         * 13 x below it. So in mixed precision the whole output is held to the bound in L2, and no element
         * may pass 4 x its own; fp32 steps and the op cases keep the element bound. */
        bool ok = prec_tol > 0 ? l2 <= tol && r <= 4 : r <= 1;
        CHECK(ok, "%s: output %s (%s): error %.3g x the element tolerance %.3g, relative L2 error %.3g (seed %llu)", label, name,
              tf_dtype_str(a.dtype), r, tol, l2, (unsigned long long)g_seed);
    }
    /* A 16-bit step's states, as its outputs above: one intermediate value rounding to the neighbouring
     * 16-bit number can move a whole gradient term (a maxpool's choice between two inputs that tie in
     * 16 bits, a relu's sign), and a small state that sums thousands of such terms with either sign is
     * then off by more than one 16-bit rounding of itself: cnn.ir fp16 with seed 1795552994, bn1.b's
     * momentum (the gradient of a batchnorm bias, 8192 terms a channel) at 1.7 x the bound, with an RMS
     * difference of 1e-5. So in mixed precision all the float states together are held to the bound in
     * L2, and no one state may pass 4 x it; fp32 steps keep the bound for each state. */
    double all_num = 0, all_den = 0;
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
            if (!a.data || !b.data || tf_session_get_state(q->ref, name, &a, (size_t)(n ? n : 1) * (size_t)tf_dtype_size(dt)) || tf_session_get_state(q->dev, name, &b, (size_t)(n ? n : 1) * (size_t)tf_dtype_size(dt))) {
                CHECK(0, "%s: state %s: %s", label, name, tf_context_last_error(q->ctx));
                free(a.data);
                free(b.data);
                continue;
            }
            /* a state that is rounding noise around an exact zero (a conv bias before batchnorm at --O0,
             * where bias_drop does not remove it, has a zero gradient: both sides hold 1e-11 .. 1e-9) is
             * not measured against its own size: an RMS difference under 1e-6, fp32's resolution at unit
             * scale, is rounding either way */
            double e = tc_rel_l2(&b, &a), t = fmax(a.dtype == TF_DTYPE_F32 || a.dtype == TF_DTYPE_F64 ? stol : tol_of(a.dtype), prec_tol);
            double rms = tc_rel_l2_floor(&b, &a, 1) * (tc_numel(&a) ? 1 : 0);
            bool mixed = prec_tol > 0 && (a.dtype == TF_DTYPE_F32 || a.dtype == TF_DTYPE_F64);
            for (int64_t k = 0; mixed && k < tc_numel(&a); k++) {
                double g = tf_elem_load((tf_dt)b.dtype, b.data, k), w = tf_elem_load((tf_dt)a.dtype, a.data, k);
                if (g == w && isinf(w)) continue;   /* an overflowed fp16 step both sides skip (tc_rel_l2_floor) */
                all_num += (g - w) * (g - w);
                all_den += w * w;
            }
            CHECK(e <= (mixed ? 4 * t : t) || rms <= 1e-6, "%s: state %s (%s): relative L2 error %.3g > %.3g, RMS difference %.3g (seed %llu)",
                  label, name, tf_dtype_str(a.dtype), e, mixed ? 4 * t : t, rms, (unsigned long long)g_seed);
            free(a.data);
            free(b.data);
        }
    if (state && prec_tol > 0 && all_den > 0)
        CHECK(sqrt(all_num / all_den) <= prec_tol, "%s: the float states together: relative L2 error %.3g > %.3g (seed %llu)", label,
              sqrt(all_num / all_den), prec_tol, (unsigned long long)g_seed);
}

/* ---- ops --------------------------------------------------------------------- */

/* Inference: fp32, then the model with every f32 narrowed to bf16 and f16.
 * Training: fp32 and the mixed precisions (f32 params, 16-bit activations). */
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
        /* fp16 training: from a loss scale the first step does not overflow, which must be taken */
        bool made = pair_make(&q, lab, u, mode, mode == TF_MODE_TRAIN ? precisions[pi] : NULL, NULL, 0);
        bool fp16_train = mode == TF_MODE_TRAIN && pi == 2;
        if (made && fp16_train) {
            made = tc_small_loss_scale(q.ref, q.dev);
            CHECK(made, "%s: set train.loss_scale: %s", lab, tf_context_last_error(q.ctx));
        }
        if (made && pair_step(&q, lab)) {
            CHECK(!fp16_train || tc_train_step(q.ref) == 1, "%s: the fp16 step was skipped (train.step %lld): nothing to compare",
                  lab, (long long)tc_train_step(q.ref));
            pair_compare(&q, lab, mode == TF_MODE_TRAIN, state_tol(),
                         mode == TF_MODE_TRAIN && pi ? tol_of(pi == 1 ? TF_DTYPE_BF16 : TF_DTYPE_F16) : 0);
            g_cases++;
        }
        pair_free(&q);
        free(u);
    }
}

/* the written cases and those made from the op table; then scatter_add with repeated ids (20 ids,
 * 11 rows; 3 ids, 13 rows), which the cuda target adds with atomics in f32 and in order in f16/bf16 */
static void ops(void)
{
    tc_each_case(op_case);
    op_case("scatter_add", "input ids : i64[4, 5]\ninput t : f32[11, 6]\ninput j : i32[3]\ninput d : f32[3]\n"
            "e = gather(ids, t)\ns = scatter_add(ids, e, shape=[11, 6])\nu = scatter_add(j, d, shape=[13])\noutput s\noutput u\n",
            TF_MODE_INFER);
}

/* ---- the examples ---------------------------------------------------------------- */

static void examples(void)
{
    for (size_t i = 0; i < TEST_NEXAMPLES; i++) {
        const test_example *ex = &test_examples[i];
        tf_dim_override dims[3];
        for (int j = 0; j < ex->nd; j++) dims[j] = (tf_dim_override){ex->dims[j].name, ex->dims[j].value};
        char path[4096];
        char *text = test_read_example(ex->file, path, sizeof path);
        CHECK(text != NULL, "cannot read %s", path);
        if (!text) continue;
        static const char *const precs[] = {"fp32", "bf16", "fp16"};
        for (int pi = 0; pi < 4; pi++) {   /* the model's own precision, then each one */
            const char *prec = pi ? precs[pi - 1] : NULL;
            double ptol = pi == 2 ? tol_of(TF_DTYPE_BF16) : pi == 3 ? tol_of(TF_DTYPE_F16) : pi == 0 ? tol_of(TF_DTYPE_BF16) : 0;
            for (int infer = 0; infer < 2; infer++) {
                if (infer && !pi) continue;
                char lab[4200];
                snprintf(lab, sizeof lab, "%s %s step [%s]", path, infer ? "infer" : "train", prec ? prec : "model precision");
                pair q;
                if (pair_make(&q, lab, text, infer ? TF_MODE_INFER : TF_MODE_TRAIN, prec, dims, ex->nd) && pair_step(&q, lab))
                    pair_compare(&q, lab, !infer, state_tol(), ptol);
                pair_free(&q);
            }
        }
        /* other plans of the same step: --O0 (no fusion, no in-place reuse), no memplan (every value in
         * its own block), no fusion */
        static const char *const no_memplan[] = {"memplan"}, *const no_fuse[] = {"fuse"};
        static const struct { const char *name; int opt; const char *const *dis; size_t nd; } variants[] = {
            {"--O0", 0, NULL, 0}, {"without memplan", 1, no_memplan, 1}, {"without fuse", 1, no_fuse, 1},
        };
        for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
            char lab[4200];
            snprintf(lab, sizeof lab, "%s train step [fp32, %s]", path, variants[v].name);
            g_opt = variants[v].opt;
            g_disable = variants[v].dis;
            g_ndisable = variants[v].nd;
            pair q;
            if (pair_make(&q, lab, text, TF_MODE_TRAIN, "fp32", dims, ex->nd) && pair_step(&q, lab) && pair_step(&q, lab))
                pair_compare(&q, lab, true, state_tol(), 0);
            pair_free(&q);
            g_opt = 1;
            g_disable = NULL;
            g_ndisable = 0;
        }
        for (int pi = 0; pi < 3; pi++) {
            char lab[4200];
            snprintf(lab, sizeof lab, "%s 50 steps [%s]", path, precs[pi]);
            /* 16-bit: both sides round every activation alike, and differ by float accumulation order */
            double ctol = pi ? tol_of(pi == 1 ? TF_DTYPE_BF16 : TF_DTYPE_F16) : curve_tol();
            pair q;
            if (pair_make(&q, lab, text, TF_MODE_TRAIN, precs[pi], dims, ex->nd)) {
                double first = 0, last = 0, worst = 0;
                for (int step = 0; step < 50 && pair_step(&q, lab); step++) {
                    tf_tensor_view a, b;
                    tf_session_output(q.ref, "loss", &a);
                    tf_session_output(q.dev, "loss", &b);
                    double la = tf_view_element(&a, 0), lb = tf_view_element(&b, 0);
                    double e = fabs(la - lb) / (1 + fabs(la));
                    if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
                    if (!step) first = la;
                    last = la;
                }
                printf("%s: loss %.5f -> %.5f, worst relative difference cuda vs interp %.3g\n", lab, first, last, worst);
                CHECK(worst <= ctol, "%s: loss curves differ by %.3g (seed %llu)", lab, worst, (unsigned long long)g_seed);
                CHECK(last < first, "%s: the loss went down (%g -> %g)", lab, first, last);
            }
            pair_free(&q);
        }
        free(text);
    }
}

/* ---- cuBLASLt epilogues: a bias (and ReLU) in the GEMM, the rest in the epilogue kernel ---- */

static void epilogues(void)
{
    static const struct { const char *label, *text; int kernels; } cases[] = {
        /* relu(x w + b) alone: the GEMM does it all, no kernel is generated */
        {"relu(x w + b)", "input x : f32[37, 24]\nparam w : f32[24, 19] = uniform()\nparam b : f32[19] = uniform()\n"
                          "h = linear(x, w, b)\ny = relu(h)\noutput y\n", 0},
        /* x w + b alone */
        {"x w + b", "input x : f32[37, 24]\nparam w : f32[24, 19] = uniform()\nparam b : f32[19] = uniform()\n"
                    "y = linear(x, w, b)\noutput y\n", 0},
        /* both stored: the GEMM writes x w + b, one kernel takes its ReLU */
        {"x w + b and its relu", "input x : f32[37, 24]\nparam w : f32[24, 19] = uniform()\nparam b : f32[19] = uniform()\n"
                                 "h = linear(x, w, b)\ny = relu(h)\noutput h\noutput y\n", 1},
        /* the product read apart from the bias add: no epilogue, one kernel */
        {"x w + b and x w", "input x : f32[37, 24]\ninput w : f32[24, 19]\ninput b : f32[19]\np = matmul(x, w)\n"
                            "h = add(p, b)\nz = mul(p, p)\noutput h\noutput z\n", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        for (int pi = 0; pi < 3; pi++) {
            static const char *const names[] = {"f32", "bf16", "f16"};
            char lab[200], text[1024];
            snprintf(lab, sizeof lab, "epilogue: %s [%s]", cases[i].label, names[pi]);
            /* the model in each storage type */
            const char *src = cases[i].text;
            size_t at = 0;
            for (const char *p = src; *p && at + 8 < sizeof text; p++) {
                if (!strncmp(p, "f32", 3)) {
                    at += (size_t)snprintf(text + at, sizeof text - at, "%s", names[pi]);
                    p += 2;
                } else {
                    text[at++] = *p;
                }
            }
            text[at] = 0;
            pair q;
            if (pair_make(&q, lab, text, TF_MODE_INFER, NULL, NULL, 0) && pair_step(&q, lab)) {
                pair_compare(&q, lab, false, state_tol(), 0);
                tf_session_info info;
                tf_session_get_info(q.dev, &info);
                CHECK(info.jit_compiled + info.jit_cached == cases[i].kernels && info.fallbacks == 0,
                      "%s: %d generated kernels beside the GEMM (want %d), %d on the host", lab, info.jit_compiled + info.jit_cached,
                      cases[i].kernels, info.fallbacks);
            }
            pair_free(&q);
        }
    }
}

/* ---- backward epilogues: examples/mlp.ir's train step ----------------------------------
 * In fp32 the weight gradient dW2 = a^T dY carries b2's gradient (BGRADA)
 * and its reduction kernel does not run; ReLU's backward with b1's gradient
 * is the dX GEMM's DRELU_BGRAD (on the forward GEMM's RELU_AUX_BIAS mask),
 * at the GEMM's place or at ReLU's kernel's (then the matmul kernel is
 * "GEMM moved"); the step still matches the interpreter. In bf16 neither
 * may be used: the reduction sums the f32 gradient, the GEMM its bf16 copy,
 * and the mask is handed over in f32 only. */
static int count_how(tf_session_t *s, const char *how)
{
    int n = 0;
    for (size_t i = 0; i < tf_session_profile_count(s); i++) {
        tf_kernel_profile kp;
        if (!tf_session_profile(s, i, &kp) && kp.how && !strcmp(kp.how, how)) n++;
    }
    return n;
}

static void backward_epilogues(void)
{
    const test_example *ex = NULL;
    for (size_t i = 0; i < TEST_NEXAMPLES; i++)
        if (!strcmp(test_examples[i].file, "mlp.ir")) ex = &test_examples[i];
    CHECK(ex != NULL, "mlp.ir is among the examples");
    if (!ex) return;
    tf_dim_override dims[3];
    for (int j = 0; j < ex->nd; j++) dims[j] = (tf_dim_override){ex->dims[j].name, ex->dims[j].value};
    char path[4096];
    char *text = test_read_example(ex->file, path, sizeof path);
    CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    for (int bf = 0; bf < 2; bf++) {
        char lab[4200];
        snprintf(lab, sizeof lab, "%s backward epilogues [%s]", path, bf ? "bf16" : "fp32");
        pair q;
        /* on a GPU, --cuda-explain's lines for this session: each GEMM's epilogue, or why it has none (the first
         * GPU run found no DRELU_BGRAD in fp32 and did not say why) */
        bool explain = !g_emu && !g_fake && !bf;
        if (explain) setenv("TFUSE_CUDA_EXPLAIN", "1", 1);
        bool made = pair_make(&q, lab, text, TF_MODE_TRAIN, bf ? "bf16" : "fp32", dims, ex->nd);
        if (explain) unsetenv("TFUSE_CUDA_EXPLAIN");
        if (made) {
            tf_session_set_profiling(q.dev, 1);
            /* fp32: two steps (the second reads params the first updated through the epilogues' gradients), as the
             * other plans of examples() are checked; bf16: one, as its mixed-precision step is */
            for (int step = 0; step < (bf ? 1 : 2) && pair_step(&q, lab); step++)
                pair_compare(&q, lab, true, state_tol(), bf ? tol_of(TF_DTYPE_BF16) : 0);
            int bgrad = count_how(q.dev, "in GEMM: BGRADA") + count_how(q.dev, "in GEMM: BGRADB");
            int drelu = count_how(q.dev, "in GEMM: DRELU_BGRAD") + count_how(q.dev, "GEMM moved: DRELU_BGRAD");
            if (!bf)
                CHECK(bgrad == 1 && drelu == 1, "%s: b2's gradient in the weight-gradient GEMM (%d kernels replaced, want 1), ReLU's backward "
                      "and b1's gradient in the dX GEMM (%d, want 1)%s", lab, bgrad, drelu,
                      explain ? "; the GEMMs' epilogues, and why not, in the cuda: lines above" : "");
            else
                CHECK(bgrad == 0 && drelu == 0, "%s: no backward epilogue in bf16 (%d BGRAD, %d DRELU)", lab, bgrad, drelu);
        }
        pair_free(&q);
    }
    free(text);
}

/* ---- CUDA graphs: a replayed step computes exactly what a launched one does ------------ */

static bool same_bytes(const tf_tensor_view *a, const tf_tensor_view *b)
{
    return a->dtype == b->dtype && !memcmp(a->data, b->data, (size_t)tc_numel(a) * (size_t)tf_dtype_size(a->dtype));
}

static void graphs(void)
{
    for (size_t i = 0; i < TEST_NEXAMPLES; i++) {
        const test_example *ex = &test_examples[i];
        tf_dim_override dims[3];
        for (int j = 0; j < ex->nd; j++) dims[j] = (tf_dim_override){ex->dims[j].name, ex->dims[j].value};
        char path[4096], lab[4300];
        char *text = test_read_example(ex->file, path, sizeof path);
        if (!text) continue;
        snprintf(lab, sizeof lab, "%s: graph replay against stream launches", path);
        pair g, k;   /* the same program and inputs, a graph per step, and launches */
        g_no_graphs = true;
        bool ok = pair_make(&k, lab, text, TF_MODE_TRAIN, NULL, dims, ex->nd);
        g_no_graphs = false;
        ok = pair_make(&g, lab, text, TF_MODE_TRAIN, NULL, dims, ex->nd) && ok;
        int steps = 0, same = 0, outs = 0;
        for (int step = 0; ok && step < 4; step++) {
            if (tf_session_run(g.dev) || tf_session_run(k.dev)) {
                CHECK(0, "%s: run: %s", lab, tf_context_last_error(g.ctx));
                break;
            }
            steps++;
            for (size_t o = 0; o < tf_program_io_count(g.p, TF_IO_OUTPUT); o++) {
                const char *name;
                tf_tensor_view a, b;
                tf_program_io(g.p, TF_IO_OUTPUT, o, &name, NULL, NULL, NULL);
                tf_session_output(g.dev, name, &a);
                tf_session_output(k.dev, name, &b);
                outs++;
                same += same_bytes(&a, &b);
            }
        }
        if (ok) {
            tf_session_info gi, ki;
            tf_session_get_info(g.dev, &gi);
            tf_session_get_info(k.dev, &ki);
            printf("%s: %d steps, graph: %s (%lld replays); launches: %s\n", lab, steps, gi.step_graph, (long long)gi.graph_replays,
                   ki.step_graph);
            if (gi.fallbacks)   /* a kernel on the host cannot be captured: launches, and the reason names it */
                CHECK(gi.step_graph && strstr(gi.step_graph, "runs on the host") && gi.graph_replays == 0,
                      "%s: a host kernel keeps the step out of a graph, and says so (%s)", lab, gi.step_graph ? gi.step_graph : "-");
            else
                CHECK(gi.step_graph && !strcmp(gi.step_graph, "graph") && gi.graph_replays == steps,
                      "%s: every step ran as the captured graph (%s, %lld of %d)", lab, gi.step_graph ? gi.step_graph : "-",
                      (long long)gi.graph_replays, steps);
            CHECK(ki.step_graph && strstr(ki.step_graph, "--cuda-graphs=off") && ki.graph_replays == 0, "%s: --cuda-graphs=off launches", lab);
            CHECK(steps == 4 && same == outs, "%s: outputs bit for bit the same (%d of %d)", lab, same, outs);
            /* and every param, buffer and optimizer state after the steps */
            int states = 0, sames = 0;
            for (int kind = TF_IO_PARAM; kind <= TF_IO_BUFFER; kind++)
                for (size_t j = 0; j < tf_program_io_count(g.p, (tf_io_kind)kind); j++) {
                    const char *name;
                    tf_dtype dt;
                    int rank;
                    int64_t shape[8], n = 1;
                    tf_program_io(g.p, (tf_io_kind)kind, j, &name, &dt, &rank, shape);
                    for (int q = 0; q < rank; q++) n *= shape[q];
                    size_t bytes = (size_t)(n ? n : 1) * (size_t)tf_dtype_size(dt);
                    tf_tensor_view a = {.data = malloc(bytes)}, b = {.data = malloc(bytes)};
                    if (!tf_session_get_state(g.dev, name, &a, bytes) && !tf_session_get_state(k.dev, name, &b, bytes)) {
                        states++;
                        sames += same_bytes(&a, &b);
                    }
                    free(a.data);
                    free(b.data);
                }
            CHECK(states > 0 && sames == states, "%s: every state bit for bit the same (%d of %d)", lab, sames, states);
        }
        pair_free(&g);
        pair_free(&k);
        free(text);
    }
}

/* ---- asynchronous steps: run enqueues, the first call that reads results waits ---------- */

static const char *const ASYNC_MLP = "input x : f32[6, 10]\ninput y : i64[6]\nparam w : f32[10, 7] = uniform()\n"
                                     "param b : f32[7] = zeros()\nh = linear(x, w, b)\nr = relu(h)\nloss = cross_entropy(r, y)\n"
                                     "output loss\noutput logits = r\ntrain {\n  optimizer = adam(lr=0.01)\n}\n";
enum { ASYNC_STEPS = 6 };

typedef struct async_run {
    tf_context_t *ctx;
    tf_model_t *m;
    tf_program_t *p;
    tf_session_t *s;
} async_run;

static bool async_open(async_run *a, bool graphs)
{
    memset(a, 0, sizeof *a);
    tf_context_create(&a->ctx);
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_TRAIN;
    o.target = compile_target();
    tf_precision_parse("fp32", &o.precision);
    o.cuda_no_graphs = !graphs;
    if (tf_model_parse_string(a->ctx, "async", ASYNC_MLP, strlen(ASYNC_MLP), NULL, 0, &a->m) || tf_program_compile(a->ctx, a->m, &o, &a->p) ||
        cuda_session(a->ctx, a->p, g_seed, &a->s)) {
        CHECK(0, "async: %s", tf_context_last_error(a->ctx));
        return false;
    }
    return true;
}

static void async_close(async_run *a)
{
    tf_session_free(a->s);
    tf_program_free(a->p);
    tf_model_free(a->m);
    tf_context_free(a->ctx);
}

/* Step k's inputs: x in [-2, 2), y in [0, 7). */
static void async_inputs(int k, float *x, int64_t *y)
{
    uint64_t r = g_seed * 7919 + (uint64_t)k * 104729 + 1;
    for (int i = 0; i < 60; i++) x[i] = (float)(4 * test_rnd(&r) - 2);
    for (int i = 0; i < 6; i++) y[i] = (int64_t)(test_rnd(&r) * 7) % 7;
}

/* w, b and the optimizer's state, concatenated. */
static size_t async_state(async_run *a, unsigned char *buf, size_t cap)
{
    size_t at = 0;
    for (int kind = TF_IO_PARAM; kind <= TF_IO_BUFFER; kind++)
        for (size_t j = 0; j < tf_program_io_count(a->p, (tf_io_kind)kind); j++) {
            const char *name;
            tf_dtype dt;
            int rank;
            int64_t shape[8], n = 1;
            tf_program_io(a->p, (tf_io_kind)kind, j, &name, &dt, &rank, shape);
            for (int q = 0; q < rank; q++) n *= shape[q];
            size_t bytes = (size_t)n * (size_t)tf_dtype_size(dt);
            tf_tensor_view v = {.data = buf + at};
            if (at + bytes > cap || tf_session_get_state(a->s, name, &v, bytes)) {
                CHECK(0, "async: state %s: %s", name, tf_context_last_error(a->ctx));
                return 0;
            }
            at += bytes;
        }
    return at;
}

static void async_steps(void)
{
    int64_t xs[2] = {6, 10}, ys[1] = {6};
    float x[ASYNC_STEPS][60], logits[3][42], loss_each[2][ASYNC_STEPS];
    int64_t y[ASYNC_STEPS][6];
    for (int k = 0; k < ASYNC_STEPS; k++) async_inputs(k, x[k], y[k]);
    static unsigned char st[3][8192];
    size_t nst[3] = {0};
    float loss_last[3] = {0};
    /* 0: graphs, steps back to back, one caller buffer refilled (and then spoiled) after each run returns, nothing read
     *    until the end; 1: graphs, an output read (the host waits) after every step; 2: launches (--cuda-graphs=off),
     *    an output read after every step */
    for (int v = 0; v < 3; v++) {
        async_run a;
        if (!async_open(&a, v != 2)) {
            async_close(&a);
            return;
        }
        float xb[60];
        int64_t yb[6];
        bool ok = !tf_session_bind(a.s, "x", TF_DTYPE_F32, xs, 2, xb) && !tf_session_bind(a.s, "y", TF_DTYPE_I64, ys, 1, yb);
        for (int k = 0; ok && k < ASYNC_STEPS; k++) {
            memcpy(xb, x[k], sizeof xb);
            memcpy(yb, y[k], sizeof yb);
            ok = !tf_session_run(a.s);
            CHECK(ok, "async %d: run %d: %s", v, k, tf_context_last_error(a.ctx));
            /* the caller may change its buffers once run returns: the step computes with what was there */
            for (int i = 0; i < 60; i++) xb[i] = v == 0 ? NAN : x[(k + 1) % ASYNC_STEPS][i];
            for (int i = 0; i < 6; i++) yb[i] = (yb[i] + 3) % 7;
            if (v == 0 || !ok) continue;
            tf_tensor_view l;
            ok = !tf_session_output(a.s, "loss", &l);
            CHECK(ok, "async %d: output %d: %s", v, k, tf_context_last_error(a.ctx));
            if (ok) loss_each[v - 1][k] = ((const float *)l.data)[0];
        }
        if (ok) {
            tf_tensor_view l, l2, lg;
            ok = !tf_session_output(a.s, "loss", &l) && !tf_session_output(a.s, "logits", &lg);
            CHECK(ok, "async %d: outputs: %s", v, tf_context_last_error(a.ctx));
            if (ok) {
                loss_last[v] = ((const float *)l.data)[0];
                memcpy(logits[v], lg.data, sizeof logits[v]);
                /* read again: the same step's outputs, the same bytes */
                CHECK(!tf_session_output(a.s, "logits", &l2) && !memcmp(l2.data, logits[v], sizeof logits[v]) &&
                          !tf_session_output(a.s, "loss", &l2) && ((const float *)l2.data)[0] == loss_last[v],
                      "async %d: an output read twice is the same", v);
            }
            uint64_t step = 0;
            CHECK(!tf_session_step(a.s, &step) && step == ASYNC_STEPS, "async %d: %d steps counted (%llu)", v, ASYNC_STEPS,
                  (unsigned long long)step);
            nst[v] = async_state(&a, st[v], sizeof st[v]);
        }
        tf_session_info info;
        tf_session_get_info(a.s, &info);
        if (v != 2 && !info.fallbacks)
            CHECK(info.graph_replays == ASYNC_STEPS, "async %d: every step a graph replay (%lld)", v, (long long)info.graph_replays);
        async_close(&a);
        if (!ok) return;
    }
    g_cases++;
    CHECK(!memcmp(loss_each[0], loss_each[1], sizeof loss_each[0]), "async: each step's loss the same with graphs and launches");
    CHECK(loss_last[0] == loss_last[1] && loss_last[1] == loss_last[2] && loss_last[2] == loss_each[1][ASYNC_STEPS - 1],
          "async: the last loss the same, steps back to back or waited for, graphs or launches (%.9g %.9g %.9g)", loss_last[0],
          loss_last[1], loss_last[2]);
    CHECK(!memcmp(logits[0], logits[1], sizeof logits[0]) && !memcmp(logits[1], logits[2], sizeof logits[0]),
          "async: the last logits bit for bit the same");
    CHECK(nst[0] > 0 && nst[0] == nst[1] && nst[1] == nst[2] && !memcmp(st[0], st[1], nst[0]) && !memcmp(st[1], st[2], nst[0]),
          "async: every param and optimizer state bit for bit the same after %d steps", ASYNC_STEPS);
}

/* A fault on the GPU while a step runs (cuda-emu: one injected into a
 * launch): run has returned, the call that waits reports it, with the
 * message a synchronous step gave, and the session fails cleanly after. */
static void async_fault(void)
{
    for (int v = 0; v < 2; v++) {
        async_run a;
        if (!async_open(&a, v == 0)) {
            async_close(&a);
            return;
        }
        float xb[60];
        int64_t yb[6], xs[2] = {6, 10}, ys[1] = {6};
        async_inputs(0, xb, yb);
        tf_tensor_view l;
        bool ok = !tf_session_bind(a.s, "x", TF_DTYPE_F32, xs, 2, xb) && !tf_session_bind(a.s, "y", TF_DTYPE_I64, ys, 1, yb) &&
                  !tf_session_run(a.s) && !tf_session_output(a.s, "loss", &l) && !tf_session_run(a.s) &&
                  !tf_session_output(a.s, "loss", &l);
        CHECK(ok, "fault %d: two good steps: %s", v, tf_context_last_error(a.ctx));
        if (ok) {
            tf_cuda_emu_inject_fault(1);
            tf_status st = tf_session_run(a.s);
            CHECK(st == TF_OK, "fault %d: run returns before the step runs: %s", v, st ? tf_context_last_error(a.ctx) : "ok");
            float w[70];
            tf_tensor_view wv = {.data = w};
            /* the first call that waits: an output (graphs) or the state (launches) */
            st = v == 0 ? tf_session_output(a.s, "loss", &l) : tf_session_get_state(a.s, "w", &wv, sizeof w);
            char e[4096];
            snprintf(e, sizeof e, "%s", tf_context_last_error(a.ctx));
            CHECK(st == TF_ERR_RUNTIME && strstr(e, "error: cuda: the step failed on the GPU: ") && strstr(e, "injected") &&
                      strstr(e, "illegal memory access"),
                  "fault %d: the call that waits reports the step's failure: %s", v, e);
            tf_cuda_emu_inject_fault(0);
            st = tf_session_run(a.s);
            CHECK(st == TF_ERR_RUNTIME && !strcmp(tf_context_last_error(a.ctx), e), "fault %d: the next run fails cleanly, saying so: %s", v,
                  tf_context_last_error(a.ctx));
            st = tf_session_output(a.s, "loss", &l);
            CHECK(st == TF_ERR_RUNTIME && !strcmp(tf_context_last_error(a.ctx), e), "fault %d: so does an output", v);
            st = tf_session_get_state(a.s, "w", &wv, sizeof w);
            CHECK(st == TF_ERR_RUNTIME, "fault %d: and the state", v);
            g_cases++;
        }
        tf_cuda_emu_inject_fault(0);
        async_close(&a);
    }
}

/* ---- the session's contract -------------------------------------------------------- */

/* The cuBLASLt algorithm choices cached in $TFUSE_CACHE_DIR/cuda (default
 * ~/.cache/tfuse/cuda), as blas.c writes them: <hash>.cublaslt. */
static int cublaslt_files(void)
{
    char dir[4200];
    const char *env = getenv("TFUSE_CACHE_DIR"), *home = getenv("HOME");
    if (env && *env) snprintf(dir, sizeof dir, "%s/cuda", env);
    else snprintf(dir, sizeof dir, "%s/.cache/tfuse/cuda", home ? home : "");
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strlen(e->d_name) > 9 && !strcmp(e->d_name + strlen(e->d_name) - 9, ".cublaslt");
    if (d) closedir(d);
    return n;
}

static void contract(void)
{
    static const char *const MLP = "input x : f32[6, 10]\ninput y : i64[6]\nparam w : f32[10, 7] = uniform()\n"
                                   "param b : f32[7] = zeros()\nh = linear(x, w, b)\nr = relu(h)\nloss = cross_entropy(r, y)\n"
                                   "output loss\noutput logits = r\ntrain {\n  optimizer = adam(lr=0.01)\n}\n";
    pair q;
    if (!pair_make(&q, "contract", MLP, TF_MODE_TRAIN, "fp32", NULL, 0)) {
        pair_free(&q);
        return;
    }
    tf_session_info info;
    CHECK(!tf_session_get_info(q.dev, &info), "info: %s", tf_context_last_error(q.ctx));
    printf("cuda session: %d kernels, %d compiled, %d cached, %d on the host, GEMMs through %s, %.0f ms to start\n", info.kernels,
           info.jit_compiled, info.jit_cached, info.fallbacks, info.library, info.jit_ms);
    CHECK(!strcmp(info.target, g_emu ? "cuda-emu" : "cuda") && info.threads == 1 && info.kernels > 0, "info says %s, one thread, kernels",
          g_emu ? "cuda-emu" : "cuda");
    if (g_fake) CHECK(!strcmp(info.library, "none") && info.fallbacks > 0, "everything on the host: %d fallbacks", info.fallbacks);
    else CHECK(!strncmp(info.library, "cuBLASLt", 8), "GEMMs through cuBLASLt (got %s)", info.library);
    if (!g_fake) CHECK(cublaslt_files() > 0, "each GEMM's algorithm timed and cached on disk (no .cublaslt file in the cache)");

    /* profiles: one entry per kernel, one call each after one run */
    tf_session_set_profiling(q.dev, 1);
    if (pair_step(&q, "contract")) {
        size_t n = tf_session_profile_count(q.dev);
        int ok = 0, fallbacks = 0, gemms = 0, working = 0, bytes_ok = 0;
        for (size_t i = 0; i < n; i++) {
            tf_kernel_profile kp;
            if (tf_session_profile(q.dev, i, &kp)) continue;
            ok += kp.calls == 1 && kp.total_ms >= 0 && kp.name && kp.how;
            working += strcmp(kp.how, "view") && strcmp(kp.how, "multi");
            fallbacks += !strcmp(kp.how, "fallback");
            gemms += !strcmp(kp.how, "gemm");
            /* bytes: the least traffic of what the entry times; a view, a part of a multi-tensor launch and
             * a kernel whose work a GEMM's epilogue does ("in GEMM: BGRADA") none */
            bool none = !strcmp(kp.how, "view") || !strcmp(kp.how, "multi") || !strcmp(kp.how, "-") || !strncmp(kp.how, "in GEMM", 7);
            bytes_ok += none ? kp.bytes == 0 : kp.bytes > 0;
            if (!g_fake) printf("  profile: %-28s %-9s %8.3f ms %lld elements %lld bytes\n", kp.name, kp.how, kp.total_ms,
                                (long long)kp.elements, (long long)kp.bytes);
        }
        CHECK(bytes_ok == (int)n, "every profile entry's bytes: > 0 where it does work, 0 for views and parts (%d of %zu)", bytes_ok, n);
        /* the yardstick of those bytes; measuring it leaves the session's memory alone (pair_compare below) */
        double gbps = 0;
        CHECK(!tf_session_copy_bandwidth(q.dev, &gbps) && gbps > 0, "a device-to-device copy's bandwidth: %g GB/s (%s)", gbps,
              tf_context_last_error(q.ctx));
        printf("cuda session: a copy moves %.1f GB/s\n", gbps);
        CHECK(!tf_session_get_info(q.dev, &info) && info.device_bytes >= info.arena_bytes + (int64_t)(70 + 7) * 4,
              "device_bytes (%lld) holds the arena (%lld) and the params", (long long)info.device_bytes,
              (long long)info.arena_bytes);
        CHECK(ok == (int)n, "every profile entry ran once (%d of %zu)", ok, n);
        /* on the host every update chain is its own kernel; on the GPU they are one launch */
        CHECK(g_fake ? working >= info.kernels : working == info.kernels, "the profile's kernels doing work are the kernels info counts (%d, %d)",
              working, info.kernels);
        CHECK(fallbacks == info.fallbacks, "profiles name the fallbacks info counts (%d, %d)", fallbacks, info.fallbacks);
        if (!g_fake) CHECK(gemms > 0, "the matmuls run on cuBLASLt (%d gemm kernels; TFUSE_CUDA_EXPLAIN=1 says why not)", gemms);
        pair_compare(&q, "contract, second step", true, state_tol(), 0);
    }
    tf_session_set_profiling(q.dev, 0);

    /* state in and out; both sessions then agree again */
    float w[70], back[70];
    tf_tensor_view v = {.data = w};
    CHECK(!tf_session_get_state(q.dev, "w", &v, sizeof w), "get w: %s", tf_context_last_error(q.ctx));
    for (int i = 0; i < 70; i++) w[i] = (float)(i % 7) * 0.125f - 0.25f;
    CHECK(!tf_session_set_state(q.dev, "w", &v) && !tf_session_set_state(q.ref, "w", &v), "set w: %s", tf_context_last_error(q.ctx));
    tf_tensor_view bv = {.data = back};
    CHECK(!tf_session_get_state(q.dev, "w", &bv, sizeof back) && !memcmp(w, back, sizeof w), "w reads back as written");
    uint64_t step = 0;
    CHECK(!tf_session_step(q.dev, &step) && step == 1, "one run so far (%llu)", (unsigned long long)step);
    CHECK(!tf_session_set_step(q.dev, 7) && !tf_session_set_step(q.ref, 7) && !tf_session_step(q.dev, &step) && step == 7,
          "the step is set");
    if (pair_step(&q, "contract")) pair_compare(&q, "contract, after set_state", true, state_tol(), 0);

    /* a second session of the same program compiles nothing: the disk cache */
    tf_session_t *again = NULL;
    if (!cuda_session(q.ctx, q.p, g_seed, &again)) {
        tf_session_info i2;
        tf_session_get_info(again, &i2);
        if (info.jit_compiled + info.jit_cached > 0)
            CHECK(i2.jit_compiled == 0 && i2.jit_cached == info.jit_compiled + info.jit_cached,
                  "a second session reads every cubin from the cache (compiled %d, cached %d)", i2.jit_compiled, i2.jit_cached);
        tf_session_free(again);
    } else {
        CHECK(0, "second session: %s", tf_context_last_error(q.ctx));
    }
    pair_free(&q);

    /* out of memory: the numbers and the remedy, before anything runs */
    tf_context_t *ctx;
    tf_context_create(&ctx);
    const char *big = "dim N = 16\ninput x : f32[4]\nparam w : f32[4, 3] = ones()\na = broadcast(x, shape=[N, 4])\n"
                      "y = matmul(a, w)\nz = reduce_sum(y, axes=[0, 1])\noutput z\n";
    tf_dim_override dim = {"N", g_fake || g_emu ? (int64_t)1 << 20 : (int64_t)1 << 36};   /* 16 MiB in a 4 MiB fake; 1 TiB */
    if (g_fake) setenv("FAKE_CUDA_MEMORY", "4194304", 1);
    if (g_emu) setenv("TFUSE_EMU_MEMORY", "4194304", 1);
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_session_t *s = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = compile_target();
    if (tf_model_parse_string(ctx, "big", big, strlen(big), &dim, 1, &m) || tf_program_compile(ctx, m, &o, &p)) {
        CHECK(0, "big: %s", tf_context_last_error(ctx));
    } else {
        tf_status st = cuda_session(ctx, p, 1, &s);
        const char *e = tf_context_last_error(ctx);
        CHECK(st == TF_ERR_OOM && strstr(e, "out of GPU memory") && strstr(e, "--checkpoint=auto") && strstr(e, "smaller batch") &&
                  strstr(e, " free"),
              "out of memory says what is needed and free, and what to do: %s", e);
        printf("out of memory: %s\n", e);
    }
    unsetenv("FAKE_CUDA_MEMORY");
    unsetenv("TFUSE_EMU_MEMORY");
    tf_session_free(s);
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
}

/* Ids the API cannot check before a step (computed from an input): an id out
 * of range fails the step with the interpreter's message before any update,
 * and an in-range step then runs as the interpreter's. */
static void bad_ids(void)
{
    static const char *const M = "input ids : i64[4]\nparam t : f32[5, 3] = normal()\nj = add(ids, 2)\ne = gather(j, t)\n"
                                 "s = mul(e, e)\nloss = mean(s, axes=[0, 1])\noutput loss\n" TC_TRAIN_SGD;
    pair q;
    if (!pair_make(&q, "bad ids", M, TF_MODE_TRAIN, "fp32", NULL, 0)) {
        pair_free(&q);
        return;
    }
    int64_t bad[4] = {0, 1, 3, 1}, good[4] = {0, 2, 1, 2}, shape[1] = {4};
    float t0[15], t1[15];
    tf_tensor_view v0 = {.data = t0}, v1 = {.data = t1};
    CHECK(!tf_session_get_state(q.dev, "t", &v0, sizeof t0), "get t: %s", tf_context_last_error(q.ctx));
    CHECK(!tf_session_bind(q.dev, "ids", TF_DTYPE_I64, shape, 1, bad), "bind: %s", tf_context_last_error(q.ctx));
    tf_status st = tf_session_run(q.dev);
    const char *e = tf_context_last_error(q.ctx);
    CHECK(st == TF_ERR_RUNTIME && strstr(e, "gather: id 5 at position 2 is out of range [0, 5)"), "a computed id out of range: %s", e);
    uint64_t step = 9;
    CHECK(!tf_session_get_state(q.dev, "t", &v1, sizeof t1) && !memcmp(t0, t1, sizeof t0) && !tf_session_step(q.dev, &step) && step == 0,
          "the failed step updated nothing");
    CHECK(!tf_session_bind(q.dev, "ids", TF_DTYPE_I64, shape, 1, good) && !tf_session_bind(q.ref, "ids", TF_DTYPE_I64, shape, 1, good),
          "bind: %s", tf_context_last_error(q.ctx));
    if (pair_step(&q, "bad ids, then good ones")) pair_compare(&q, "bad ids, then good ones", true, state_tol(), 0);
    pair_free(&q);
}

/* ---- outputs over TF_CUDA_EAGER_OUTPUT_BYTES: on the device until read -----------------
 * y (640 x 512 f32, 1.25 MiB) is copied to the host only when asked for:
 * after one step, after two more back to back (the last one's), and again
 * after a param changed under it (the same bytes: nothing ran since). */
static void large_outputs(void)
{
    static const char *const M = "input x : f32[640, 512]\nparam w : f32[512] = normal()\ny = mul(x, w)\ns = mul(y, y)\n"
                                 "loss = mean(s, axes=[0, 1])\noutput loss\noutput y\n" TC_TRAIN_SGD;
    for (int mode = 0; mode < 2; mode++) {
        const char *lab = mode ? "large output [infer]" : "large output [train]";
        pair q;
        if (pair_make(&q, lab, M, mode ? TF_MODE_INFER : TF_MODE_TRAIN, "fp32", NULL, 0) && pair_step(&q, lab)) {
            pair_compare(&q, lab, true, state_tol(), 0);
            if (pair_step(&q, lab) && pair_step(&q, lab)) pair_compare(&q, "large output, the third of three steps", true, state_tol(), 0);
            tf_tensor_view y;
            static float before[640 * 512], w[512];
            bool ok = !tf_session_output(q.dev, "y", &y);
            CHECK(ok, "%s: output y: %s", lab, tf_context_last_error(q.ctx));
            if (ok) {
                memcpy(before, y.data, sizeof before);
                for (int i = 0; i < 512; i++) w[i] = (float)i;
                tf_tensor_view wv = {.dtype = TF_DTYPE_F32, .rank = 1, .shape = {512}, .data = w};
                CHECK(!tf_session_set_state(q.dev, "w", &wv), "%s: set w: %s", lab, tf_context_last_error(q.ctx));
                CHECK(!tf_session_output(q.dev, "y", &y) && !memcmp(before, y.data, sizeof before),
                      "%s: y read after w changed is the last step's", lab);
            }
            g_cases++;
        }
        pair_free(&q);
    }
}

/* ---- data parallel's NCCL path with one rank ---------------------------------------------
 * examples/mlp.ir compiled data parallel: a session without a communicator
 * (each allreduce a copy) and one with a job of one rank whose allreduces
 * go through NCCL all the same (TFUSE_CUDA_NCCL=1: packed into buckets,
 * averaged on the communication stream inside the step's graph, unpacked):
 * the mean of one rank is the value, so every output and state is the same
 * bit for bit. On a GPU, what NCCL's calls cost a step. */
static void nccl_one_rank(void)
{
    const test_example *ex = NULL;
    for (size_t i = 0; i < TEST_NEXAMPLES; i++)
        if (!strcmp(test_examples[i].file, "mlp.ir")) ex = &test_examples[i];
    char path[4096];
    char *text = ex ? test_read_example(ex->file, path, sizeof path) : NULL;
    CHECK(text != NULL, "mlp.ir is among the examples");
    if (!text) return;
    tf_dim_override dims[3];
    for (int j = 0; j < ex->nd; j++) dims[j] = (tf_dim_override){ex->dims[j].name, ex->dims[j].value};
    pair a, b;
    tf_comm_t *self = NULL;
    g_data_parallel = true;
    bool ok = pair_make(&a, "data parallel, no communicator", text, TF_MODE_TRAIN, "fp32", dims, ex->nd);
    ok = pair_make(&b, "data parallel, one rank through NCCL", text, TF_MODE_TRAIN, "fp32", dims, ex->nd) && ok;
    g_data_parallel = false;
    ok = ok && !tf_comm_create_self(b.ctx, &self) && !tf_session_set_comm(b.dev, self);
    CHECK(ok, "two data-parallel sessions, one with a job of one rank: %s", tf_context_last_error(b.ctx));
    setenv("TFUSE_CUDA_NCCL", "1", 1);   /* read when the first step makes the communicator */
    const int steps = 4, timed = g_emu ? 0 : 20;
    long runs0 = tf_cuda_emu_nccl_runs();
    double ms[2] = {0, 0};
    for (int step = 0; ok && step < steps + timed; step++) {
        for (int v = 0; ok && v < 2; v++) {
            tf_session_t *s = v ? b.dev : a.dev;
            struct timespec t0, t1;
            tf_tensor_view l;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            ok = !tf_session_run(s) && !tf_session_output(s, "loss", &l);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (step >= steps) ms[v] += 1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec);
            CHECK(ok, "one rank through NCCL, step %d: %s", step, tf_context_last_error(v ? b.ctx : a.ctx));
        }
    }
    unsetenv("TFUSE_CUDA_NCCL");
    if (ok) {
        int states = 0, sames = 0;
        for (size_t j = 0; j < tf_program_io_count(a.p, TF_IO_PARAM); j++) {
            const char *name;
            tf_dtype dt;
            int rank;
            int64_t shape[8], n = 1;
            tf_program_io(a.p, TF_IO_PARAM, j, &name, &dt, &rank, shape);
            for (int q = 0; q < rank; q++) n *= shape[q];
            size_t bytes = (size_t)n * (size_t)tf_dtype_size(dt);
            tf_tensor_view x = {.data = malloc(bytes)}, y = {.data = malloc(bytes)};
            if (!tf_session_get_state(a.dev, name, &x, bytes) && !tf_session_get_state(b.dev, name, &y, bytes)) {
                states++;
                sames += same_bytes(&x, &y);
            }
            free(x.data);
            free(y.data);
        }
        tf_session_info info;
        tf_session_get_info(b.dev, &info);
        CHECK(states > 0 && sames == states, "one rank through NCCL: every param bit for bit the copy's (%d of %d)", sames, states);
        CHECK(info.graph_replays == steps + timed && info.step_graph && !strcmp(info.step_graph, "graph"),
              "one rank through NCCL: each step one graph, NCCL's calls in it (%s, %lld replays)", info.step_graph ? info.step_graph : "-",
              (long long)info.graph_replays);
        tf_comm_totals t;
        tf_comm_stats(self, &t);
        if (g_emu)
            CHECK(tf_cuda_emu_nccl_runs() - runs0 >= steps, "one rank through NCCL: its allreduces ran in the stand-in NCCL (%ld times in %d "
                  "steps), not as copies", tf_cuda_emu_nccl_runs() - runs0, steps);
        else
            CHECK(t.bytes_nccl > 0, "one rank through NCCL: its allreduces went through NCCL (%lld bytes), not copies", (long long)t.bytes_nccl);
        if (timed) printf("data parallel, one rank: %.4f ms a step through NCCL, %.4f ms with copies (%d steps each; %lld bytes through NCCL)\n",
                          ms[1] / timed, ms[0] / timed, timed, (long long)t.bytes_nccl);
        g_cases++;
    }
    pair_free(&a);
    pair_free(&b);
    tf_comm_free(self);
    free(text);
}

/* ---- with the fake driver: compiling, the cache, launches ----------------------------- */

static void fake_compiles(const char *cache)
{
    unsetenv("TFUSE_CUDA_FALLBACK");
    tf_context_t *ctx;
    tf_context_create(&ctx);
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = compile_target();
    if (tf_model_parse_string(ctx, "unary", tc_text("unary"), strlen(tc_text("unary")), NULL, 0, &m) || tf_program_compile(ctx, m, &o, &p)) {
        CHECK(0, "unary: %s", tf_context_last_error(ctx));
    } else {
        tf_session_t *s1 = NULL, *s2 = NULL, *s3 = NULL;
        tf_session_info i1 = {0}, i2 = {0}, i3 = {0};
        CHECK(!cuda_session(ctx, p, 1, &s1), "compiling session: %s", tf_context_last_error(ctx));
        if (s1) tf_session_get_info(s1, &i1);
        CHECK(i1.jit_compiled > 0 && i1.fallbacks == 0, "NVRTC compiled the kernels (%d), none on the host (%d)", i1.jit_compiled,
              i1.fallbacks);
        CHECK(!cuda_session(ctx, p, 1, &s2), "cached session: %s", tf_context_last_error(ctx));
        if (s2) tf_session_get_info(s2, &i2);
        CHECK(i2.jit_compiled == 0 && i2.jit_cached == i1.jit_compiled, "the second session reads the cache (%d compiled, %d cached)",
              i2.jit_compiled, i2.jit_cached);
        /* a torn cache file (one NVRTC program of several kernels) is compiled again and replaced */
        char cmd[4400];
        snprintf(cmd, sizeof cmd, "f=$(ls %s/cuda/*.cubin | head -n 1) && head -c 100 \"$f\" > \"$f.x\" && mv \"$f.x\" \"$f\"", cache);
        CHECK(system(cmd) == 0, "truncating a cache file");
        CHECK(!cuda_session(ctx, p, 1, &s3), "session over a torn cache: %s", tf_context_last_error(ctx));
        if (s3) tf_session_get_info(s3, &i3);
        CHECK(i3.jit_compiled >= 1 && i3.jit_compiled + i3.jit_cached == i1.jit_compiled,
              "one torn program file: its kernels compiled again, the rest from the cache (%d compiled, %d cached)", i3.jit_compiled,
              i3.jit_cached);
        tf_session_t *s3b = NULL;
        tf_session_info i3b = {0};
        CHECK(!cuda_session(ctx, p, 1, &s3b), "session after the torn file: %s", tf_context_last_error(ctx));
        if (s3b) tf_session_get_info(s3b, &i3b);
        CHECK(i3b.jit_compiled == 0 && i3b.jit_cached == i1.jit_compiled, "the torn file was replaced (%d compiled, %d cached)",
              i3b.jit_compiled, i3b.jit_cached);
        tf_session_free(s3b);
        /* a package: the session takes its cubins and compiles nothing; a GPU of another architecture is refused */
        char pkg[4400];
        tf_package_info pi = {0};
        snprintf(pkg, sizeof pkg, "%s/unary.tfp", cache);
        tf_program_t *lp = NULL;
        tf_session_t *s4 = NULL;
        tf_session_info i4 = {0};
        CHECK(!tf_program_save(ctx, p, pkg, 1, 1, "sm_80,sm_90", &pi) && pi.objects >= 2 && pi.objects <= 2 * i1.jit_compiled,
              "a cuda package with sm_80 and sm_90 cubins, NVRTC programs of several kernels (%d for %d kernels): %s", pi.objects,
              i1.jit_compiled, tf_context_last_error(ctx));
        CHECK(!tf_program_load(ctx, pkg, &lp), "loading the cuda package: %s", tf_context_last_error(ctx));
        CHECK(lp && !cuda_session(ctx, lp, 1, &s4), "a session of the package: %s", tf_context_last_error(ctx));
        if (s4) tf_session_get_info(s4, &i4);
        CHECK(i4.jit_compiled == 0 && i4.jit_cached == 0 && i4.jit_package == i1.jit_compiled,
              "the package's session compiles nothing (%d compiled, %d cached, %d from the package)", i4.jit_compiled, i4.jit_cached,
              i4.jit_package);
        tf_session_free(s4);
        tf_program_free(lp);
        lp = NULL, s4 = NULL;
        CHECK(!tf_program_save(ctx, p, pkg, 1, 1, "sm_80", NULL) && !tf_program_load(ctx, pkg, &lp), "an sm_80 package: %s",
              tf_context_last_error(ctx));
        tf_status pst = lp ? cuda_session(ctx, lp, 1, &s4) : TF_ERR_INTERNAL;
        CHECK(pst == TF_ERR_UNAVAILABLE && strstr(tf_context_last_error(ctx), "built for sm_80") &&
                  strstr(tf_context_last_error(ctx), "is sm_90"),
              "a package for another GPU is refused, naming both: %s", tf_context_last_error(ctx));
        tf_session_free(s4);
        tf_program_free(lp);
        /* a run: the fake driver runs no kernel, and the error names the kernel and the call */
        if (s2) {
            float x[91] = {0};
            int64_t shape[2] = {7, 13};
            tf_session_bind(s2, "x", TF_DTYPE_F32, shape, 2, x);
            tf_status st = tf_session_run(s2);
            const char *e = tf_context_last_error(ctx);
            CHECK(st == TF_ERR_RUNTIME && strstr(e, "launching kernel") && strstr(e, "CUDA_ERROR_NOT_SUPPORTED"),
                  "a failed launch says which kernel and why: %s", e);
            CHECK(fake_counter("fake_cuda_launches") == 1, "one launch attempted");
        }
        tf_session_free(s1);
        tf_session_free(s2);
        tf_session_free(s3);
    }
    /* a matmul with cuBLASLt present but no real driver behind it: whatever
     * cuBLASLt says, the session starts or fails cleanly */
    tf_program_free(p);
    tf_model_free(m);
    m = NULL;
    p = NULL;
    if (tf_model_parse_string(ctx, "gemm", tc_text("gemm"), strlen(tc_text("gemm")), NULL, 0, &m) || tf_program_compile(ctx, m, &o, &p)) {
        CHECK(0, "gemm: %s", tf_context_last_error(ctx));
    } else {
        tf_session_t *s = NULL;
        tf_status st = cuda_session(ctx, p, 1, &s);
        tf_session_info in = {0};
        if (!st) tf_session_get_info(s, &in);
        printf("gemm session over the fake driver: %s (GEMMs: %s, %d on the host)\n", st ? tf_context_last_error(ctx) : "started",
               st ? "-" : in.library, in.fallbacks);
        tf_session_free(s);
    }
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
    setenv("TFUSE_CUDA_FALLBACK", "all", 1);
}

/* ---- with the fake driver and the cuDNN stand-in: convolutions on cuDNN's path ------- */

/* The cuda target's own convolution path (RUN_CONV: plans, Find on the
 * session's buffers, the algorithm cache, the workspace, the runs) over the
 * stand-in libcudnn.so.9 (fake_libcudnn.c), which computes on the host what
 * the interpreter computes, in the same order: every output bit for bit. */
static int dnn_counter(void *lib, const char *name)
{
    int (*f)(void) = NULL;
    void *p = lib ? dlsym(lib, name) : NULL;
    memcpy(&f, &p, sizeof p);
    return f ? f() : -1;
}

static int count_algo_files(const char *cache)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/cuda", cache);
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strlen(e->d_name) > 6 && !strcmp(e->d_name + strlen(e->d_name) - 6, ".cudnn");
    if (d) closedir(d);
    return n;
}

static void fake_convs(const char *fake_dir, const char *cache)
{
    char lib[4200];
    snprintf(lib, sizeof lib, "%s/libcudnn.so.9", fake_dir);
    void *dnn = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    CHECK(dnn != NULL, "the cuDNN stand-in loads: %s", dnn ? "yes" : dlerror());
    if (!dnn) return;
    unsetenv("TFUSE_CUDA_FALLBACK");
    setenv("FAKE_CUDA_MEMORY", "67108864", 1);   /* Find's scratch: at most half of what is free */
    /* stride, padding and dilation per axis, two groups; each direction once */
    static const char *const text =
        "input x : f32[3, 4, 9, 8]\ninput w : f32[6, 2, 2, 3]\ninput dy : f32[3, 6, 4, 10]\n"
        "y = conv2d(x, w, stride=[2, 1], padding=[0, 2], dilation=[2, 1], groups=2)\n"
        "dx = conv2d_grad_input(dy, w, stride=[2, 1], padding=[0, 2], dilation=[2, 1], groups=2, shape=[3, 4, 9, 8])\n"
        "dw = conv2d_grad_weight(x, dy, stride=[2, 1], padding=[0, 2], dilation=[2, 1], groups=2, shape=[6, 2, 2, 3])\n"
        "output y\noutput dx\noutput dw\n";
    static const char *const types[] = {"f32", "bf16", "f16"};
    int finds0 = dnn_counter(dnn, "fake_cudnn_finds"), files0 = count_algo_files(cache);
    for (int round = 0; round < 2; round++)   /* the second: every algorithm from the disk cache */
        for (int ti = 0; ti < 3; ti++) {
            char u[2048], *w = u, lab[128];
            for (const char *p = text; *p; p++) {
                if (!strncmp(p, "f32", 3)) {
                    w += sprintf(w, "%s", types[ti]);
                    p += 2;
                } else {
                    *w++ = *p;
                }
            }
            *w = 0;
            snprintf(lab, sizeof lab, "convolutions through cuDNN [%s%s]", types[ti], round ? ", cached" : "");
            if (!round && !ti) setenv("TFUSE_CUDA_EXPLAIN", "1", 1);   /* the algorithm each conv got, on stderr */
            pair q;
            if (pair_make(&q, lab, u, TF_MODE_INFER, NULL, NULL, 0)) {
                tf_session_info info;
                tf_session_get_info(q.dev, &info);
                CHECK(info.fallbacks == 0 && !strcmp(info.library, "cuDNN"), "%s: nothing on the host (%d), library %s", lab, info.fallbacks,
                      info.library);
                int convs0 = dnn_counter(dnn, "fake_cudnn_convs");
                tf_session_set_profiling(q.dev, 1);
                if (pair_step(&q, lab) && pair_step(&q, lab)) {
                    pair_compare(&q, lab, false, 0, 0);
                    g_cases++;
                }
                int conv_kernels = 0;
                for (size_t i = 0; i < tf_session_profile_count(q.dev); i++) {
                    tf_kernel_profile kp;
                    if (!tf_session_profile(q.dev, i, &kp)) conv_kernels += !strcmp(kp.how, "conv");
                }
                CHECK(conv_kernels == 3 && dnn_counter(dnn, "fake_cudnn_convs") == convs0 + 6,
                      "%s: three conv kernels (%d), each run through cuDNN in both steps (%d calls)", lab, conv_kernels,
                      dnn_counter(dnn, "fake_cudnn_convs") - convs0);
            }
            pair_free(&q);
            unsetenv("TFUSE_CUDA_EXPLAIN");
            if (ti == 2) {
                int finds = dnn_counter(dnn, "fake_cudnn_finds") - finds0, files = count_algo_files(cache) - files0;
                CHECK(finds == 9 && files == 9, "%s: nine Finds, one per direction and type (%d), and nine algorithm files (%d)",
                      round ? "after the cached sessions" : "first sessions", finds, files);
            }
        }
    CHECK(dnn_counter(dnn, "fake_cudnn_live") == 0, "every cuDNN handle and descriptor destroyed (%d left)", dnn_counter(dnn, "fake_cudnn_live"));
    unsetenv("FAKE_CUDA_MEMORY");
    setenv("TFUSE_CUDA_FALLBACK", "all", 1);
    dlclose(dnn);
}

/* section: run one part of the test and say how long it took and how many checks have failed */
static void section(const char *name, void (*part)(void))
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    part();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("-- %s: %.1f s, %d op cases so far, %d failed checks so far\n", name,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), g_cases, check_failed);
}

int main(int argc, char **argv)
{
    const char *fake_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fake") && i + 1 < argc) fake_dir = argv[++i];
        else if (!strcmp(argv[i], "--emu")) g_emu = true, g_target = TF_TARGET_CUDA_EMU;
        else {
            fprintf(stderr, "usage: test_gpu [--fake DIR_WITH_FAKE_LIBCUDA | --emu]\n");
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);   /* piped through tee and maybe killed at a deadline: lose no line */
    char cache[4096] = "";
    if (fake_dir) {
        g_fake = true;
        setenv("TFUSE_CUDA_LIBS", fake_dir, 1);
        setenv("TFUSE_CUDA_FALLBACK", "all", 1);
        snprintf(cache, sizeof cache, "%s/cache", fake_dir);
        setenv("TFUSE_CACHE_DIR", cache, 1);
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);   /* the compile checks count from an empty cache */
        if (system(cmd) != 0) return 1;
        char lib[4200];
        snprintf(lib, sizeof lib, "%s/libcuda.so.1", fake_dir);
        if (!(g_fake_lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL))) {
            fprintf(stderr, "test_gpu: cannot load the fake driver %s: %s\n", lib, dlerror());
            return 1;
        }
    }
    if (g_emu && !getenv("TFUSE_CACHE_DIR")) setenv("TFUSE_CACHE_DIR", "emu-cache", 1);   /* the compiled kernels, beside the test */
    g_tf32 = !g_fake && !g_emu && !(getenv("TFUSE_NO_TF32") && !strcmp(getenv("TFUSE_NO_TF32"), "1"));
    g_seed = test_seed();
    const char *why = g_emu ? tf_backend_for(g_target)->unavailable() : tf_backend_cuda.unavailable();
    if (why && g_fake && getenv("TFUSE_NO_NVRTC") && !strcmp(getenv("TFUSE_NO_NVRTC"), "1")) {
        printf("SKIP: TFUSE_NO_NVRTC=1 and the cuda target cannot start without NVRTC: %s\n", why);
        return 0;
    }
    if (why) {
        fprintf(stderr, "test_gpu: the cuda target cannot run here: %s\n", why);
        return 1;
    }
    printf("cuda target: %s%s; sessions %s\n", g_fake ? "fake driver, every kernel on the host" : g_emu ? "cuda-emu, every kernel run on the host" : "GPU",
           g_fake ? "" : g_tf32 ? ", TF32 GEMMs" : ", fp32 GEMMs (TFUSE_NO_TF32=1)",
           tf_backend_for(TF_TARGET_CUDA) ? "through tf_session_create" : "built by the test (api.c does not route TF_TARGET_CUDA yet)");
    /* each part's time and failures so far, as it ends: a run cut by a deadline
       (tests/gpu/session.sh) still says how far it got */
    section("ops", ops);
    section("examples", examples);
    if (!g_fake) section("graphs", graphs);   /* the fake driver runs no kernel, and captures nothing */
    if (!g_fake) section("epilogues", epilogues);   /* nor has it a cuBLASLt */
    if (!g_fake) section("backward epilogues", backward_epilogues);
    section("contract", contract);
    section("bad ids", bad_ids);
    section("large outputs", large_outputs);
    if (!g_fake) section("nccl, one rank", nccl_one_rank);   /* the fake driver runs every kernel on the host */
    if (!g_fake) section("async steps", async_steps);   /* the fake driver runs no kernel */
    if (g_emu) section("async fault", async_fault);
    if (g_fake) {
        fake_compiles(cache);
        fake_convs(fake_dir, cache);
        CHECK(fake_counter("fake_cuda_live") == 0, "every allocation, module, stream, event and context reference is released (%d left)",
              fake_counter("fake_cuda_live"));
        CHECK(fake_counter("fake_cuda_errors") == 0, "no copy or memset outside an allocation, no bad handle (%d)",
              fake_counter("fake_cuda_errors"));
    }
    if (g_emu) CHECK(tf_cuda_emu_live() == 0, "every cuda-emu allocation, module, stream and event is released (%d left)", tf_cuda_emu_live());
    printf("cuda: %d op cases against the interpreter\n", g_cases);
    return check_report();
}
