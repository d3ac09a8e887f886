/* test_grad_rules.c — every gradient rule, and whole models, against central
 * finite differences in float64 on fresh random inputs.
 *
 * For each case: params P (seeded random values), an input r; the loss
 * L = sum(op(P...) * r). autodiff (with grad.<param> outputs) gives dL/dP;
 * finite differences of the lowered forward module give the reference,
 * (L(p + h) - L(p - h)) / 2h with h = 1e-6 (wider through f32). The error bound is relative to
 * the largest gradient in the tensor: 1e-6 for the rules, 1e-5 for whole
 * models (longer chains). Ops with kinks (relu, abs, max, pooling) get inputs
 * away from the kinks; where the one-sided slopes of a whole model disagree
 * (a kink within h), autodiff must match one of them within 10x the bound
 * (a one-sided difference is less accurate). The examples run in f64 with
 * small dims. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autodiff.h"
#include "check.h"
#include "interp.h"
#include "parser.h"
#include "passes.h"
#include "testutil.h"

static uint64_t g_seed;

static tf_module *build(const char *label, const char *text, const char *passes, bool grads, const tf_dim_set *dims, int nd)
{
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(label, text, strlen(text), dims, nd, &m, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        return NULL;
    }
    tf_options o = {.mode = TF_IR_TRAIN, .diag = &d, .grad_outputs = grads};
    if (tf_run_pipeline(m, passes, &o)) {
        CHECK(0, "%s: %s: %s", label, passes, d.msg);
        tf_module_free(m);
        return NULL;
    }
    return m;
}

static tf_value *output(const tf_module *m, const char *name)
{
    for (int i = 0; i < m->noutputs; i++)
        if (!strcmp(m->outputs[i].name, name)) return m->outputs[i].value;
    return NULL;
}

/* Set every decl of `m` from `src` values by name (params from the gradient
 * module's initial state, inputs random). */
static void copy_state(tf_interp_ctx *dst, tf_module *dm, tf_interp_ctx *src, tf_module *sm)
{
    tf_diag d = {0};
    for (int i = 0; i < dm->decls.n; i++) {
        tf_value *v = dm->decls.items[i], *w = tf_module_find_value(sm, v->name);
        if (!w) continue;
        tf_tensor *a = tf_interp_tensor(dst, v, &d), *b = tf_interp_tensor(src, w, &d);
        if (a && b && a->numel == b->numel) memcpy(a->data, b->data, (size_t)a->numel * sizeof(double));
    }
}

static double loss_of(tf_interp_ctx *ip, tf_module *m)
{
    tf_diag d = {0};
    tf_interp_set_step(ip, 0);   /* the gradient run's step: dropout draws the same mask every time */
    if (tf_interp_run(ip, &d)) {
        CHECK(0, "forward run: %s", d.msg);
        return NAN;
    }
    tf_tensor *t = tf_interp_tensor(ip, output(m, "loss"), &d);
    return t ? t->data[0] : NAN;
}

