/* test_backward_ops.c — the interpreter's backward-op kernels
 * (ir/interp_backward.c) against central finite differences of their
 * forward ops, in float64.
 *
 * Each case is a forward module (output y) and a backward module (output g)
 * whose inputs are dy and the forward module's inputs of the same names. For
 * a random cotangent dy, L = sum(y * dy); dL/d(wrt)[k] by central differences
 * (step H) must equal g[k] within 1e-6 of the gradient's scale. The forward
 * ops are linear (conv, avgpool, gather, slice) or piecewise linear
 * (maxpool: the float inputs are a shuffled grid of distinct values, spaced
 * far wider than H, so no window has a tie or changes its argmax), so the
 * differences are exact up to rounding. Also: maxpool2d_grad's tie rule (the
 * first maximum in row-major window order, like the forward kernel) on data
 * full of ties, scatter_add's out-of-range id, and each shape rule rejecting
 * a wrong `shape`/`size` with a message naming the op. The seed comes from
 * TFUSE_TEST_SEED or the clock and is printed. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "testutil.h"
#include "interp.h"
#include "parser.h"

#define H    1e-5
#define RTOL 1e-6

static uint64_t g_seed;

/* ---- a parsed module with its interpreter ----------------------------------------- */

typedef struct prog { const char *label; tf_module *m; tf_interp_ctx *ip; tf_diag d; } prog;

static bool prog_open(prog *p, const char *label, const char *text)
{
    memset(p, 0, sizeof *p);
    p->label = label;
    if (tf_parse(label, text, strlen(text), NULL, 0, &p->m, &p->d)) {
        CHECK(0, "%s does not parse: %s", label, p->d.msg);
        return false;
    }
    p->ip = tf_interp_create(p->m, TF_IR_INFER, g_seed);
    CHECK(p->ip != NULL, "%s: tf_interp_create failed", label);
    return p->ip != NULL;
}

static void prog_close(prog *p)
{
    tf_interp_free(p->ip);
    tf_module_free(p->m);
    memset(p, 0, sizeof *p);
}

static tf_tensor *prog_tensor(prog *p, const char *name)
{
    tf_value *v = tf_module_find_value(p->m, name);
    tf_tensor *t = v ? tf_interp_tensor(p->ip, v, &p->d) : NULL;
    CHECK(t != NULL, "%s: no tensor for %s", p->label, name);
    return t;
}

/* Run; the first output, or NULL (a failed check) on error. */
static const tf_tensor *prog_run(prog *p)
{
    if (tf_interp_run(p->ip, &p->d)) {
        CHECK(0, "%s: run failed: %s", p->label, p->d.msg);
        return NULL;
    }
    return tf_interp_tensor(p->ip, p->m->outputs[0].value, &p->d);
}

/* Float inputs: a shuffled grid of distinct values in (-2, 2); integer
 * inputs (ids): uniform in [0, bound). */
static void fill_inputs(prog *p, int64_t bound, uint64_t *rs)
{
    for (int i = 0; i < p->m->decls.n; i++) {
        tf_value *v = p->m->decls.items[i];
        if (v->kind != TF_VAL_INPUT) continue;
        tf_tensor *t = prog_tensor(p, v->name);
        if (!t) continue;
        for (int64_t k = 0; k < t->numel; k++)
            t->data[k] = tf_dtype_is_float(t->dtype) ? -2.0 + 4.0 * ((double)k + 0.5) / (double)t->numel
                                                     : (double)(int64_t)(test_rnd(rs) * (double)bound);
        if (tf_dtype_is_float(t->dtype))
            for (int64_t k = t->numel - 1; k > 0; k--) {   /* Fisher-Yates */
                int64_t j = (int64_t)(test_rnd(rs) * (double)(k + 1));
                double tmp = t->data[k];
                t->data[k] = t->data[j];
                t->data[j] = tmp;
            }
    }
}

/* ---- finite differences against the backward op -------------------------------------- */

