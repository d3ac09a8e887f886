/* test_once.c — inference work that depends on the state alone is done once
 * per state (issue 33, lever 4): memplan marks the values an inference
 * program computes from params, buffers and constants alone (value->once)
 * and gives each memory of its own for the whole step; the cpu target runs
 * the kernels that write only such values when the state has changed since
 * they last ran, not every step.
 *
 *   - a weight scaled by a param (w * s, as batch norm folded into a weight
 *     is) feeding a matmul: `once` in inference, not in training; over three
 *     steps on the cpu target its kernel runs once, and the outputs match the
 *     interpreter's each step (fresh inputs each step);
 *   - tf_session_set_state of w: the next step computes it again (the
 *     outputs follow the new w, as the interpreter's do), once;
 *   - the arena holds the once value apart from everything else: its block
 *     overlaps no other value's, whatever their lifetimes;
 *   - a convolution with batch norm folded into it, whose weights the cpu
 *     target keeps in oneDNN's layout between steps: its outputs are the
 *     interpreter's over steps and after the weights and the norm's scale
 *     change;
 *   - examples/mlp.ir in inference (bf16: its weight casts are once, and its
 *     GEMMs' results are placed in the arena's gaps afterwards): no once
 *     value shares a byte with another value, and batches after new states
 *     give the interpreter's losses (this caught a GEMM result placed over
 *     a once value that the step made later). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime.h"
#include "testutil.h"
#include "tfuse.h"

static const char *model =
    "input x : f32[8, 16]\n"
    "param w : f32[16, 32] = normal()\n"
    "param s : f32[32] = normal()\n"
    "param b : f32[32] = normal()\n"
    "ws = mul(w, s)\n"
    "h = matmul(x, ws)\n"
    "a = add(h, b)\n"
    "y = relu(a)\n"
    "output y\n";

static tf_program_t *compile(tf_context_t *ctx, tf_mode mode)
{
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = mode;
    o.target = TF_TARGET_INTERP;   /* the plan is the same for every target; sessions pick theirs */
    if (tf_model_parse_string(ctx, "once.ir", model, strlen(model), NULL, 0, &m) || tf_program_compile(ctx, m, &o, &p))
        CHECK(0, "compile: %s", tf_context_last_error(ctx));
    tf_model_free(m);
    return p;
}

/* The value named name in the program's module. */
static const tf_value *value_of(const tf_program_t *p, const char *name)
{
    for (int i = 0; i < p->m->nodes.n; i++) {
        const tf_node *n = p->m->nodes.items[i];
        if (n->out->name && !strcmp(n->out->name, name)) return n->out;
    }
    return NULL;
}

/* How many once values p's plan holds, -1 when one shares a byte of the arena with another value (any lifetimes). */
static int once_apart(const tf_program_t *p, const char *what)
{
    int n = 0;
    for (int i = 0; i < p->m->nodes.n; i++) {
        const tf_value *v = ((const tf_node *)p->m->nodes.items[i])->out;
        if (!v->once || v->offset < 0) continue;
        n++;
        int64_t a = v->offset, e = a + tf_type_numel(&v->type) * tf_dtype_bytes(v->type.dtype);
        for (int j = 0; j < p->m->nodes.n; j++) {
            const tf_value *w = ((const tf_node *)p->m->nodes.items[j])->out;
            int64_t b = w->offset, f = b + tf_type_numel(&w->type) * tf_dtype_bytes(w->type.dtype);
            if (w != v && w->offset >= 0 && f > a && b < e) {
                CHECK(0, "%s: once value %s [%lld, %lld) shares memory with %s [%lld, %lld)", what, v->name, (long long)a, (long long)e,
                      w->name, (long long)b, (long long)f);
                return -1;
            }
        }
    }
    return n;
}

/* Calls of the kernel that writes ws. */
static int64_t calls_of_ws(tf_session_t *s)
{
    for (size_t i = 0; i < tf_session_profile_count(s); i++) {
        tf_kernel_profile kp;
        if (!tf_session_profile(s, i, &kp) && strstr(kp.name, "_mul")) return kp.calls;
    }
    return -1;
}

static double worst(tf_session_t *a, tf_session_t *b)
{
    tf_tensor_view va, vb;
    if (tf_session_output(a, "y", &va) || tf_session_output(b, "y", &vb)) return INFINITY;
    double e = 0;
    for (int i = 0; i < 8 * 32; i++) e = fmax(e, fabs(((const float *)va.data)[i] - ((const float *)vb.data)[i]));
    return e;
}

/* A convolution with batch norm folded into its weights (inference): the cpu target's outputs are the interpreter's over
 * steps, and after the conv's weight and the norm's scale change (the reordered weights are kept between steps). */
