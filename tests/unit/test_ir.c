/* test_ir.c — the IR layer by itself: dtype rounding, printing, the fixed
 * point of print(parse(x)), dim overrides, builders, clones, the verifier. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "interp.h"
#include "parser.h"
#include "passes.h"

static tf_module *parse(const char *text, tf_diag *d)
{
    tf_module *m = NULL;
    tf_diag_clear(d);
    tf_parse("t.ir", text, strlen(text), NULL, 0, &m, d);
    return m;
}

static void test_rounding(void)
{
    CHECK(tf_dtype_round(TF_DT_F16, 1.0 / 3) == 0.333251953125, "f16(1/3) = %.17g", tf_dtype_round(TF_DT_F16, 1.0 / 3));
    CHECK(tf_dtype_round(TF_DT_F16, 65504) == 65504, "f16 max");
    CHECK(isinf(tf_dtype_round(TF_DT_F16, 65520)), "f16 overflow rounds to inf");
    CHECK(tf_dtype_round(TF_DT_F16, 65519) == 65504, "f16 just below the overflow threshold");
    CHECK(tf_dtype_round(TF_DT_F16, ldexp(1, -24)) == ldexp(1, -24), "smallest f16 subnormal");
    CHECK(tf_dtype_round(TF_DT_F16, ldexp(1, -26)) == 0, "below half the smallest subnormal: 0");
    CHECK(tf_dtype_round(TF_DT_F16, 2049) == 2048, "ties to even: 2049 -> 2048");
    CHECK(tf_dtype_round(TF_DT_F16, 2051) == 2052, "ties to even: 2051 -> 2052");
    CHECK(tf_dtype_round(TF_DT_BF16, 1.0 / 3) == 0.333984375, "bf16(1/3) = %.17g", tf_dtype_round(TF_DT_BF16, 1.0 / 3));
    CHECK(tf_dtype_round(TF_DT_BF16, 257) == 256, "bf16 ties to even");
    CHECK(tf_dtype_round(TF_DT_F32, 0.1) == (double)0.1f, "f32 rounding");
    CHECK(tf_dtype_round(TF_DT_I64, -2.7) == -2, "ints truncate toward zero");
    CHECK(tf_dtype_round(TF_DT_BOOL, 0.25) == 1, "bool");
}

static void test_roundtrip_and_canonical(void)
{
    tf_diag d;
    const char *src =
        "module  m   # comment\n\n"
        "dim B=3\n"
        "input x:f32[B,4]\n"
        "param w : f32[4, 2] = uniform(-0.5, 0.5)\n"
        "h = linear(x, w)\n"
        "y : f32[B, 2] = mul(h, 0.1)\n"
        "p = maxpool2d(r, kernel=2)\n";   /* r undefined: error */
    tf_module *m = parse(src, &d);
    CHECK(!m && strstr(d.msg, "t.ir:8:15: error: undefined value 'r'"), "undefined value message: %s", d.msg);
    tf_module_free(m);

    src = "module  m\ndim B=3\ninput x:f32[B,4]\nparam w : f32[4, 2] = uniform(-0.5, 0.5)\n"
          "h = linear(x, w)\ny : f32[B, 2] = mul(h, 0.1)\nc = conv2d(x4, k, stride=2)\n";
    m = parse(src, &d);
    CHECK(!m, "undefined x4");
    tf_module_free(m);

    src = "module m\ndim B=3\ninput x:f32[B,4]\nparam w : f32[4, 2] = uniform(-0.5, 0.5)\n"
          "h = linear(x, w)\ny : f32[B, 2] = mul(h, 0.1)\nz = reshape(y, shape=[B, -1, 1])\noutput z\n"
          "train {\n  optimizer = sgd(0.5)\n}\n";
    m = parse(src, &d);
    CHECK(m != NULL, "parse: %s", d.msg);
    if (!m) return;
    char *p1 = tf_print_module(m);
    const char *want =
        "module m\n\ndim B = 3\n\ninput  x : f32[B, 4]\nparam  w : f32[4, 2] = uniform(low=-0.5, high=0.5)\n\n"
        "h : f32[B, 2] = linear(x, w)\ny : f32[B, 2] = mul(h, 0.1)\nz : f32[B, 2, 1] = reshape(y, shape=[B, -1, 1])\n\n"
        "output z\n\ntrain {\n  optimizer = sgd(lr=0.5)\n}\n";
    CHECK(p1 && !strcmp(p1, want), "canonical text:\n%s\nwanted:\n%s", p1 ? p1 : "(null)", want);
    tf_module *m2 = parse(p1, &d);
    char *p2 = m2 ? tf_print_module(m2) : NULL;
    CHECK(p2 && !strcmp(p1, p2), "print(parse(print(x))) differs:\n%s", p2 ? p2 : "(null)");
    /* clones print the same */
    tf_module *c = tf_module_clone(m);
    char *p3 = c ? tf_print_module(c) : NULL;
    CHECK(p3 && !strcmp(p1, p3), "clone prints differently:\n%s", p3 ? p3 : "(null)");
    tf_free(p1);
    tf_free(p2);
    tf_free(p3);
    tf_module_free(m);
    tf_module_free(m2);
    tf_module_free(c);

    /* --dim overrides flow into every shape, including reshape's dim names */
    tf_dim_set over = {"B", 17};
    tf_diag_clear(&d);
    CHECK(tf_parse("t.ir", src, strlen(src), &over, 1, &m, &d) == TF_IR_OK, "override: %s", d.msg);
    if (m) {
        CHECK(m->dims[0].value == 17, "B overridden");
        tf_node *z = m->nodes.items[2];
        CHECK(z->out->type.dims[0].n == 17 && z->out->type.dims[1].n == 2, "reshape follows B");
        tf_module_free(m);
    }
    tf_dim_set bad = {"Q", 2};
    tf_diag_clear(&d);
    CHECK(tf_parse("t.ir", src, strlen(src), &bad, 1, &m, &d) != TF_IR_OK && strstr(d.msg, "no dim named 'Q'"),
          "unknown override: %s", d.msg);
}

