/* test_numerics.c — fast and exact 16-bit numerics (docs/numerics.md).
 *
 * A bf16 chain y = (a * b + c) * a - b and a row sum of a * b, fused into
 * kernels, compiled both ways:
 *   - fast (the default): fuse marks the regions numerics=fast, the printed
 *     IR says so and parses back with the mark; the interpreter's y is,
 *     bit for bit, the chain computed at f32 with one bf16 rounding at the
 *     end (computed here by hand);
 *   - exact: no region is marked, and y is the chain rounded to bf16 after
 *     every op (by hand too); the two differ on these inputs;
 *   - the cpu target gives the interpreter's outputs bit for bit in both
 *     modes (the row sum's order of additions included; without LLVM, its
 *     kernels are the kernel IR's evaluator, which must agree too);
 *   - f32 models get no mark in either mode: fast mode only changes 16-bit
 *     values. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "parser.h"
#include "runtime.h"
#include "testutil.h"
#include "tfuse.h"

enum { R = 37, C = 45, N = R * C };

static const char *model =
    "input a : bf16[37, 45]\n"
    "input b : bf16[37, 45]\n"
    "input c : bf16[37, 45]\n"
    "m = mul(a, b)\n"
    "s = add(m, c)\n"
    "t = mul(s, a)\n"
    "y = sub(t, b)\n"
    "p = mul(a, b)\n"
    "r = reduce_sum(p, axes=[1])\n"
    "output y\n"
    "output r\n";

static tf_program_t *compile(tf_context_t *ctx, const char *text, bool exact)
{
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = TF_TARGET_INTERP;
    o.numerics_exact = exact;
    if (tf_model_parse_string(ctx, "numerics.ir", text, strlen(text), NULL, 0, &m) || tf_program_compile(ctx, m, &o, &p))
        CHECK(0, "compile (%s): %s", exact ? "exact" : "fast", tf_context_last_error(ctx));
    tf_model_free(m);
    return p;
}

static int marked_regions(const tf_module *m)
{
    int n = 0;
    for (int i = 0; i < m->nregions; i++) n += m->regions[i].wide;
    return n;
}

/* bf16 round to nearest even of a double, as tf_dtype_round does */
static double bf(double v) { return tf_dtype_round(TF_DT_BF16, v); }
static double f32(double v) { return (double)(float)v; }