typedef struct gcase {
    const char *label;
    const char *fwd;    /* output y */
    const char *wrt;    /* the forward input differentiated */
    const char *bwd;    /* input dy + forward inputs by name; output g */
    int64_t bound;      /* ids in [0, bound) */
} gcase;

static double loss(prog *f, const double *dy)
{
    const tf_tensor *y = prog_run(f);
    double l = 0;
    for (int64_t k = 0; y && k < y->numel; k++) l += y->data[k] * dy[k];
    return l;
}

static void run_case(const gcase *c)
{
    prog f, b;
    uint64_t rs = g_seed ^ tf_rng_stream(c->label);
    if (!prog_open(&f, c->label, c->fwd)) return;
    double *dy = NULL, *fd = NULL;
    fill_inputs(&f, c->bound, &rs);
    const tf_tensor *y = prog_run(&f);
    tf_tensor *x = prog_tensor(&f, c->wrt);
    if (!y || !x) goto done;
    int64_t ny = y->numel;
    dy = malloc((size_t)ny * sizeof *dy);
    fd = malloc((size_t)x->numel * sizeof *fd);
    if (!dy || !fd) goto done;
    for (int64_t k = 0; k < ny; k++) dy[k] = 2 * test_rnd(&rs) - 1;
    double scale = 0;
    for (int64_t k = 0; k < x->numel; k++) {
        double x0 = x->data[k];
        x->data[k] = x0 + H;
        double lp = loss(&f, dy);
        x->data[k] = x0 - H;
        double lm = loss(&f, dy);
        x->data[k] = x0;
        fd[k] = (lp - lm) / (2 * H);
        if (fabs(fd[k]) > scale) scale = fabs(fd[k]);
    }
    CHECK(scale > 0, "%s: the finite-difference gradient is all zero", c->label);

    char blabel[128];
    snprintf(blabel, sizeof blabel, "%s (backward)", c->label);
    if (!prog_open(&b, blabel, c->bwd)) goto done;
    for (int i = 0; i < b.m->decls.n; i++) {
        tf_value *v = b.m->decls.items[i];
        if (v->kind != TF_VAL_INPUT) continue;
        tf_tensor *t = prog_tensor(&b, v->name);
        if (!t) continue;
        const double *src = dy;
        int64_t n = ny;
        if (strcmp(v->name, "dy")) {
            tf_tensor *s = prog_tensor(&f, v->name);
            src = s ? s->data : NULL;
            n = s ? s->numel : -1;
        }
        CHECK(src && n == t->numel, "%s: input %s does not match the forward module", blabel, v->name);
        if (src && n == t->numel) memcpy(t->data, src, (size_t)n * sizeof *src);
    }
    const tf_tensor *g = prog_run(&b);
    if (g) {
        CHECK(g->numel == x->numel, "%s: gradient has %lld elements, %s has %lld", blabel, (long long)g->numel,
              c->wrt, (long long)x->numel);
        int bad = 0;
        double worst = 0;
        for (int64_t k = 0; k < g->numel && k < x->numel; k++) {
            double e = fabs(g->data[k] - fd[k]);
            if (e > worst) worst = e;
            if (e > RTOL * scale && bad++ < 3)
                CHECK(0, "%s: d/d%s[%lld]: backward op %.12g, finite differences %.12g (seed %llu)", c->label,
                      c->wrt, (long long)k, g->data[k], fd[k], (unsigned long long)g_seed);
        }
        if (!bad) check_passed++;
        printf("  %-40s %6lld elements, max |error| %.2e of scale %.3g\n", c->label, (long long)x->numel, worst,
               scale);
    }
    prog_close(&b);
done:
    free(dy);
    free(fd);
    prog_close(&f);
}

/* conv2d: x and w, both gradients, one module pair per attribute set. */
#define CONV_FWD(X, W, ATTRS) "input x : f64" X "\ninput w : f64" W "\ny = conv2d(x, w, " ATTRS ")\noutput y\n"
#define CONV_BX(X, W, DY, ATTRS, SHAPE)                                                                       \
    "input dy : f64" DY "\ninput w : f64" W "\ng = conv2d_grad_input(dy, w, " ATTRS ", shape=" SHAPE ")\noutput g\n"