static void test_numbers_print_exactly(void)
{
    tf_diag d;
    const char *src = "input x : f32[2]\na = mul(x, 0.1)\nb = add(a, 1e-07)\nc = sub(b, 3)\ne = maximum(c, -inf)\n"
                      "f = layernorm(x, x, x, eps=1.5e-05)\n";
    tf_module *m = parse(src, &d);
    CHECK(m != NULL, "%s", d.msg);
    if (!m) return;
    char *p = tf_print_module(m);
    CHECK(p && strstr(p, "mul(x, 0.1)") && strstr(p, "add(a, 1e-07)") && strstr(p, "sub(b, 3.0)") &&
              strstr(p, "maximum(c, -inf)") && strstr(p, "eps=1.5e-05"),
          "numbers:\n%s", p ? p : "(null)");
    tf_free(p);
    tf_module_free(m);
}

static void test_builder_and_verifier(void)
{
    tf_diag d = {0};
    tf_module *m = parse("input a : f32[2, 3]\ninput b : f32[4, 5]\n", &d);
    CHECK(m != NULL, "%s", d.msg);
    if (!m) return;
    tf_value *a = m->decls.items[0], *b = m->decls.items[1];
    tf_value *in[2] = {a, b};
    tf_diag_clear(&d);
    CHECK(!tf_build(m, &d, TF_OP_MATMUL, in, 2, NULL, 0, "mm", NULL) && strstr(d.msg, "contraction sizes differ"),
          "matmul mismatch: %s", d.msg);
    tf_diag_clear(&d);
    tf_value *t = tf_build(m, &d, TF_OP_TANH, &a, 1, NULL, 0, "a", NULL);
    CHECK(t && !strcmp(t->name, "a.1"), "unique names: %s", t ? t->name : d.msg);
    tf_value *u = tf_build(m, &d, TF_OP_EXP, &t, 1, NULL, 0, "a", NULL);
    CHECK(u && !strcmp(u->name, "a.2"), "unique names: %s", u ? u->name : d.msg);
    tf_named_attr bad = {"perm", tf_attr_ints(m, (int64_t[]){0, 0}, 2)};
    tf_diag_clear(&d);
    CHECK(!tf_build(m, &d, TF_OP_TRANSPOSE, &a, 1, &bad, 1, "tr", NULL) && strstr(d.msg, "permutation"),
          "transpose check: %s", d.msg);
    /* a node moved before its operand's definition is caught */
    if (t && u) {
        void *tmp = m->nodes.items[0];
        m->nodes.items[0] = m->nodes.items[1];
        m->nodes.items[1] = tmp;
        tf_diag_clear(&d);
        CHECK(tf_verify(m, &d) != TF_IR_OK && strstr(d.msg, "used before it is defined"), "order: %s", d.msg);
    }
    tf_module_free(m);
}