static const char *conv_model =
    "input x : f32[2, 3, 12, 12]\n"
    "param w : f32[8, 3, 3, 3] = normal()\n"
    "param g : f32[8] = uniform()\n"
    "param bb : f32[8] = normal()\n"
    "buffer mean : f32[8] = zeros()\n"
    "buffer var : f32[8] = ones()\n"
    "c = conv2d(x, w, padding=[1, 1])\n"
    "n = batchnorm(c, g, bb, mean, var)\n"
    "y = relu(n)\n"
    "output y\n";

static void conv_steps(tf_context_t *ctx)
{
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = TF_TARGET_INTERP;
    tf_session_t *cpu = NULL, *ref = NULL;
    if (tf_model_parse_string(ctx, "conv.ir", conv_model, strlen(conv_model), NULL, 0, &m) || tf_program_compile(ctx, m, &o, &p)) {
        CHECK(0, "conv: %s", tf_context_last_error(ctx));
    } else if (tf_session_create(ctx, p, TF_TARGET_CPU, 5, &cpu) == TF_OK && !tf_session_create(ctx, p, TF_TARGET_INTERP, 5, &ref)) {
        uint64_t seed = test_seed() + 1;
        float x[2 * 3 * 12 * 12], w[8 * 3 * 3 * 3], g[8];
        int64_t xs[4] = {2, 3, 12, 12};
        for (int step = 0; step < 4; step++) {
            for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = (float)(2 * test_rnd(&seed) - 1);
            if (step == 2) {   /* new weights and a new scale: the folded, reordered weights follow */
                for (size_t i = 0; i < sizeof w / sizeof *w; i++) w[i] = (float)(2 * test_rnd(&seed) - 1);
                for (size_t i = 0; i < 8; i++) g[i] = (float)(0.5 + test_rnd(&seed));
                tf_tensor_view tw = {TF_DTYPE_F32, 4, {8, 3, 3, 3}, w}, tg = {TF_DTYPE_F32, 1, {8}, g};
                CHECK(!tf_session_set_state(cpu, "w", &tw) && !tf_session_set_state(ref, "w", &tw) && !tf_session_set_state(cpu, "g", &tg) &&
                          !tf_session_set_state(ref, "g", &tg),
                      "set w, g: %s", tf_context_last_error(ctx));
            }
            tf_tensor_view va, vb;
            if (tf_session_bind(cpu, "x", TF_DTYPE_F32, xs, 4, x) || tf_session_bind(ref, "x", TF_DTYPE_F32, xs, 4, x) ||
                tf_session_run(cpu) || tf_session_run(ref) || tf_session_output(cpu, "y", &va) || tf_session_output(ref, "y", &vb)) {
                CHECK(0, "conv step %d: %s", step, tf_context_last_error(ctx));
                break;
            }
            double e = 0;
            for (int i = 0; i < 2 * 8 * 12 * 12; i++) e = fmax(e, fabs(((const float *)va.data)[i] - ((const float *)vb.data)[i]));
            CHECK(e < 1e-4, "conv step %d: the cpu target's outputs are the interpreter's (worst %.3g)", step, e);
        }
    }
    tf_session_free(cpu);
    tf_session_free(ref);
    tf_program_free(p);
    tf_model_free(m);
}

/* examples/mlp.ir in inference (bf16: its weights cast once; the GEMMs' results placed in the gaps of the arena):
 * every once value apart, and five batches after each of two new states the interpreter's numbers. */