#define CONV_BW(X, W, DY, ATTRS, SHAPE)                                                                       \
    "input x : f64" X "\ninput dy : f64" DY "\ng = conv2d_grad_weight(x, dy, " ATTRS ", shape=" SHAPE ")\noutput g\n"
#define CONV_CASES(NAME, X, W, DY, ATTRS)                                                                     \
    {NAME " dx", CONV_FWD(X, W, ATTRS), "x", CONV_BX(X, W, DY, ATTRS, X), 0},                                 \
    {NAME " dw", CONV_FWD(X, W, ATTRS), "w", CONV_BW(X, W, DY, ATTRS, W), 0}

#define POOL_FWD(OP, X, ATTRS) "input x : f64" X "\ny = " OP "(x, " ATTRS ")\noutput y\n"
#define MAXPOOL_CASE(NAME, X, DY, ATTRS)                                                                      \
    {NAME, POOL_FWD("maxpool2d", X, ATTRS), "x",                                                              \
     "input x : f64" X "\ninput dy : f64" DY "\ng = maxpool2d_grad(x, dy, " ATTRS ")\noutput g\n", 0}
#define AVGPOOL_CASE(NAME, X, DY, ATTRS)                                                                      \
    {NAME, POOL_FWD("avgpool2d", X, ATTRS), "x",                                                              \
     "input dy : f64" DY "\ng = avgpool2d_grad(dy, " ATTRS ", shape=" X ")\noutput g\n", 0}

static const gcase cases[] = {
    CONV_CASES("conv2d s2 p1 d2 g2", "[2, 4, 7, 6]", "[6, 2, 3, 3]", "[2, 6, 3, 2]",
               "stride=2, padding=1, dilation=2, groups=2"),
    CONV_CASES("conv2d s[1,2] p[0,2] d[2,1]", "[1, 3, 5, 8]", "[4, 3, 2, 3]", "[1, 4, 3, 5]",
               "stride=[1, 2], padding=[0, 2], dilation=[2, 1]"),
    CONV_CASES("conv2d depthwise s2 p1", "[2, 3, 5, 5]", "[3, 1, 3, 3]", "[2, 3, 3, 3]",
               "stride=2, padding=1, groups=3"),
    CONV_CASES("conv2d g3 s3 p2", "[1, 6, 6, 5]", "[6, 2, 2, 2]", "[1, 6, 3, 3]", "stride=3, padding=2, groups=3"),
    CONV_CASES("conv2d 1x1 default attrs", "[2, 3, 3, 2]", "[5, 3, 1, 1]", "[2, 5, 3, 2]", "groups=1"),

    MAXPOOL_CASE("maxpool2d k3 s2 p1", "[2, 3, 7, 6]", "[2, 3, 4, 3]", "kernel=3, stride=2, padding=1"),
    MAXPOOL_CASE("maxpool2d k[2,3] s1 p1", "[1, 2, 5, 6]", "[1, 2, 6, 6]", "kernel=[2, 3], stride=1, padding=1"),
    MAXPOOL_CASE("maxpool2d k2 default stride", "[1, 2, 5, 5]", "[1, 2, 2, 2]", "kernel=2"),
    MAXPOOL_CASE("maxpool2d k3 s[1,2] p[1,0]", "[2, 1, 6, 7]", "[2, 1, 6, 3]", "kernel=3, stride=[1, 2], padding=[1, 0]"),

    AVGPOOL_CASE("avgpool2d k3 s2 p1", "[2, 3, 7, 6]", "[2, 3, 4, 3]", "kernel=3, stride=2, padding=1"),
    AVGPOOL_CASE("avgpool2d k[2,3] s[1,2] p[1,0]", "[1, 2, 5, 7]", "[1, 2, 6, 3]",
                 "kernel=[2, 3], stride=[1, 2], padding=[1, 0]"),
    AVGPOOL_CASE("avgpool2d k2 default stride", "[1, 2, 5, 5]", "[1, 2, 2, 2]", "kernel=2"),

    /* 12 ids into 5 rows: ids repeat */
    {"gather repeated ids", "input ids : i64[3, 4]\ninput t : f64[5, 2, 3]\ny = gather(ids, t)\noutput y\n", "t",
     "input ids : i64[3, 4]\ninput dy : f64[3, 4, 2, 3]\ng = scatter_add(ids, dy, shape=[5, 2, 3])\noutput g\n", 5},
    {"gather rank-1 table", "input ids : i64[9]\ninput t : f64[4]\ny = gather(ids, t)\noutput y\n", "t",
     "input ids : i64[9]\ninput dy : f64[9]\ng = scatter_add(ids, dy, shape=[4])\noutput g\n", 4},

    {"slice axis=-2 start=-6 end=7 step=2", "input x : f64[3, 7, 5]\ny = slice(x, axis=-2, start=-6, end=7, step=2)\noutput y\n",
     "x", "input dy : f64[3, 3, 5]\ng = slice_grad(dy, axis=-2, start=-6, end=7, step=2, size=7)\noutput g\n", 0},
    {"slice axis=2 start=-100 end=-1 step=3", "input x : f64[2, 3, 8]\ny = slice(x, axis=2, start=-100, end=-1, step=3)\noutput y\n",
     "x", "input dy : f64[2, 3, 3]\ng = slice_grad(dy, axis=2, start=-100, end=-1, step=3, size=8)\noutput g\n", 0},
    {"slice axis=0 start=1 end=99", "input x : f64[4, 3]\ny = slice(x, axis=0, start=1, end=99)\noutput y\n",
     "x", "input dy : f64[3, 3]\ng = slice_grad(dy, axis=0, start=1, end=99, size=4)\noutput g\n", 0},
};