/* Check dL/dparam for every param of `text`; at most `maxel` elements each. */
static void check_grads(const char *label, const char *text, const tf_dim_set *dims, int nd, double tol, int maxel,
                        bool positive, double h)
{
    tf_module *gm = build(label, text, "lower,autodiff", true, dims, nd);
    tf_module *fm = build(label, text, "lower", false, dims, nd);
    tf_diag d = {0};
    if (!gm || !fm) goto done;
    tf_interp_ctx *gi = tf_interp_create(gm, TF_IR_TRAIN, g_seed), *fi = tf_interp_create(fm, TF_IR_TRAIN, g_seed);
    if (!gi || !fi || tf_interp_init_state(gi, &d) || tf_interp_init_state(fi, &d)) {
        CHECK(0, "%s: init: %s", label, d.msg);
        tf_interp_free(gi), tf_interp_free(fi);
        goto done;
    }
    /* inputs: random; labels/ids in range; params: from the initializers,
     * or positive where an op needs it (log, sqrt, pow) */
    uint64_t s = g_seed ^ tf_rng_stream(label);
    for (int i = 0; i < gm->decls.n; i++) {
        tf_value *v = gm->decls.items[i];
        tf_tensor *t = tf_interp_tensor(gi, v, &d);
        if (!t || v->kind == TF_VAL_BUFFER) continue;
        bool fl = tf_dtype_is_float(v->type.dtype);
        int64_t bound = test_int_bound(fm, tf_module_find_value(fm, v->name));
        for (int64_t k = 0; k < t->numel; k++) {
            double u = test_rnd(&s);
            if (!fl) t->data[k] = (double)(int64_t)(u * (double)bound);
            else if (v->kind == TF_VAL_INPUT) t->data[k] = 2 * u - 1;
            else if (positive) t->data[k] = 0.5 + 1.5 * u;
            else if (!strncmp(label, "rule", 4)) t->data[k] = (2 * u - 1) * 1.5;
        }
    }
    copy_state(fi, fm, gi, gm);
    if (tf_interp_run(gi, &d)) {
        CHECK(0, "%s: gradient run: %s", label, d.msg);
        tf_interp_free(gi), tf_interp_free(fi);
        goto done;
    }
    for (int i = 0; i < fm->decls.n; i++) {
        tf_value *p = fm->decls.items[i];
        if (p->kind != TF_VAL_PARAM) continue;
        char name[300];
        snprintf(name, sizeof name, "grad.%s", p->name);
        tf_value *go = output(gm, name);
        CHECK(go != NULL, "%s: no gradient output for %s", label, p->name);
        if (!go) continue;
        tf_tensor *gt = tf_interp_tensor(gi, go, &d), *pt = tf_interp_tensor(fi, p, &d);
        double scale = 0, worst = 0;
        int64_t at = 0;
        for (int64_t k = 0; k < gt->numel; k++)
            if (fabs(gt->data[k]) > scale) scale = fabs(gt->data[k]);
        int64_t stride = gt->numel > maxel ? gt->numel / maxel : 1;
        for (int64_t k = 0; k < gt->numel; k += stride) {
            double x0 = pt->data[k];
            pt->data[k] = x0 + h;
            double lp = loss_of(fi, fm);
            pt->data[k] = x0 - h;
            double lm = loss_of(fi, fm);
            pt->data[k] = x0;
            /* a kink within h (relu at 0, a maxpool tie) makes the one-sided
             * slopes disagree; autodiff must then give one of them (the
             * forward op's choice), to the one-sided difference's accuracy */
            double l0 = loss_of(fi, fm), up = (lp - l0) / h, down = (l0 - lm) / h;
            double fd = (lp - lm) / (2 * h), e = fabs(fd - gt->data[k]), bound = tol * (scale > 1 ? scale : 1);
            if (fabs(up - down) > bound) {
                double side = fmin(fabs(up - gt->data[k]), fabs(down - gt->data[k]));
                if (side <= 10 * bound) e = fmin(e, side / 10);
            }
            if (getenv("TFUSE_GRAD_DEBUG") && (e > bound || getenv("TFUSE_GRAD_ALL")))
                printf("%s %s[%lld]: finite differences %.9g (slopes %.9g / %.9g), autodiff %.9g\n", label, p->name,
                       (long long)k, fd, up, down, gt->data[k]);
            if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e, at = k;
        }
        CHECK(worst <= tol * (scale > 1 ? scale : 1), "%s: d loss/d %s[%lld]: autodiff %.10g, finite differences off by %.3g "
              "(scale %.3g, seed %llu)", label, p->name, (long long)at, gt->data[at], worst, scale, (unsigned long long)g_seed);
    }
    tf_interp_free(gi);
    tf_interp_free(fi);
done:
    tf_module_free(gm);
    tf_module_free(fm);
}

/* One rule: y = EXPR over params a, b (shapes given); L = sum(y * r). */
static void rule_h(const char *name, const char *decls, const char *body, const char *yshape, bool positive, double h,
                   double tol)
{
    char text[4096], label[128];
    snprintf(text, sizeof text, "%s\ninput r : f64%s\n%s\nl0 = mul(y, r)\nloss = reduce_sum(l0, axes=[])\noutput loss\n", decls,
             yshape, body);
    snprintf(label, sizeof label, "rule %s", name);
    check_grads(label, text, NULL, 0, tol, 64, positive, h);
}

static void rule(const char *name, const char *decls, const char *body, const char *yshape, bool positive)
{
    rule_h(name, decls, body, yshape, positive, 1e-6, 1e-6);
}

/* gather(ids, a, padding_idx=P) (embedding's padding row): the gradient is
 * the plain gather's with row P zeroed, though the ids use row P (so finite
 * differences, which see the row's use, cannot be the reference). */