static void test_lower_names_and_modes(void)
{
    tf_diag d;
    const char *src = "input x : f32[4, 3]\nparam w : f32[3, 2] = ones()\nparam b : f32[2] = zeros()\n"
                      "h = linear(x, w, b)\nd = dropout(h, p=0.5)\noutput d\n";
    for (int mode = 0; mode < 2; mode++) {
        tf_module *m = parse(src, &d);
        tf_options o = {.mode = (tf_ir_mode)mode, .diag = &d};
        CHECK(m && !pass_lower(m, &o) && !tf_verify(m, &d), "lower: %s", d.msg);
        if (!m) continue;
        char *p = tf_print_module(m);
        CHECK(p && strstr(p, "h.mm : f32[4, 2] = matmul(x, w)") && strstr(p, "h : f32[4, 2] = add(h.mm, b)"),
              "lowered names:\n%s", p ? p : "(null)");
        if (mode == TF_IR_TRAIN)
            CHECK(p && strstr(p, "dropout_mask(h, p=0.5") && strstr(p, "d : f32[4, 2] = mul(h, d.mask)"), "train dropout:\n%s", p ? p : "(null)");
        else
            CHECK(p && !strstr(p, "dropout") && strstr(p, "output d = h"), "infer dropout vanishes:\n%s", p ? p : "(null)");
        tf_free(p);
        tf_module_free(m);
    }
}

static void test_interp_seeds(void)
{
    tf_diag d;
    tf_module *m = parse("param w : f32[64, 32] = kaiming_uniform()\nparam v : f32[8] = normal(std=2.0)\n", &d);
    CHECK(m != NULL, "%s", d.msg);
    if (!m) return;
    double sum[3] = {0}, maxabs = 0;
    for (int run = 0; run < 3; run++) {
        tf_interp_ctx *ip = tf_interp_create(m, TF_IR_TRAIN, run == 2 ? 8 : 7);
        CHECK(ip && !tf_interp_init_state(ip, &d), "init");
        if (!ip) continue;
        tf_tensor *w = tf_interp_tensor(ip, m->decls.items[0], &d);
        for (int64_t i = 0; i < w->numel; i++) {
            sum[run] += w->data[i];
            if (fabs(w->data[i]) > maxabs) maxabs = fabs(w->data[i]);
        }
        tf_interp_free(ip);
    }
    CHECK(sum[0] == sum[1], "same seed, same params");
    CHECK(sum[0] != sum[2], "another seed, other params");
    double bound = sqrt(2.0) * sqrt(3.0 / 64);
    CHECK(maxabs <= bound && maxabs > 0.9 * bound, "kaiming_uniform bound %g, max drawn %g", bound, maxabs);
    tf_module_free(m);
}