/* ---- maxpool2d_grad's tie rule ---------------------------------------------------------- */

/* x in {0, 1, 2} (ties everywhere) with one plane all -inf: each window's dy
 * goes to its first maximum in row-major order, or its first in-bounds
 * element when every element is -inf. Expectation computed naively here. */
static void check_maxpool_ties(void)
{
    enum { NP = 4, HH = 6, WW = 5, K = 3, S = 1, P = 1, HO = 6, WO = 5 };
    const char *text = "input x : f64[2, 2, 6, 5]\ninput dy : f64[2, 2, 6, 5]\n"
                       "g = maxpool2d_grad(x, dy, kernel=3, stride=1, padding=1)\noutput g\n";
    prog p;
    if (!prog_open(&p, "maxpool2d_grad ties", text)) return;
    tf_tensor *x = prog_tensor(&p, "x"), *dy = prog_tensor(&p, "dy");
    uint64_t rs = g_seed ^ 0x7469657321ull;
    static double want[NP * HH * WW];
    memset(want, 0, sizeof want);
    for (int64_t k = 0; x && dy && k < x->numel; k++) {
        x->data[k] = k / (HH * WW) == 2 ? -INFINITY : (double)(int)(test_rnd(&rs) * 3);
        dy->data[k] = 2 * test_rnd(&rs) - 1;
    }
    const tf_tensor *g = x && dy ? prog_run(&p) : NULL;
    if (g) {
        for (int pl = 0; pl < NP; pl++)
            for (int oh = 0; oh < HO; oh++)
                for (int ow = 0; ow < WO; ow++) {
                    int at = -1;
                    double best = -INFINITY;
                    for (int ih = oh * S - P; ih < oh * S - P + K; ih++)
                        for (int iw = ow * S - P; iw < ow * S - P + K; iw++) {
                            if (ih < 0 || ih >= HH || iw < 0 || iw >= WW) continue;
                            double v = x->data[pl * HH * WW + ih * WW + iw];
                            if (at < 0 || v > best) at = ih * WW + iw, best = v;
                        }
                    want[pl * HH * WW + at] += dy->data[pl * HO * WO + oh * WO + ow];
                }
        int bad = 0;
        for (int k = 0; k < NP * HH * WW; k++)
            if (!check_close(g->data[k], want[k], 1e-15, 1e-15) && bad++ < 3)
                CHECK(0, "maxpool2d_grad ties: dx[%d] = %.17g, expected %.17g", k, g->data[k], want[k]);
        if (!bad) check_passed++;
    }
    prog_close(&p);
}