static void padding_row(void)
{
    static const char *text[2] = {
        "param a : f64[6, 4] = uniform()\ninput ids : i64[3, 5]\ninput r : f64[3, 5, 4]\ny = gather(ids, a)\n"
        "l0 = mul(y, r)\nloss = reduce_sum(l0, axes=[])\noutput loss\n",
        "param a : f64[6, 4] = uniform()\ninput ids : i64[3, 5]\ninput r : f64[3, 5, 4]\ny = gather(ids, a, padding_idx=2)\n"
        "l0 = mul(y, r)\nloss = reduce_sum(l0, axes=[])\noutput loss\n"};
    static const int64_t ids[15] = {2, 0, 5, 2, 1, 3, 2, 4, 4, 0, 2, 1, 5, 3, 2};
    double grads[2][24];
    tf_diag d = {0};
    uint64_t s = g_seed ^ tf_rng_stream("padding_idx");
    double r[60];
    for (int k = 0; k < 60; k++) r[k] = 2 * test_rnd(&s) - 1;
    for (int v = 0; v < 2; v++) {
        tf_module *m = build("padding_idx", text[v], "lower,autodiff", true, NULL, 0);
        tf_interp_ctx *ip = m ? tf_interp_create(m, TF_IR_TRAIN, g_seed) : NULL;
        bool ok = ip && !tf_interp_init_state(ip, &d);
        tf_tensor *ti = ok ? tf_interp_tensor(ip, tf_module_find_value(m, "ids"), &d) : NULL;
        tf_tensor *tr = ok ? tf_interp_tensor(ip, tf_module_find_value(m, "r"), &d) : NULL;
        if (ti && tr) {
            for (int k = 0; k < 15; k++) ti->data[k] = (double)ids[k];
            memcpy(tr->data, r, sizeof r);
        }
        ok = ti && tr && !tf_interp_run(ip, &d);
        CHECK(ok, "padding_idx: %s", d.msg);
        tf_tensor *g = ok ? tf_interp_tensor(ip, output(m, "grad.a"), &d) : NULL;
        if (g) memcpy(grads[v], g->data, sizeof grads[v]);
        tf_interp_free(ip);
        tf_module_free(m);
        if (!g) return;
    }
    for (int k = 0; k < 24; k++) {
        bool pad_row = k / 4 == 2;
        CHECK(pad_row ? grads[1][k] == 0 && grads[0][k] != 0 : grads[1][k] == grads[0][k],
              "padding_idx: grad.a[%d] = %g, without padding_idx %g", k, grads[1][k], grads[0][k]);
    }
}

#define P2(sa, sb) "param a : f64" sa " = uniform()\nparam b : f64" sb " = uniform()"