static void mlp_steps(tf_context_t *ctx)
{
    char path[4096];
    const char *ex = getenv("TFUSE_EXAMPLES");
    snprintf(path, sizeof path, "%s/mlp.ir", ex ? ex : "examples");
    tf_dim_override dims[2] = {{"F", 64}, {"B", 48}};
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = TF_TARGET_INTERP;
    tf_session_t *cpu = NULL, *ref = NULL;
    if (tf_model_parse_file(ctx, path, dims, 2, &m) || tf_program_compile(ctx, m, &o, &p)) {
        CHECK(0, "mlp: %s", tf_context_last_error(ctx));
    } else {
        CHECK(once_apart(p, "mlp") == 4, "mlp: its four weight casts are once, each in memory of its own");
        if (tf_session_create(ctx, p, TF_TARGET_CPU, 1, &cpu) == TF_OK && !tf_session_create(ctx, p, TF_TARGET_INTERP, 1, &ref)) {
            uint64_t seed = test_seed() + 2;
            static float x[48 * 64], w1[64 * 256], w2[256 * 10];
            int64_t y[48], xs[2] = {48, 64}, ys[1] = {48};
            for (int state = 0; state < 2; state++) {
                for (size_t i = 0; i < sizeof w1 / sizeof *w1; i++) w1[i] = (float)(0.2 * (2 * test_rnd(&seed) - 1));
                for (size_t i = 0; i < sizeof w2 / sizeof *w2; i++) w2[i] = (float)(0.2 * (2 * test_rnd(&seed) - 1));
                tf_tensor_view t1 = {TF_DTYPE_F32, 2, {64, 256}, w1}, t2 = {TF_DTYPE_F32, 2, {256, 10}, w2};
                CHECK(!tf_session_set_state(cpu, "w1", &t1) && !tf_session_set_state(ref, "w1", &t1) && !tf_session_set_state(cpu, "w2", &t2) &&
                          !tf_session_set_state(ref, "w2", &t2), "mlp: set state: %s", tf_context_last_error(ctx));
                for (int b = 0; b < 5; b++) {
                    for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = (float)(2 * test_rnd(&seed) - 1);
                    for (int i = 0; i < 48; i++) y[i] = (int64_t)(test_rnd(&seed) * 10) % 10;
                    tf_tensor_view la, lb;
                    if (tf_session_bind(cpu, "x", TF_DTYPE_F32, xs, 2, x) || tf_session_bind(ref, "x", TF_DTYPE_F32, xs, 2, x) ||
                        tf_session_bind(cpu, "y", TF_DTYPE_I64, ys, 1, y) || tf_session_bind(ref, "y", TF_DTYPE_I64, ys, 1, y) ||
                        tf_session_run(cpu) || tf_session_run(ref) || tf_session_output(cpu, "loss", &la) ||
                        tf_session_output(ref, "loss", &lb)) {
                        CHECK(0, "mlp: %s", tf_context_last_error(ctx));
                        break;
                    }
                    double a = *(const float *)la.data, r = *(const float *)lb.data;
                    CHECK(fabs(a - r) <= 1e-2 * fabs(r) + 1e-3, "mlp: state %d batch %d: loss %.6g, the interpreter's %.6g", state, b, a, r);
                }
            }
        }
    }
    tf_session_free(cpu);
    tf_session_free(ref);
    tf_program_free(p);
    tf_model_free(m);
}

int main(void)
{
    tf_context_t *ctx;
    tf_context_create(&ctx);
    tf_program_t *inf = compile(ctx, TF_MODE_INFER), *tr = compile(ctx, TF_MODE_TRAIN);
    const tf_value *ws = inf ? value_of(inf, "ws") : NULL, *wt = tr ? value_of(tr, "ws") : NULL;
    CHECK(ws && ws->once, "inference: ws = w * s is computed from the state alone");
    CHECK(!wt || !wt->once, "training: nothing is once (the step changes the state)");
    const tf_value *h = inf ? value_of(inf, "h") : NULL;
    CHECK(h && !h->once, "h reads the input: not once");
    CHECK(inf && once_apart(inf, "once.ir") == 1, "the once value's memory is its own");
    tf_session_t *cpu = NULL, *ref = NULL;
    tf_status st = inf ? tf_session_create(ctx, inf, TF_TARGET_CPU, 3, &cpu) : TF_OK;
    if (st == TF_ERR_UNAVAILABLE) printf("SKIPPED: the cpu target's steps (%s)\n", tf_context_last_error(ctx));
    else if (st || (inf && tf_session_create(ctx, inf, TF_TARGET_INTERP, 3, &ref))) CHECK(0, "sessions: %s", tf_context_last_error(ctx));
    if (cpu && ref) {
        tf_session_set_profiling(cpu, 1);
        uint64_t seed = test_seed();
        float x[8 * 16], w[16 * 32];
        int64_t xs[2] = {8, 16};
        for (int step = 0; step < 4; step++) {
            for (int i = 0; i < 8 * 16; i++) x[i] = (float)(2 * test_rnd(&seed) - 1);
            if (step == 3) {   /* a new w: the next step computes ws again */
                for (int i = 0; i < 16 * 32; i++) w[i] = (float)(2 * test_rnd(&seed) - 1);
                tf_tensor_view tv = {TF_DTYPE_F32, 2, {16, 32}, w};
                CHECK(!tf_session_set_state(cpu, "w", &tv) && !tf_session_set_state(ref, "w", &tv), "set w: %s",
                      tf_context_last_error(ctx));
            }
            if (tf_session_bind(cpu, "x", TF_DTYPE_F32, xs, 2, x) || tf_session_bind(ref, "x", TF_DTYPE_F32, xs, 2, x) ||
                tf_session_run(cpu) || tf_session_run(ref)) {
                CHECK(0, "step %d: %s", step, tf_context_last_error(ctx));
                break;
            }
            double e = worst(cpu, ref);
            CHECK(e < 1e-4, "step %d: the cpu target's outputs are the interpreter's (worst %.3g)", step, e);
            int64_t calls = calls_of_ws(cpu);
            CHECK(calls == (step < 3 ? 1 : 2), "step %d: the kernel of ws ran %lld times (%s)", step, (long long)calls,
                  step < 3 ? "once for the state it started with" : "again for the new w");
        }
    }
    tf_session_free(cpu);
    tf_session_free(ref);
    conv_steps(ctx);
    mlp_steps(ctx);
    tf_program_free(inf);
    tf_program_free(tr);
    tf_context_free(ctx);
    return check_report();
}