/* ---- errors --------------------------------------------------------------------------- */

static void check_scatter_add_range(void)
{
    const char *text = "input ids : i64[2, 3]\ninput dy : f64[2, 3, 4]\ng = scatter_add(ids, dy, shape=[5, 4])\noutput g\n";
    static const double bad_ids[] = {-1, 5};
    for (int i = 0; i < 2; i++) {
        prog p;
        if (!prog_open(&p, "scatter_add range", text)) return;
        tf_tensor *ids = prog_tensor(&p, "ids");
        for (int64_t k = 0; ids && k < ids->numel; k++) ids->data[k] = k == 4 ? bad_ids[i] : (double)k;
        tf_ir_status st = tf_interp_run(p.ip, &p.d);
        CHECK(st == TF_IR_ERR_RUNTIME && strstr(p.d.msg, "scatter_add") && strstr(p.d.msg, "out of range") &&
                  strstr(p.d.msg, "position 4"),
              "scatter_add with id %g: status %d, message '%s'", bad_ids[i], (int)st, p.d.msg);
        prog_close(&p);
    }
}

/* Each module has a backward op whose shape/size does not match dy. */
static void check_shape_rules(void)
{
    static const struct { const char *op, *text; } bad[] = {
        {"conv2d_grad_input", "input dy : f64[2, 6, 3, 2]\ninput w : f64[6, 2, 3, 3]\n"
                              "g = conv2d_grad_input(dy, w, stride=2, padding=1, dilation=2, groups=2, shape=[2, 4, 9, 6])\noutput g\n"},
        {"conv2d_grad_input", "input dy : f64[2, 6, 3, 2]\ninput w : f64[6, 2, 3, 3]\n"
                              "g = conv2d_grad_input(dy, w, stride=2, padding=1, dilation=2, groups=2, shape=[2, 6, 7, 6])\noutput g\n"},
        {"conv2d_grad_weight", "input x : f64[2, 4, 7, 6]\ninput dy : f64[2, 6, 3, 2]\n"
                               "g = conv2d_grad_weight(x, dy, stride=2, padding=1, dilation=2, groups=2, shape=[6, 2, 2, 3])\noutput g\n"},
        {"conv2d_grad_weight", "input x : f64[2, 4, 7, 6]\ninput dy : f64[2, 6, 3, 2]\n"
                               "g = conv2d_grad_weight(x, dy, stride=2, padding=1, dilation=2, groups=2, shape=[6, 3, 3, 3])\noutput g\n"},
        {"maxpool2d_grad", "input x : f64[2, 3, 7, 6]\ninput dy : f64[2, 3, 4, 4]\n"
                           "g = maxpool2d_grad(x, dy, kernel=3, stride=2, padding=1)\noutput g\n"},
        {"avgpool2d_grad", "input dy : f64[2, 3, 4, 3]\ng = avgpool2d_grad(dy, kernel=3, stride=2, padding=1, shape=[2, 3, 9, 6])\noutput g\n"},
        {"scatter_add", "input ids : i64[3, 4]\ninput dy : f64[3, 4, 5]\ng = scatter_add(ids, dy, shape=[7, 6])\noutput g\n"},
        {"slice_grad", "input dy : f64[3, 3, 5]\ng = slice_grad(dy, axis=-2, start=-6, end=7, step=2, size=9)\noutput g\n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tf_diag d = {0};
        tf_module *m = NULL;
        tf_ir_status st = tf_parse("bad", bad[i].text, strlen(bad[i].text), NULL, 0, &m, &d);
        CHECK(st != TF_IR_OK && strstr(d.msg, bad[i].op), "%s with a wrong shape: status %d, message '%s'", bad[i].op,
              (int)st, d.msg);
        if (!st) tf_module_free(m);
    }
}

int main(void)
{
    g_seed = test_seed();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
    check_maxpool_ties();
    check_scatter_add_range();
    check_shape_rules();
    return check_report();
}