static uint16_t bf_bits(double v)
{
    float f = (float)bf(v);
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static double bf_val(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Runs the program on target t; y and r (as doubles) into out. */
static bool run(tf_context_t *ctx, tf_program_t *p, tf_target t, uint16_t *in[3], double *y, double *r)
{
    tf_session_t *s = NULL;
    tf_status st = tf_session_create(ctx, p, t, 2, &s);
    if (st == TF_ERR_UNAVAILABLE) return false;
    int64_t shape[2] = {R, C};
    const char *names[3] = {"a", "b", "c"};
    bool ok = !st;
    for (int i = 0; ok && i < 3; i++) ok = !tf_session_bind(s, names[i], TF_DTYPE_BF16, shape, 2, in[i]);
    ok = ok && !tf_session_run(s);
    tf_tensor_view vy, vr;
    ok = ok && !tf_session_output(s, "y", &vy) && !tf_session_output(s, "r", &vr);
    CHECK(ok, "run on %s: %s", t == TF_TARGET_CPU ? "cpu" : "interp", tf_context_last_error(ctx));
    if (ok) {
        for (int i = 0; i < N; i++) y[i] = bf_val(((const uint16_t *)vy.data)[i]);
        for (int i = 0; i < R; i++) r[i] = bf_val(((const uint16_t *)vr.data)[i]);
    }
    tf_session_free(s);
    return ok;
}

int main(void)
{
    uint64_t seed = test_seed();
    tf_context_t *ctx = NULL;
    CHECK(tf_context_create(&ctx) == TF_OK, "context");
    static uint16_t a[N], b[N], c[N];
    uint64_t s = seed;
    for (int i = 0; i < N; i++) {
        a[i] = bf_bits(4 * test_rnd(&s) - 2);
        b[i] = bf_bits(4 * test_rnd(&s) - 2);
        c[i] = bf_bits(4 * test_rnd(&s) - 2);
    }
    uint16_t *in[3] = {a, b, c};
    static double y[2][2][N], r[2][2][R];   /* [exact][target: interp, cpu] */
    for (int exact = 0; exact < 2; exact++) {
        tf_program_t *p = compile(ctx, model, exact);
        if (!p) continue;
        /* the mark: on the fused regions in fast mode, nowhere in exact mode; printed and parsed back */
        int marks = marked_regions(p->m);
        CHECK(exact ? marks == 0 : marks >= 1, "%s: %d regions marked numerics=fast", exact ? "exact" : "fast", marks);
        char *text = tf_print_module(p->m);
        CHECK(text && (strstr(text, "numerics=fast") != NULL) == !exact, "%s: the printed IR %s numerics=fast",
              exact ? "exact" : "fast", exact ? "has" : "lacks");
        char *plan = text ? strstr(text, "\n# memplan") : NULL;   /* comments: the plan is made again */
        if (plan) plan[0] = 0;
        tf_module *back = NULL;
        tf_diag d = {0};
        if (text && !tf_parse("printed.ir", text, strlen(text), NULL, 0, &back, &d)) {
            CHECK(marked_regions(back) == marks, "the printed IR parses back with %d marks, not %d", marked_regions(back), marks);
            char *again = tf_print_module(back);
            CHECK(again && !strcmp(again, text), "printing the parsed IR gives other text:\n%s\n----\n%s", text, again ? again : "");
            tf_free(again);
        } else {
            CHECK(0, "the printed IR does not parse: %s", d.msg);
        }
        tf_module_free(back);
        tf_free(text);
        bool ran = run(ctx, p, TF_TARGET_INTERP, in, y[exact][0], r[exact][0]);
        if (ran && run(ctx, p, TF_TARGET_CPU, in, y[exact][1], r[exact][1])) {
            int bad = 0;
            for (int i = 0; i < N; i++) bad += memcmp(&y[exact][0][i], &y[exact][1][i], sizeof(double)) != 0;
            for (int i = 0; i < R; i++) bad += memcmp(&r[exact][0][i], &r[exact][1][i], sizeof(double)) != 0;
            CHECK(bad == 0, "%s: the cpu target differs from the interpreter in %d elements", exact ? "exact" : "fast", bad);
        }
        tf_program_free(p);
    }
    /* by hand: fast holds m, s, t at f32 and rounds y once; exact rounds each op */
    int bad_fast = 0, bad_exact = 0, differ = 0, rdiffer = 0;
    for (int i = 0; i < N; i++) {
        double va = bf_val(a[i]), vb = bf_val(b[i]), vc = bf_val(c[i]);
        double fast = bf(f32(f32(f32(va * vb) + vc) * va) - vb);
        double ex = bf(bf(bf(bf(va * vb) + vc) * va) - vb);
        bad_fast += fast != y[0][0][i];
        bad_exact += ex != y[1][0][i];
        differ += y[0][0][i] != y[1][0][i];
    }
    for (int i = 0; i < R; i++) rdiffer += r[0][0][i] != r[1][0][i];
    CHECK(bad_fast == 0, "fast: %d of %d elements are not the chain at f32 rounded once to bf16", bad_fast, N);
    CHECK(bad_exact == 0, "exact: %d of %d elements are not the chain rounded to bf16 op by op", bad_exact, N);
    CHECK(differ > N / 20, "fast and exact differ in only %d of %d elements", differ, N);
    CHECK(rdiffer > 0, "the row sums of products held at f32 and of products rounded to bf16 are the same in every row");
    /* fp32: nothing to hold wide */
    char *f32model = strdup(model);
    for (char *q = f32model; (q = strstr(q, "bf16")); q += 4) memcpy(q, "f32 ", 4);
    tf_program_t *p = compile(ctx, f32model, false);
    if (p) CHECK(marked_regions(p->m) == 0, "an f32 model got %d numerics=fast marks", marked_regions(p->m));
    tf_program_free(p);
    free(f32model);
    tf_context_free(ctx);
    return check_report();
}