int main(void)
{
    g_seed = test_seed();

    static const char *unary[] = {"neg", "exp", "tanh", "sigmoid", "erf", "sin", "cos", "abs", "relu"};
    for (size_t i = 0; i < sizeof unary / sizeof *unary; i++) {
        char body[128];
        snprintf(body, sizeof body, "y = %s(a)", unary[i]);
        rule(unary[i], "param a : f64[3, 5] = uniform()", body, "[3, 5]", false);
    }
    static const char *positive_unary[] = {"log", "sqrt", "rsqrt"};
    for (size_t i = 0; i < 3; i++) {
        char body[128];
        snprintf(body, sizeof body, "y = %s(a)", positive_unary[i]);
        rule(positive_unary[i], "param a : f64[3, 5] = uniform()", body, "[3, 5]", true);
    }
    static const char *binary[] = {"add", "sub", "mul", "div", "maximum", "minimum"};
    for (size_t i = 0; i < sizeof binary / sizeof *binary; i++) {
        char body[128];
        snprintf(body, sizeof body, "y = %s(a, b)", binary[i]);
        rule(binary[i], P2("[3, 5]", "[3, 5]"), body, "[3, 5]", !strcmp(binary[i], "div"));
        snprintf(body, sizeof body, "y = %s(a, b)", binary[i]);   /* b broadcasts */
        char nm[64];
        snprintf(nm, sizeof nm, "%s broadcast", binary[i]);
        rule(nm, P2("[3, 5]", "[5]"), body, "[3, 5]", !strcmp(binary[i], "div"));
        snprintf(nm, sizeof nm, "%s broadcast keepdim", binary[i]);
        rule(nm, P2("[2, 3, 5]", "[2, 1, 5]"), body, "[2, 3, 5]", !strcmp(binary[i], "div"));
    }
    /* every pointwise op of the table with a rule, operands in [0.5, 2]
     * (the domain of log, sqrt, pow; away from relu's and abs's kinks): a
     * row added to ops.def is checked here without a line written for it */
    int walked = 0;
    for (int op = 0; op < TF_OP_COUNT; op++) {
        const tf_op_info *in = tf_op_info_of(op);
        if (in->kind != TF_OPK_POINTWISE || tf_op_has(op, TF_OPF_LAYER) || in->nattrs || in->min_in != in->max_in ||
            in->min_in < 1 || in->min_in > 2 || !tf_grad_rule(op))
            continue;
        char body[128], nm[64];
        snprintf(body, sizeof body, in->min_in == 2 ? "y = %s(a, b)" : "y = %s(a)", in->name);
        snprintf(nm, sizeof nm, "table walk %s", in->name);
        rule(nm, in->min_in == 2 ? P2("[3, 5]", "[5]") : "param a : f64[3, 5] = uniform()", body, "[3, 5]", true);
        walked++;
    }
    CHECK(walked >= 20, "the table walk found the pointwise ops (%d)", walked);
    rule("pow", P2("[3, 5]", "[3, 5]"), "y = pow(a, b)", "[3, 5]", true);
    rule("where", P2("[3, 5]", "[3, 5]"), "c = gt(a, b)\ny = where(c, a, b)", "[3, 5]", false);
    /* through f32: a quadratic (central differences are exact on it) with a
     * wide step, so f32 rounding (~6e-8 of L) stays far below the bound */
    rule_h("cast", "param a : f64[3, 5] = uniform()", "c = cast(a, to=f32)\nd = mul(c, c)\ny = cast(d, to=f64)", "[3, 5]",
           false, 1e-2, 1e-4);
    rule("reduce_sum", "param a : f64[3, 4, 5] = uniform()", "y = reduce_sum(a, axes=[0, 2])", "[4]", false);
    rule("reduce_sum keepdims", "param a : f64[3, 4, 5] = uniform()", "y = reduce_sum(a, axes=[-1], keepdims=true)", "[3, 4, 1]", false);
    rule("reduce_mean", "param a : f64[3, 4, 5] = uniform()", "y = reduce_mean(a, axes=[1])", "[3, 5]", false);
    rule("reduce_max", "param a : f64[3, 4, 5] = uniform()", "y = reduce_max(a, axes=[2], keepdims=true)", "[3, 4, 1]", false);
    rule("matmul", P2("[3, 4]", "[4, 5]"), "y = matmul(a, b)", "[3, 5]", false);
    rule("matmul ta", P2("[4, 3]", "[4, 5]"), "y = matmul(a, b, transpose_a=true)", "[3, 5]", false);
    rule("matmul tb", P2("[3, 4]", "[5, 4]"), "y = matmul(a, b, transpose_b=true)", "[3, 5]", false);
    rule("matmul ta tb", P2("[4, 3]", "[5, 4]"), "y = matmul(a, b, transpose_a=true, transpose_b=true)", "[3, 5]", false);
    rule("matmul batched broadcast", P2("[2, 3, 4]", "[4, 5]"), "y = matmul(a, b)", "[2, 3, 5]", false);
    rule("matmul batch axes", P2("[2, 1, 3, 4]", "[3, 4, 5]"), "y = matmul(a, b)", "[2, 3, 3, 5]", false);
    rule("conv2d", P2("[2, 4, 7, 6]", "[6, 2, 3, 3]"), "y = conv2d(a, b, stride=2, padding=1, dilation=[1, 2], groups=2)",
         "[2, 6, 4, 2]", false);
    rule("conv2d_grad_input (transposed conv)", P2("[2, 4, 3, 3]", "[4, 3, 3, 3]"),
         "y = conv2d_grad_input(a, b, stride=2, padding=1, shape=[2, 3, 6, 6])", "[2, 3, 6, 6]", false);
    rule("conv2d_grad_input grouped", P2("[2, 4, 4, 3]", "[4, 1, 2, 3]"),
         "y = conv2d_grad_input(a, b, stride=[2, 1], dilation=[1, 2], groups=2, shape=[2, 2, 8, 7])", "[2, 2, 8, 7]", false);
    rule("maxpool2d", "param a : f64[2, 3, 6, 5] = uniform()", "y = maxpool2d(a, kernel=3, stride=2, padding=1)", "[2, 3, 3, 3]", false);
    rule("avgpool2d", "param a : f64[2, 3, 6, 5] = uniform()", "y = avgpool2d(a, kernel=2, padding=1)", "[2, 3, 4, 3]", false);
    rule("reshape", "param a : f64[3, 4, 5] = uniform()", "y = reshape(a, shape=[4, 15])", "[4, 15]", false);
    rule("transpose", "param a : f64[3, 4, 5] = uniform()", "y = transpose(a, perm=[2, 0, 1])", "[5, 3, 4]", false);
    rule("broadcast", "param a : f64[4, 1] = uniform()", "y = broadcast(a, shape=[3, 4, 5])", "[3, 4, 5]", false);
    rule("slice", "param a : f64[3, 9] = uniform()", "y = slice(a, axis=1, start=-8, end=8, step=3)", "[3, 3]", false);
    rule("concat", P2("[3, 2]", "[3, 4]"), "y = concat(a, b, a, axis=1)", "[3, 8]", false);
    rule("gather", "param a : f64[6, 4] = uniform()\ninput ids : i64[3, 5]", "y = gather(ids, a)", "[3, 5, 4]", false);
    padding_row();
    rule("shared use", P2("[3, 5]", "[5]"), "u = mul(a, a)\nv = add(u, a)\ny = mul(v, b)", "[3, 5]", false);
    /* attention: the fused op's rule (flash_attention_grad) with grouped-query heads (4 on 2), cross-attention
     * (5 queries, 7 keys), v narrower than q; causal with a scale; a bool mask whose first row sees no key;
     * an additive mask; dropout (every run at step 0 draws one mask); flash_attention written without lse
     * (the rule runs it again with it); and a learned mask, which keeps the attention decomposed */
#define QKV "param a : f64[2, 4, 5, 6] = uniform()\nparam b : f64[2, 2, 7, 6] = uniform()\nparam c : f64[2, 2, 7, 3] = uniform()"
#define KEEP "col = iota(shape=[2, 1, 5, 7], axis=3)\nrow = iota(shape=[2, 1, 5, 7], axis=2)\nm = lt(col, row)\n"
    rule("attention causal", QKV, "y = attention(a, b, c, causal=true, scale=0.7)", "[2, 4, 5, 3]", false);
    rule("attention bool mask", QKV, KEEP "y = attention(a, b, c, m)", "[2, 4, 5, 3]", false);
    rule("attention additive mask", QKV "\ninput m : f64[1, 4, 5, 7]", "y = attention(a, b, c, m, causal=true)", "[2, 4, 5, 3]",
         false);
    rule("attention dropout", QKV, "y = attention(a, b, c, dropout=0.3, salt=3)", "[2, 4, 5, 3]", false);
    rule("flash_attention without lse", QKV, "y = flash_attention(a, b, c, scale=0.4)", "[2, 4, 5, 3]", false);
    rule("attention learned mask (decomposed)", QKV "\nparam m : f64[1, 4, 1, 7] = uniform()", "y = attention(a, b, c, m)",
         "[2, 4, 5, 3]", false);
#undef QKV
#undef KEEP

    /* whole models, in f64 with small dims */
    static const struct { const char *file; tf_dim_set dims[6]; int nd; } models[] = {
        {"mlp.ir", {{"B", 4}}, 1},
        {"cnn.ir", {{"N", 2}, {"C", 4}}, 2},
        {"transformer.ir", {{"B", 2}, {"T", 4}, {"V", 11}}, 3},
    };
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char path[4096];
        char *text = test_read_example(models[i].file, path, sizeof path);
        CHECK(text != NULL, "cannot read %s", path);
        if (!text) continue;
        /* f64 everywhere: replace every "f32[" */
        for (char *q = strstr(text, "f32["); q; q = strstr(q + 4, "f32[")) q[1] = '6', q[2] = '4';
        check_grads(path, text, models[i].dims, models[i].nd, 1e-5, 12, false, 1e-6);
        free(text);
    }
    return check_report();
}