/* normal() draws: the AS241 quantile against values computed to 30 digits
 * (mpmath, 80 digits: sqrt(2) erfinv(2p - 1)); each draw is exactly the quantile at
 * (k + 1/2) / 2^52, k the top 52 bits of the uniform draw's hash; the
 * chunked fill (tf_interp_init_range, from any offset) gives the scalar
 * draw's bits; and the draws are normal: moments, the share past the
 * central region's split, and a Kolmogorov-Smirnov bound. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_normal_draws(void)
{
    static const struct { double p, z; } ref[] = {
        {0.975, 1.9599639845400542355}, {0.9, 1.281551565544600467},   {0.3, -0.52440051270804078404},
        {1e-10, -6.3613409024040562047}, {1e-20, -9.2623400897984075737}, {0x1p-53, -8.2095361516013868556},
    };
    for (size_t i = 0; i < sizeof ref / sizeof *ref; i++) {
        double z = tf_normal_quantile(ref[i].p), zc = tf_normal_quantile(1 - ref[i].p);
        CHECK(fabs(z - ref[i].z) <= 1e-14 * fabs(ref[i].z), "Phi^-1(%g) = %.17g, want %.17g", ref[i].p, z, ref[i].z);
        if (ref[i].p > 0.01 || ref[i].p == 0x1p-53)   /* 1 - p close enough (exact for 2^-53) */
            CHECK(fabs(zc + ref[i].z) <= 1e-14 * fabs(ref[i].z), "Phi^-1(1 - %g) = %.17g", ref[i].p, zc);
    }
    CHECK(tf_normal_quantile(0.5) == 0 && isinf(tf_normal_quantile(0)) && isnan(tf_normal_quantile(1.5)), "Phi^-1 at 1/2, 0, 1.5");

    tf_diag d;
    tf_module *m = parse("param w : f64[5000] = normal(std=1.0)\nparam h : f32[777] = normal(mean=0.5, std=3.0)\n", &d);
    CHECK(m != NULL, "%s", d.msg);
    if (!m) return;
    const uint64_t seed = 11;
    tf_value *w = m->decls.items[0], *h = m->decls.items[1];
    enum { N = 5000 };
    static double z[N], sorted[N], part[N];
    uint64_t stream = tf_rng_stream("w");
    int mismatch = 0, tails = 0;
    double mean = 0, var = 0, maxabs = 0;
    for (int i = 0; i < N; i++) {
        z[i] = tf_rng_normal(seed, stream, (uint64_t)i);
        double k = floor(tf_rng_uniform(seed, stream, (uint64_t)i) * 0x1p52);
        mismatch += z[i] != tf_normal_quantile((k + 0.5) * 0x1p-52);
        mean += z[i];
        tails += fabs(z[i]) > 1.4395314709384563;   /* Phi^-1(0.925): the tails' rational */
        if (fabs(z[i]) > maxabs) maxabs = fabs(z[i]);
    }
    CHECK(mismatch == 0, "%d draws are not Phi^-1((k + 1/2) / 2^52)", mismatch);
    mean /= N;
    for (int i = 0; i < N; i++) var += (z[i] - mean) * (z[i] - mean) / (N - 1);
    CHECK(fabs(mean) < 4 / sqrt(N) && fabs(var - 1) < 0.1 && maxabs < 8.21, "mean %g, variance %g, max |z| %g", mean, var, maxabs);
    CHECK(tails > 0.12 * N && tails < 0.18 * N, "%d of %d draws in the tails, want about 15%%", tails, N);
    memcpy(sorted, z, sizeof z);
    qsort(sorted, N, sizeof *sorted, cmp_double);
    double ks = 0;
    for (int i = 0; i < N; i++) {
        double F = 0.5 * erfc(-sorted[i] / sqrt(2.0)), e1 = fabs(F - (double)i / N), e2 = fabs(F - (double)(i + 1) / N);
        if (e1 > ks) ks = e1;
        if (e2 > ks) ks = e2;
    }
    CHECK(ks < 1.63 / sqrt(N), "Kolmogorov-Smirnov distance %g to the normal CDF (1%% level: %g)", ks, 1.63 / sqrt(N));
    /* the chunked fill, from offsets that are not the chunk's, is the scalar draw */
    tf_interp_init_range(w, seed, 3, 3001, part);
    tf_interp_init_range(w, seed, 3001, N, part + 2998);
    mismatch = 0;
    for (int i = 3; i < N; i++) mismatch += part[i - 3] != z[i];
    CHECK(mismatch == 0, "%d elements of the chunked fill differ from tf_rng_normal", mismatch);
    tf_interp_init_range(h, seed, 0, 777, part);
    mismatch = 0;
    for (int i = 0; i < 777; i++) mismatch += part[i] != (double)(float)(0.5 + 3.0 * tf_rng_normal(seed, tf_rng_stream("h"), (uint64_t)i));
    CHECK(mismatch == 0, "%d f32 elements are not mean + std * z rounded to f32", mismatch);
    tf_module_free(m);
}

int main(void)
{
    test_rounding();
    test_roundtrip_and_canonical();
    test_numbers_print_exactly();
    test_builder_and_verifier();
    test_lower_names_and_modes();
    test_interp_seeds();
    test_normal_draws();
    return check_report();
}
