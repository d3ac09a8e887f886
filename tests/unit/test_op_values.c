/* test_op_values.c — a numeric test per op of ir/ops.def, against values
 * worked out independently of the interpreter.
 *
 * Every case writes a tiny model in the text format, compiles it for the
 * interp target (infer mode unless the op behaves differently in train mode;
 * compiling runs `lower`, so layer ops are checked through their lowering
 * into core ops), binds small inputs, runs and compares the outputs with
 * expectations computed here: by hand for tiny cases, or by naive float64
 * loops written from each op's mathematical definition (a conv2d as a
 * six-deep loop, softmax as exp(x)/sum(exp(x)), ...). f16/bf16 bit patterns
 * come from NumPy (see the comment at each table). f32 outputs must be within
 * rtol 1e-6 / atol 1e-6 of the float64 expectation; integer and bool outputs
 * must be exact. Also checks that bad ids/labels fail cleanly at run time. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tfuse.h"

#define TOL 1e-6, 1e-6   /* rtol, atol for f32 outputs */
#define EXACT 0.0, 0.0   /* integer, bool, bit patterns */

/* ---- inputs and the helper that runs one case ------------------------------ */

typedef struct arg { const char *name; tf_dtype dt; int rank; int64_t shape[8]; const void *data; } arg;

#define NDIMS(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define IN(nm, dt, d, ...) ((arg){nm, dt, NDIMS(__VA_ARGS__), {__VA_ARGS__}, d})
#define F32(nm, d, ...) IN(nm, TF_DTYPE_F32, d, __VA_ARGS__)
#define I64(nm, d, ...) IN(nm, TF_DTYPE_I64, d, __VA_ARGS__)
#define ARGS(...) ((const arg[]){__VA_ARGS__}), ((int)(sizeof((arg[]){__VA_ARGS__}) / sizeof(arg)))
/* an output's expected shape: rank, dims */
#define DIMS(...) NDIMS(__VA_ARGS__), ((const int64_t[]){__VA_ARGS__})
#define SCALAR 0, NULL

typedef struct sess { const char *label; tf_context_t *ctx; tf_model_t *m; tf_program_t *p; tf_session_t *s; } sess;

static void sess_close(sess *t)
{
    tf_session_free(t->s);
    tf_program_free(t->p);
    tf_model_free(t->m);
    tf_context_free(t->ctx);
    memset(t, 0, sizeof *t);
}

/* Parse, compile (interp, mode), create a session with `seed`, bind args. */
static bool sess_open(sess *t, const char *label, const char *text, tf_mode mode, const arg *args, int nargs,
                      uint64_t seed)
{
    memset(t, 0, sizeof *t);
    t->label = label;
    if (tf_context_create(&t->ctx) != TF_OK) {
        CHECK(0, "%s: tf_context_create failed", label);
        return false;
    }
    tf_status st = tf_model_parse_string(t->ctx, label, text, strlen(text), NULL, 0, &t->m);
    if (!st) {
        tf_compile_options o;
        tf_compile_options_init(&o);
        o.mode = mode;
        o.target = TF_TARGET_INTERP;
        st = tf_program_compile(t->ctx, t->m, &o, &t->p);
    }
    if (!st) st = tf_session_create(t->ctx, t->p, TF_TARGET_INTERP, seed, &t->s);
    for (int i = 0; i < nargs && !st; i++)
        st = tf_session_bind(t->s, args[i].name, args[i].dt, args[i].shape, args[i].rank, args[i].data);
    CHECK(st == TF_OK, "%s: setting up failed (%s): %s", label, tf_status_name(st), tf_context_last_error(t->ctx));
    if (st) sess_close(t);
    return st == TF_OK;
}

static bool sess_run(sess *t)
{
    tf_status st = tf_session_run(t->s);
    CHECK(st == TF_OK, "%s: run failed (%s): %s", t->label, tf_status_name(st), tf_context_last_error(t->ctx));
    return st == TF_OK;
}

/* open + run; on false the session is closed (sess_close is safe either way) */
static bool sess_go(sess *t, const char *label, const char *text, tf_mode mode, const arg *args, int nargs)
{
    return sess_open(t, label, text, mode, args, nargs, 7) && sess_run(t);
}

/* f16/bf16 decoded here, from the IEEE layouts, not with the library's code. */
static double f16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, f = h & 1023;
    double v = e == 0 ? ldexp(f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexp(1024 + f, e - 25);
    return s ? -v : v;
}

static double bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double view_elem(const tf_tensor_view *v, size_t i)
{
    const char *p = v->data;
    switch (v->dtype) {
    case TF_DTYPE_F32: { float x; memcpy(&x, p + 4 * i, 4); return x; }
    case TF_DTYPE_F64: { double x; memcpy(&x, p + 8 * i, 8); return x; }
    case TF_DTYPE_I64: { int64_t x; memcpy(&x, p + 8 * i, 8); return (double)x; }
    case TF_DTYPE_I32: { int32_t x; memcpy(&x, p + 4 * i, 4); return x; }
    case TF_DTYPE_F16: { uint16_t x; memcpy(&x, p + 2 * i, 2); return f16_value(x); }
    case TF_DTYPE_BF16: { uint16_t x; memcpy(&x, p + 2 * i, 2); return bf16_value(x); }
    case TF_DTYPE_BOOL: return p[i] == 1 ? 1.0 : p[i] == 0 ? 0.0 : NAN;   /* a bool byte is 0 or 1 */
    }
    return NAN;
}

/* The output's view after checking its dtype and shape; false on mismatch. */
static bool sess_view(sess *t, const char *name, tf_dtype dt, int rank, const int64_t *shape, tf_tensor_view *v,
                      size_t *n)
{
    tf_status st = tf_session_output(t->s, name, v);
    CHECK(st == TF_OK, "%s: no output %s: %s", t->label, name, tf_context_last_error(t->ctx));
    if (st) return false;
    bool ok = v->dtype == dt && v->rank == rank;
    *n = 1;
    for (int i = 0; ok && i < rank; i++) {
        ok = v->shape[i] == shape[i];
        *n *= (size_t)shape[i];
    }
    CHECK(ok, "%s: output %s is %s rank %d (dim0 %lld), want %s rank %d (dim0 %lld)", t->label, name,
          tf_dtype_str(v->dtype), v->rank, (long long)(v->rank ? v->shape[0] : 0), tf_dtype_str(dt), rank,
          (long long)(rank ? shape[0] : 0));
    return ok;
}

/* Compare output `name` with want[] (row-major), |got-want| <= atol + rtol|want|. */
static void expect_out(sess *t, const char *name, tf_dtype dt, int rank, const int64_t *shape, const double *want,
                       double rtol, double atol)
{
    tf_tensor_view v;
    size_t n, bad = 0, first = 0;
    if (!sess_view(t, name, dt, rank, shape, &v, &n)) return;
    for (size_t i = 0; i < n; i++)
        if (!check_close(view_elem(&v, i), want[i], rtol, atol) && bad++ == 0) first = i;
    CHECK(bad == 0, "%s: %s[%zu] = %.9g, want %.9g (%zu of %zu elements differ)", t->label, name, first,
          bad ? view_elem(&v, first) : 0.0, want[first], bad, n);
}

/* The helper behind most cases: model text, inputs, one output, expectation. */
static void op_case(const char *label, const char *text, tf_mode mode, const arg *args, int nargs, const char *out,
                    tf_dtype dt, int rank, const int64_t *shape, const double *want, double rtol, double atol)
{
    sess t;
    if (!sess_open(&t, label, text, mode, args, nargs, 7)) return;
    if (sess_run(&t)) expect_out(&t, out, dt, rank, shape, want, rtol, atol);
    sess_close(&t);
}

#define INFER TF_MODE_INFER
#define TRAIN TF_MODE_TRAIN

/* ---- data and float64 references ----------------------------------------------- */

/* n values k/97 with k a pseudo-random integer in [-200, 200], never 0. */
static void fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        int k = (int)((seed >> 8) % 401) - 200;
        x[i] = (float)((k ? k : 37) / 97.0);
    }
}

static void to_double(const float *x, size_t n, double *y)
{
    for (size_t i = 0; i < n; i++) y[i] = x[i];
}

/* one M x N product; A(i,k) = ta ? a[k][i] : a[i][k], B(k,j) = tb ? b[j][k] : b[k][j] */
static void ref_mm(const float *a, bool ta, const float *b, bool tb, int M, int K, int N, double *out)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)(ta ? a[k * M + i] : a[i * K + k]) * (double)(tb ? b[j * K + k] : b[k * N + j]);
            out[i * N + j] = s;
        }
}

typedef struct convp { int N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, G; } convp;

/* y[n][o][i][j] = b[o] + sum over c in o's group, kh, kw of
 * x[n][c][i*sh - ph + kh*dh][j*sw - pw + kw*dw] * w[o][c - group start][kh][kw] (zero outside x). */
static void ref_conv(const convp *c, const float *x, const float *w, const float *b, double *y, int *ho, int *wo)
{
    int Ho = (c->H + 2 * c->ph - c->dh * (c->KH - 1) - 1) / c->sh + 1;
    int Wo = (c->W + 2 * c->pw - c->dw * (c->KW - 1) - 1) / c->sw + 1;
    int cin = c->C / c->G, cout = c->O / c->G;
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->O; o++)
            for (int i = 0; i < Ho; i++)
                for (int j = 0; j < Wo; j++) {
                    double s = b ? b[o] : 0.0;
                    int g = o / cout;
                    for (int ci = 0; ci < cin; ci++)
                        for (int u = 0; u < c->KH; u++)
                            for (int v = 0; v < c->KW; v++) {
                                int r = i * c->sh - c->ph + u * c->dh, q = j * c->sw - c->pw + v * c->dw;
                                if (r < 0 || r >= c->H || q < 0 || q >= c->W) continue;
                                s += (double)x[((n * c->C + g * cin + ci) * c->H + r) * c->W + q] *
                                     (double)w[((o * cin + ci) * c->KH + u) * c->KW + v];
                            }
                    y[((n * c->O + o) * Ho + i) * Wo + j] = s;
                }
    *ho = Ho;
    *wo = Wo;
}

/* Pooling over planes of H x W; padded positions are skipped by max and
 * count as zeros for avg (the divisor is always kh*kw). */
static void ref_pool(const float *x, int planes, int H, int W, int kh, int kw, int sh, int sw, int ph, int pw,
                     bool is_max, double *y, int *ho, int *wo)
{
    int Ho = (H + 2 * ph - kh) / sh + 1, Wo = (W + 2 * pw - kw) / sw + 1;
    for (int p = 0; p < planes; p++)
        for (int i = 0; i < Ho; i++)
            for (int j = 0; j < Wo; j++) {
                double acc = is_max ? -INFINITY : 0.0;
                for (int u = 0; u < kh; u++)
                    for (int v = 0; v < kw; v++) {
                        int r = i * sh - ph + u, q = j * sw - pw + v;
                        if (r < 0 || r >= H || q < 0 || q >= W) continue;
                        double e = x[(p * H + r) * W + q];
                        acc = is_max ? (e > acc ? e : acc) : acc + e;
                    }
                y[(p * Ho + i) * Wo + j] = is_max ? acc : acc / (kh * kw);
            }
    *ho = Ho;
    *wo = Wo;
}

/* Reduce x[d0][d1][d2] over the axes flagged in red[3]; result row-major over the kept axes. */
enum { R_SUM, R_MEAN, R_MAX };
static void ref_reduce3(const double *x, const int d[3], const bool red[3], int kind, double *y)
{
    int od[3], cnt = 1, n = 1;
    for (int a = 0; a < 3; a++) {
        od[a] = red[a] ? 1 : d[a];
        if (red[a]) cnt *= d[a];
        n *= od[a];
    }
    for (int i = 0; i < n; i++) y[i] = kind == R_MAX ? -INFINITY : 0.0;
    for (int i = 0; i < d[0]; i++)
        for (int j = 0; j < d[1]; j++)
            for (int k = 0; k < d[2]; k++) {
                int o = ((red[0] ? 0 : i) * od[1] + (red[1] ? 0 : j)) * od[2] + (red[2] ? 0 : k);
                double v = x[(i * d[1] + j) * d[2] + k];
                if (kind == R_MAX) y[o] = v > y[o] ? v : y[o];
                else y[o] += v;
            }
    if (kind == R_MEAN)
        for (int i = 0; i < n; i++) y[i] /= cnt;
}

/* softmax / log_softmax of rows of length n */
static void ref_softmax_rows(const double *x, int rows, int n, bool lg, double *y)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int j = 0; j < n; j++) s += exp(x[r * n + j]);
        for (int j = 0; j < n; j++) y[r * n + j] = lg ? x[r * n + j] - log(s) : exp(x[r * n + j]) / s;
    }
}

/* ---- pointwise ops ---------------------------------------------------------------- */

static double d_neg(double x) { return -x; }
static double d_abs(double x) { return x < 0 ? -x : x; }
static double d_rsqrt(double x) { return 1.0 / sqrt(x); }
static double d_sigmoid(double x) { return 0.5 * (1.0 + tanh(0.5 * x)); }   /* = 1/(1+e^-x) */
static double d_relu(double x) { return x > 0 ? x : 0.0; }

static void test_unary(void)
{
    static const struct { const char *op; double (*f)(double); bool positive; } ops[] = {
        {"neg", d_neg, false}, {"abs", d_abs, false},   {"exp", exp, false},         {"log", log, true},
        {"sqrt", sqrt, true},  {"rsqrt", d_rsqrt, true}, {"tanh", tanh, false},      {"sigmoid", d_sigmoid, false},
        {"relu", d_relu, false}, {"erf", erf, false},
    };
    static const float any[7] = {-2.5f, -1.25f, -0.3f, 0.0f, 0.7f, 1.9f, 3.1f};
    static const float pos[7] = {0.25f, 0.5f, 1.0f, 1.7f, 2.0f, 3.3f, 10.0f};
    /* NaN goes through every one of them; relu too (PyTorch: torch.relu(nan) is nan, like maximum(nan, 0) here) */
    static const float nan3[3] = {NAN, NAN, NAN};
    sess t;
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        const float *x = ops[k].positive ? pos : any;
        char text[128];
        snprintf(text, sizeof text, "input x : f32[7]\ninput n : f32[3]\ny = %s(x)\nz = %s(n)\noutput y\noutput z\n",
                 ops[k].op, ops[k].op);
        double want[7];
        for (int i = 0; i < 7; i++) want[i] = ops[k].f(x[i]);
        if (sess_go(&t, ops[k].op, text, INFER, ARGS(F32("x", x, 7), F32("n", nan3, 3)))) {
            expect_out(&t, "y", TF_DTYPE_F32, DIMS(7), want, TOL);
            expect_out(&t, "z", TF_DTYPE_F32, DIMS(3), (const double[]){NAN, NAN, NAN}, TOL);
        }
        sess_close(&t);
    }
    /* special values: log(0) = -inf, log(-1) = sqrt(-1) = NaN, rsqrt(0) = inf, exp overflows f32 */
    static const float sp[4] = {0.0f, -1.0f, 100.0f, 4.0f};
    if (sess_go(&t, "unary specials", "input x : f32[4]\na = log(x)\nb = sqrt(x)\nc = rsqrt(x)\nd = exp(x)\n"
                "output a\noutput b\noutput c\noutput d\n", INFER, ARGS(F32("x", sp, 4)))) {
        expect_out(&t, "a", TF_DTYPE_F32, DIMS(4), (const double[]){-INFINITY, NAN, log(100.0), log(4.0)}, TOL);
        expect_out(&t, "b", TF_DTYPE_F32, DIMS(4), (const double[]){0, NAN, 10, 2}, TOL);
        expect_out(&t, "c", TF_DTYPE_F32, DIMS(4), (const double[]){INFINITY, NAN, 0.1, 0.5}, TOL);
        expect_out(&t, "d", TF_DTYPE_F32, DIMS(4), (const double[]){1, exp(-1.0), INFINITY, exp(4.0)}, TOL);
    }
    sess_close(&t);
    /* each op rounds its result to f32: (1 + 1e-8) rounds to 1, so (x + 1e-8) - x is 0 */
    static const float one[2] = {1.0f, -3.0f};
    op_case("f32 rounding per op", "input x : f32[2]\ny = add(x, 1e-08)\nz = sub(y, x)\noutput z\n", INFER,
            ARGS(F32("x", one, 2)), "z", TF_DTYPE_F32, DIMS(2), (const double[]){0, 0}, EXACT);
    /* integer neg/abs/relu are exact */
    static const int64_t xi[5] = {-3, 0, 5, -7, 2};
    op_case("neg i64", "input x : i64[5]\ny = neg(x)\noutput y\n", INFER, ARGS(I64("x", xi, 5)), "y", TF_DTYPE_I64,
            DIMS(5), (const double[]){3, 0, -5, 7, -2}, EXACT);
    op_case("abs i64", "input x : i64[5]\ny = abs(x)\noutput y\n", INFER, ARGS(I64("x", xi, 5)), "y", TF_DTYPE_I64,
            DIMS(5), (const double[]){3, 0, 5, 7, 2}, EXACT);
    op_case("relu i64", "input x : i64[5]\ny = relu(x)\noutput y\n", INFER, ARGS(I64("x", xi, 5)), "y",
            TF_DTYPE_I64, DIMS(5), (const double[]){0, 0, 5, 0, 2}, EXACT);
}

static double b_add(double a, double b) { return a + b; }
static double b_sub(double a, double b) { return a - b; }
static double b_mul(double a, double b) { return a * b; }
static double b_div(double a, double b) { return a / b; }
static double b_pow(double a, double b) { return pow(a, b); }
static double b_max(double a, double b) { return a > b ? a : b; }
static double b_min(double a, double b) { return a < b ? a : b; }
static double b_eq(double a, double b) { return a == b; }
static double b_ne(double a, double b) { return a != b; }
static double b_lt(double a, double b) { return a < b; }
static double b_le(double a, double b) { return a <= b; }
static double b_gt(double a, double b) { return a > b; }
static double b_ge(double a, double b) { return a >= b; }

static void test_binary(void)
{
    static const struct { const char *op; double (*f)(double, double); bool boolout; } ops[] = {
        {"add", b_add, false}, {"sub", b_sub, false}, {"mul", b_mul, false}, {"div", b_div, false},
        {"pow", b_pow, false}, {"maximum", b_max, false}, {"minimum", b_min, false}, {"eq", b_eq, true},
        {"ne", b_ne, true},   {"lt", b_lt, true},   {"le", b_le, true},   {"gt", b_gt, true},
        {"ge", b_ge, true},
    };
    /* a [2,3] against b [3] (broadcast over rows) and against c [2,1] (over columns) */
    static const float a[6] = {1.5f, 0.25f, 3.0f, 2.0f, 0.7f, 1.25f};
    static const float b[3] = {2.0f, -0.5f, 1.25f};
    static const float c[2] = {0.25f, 2.0f};
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        char text[256];
        snprintf(text, sizeof text,
                 "input a : f32[2, 3]\ninput b : f32[3]\ninput c : f32[2, 1]\n"
                 "y = %s(a, b)\nz = %s(c, a)\noutput y\noutput z\n", ops[k].op, ops[k].op);
        tf_dtype dt = ops[k].boolout ? TF_DTYPE_BOOL : TF_DTYPE_F32;
        double wy[6], wz[6];
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) {
                wy[i * 3 + j] = ops[k].f(a[i * 3 + j], b[j]);
                wz[i * 3 + j] = ops[k].f(c[i], a[i * 3 + j]);
            }
        sess t;
        if (!sess_open(&t, ops[k].op, text, INFER, ARGS(F32("a", a, 2, 3), F32("b", b, 3), F32("c", c, 2, 1)), 7))
            continue;
        if (sess_run(&t)) {
            expect_out(&t, "y", dt, DIMS(2, 3), wy, ops[k].boolout ? 0 : 1e-6, ops[k].boolout ? 0 : 1e-6);
            expect_out(&t, "z", dt, DIMS(2, 3), wz, ops[k].boolout ? 0 : 1e-6, ops[k].boolout ? 0 : 1e-6);
        }
        sess_close(&t);
    }
    /* numbers as operands take the tensor's dtype */
    static const float x[5] = {-2.0f, -0.5f, 0.3f, 1.0f, 4.5f};
    op_case("sub const", "input x : f32[5]\ny = sub(2.5, x)\noutput y\n", INFER, ARGS(F32("x", x, 5)), "y",
            TF_DTYPE_F32, DIMS(5), (const double[]){4.5, 3.0, 2.5 - (double)0.3f, 1.5, -2.0}, TOL);
    op_case("div const", "input x : f32[5]\ny = div(x, 4)\noutput y\n", INFER, ARGS(F32("x", x, 5)), "y",
            TF_DTYPE_F32, DIMS(5), (const double[]){-0.5, -0.125, (double)0.3f / 4, 0.25, 1.125}, TOL);
    /* pow of a negative base: integer exponent fine, fractional NaN; NaN propagates through maximum/minimum */
    static const float pb[4] = {-2.0f, -2.0f, NAN, 1.0f}, pe[4] = {3.0f, 0.5f, 0.0f, NAN};
    sess t;
    if (sess_go(&t, "pow/maximum/minimum specials", "input a : f32[4]\ninput b : f32[4]\np = pow(a, b)\n"
                "mx = maximum(a, b)\nmn = minimum(a, b)\noutput p\noutput mx\noutput mn\n", INFER,
                ARGS(F32("a", pb, 4), F32("b", pe, 4)))) {
        expect_out(&t, "p", TF_DTYPE_F32, DIMS(4), (const double[]){-8, NAN, 1, 1}, TOL);
        expect_out(&t, "mx", TF_DTYPE_F32, DIMS(4), (const double[]){3, 0.5, NAN, NAN}, TOL);
        expect_out(&t, "mn", TF_DTYPE_F32, DIMS(4), (const double[]){-2, -2, NAN, NAN}, TOL);
    }
    sess_close(&t);
    /* integer arithmetic with broadcasting, a number and a rank-0 input, exact; comparisons of ints and bools */
    static const int64_t ia[6] = {-3, 7, 0, 12, -5, 1}, ib[3] = {4, -2, 9}, is = 10;
    static const unsigned char p[4] = {0, 0, 1, 1}, q[4] = {0, 1, 0, 1};
    if (sess_go(&t, "i64 and bool", "input a : i64[2, 3]\ninput b : i64[3]\ninput s : i64\ninput p : bool[4]\n"
                "input q : bool[4]\nad = add(a, b)\nmu = mul(a, 3)\nsu = sub(a, s)\nmi = minimum(a, b)\nge = ge(a, b)\n"
                "eq = eq(p, q)\nne = ne(p, q)\noutput ad\noutput mu\noutput su\noutput mi\noutput ge\n"
                "output eq\noutput ne\n",
                INFER, ARGS(I64("a", ia, 2, 3), I64("b", ib, 3), ((arg){"s", TF_DTYPE_I64, 0, {0}, &is}),
                            IN("p", TF_DTYPE_BOOL, p, 4), IN("q", TF_DTYPE_BOOL, q, 4)))) {
        expect_out(&t, "ad", TF_DTYPE_I64, DIMS(2, 3), (const double[]){1, 5, 9, 16, -7, 10}, EXACT);
        expect_out(&t, "mu", TF_DTYPE_I64, DIMS(2, 3), (const double[]){-9, 21, 0, 36, -15, 3}, EXACT);
        expect_out(&t, "su", TF_DTYPE_I64, DIMS(2, 3), (const double[]){-13, -3, -10, 2, -15, -9}, EXACT);
        expect_out(&t, "mi", TF_DTYPE_I64, DIMS(2, 3), (const double[]){-3, -2, 0, 4, -5, 1}, EXACT);
        expect_out(&t, "ge", TF_DTYPE_BOOL, DIMS(2, 3), (const double[]){0, 1, 0, 1, 0, 0}, EXACT);
        expect_out(&t, "eq", TF_DTYPE_BOOL, DIMS(4), (const double[]){1, 0, 0, 1}, EXACT);
        expect_out(&t, "ne", TF_DTYPE_BOOL, DIMS(4), (const double[]){0, 1, 1, 0}, EXACT);
    }
    sess_close(&t);
    /* comparisons of NaN: only ne is true (le too is false) */
    static const float nan1[1] = {NAN};
    if (sess_go(&t, "nan compare",
                "input a : f32[1]\ne = eq(a, a)\nn = ne(a, a)\nl = le(a, a)\noutput e\noutput n\noutput l\n",
                INFER, ARGS(F32("a", nan1, 1)))) {
        expect_out(&t, "e", TF_DTYPE_BOOL, DIMS(1), (const double[]){0}, EXACT);
        expect_out(&t, "n", TF_DTYPE_BOOL, DIMS(1), (const double[]){1}, EXACT);
        expect_out(&t, "l", TF_DTYPE_BOOL, DIMS(1), (const double[]){0}, EXACT);
    }
    sess_close(&t);
}

static void test_where(void)
{
    static const unsigned char cond[6] = {1, 0, 0, 1, 1, 0};
    static const float a[6] = {1.5f, -2.0f, 3.25f, -4.0f, 5.5f, -6.0f}, b[3] = {10.0f, 20.0f, 30.0f};
    op_case("where", "input c : bool[2, 3]\ninput a : f32[2, 3]\ninput b : f32[3]\ny = where(c, a, b)\noutput y\n",
            INFER, ARGS(IN("c", TF_DTYPE_BOOL, cond, 2, 3), F32("a", a, 2, 3), F32("b", b, 3)), "y", TF_DTYPE_F32,
            DIMS(2, 3), (const double[]){1.5, 20, 30, -4, 5.5, 30}, TOL);
    /* the condition broadcasts too, and a number fills the other branch; the condition from a comparison */
    static const unsigned char c2[3] = {0, 1, 1};
    op_case("where bcast cond", "input c : bool[3]\ninput a : f32[2, 3]\ny = where(c, a, -1.5)\noutput y\n", INFER,
            ARGS(IN("c", TF_DTYPE_BOOL, c2, 3), F32("a", a, 2, 3)), "y", TF_DTYPE_F32, DIMS(2, 3),
            (const double[]){-1.5, -2, 3.25, -1.5, 5.5, -6}, TOL);
    op_case("where of gt", "input a : f32[2, 3]\nc = gt(a, 0.0)\ny = where(c, a, 0.0)\noutput y\n", INFER,
            ARGS(F32("a", a, 2, 3)), "y", TF_DTYPE_F32, DIMS(2, 3), (const double[]){1.5, 0, 3.25, 0, 5.5, 0}, TOL);
}

/* Expected f16/bf16 bit patterns computed with NumPy 2.4:
 *   np.array(xs, np.float32).astype(np.float16).view(np.uint16)
 *   bf16: u = f32 bits; (u + 0x7FFF + ((u >> 16) & 1)) >> 16   (round to nearest even) */
static void test_cast(void)
{
    static const float x16[14] = {1.0009765625f, 1.00048828125f, 1.00146484375f, 0.1f, -2.5f, 65504.0f, 65519.0f,
                                  65520.0f, 1e-8f, 3e-8f, 1e-5f, 3.14159265f, -0.0f, -70000.0f};
    static const uint16_t h16[14] = {0x3C01, 0x3C00, 0x3C02, 0x2E66, 0xC100, 0x7BFF, 0x7BFF,
                                     0x7C00, 0x0000, 0x0001, 0x00A8, 0x4248, 0x8000, 0xFC00};
    static const float xbf[10] = {1.00390625f, 1.01171875f, 0.1f, -3.14159265f, 1e-40f, 3.4e38f, 65504.0f,
                                  1.0e10f, -1.0009765625f, 3.3961e38f};
    static const uint16_t hbf[10] = {0x3F80, 0x3F82, 0x3DCD, 0xC049, 0x0001, 0x7F80, 0x4780, 0x5015, 0xBF80, 0x7F7F};
    static const struct { const char *t; tf_dtype dt; int n; const float *x; const uint16_t *h; } cs[2] = {
        {"f16", TF_DTYPE_F16, 14, x16, h16}, {"bf16", TF_DTYPE_BF16, 10, xbf, hbf}};
    sess t;
    for (int c = 0; c < 2; c++) {
        char text[160], label[32];
        snprintf(text, sizeof text, "input x : f32[%d]\ny = cast(x, to=%s)\nz = cast(y, to=f32)\noutput y\noutput z\n",
                 cs[c].n, cs[c].t);
        snprintf(label, sizeof label, "cast f32->%s", cs[c].t);
        tf_tensor_view v;
        size_t n;
        if (sess_go(&t, label, text, INFER, ARGS(F32("x", cs[c].x, cs[c].n))) &&
            sess_view(&t, "y", cs[c].dt, DIMS(cs[c].n), &v, &n)) {
            double w[14];
            for (int i = 0; i < cs[c].n; i++) {
                uint16_t got = ((const uint16_t *)v.data)[i];
                CHECK(got == cs[c].h[i], "%s: %.10g -> 0x%04X, want 0x%04X", label, cs[c].x[i], got, cs[c].h[i]);
                w[i] = c ? bf16_value(cs[c].h[i]) : f16_value(cs[c].h[i]);
            }
            expect_out(&t, "z", TF_DTYPE_F32, DIMS(cs[c].n), w, EXACT);   /* and back, exactly */
        }
        sess_close(&t);
    }
    /* to integers: truncation toward zero (123456.789f is 123456.7890625) */
    static const float xi[8] = {2.7f, -2.7f, -0.5f, 0.5f, 7.0f, -7.0f, 123456.789f, -999999.5f};
    static const double ti[8] = {2, -2, 0, 0, 7, -7, 123456, -999999};
    /* i64 -> f32 rounds to nearest even: 2^24+1 -> 2^24, 2^24+3 -> 2^24+4; to bool: nonzero is true */
    static const int64_t il[4] = {16777217, 16777219, -5, 123};
    static const float xb[5] = {0.0f, -0.5f, 2.0f, -0.0f, 1e-30f};
    if (sess_go(&t, "cast ints and bools", "input x : f32[8]\ninput l : i64[4]\ninput b : f32[5]\n"
                "i = cast(x, to=i64)\nj = cast(x, to=i32)\nf = cast(l, to=f32)\nc = cast(b, to=bool)\n"
                "cf = cast(c, to=f32)\n"
                "output i\noutput j\noutput f\noutput c\noutput cf\n", INFER,
                ARGS(F32("x", xi, 8), I64("l", il, 4), F32("b", xb, 5)))) {
        expect_out(&t, "i", TF_DTYPE_I64, DIMS(8), ti, EXACT);
        expect_out(&t, "j", TF_DTYPE_I32, DIMS(8), ti, EXACT);
        expect_out(&t, "f", TF_DTYPE_F32, DIMS(4), (const double[]){16777216, 16777220, -5, 123}, EXACT);
        expect_out(&t, "c", TF_DTYPE_BOOL, DIMS(5), (const double[]){0, 1, 1, 0, 1}, EXACT);
        expect_out(&t, "cf", TF_DTYPE_F32, DIMS(5), (const double[]){0, 1, 1, 0, 1}, EXACT);
    }
    sess_close(&t);
}

/* ---- reductions ------------------------------------------------------------------ */

static void test_reduce(void)
{
    static float x[24];
    fill(x, 24, 11);
    double xd[24], w[24];
    to_double(x, 24, xd);
    const int d[3] = {2, 3, 4};
    static const struct {
        const char *op, *attrs;
        int kind;
        bool red[3], keep;
    } cs[] = {
        {"reduce_sum", "axes=[1]", R_SUM, {0, 1, 0}, 0},
        {"reduce_sum", "axes=[0, 2], keepdims=true", R_SUM, {1, 0, 1}, 1},
        {"reduce_sum", "axes=[]", R_SUM, {1, 1, 1}, 0},
        {"reduce_mean", "axes=[-1]", R_MEAN, {0, 0, 1}, 0},
        {"reduce_mean", "axes=[-3, 1], keepdims=true", R_MEAN, {1, 1, 0}, 1},
        {"reduce_mean", "axes=[]", R_MEAN, {1, 1, 1}, 0},
        {"reduce_max", "axes=[1]", R_MAX, {0, 1, 0}, 0},
        {"reduce_max", "axes=[-1, 0], keepdims=true", R_MAX, {1, 0, 1}, 1},
        {"reduce_max", "axes=[], keepdims=true", R_MAX, {1, 1, 1}, 1},
        /* the layer ops sum/mean/max lower onto the same core reductions */
        {"sum", "axes=[2, 0]", R_SUM, {1, 0, 1}, 0},
        {"mean", "axes=[1], keepdims=true", R_MEAN, {0, 1, 0}, 1},
        {"max", "axes=[]", R_MAX, {1, 1, 1}, 0},
        {"max", "axes=[-2]", R_MAX, {0, 1, 0}, 0},
    };
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
        char text[160], label[96];
        snprintf(text, sizeof text, "input x : f32[2, 3, 4]\ny = %s(x, %s)\noutput y\n", cs[k].op, cs[k].attrs);
        snprintf(label, sizeof label, "%s(%s)", cs[k].op, cs[k].attrs);
        ref_reduce3(xd, d, cs[k].red, cs[k].kind, w);
        int64_t shape[3];
        int rank = 0;
        for (int a = 0; a < 3; a++)
            if (!cs[k].red[a]) shape[rank++] = d[a];
            else if (cs[k].keep) shape[rank++] = 1;
        op_case(label, text, INFER, ARGS(F32("x", x, 2, 3, 4)), "y", TF_DTYPE_F32, rank, shape, w, TOL);
    }
    /* integer reductions are exact */
    static const int64_t xi[6] = {4, -9, 2, 7, 3, -1};
    sess t;
    if (sess_go(&t, "reduce i64", "input x : i64[2, 3]\ns = reduce_sum(x, axes=[0])\nm = reduce_max(x, axes=[1])\n"
                "a = sum(x, axes=[])\noutput s\noutput m\noutput a\n", INFER, ARGS(I64("x", xi, 2, 3)))) {
        expect_out(&t, "s", TF_DTYPE_I64, DIMS(3), (const double[]){11, -6, 1}, EXACT);
        expect_out(&t, "m", TF_DTYPE_I64, DIMS(2), (const double[]){4, 7}, EXACT);
        expect_out(&t, "a", TF_DTYPE_I64, SCALAR, (const double[]){6}, EXACT);
    }
    sess_close(&t);
    /* max over all-negative values, not clipped at 0 */
    static const float neg[3] = {-3.5f, -0.75f, -2.0f};
    /* a NaN wins a max, as in PyTorch */
    static const float xn[6] = {1.0f, NAN, 3.0f, -1.0f, -2.0f, -3.0f};
    op_case("reduce_max nan", "input x : f32[2, 3]\ny = reduce_max(x, axes=[1])\noutput y\n", INFER,
            ARGS(F32("x", xn, 2, 3)), "y", TF_DTYPE_F32, DIMS(2), (const double[]){NAN, -1}, TOL);
    op_case("reduce_max negative", "input x : f32[3]\ny = reduce_max(x, axes=[0])\noutput y\n", INFER,
            ARGS(F32("x", neg, 3)), "y", TF_DTYPE_F32, SCALAR, (const double[]){-0.75}, TOL);
}

/* ---- matmul, linear, attention ------------------------------------------------------------ */

static void test_matmul(void)
{
    static float a[2 * 3 * 5], b[3 * 5 * 4];
    fill(a, 30, 21);
    fill(b, 60, 22);
    double w[128];
    /* [3, 5] x [5, 4], with a stored as [5, 3] under transpose_a and b as [4, 5] under transpose_b */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            char text[200], label[48];
            snprintf(text, sizeof text, "input a : f32[%s]\ninput b : f32[%s]\ny = matmul(a, b, transpose_a=%s, "
                     "transpose_b=%s)\noutput y\n", ta ? "5, 3" : "3, 5", tb ? "4, 5" : "5, 4", ta ? "true" : "false",
                     tb ? "true" : "false");
            snprintf(label, sizeof label, "matmul ta=%d tb=%d", ta, tb);
            ref_mm(a, ta, b, tb, 3, 5, 4, w);
            op_case(label, text, INFER, ARGS(F32("a", a, ta ? 5 : 3, ta ? 3 : 5), F32("b", b, tb ? 4 : 5, tb ? 5 : 4)),
                    "y", TF_DTYPE_F32, DIMS(3, 4), w, TOL);
        }
    ref_mm(a, false, b, false, 3, 5, 4, w);
    op_case("matmul default", "input a : f32[3, 5]\ninput b : f32[5, 4]\ny = matmul(a, b)\noutput y\n", INFER,
            ARGS(F32("a", a, 3, 5), F32("b", b, 5, 4)), "y", TF_DTYPE_F32, DIMS(3, 4), w, TOL);
    /* batch axes broadcast: a [2, 1, 3, 5] x b [3, 5, 4] -> [2, 3, 3, 4] */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) ref_mm(a + i * 15, false, b + j * 20, false, 3, 5, 4, w + (i * 3 + j) * 12);
    op_case("matmul batched bcast",
            "input a : f32[2, 1, 3, 5]\ninput b : f32[3, 5, 4]\ny = matmul(a, b)\noutput y\n", INFER,
            ARGS(F32("a", a, 2, 1, 3, 5), F32("b", b, 3, 5, 4)), "y", TF_DTYPE_F32, DIMS(2, 3, 3, 4), w, TOL);
    /* rank 2 against rank 3, b transposed per batch: a [3, 5] x b[j] read as [4, 5] */
    for (int j = 0; j < 3; j++) ref_mm(a, false, b + j * 20, true, 3, 5, 4, w + j * 12);
    op_case("matmul rank2 x rank3 tb",
            "input a : f32[3, 5]\ninput b : f32[3, 4, 5]\ny = matmul(a, b, transpose_b=true)\noutput y\n", INFER,
            ARGS(F32("a", a, 3, 5), F32("b", b, 3, 4, 5)), "y", TF_DTYPE_F32, DIMS(3, 3, 4), w, TOL);
    /* batched with transpose_a: a [2, 5, 3] (each read as [3, 5]) x b [2, 5, 4] */
    for (int i = 0; i < 2; i++) ref_mm(a + i * 15, true, b + i * 20, false, 3, 5, 4, w + i * 12);
    op_case("matmul batched ta",
            "input a : f32[2, 5, 3]\ninput b : f32[2, 5, 4]\ny = matmul(a, b, transpose_a=true)\noutput y\n", INFER,
            ARGS(F32("a", a, 2, 5, 3), F32("b", b, 2, 5, 4)), "y", TF_DTYPE_F32, DIMS(2, 3, 4), w, TOL);
}

static void test_linear(void)
{
    static float x[2 * 3 * 5], wt[5 * 3], bias[3];
    fill(x, 30, 31);
    fill(wt, 15, 32);
    fill(bias, 3, 33);
    double w[64];
    /* y = x @ W + b, W is [in, out] */
    ref_mm(x, false, wt, false, 6, 5, 3, w);
    double wb[64];
    for (int i = 0; i < 18; i++) wb[i] = w[i] + bias[i % 3];
    op_case("linear bias",
            "input x : f32[6, 5]\ninput w : f32[5, 3]\ninput b : f32[3]\ny = linear(x, w, b)\noutput y\n",
            INFER, ARGS(F32("x", x, 6, 5), F32("w", wt, 5, 3), F32("b", bias, 3)), "y", TF_DTYPE_F32, DIMS(6, 3), wb,
            TOL);
    op_case("linear rank3 no bias", "input x : f32[2, 3, 5]\ninput w : f32[5, 3]\ny = linear(x, w)\noutput y\n", INFER,
            ARGS(F32("x", x, 2, 3, 5), F32("w", wt, 5, 3)), "y", TF_DTYPE_F32, DIMS(2, 3, 3), w, TOL);
    op_case("linear vector",
            "input x : f32[5]\ninput w : f32[5, 3]\ninput b : f32[3]\ny = linear(x, w, b)\noutput y\n", TRAIN,
            ARGS(F32("x", x, 5), F32("w", wt, 5, 3), F32("b", bias, 3)), "y", TF_DTYPE_F32, DIMS(3), wb, TOL);
}

/* softmax(q k^T / sqrt(D)) v per (batch, head); causal: query i sees keys j <= i (top-left aligned,
 * as PyTorch's tril mask) */
static void ref_attention(const float *q, const float *k, const float *v, int BH, int T, int S, int D, int Dv,
                          bool causal, double *o)
{
    for (int h = 0; h < BH; h++)
        for (int i = 0; i < T; i++) {
            double p[16], z = 0;
            for (int j = 0; j < S; j++) {
                double s = 0;
                for (int e = 0; e < D; e++) s += (double)q[(h * T + i) * D + e] * k[(h * S + j) * D + e];
                p[j] = causal && j > i ? 0.0 : exp(s / sqrt((double)D));
                z += p[j];
            }
            for (int e = 0; e < Dv; e++) {
                double s = 0;
                for (int j = 0; j < S; j++) s += p[j] / z * v[(h * S + j) * Dv + e];
                o[(h * T + i) * Dv + e] = s;
            }
        }
}

static void test_attention(void)
{
    static float q[2 * 2 * 4 * 4], k[2 * 2 * 5 * 4], v[2 * 2 * 5 * 3];
    fill(q, 64, 41);
    fill(k, 80, 42);
    fill(v, 60, 43);
    double w[128];
    /* H = 2 heads, D = 4, Dv = 3; T != S (causal: top-left aligned) and T == S; causal defaults to false */
    static const struct { int B, T, S; bool causal; const char *attr; tf_mode mode; } cs[] = {
        {1, 3, 5, false, "", INFER}, {1, 3, 5, true, ", causal=true", INFER},
        {2, 4, 4, true, ", causal=true", TRAIN}, {2, 4, 4, false, ", causal=false", INFER}};
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        int B = cs[c].B, T = cs[c].T, S = cs[c].S;
        char text[256], label[64];
        snprintf(text, sizeof text,
                 "input q : f32[%d, 2, %d, 4]\ninput k : f32[%d, 2, %d, 4]\ninput v : f32[%d, 2, %d, 3]\n"
                 "y = attention(q, k, v%s)\noutput y\n", B, T, B, S, B, S, cs[c].attr);
        snprintf(label, sizeof label, "attention B=%d T=%d S=%d%s", B, T, S, cs[c].attr);
        ref_attention(q, k, v, 2 * B, T, S, 4, 3, cs[c].causal, w);
        op_case(label, text, cs[c].mode,
                ARGS(F32("q", q, B, 2, T, 4), F32("k", k, B, 2, S, 4), F32("v", v, B, 2, S, 3)),
                "y", TF_DTYPE_F32, DIMS(B, 2, T, 3), w, TOL);
    }
}

/* ---- conv and pooling -------------------------------------------------------------------- */

static void test_conv2d(void)
{
    static float x[2 * 4 * 5 * 7], wt[6 * 4 * 3 * 3], bias[6];
    fill(x, sizeof x / sizeof *x, 51);
    fill(wt, sizeof wt / sizeof *wt, 52);
    fill(bias, 6, 53);
    static double w[2 * 6 * 7 * 11];
    int ho, wo;
    /* plain: x [1, 2, 5, 5], w [3, 2, 3, 3], no bias */
    convp c1 = {1, 2, 5, 5, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1};
    ref_conv(&c1, x, wt, NULL, w, &ho, &wo);
    op_case("conv2d plain", "input x : f32[1, 2, 5, 5]\ninput w : f32[3, 2, 3, 3]\ny = conv2d(x, w)\noutput y\n",
            INFER, ARGS(F32("x", x, 1, 2, 5, 5), F32("w", wt, 3, 2, 3, 3)), "y", TF_DTYPE_F32, DIMS(1, 3, ho, wo), w,
            TOL);
    /* everything: stride [2, 1], padding [1, 2], dilation [1, 2], groups 2, bias; x [2, 4, 5, 7], w [6, 2, 3, 2] */
    convp c2 = {2, 4, 5, 7, 6, 3, 2, 2, 1, 1, 2, 1, 2, 2};
    ref_conv(&c2, x, wt, bias, w, &ho, &wo);
    op_case("conv2d stride/pad/dil/groups/bias",
            "input x : f32[2, 4, 5, 7]\ninput w : f32[6, 2, 3, 2]\ninput b : f32[6]\n"
            "y = conv2d(x, w, b, stride=[2, 1], padding=[1, 2], dilation=[1, 2], groups=2)\noutput y\n",
            INFER, ARGS(F32("x", x, 2, 4, 5, 7), F32("w", wt, 6, 2, 3, 2), F32("b", bias, 6)), "y", TF_DTYPE_F32,
            DIMS(2, 6, ho, wo), w, TOL);
    /* the same without bias, in train mode */
    ref_conv(&c2, x, wt, NULL, w, &ho, &wo);
    op_case("conv2d no bias train",
            "input x : f32[2, 4, 5, 7]\ninput w : f32[6, 2, 3, 2]\n"
            "y = conv2d(x, w, stride=[2, 1], padding=[1, 2], dilation=[1, 2], groups=2)\noutput y\n",
            TRAIN, ARGS(F32("x", x, 2, 4, 5, 7), F32("w", wt, 6, 2, 3, 2)), "y", TF_DTYPE_F32, DIMS(2, 6, ho, wo), w,
            TOL);
    /* depthwise (groups = C), one stride/padding/dilation value for both axes, bias */
    convp c3 = {1, 3, 7, 6, 3, 2, 2, 2, 2, 1, 1, 2, 2, 3};
    ref_conv(&c3, x, wt, bias, w, &ho, &wo);
    op_case("conv2d depthwise",
            "input x : f32[1, 3, 7, 6]\ninput w : f32[3, 1, 2, 2]\ninput b : f32[3]\n"
            "y = conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=3)\noutput y\n",
            INFER, ARGS(F32("x", x, 1, 3, 7, 6), F32("w", wt, 3, 1, 2, 2), F32("b", bias, 3)), "y", TF_DTYPE_F32,
            DIMS(1, 3, ho, wo), w, TOL);
}

static void test_pool(void)
{
    static float x[2 * 3 * 5 * 7];
    fill(x, sizeof x / sizeof *x, 61);
    double w[256];
    int ho, wo;
    static const struct { const char *attrs; int kh, kw, sh, sw, ph, pw; } cs[] = {
        {"kernel=2", 2, 2, 2, 2, 0, 0},                               /* stride defaults to the kernel */
        {"kernel=3, stride=2, padding=1", 3, 3, 2, 2, 1, 1},           /* padding counts in avg's divisor */
        {"kernel=[2, 3], stride=[1, 2], padding=[1, 1]", 2, 3, 1, 2, 1, 1},
        {"kernel=[3, 2], stride=[2, 1]", 3, 2, 2, 1, 0, 0},
    };
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++)
        for (int m = 0; m < 2; m++) {
            char text[160], label[96];
            const char *op = m ? "maxpool2d" : "avgpool2d";
            snprintf(text, sizeof text, "input x : f32[2, 3, 5, 7]\ny = %s(x, %s)\noutput y\n", op, cs[k].attrs);
            snprintf(label, sizeof label, "%s(%s)", op, cs[k].attrs);
            ref_pool(x, 6, 5, 7, cs[k].kh, cs[k].kw, cs[k].sh, cs[k].sw, cs[k].ph, cs[k].pw, m, w, &ho, &wo);
            op_case(label, text, INFER, ARGS(F32("x", x, 2, 3, 5, 7)), "y", TF_DTYPE_F32, DIMS(2, 3, ho, wo), w, TOL);
        }
    /* by hand: 3x3 of 1..9, kernel 3, stride 2, padding 1 -> 2x2; avg divides by 9 everywhere */
    static const float h[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    op_case("avgpool2d by hand",
            "input x : f32[1, 1, 3, 3]\ny = avgpool2d(x, kernel=3, stride=2, padding=1)\noutput y\n",
            INFER, ARGS(F32("x", h, 1, 1, 3, 3)), "y", TF_DTYPE_F32, DIMS(1, 1, 2, 2),
            (const double[]){12.0 / 9, 16.0 / 9, 24.0 / 9, 28.0 / 9}, TOL);
    static const float hn[9] = {-1, -2, -3, -4, -5, -6, -7, -8, -9};   /* padding never wins a max */
    static const float pn[8] = {NAN, 1, 5, 6, 2, 3, 7, -8};
    op_case("maxpool2d nan", "input x : f32[1, 1, 2, 4]\ny = maxpool2d(x, kernel=2)\noutput y\n", INFER,
            ARGS(F32("x", pn, 1, 1, 2, 4)), "y", TF_DTYPE_F32, DIMS(1, 1, 1, 2), (const double[]){NAN, 7}, TOL);
    op_case("maxpool2d by hand",
            "input x : f32[1, 1, 3, 3]\ny = maxpool2d(x, kernel=3, stride=2, padding=1)\noutput y\n",
            INFER, ARGS(F32("x", hn, 1, 1, 3, 3)), "y", TF_DTYPE_F32, DIMS(1, 1, 2, 2),
            (const double[]){-1, -2, -4, -5}, TOL);
}

static void test_global_avgpool(void)
{
    static float x[2 * 3 * 2 * 5];
    fill(x, 60, 71);
    double w[6];
    for (int p = 0; p < 6; p++) {
        double s = 0;
        for (int i = 0; i < 10; i++) s += x[p * 10 + i];
        w[p] = s / 10;
    }
    op_case("global_avgpool rank4", "input x : f32[2, 3, 2, 5]\ny = global_avgpool(x)\noutput y\n", INFER,
            ARGS(F32("x", x, 2, 3, 2, 5)), "y", TF_DTYPE_F32, DIMS(2, 3), w, TOL);
    op_case("global_avgpool rank3", "input x : f32[2, 3, 10]\ny = global_avgpool(x)\noutput y\n", TRAIN,
            ARGS(F32("x", x, 2, 3, 10)), "y", TF_DTYPE_F32, DIMS(2, 3), w, TOL);
}

/* ---- normalization, activations, losses --------------------------------------------------------- */

/* set f32 [3] state `name`; compare it with want[3] */
static void set_state3(sess *t, const char *name, const float *v)
{
    tf_tensor_view tv = {TF_DTYPE_F32, 1, {3}, (void *)v};
    CHECK(tf_session_set_state(t->s, name, &tv) == TF_OK, "%s: set_state %s: %s", t->label, name,
          tf_context_last_error(t->ctx));
}

static void expect_state3(sess *t, const char *name, const double *want)
{
    float got[3];
    tf_tensor_view tv = {.data = got};
    tf_status st = tf_session_get_state(t->s, name, &tv, sizeof got);
    CHECK(st == TF_OK, "%s: get_state %s: %s", t->label, name, tf_context_last_error(t->ctx));
    for (int c = 0; !st && c < 3; c++)
        CHECK(check_close(got[c], want[c], TOL), "%s: %s[%d] = %.9g, want %.9g", t->label, name, c, got[c], want[c]);
}

static void test_batchnorm(void)
{
    static float x[2 * 3 * 2 * 3];
    fill(x, 36, 81);
    static const float g[3] = {1.5f, -0.5f, 2.0f}, b[3] = {0.1f, -0.2f, 0.3f};
    static const float rm0[3] = {0.5f, -1.0f, 0.25f}, rv0[3] = {1.5f, 0.5f, 2.0f};
    /* train, x [2, 3, 2, 3]: statistics per channel c over n, h, w (12 values); the biased variance
     * normalizes, the unbiased one (x 12/11) goes into the running variance */
    double mean[3] = {0}, var[3] = {0}, w[36], erm[3], erv[3];
    for (int i = 0; i < 36; i++) mean[i / 6 % 3] += x[i] / 12.0;
    for (int i = 0; i < 36; i++) var[i / 6 % 3] += (x[i] - mean[i / 6 % 3]) * (x[i] - mean[i / 6 % 3]) / 12.0;
    for (int i = 0, c = 0; i < 36; i++, c = i / 6 % 3) w[i] = (x[i] - mean[c]) / sqrt(var[c] + 0.001) * g[c] + b[c];
    for (int c = 0; c < 3; c++) erm[c] = rm0[c], erv[c] = rv0[c];
    sess t;
    if (sess_open(&t, "batchnorm train", "input x : f32[2, 3, 2, 3]\ninput g : f32[3]\ninput b : f32[3]\n"
                  "buffer rm : f32[3] = zeros()\nbuffer rv : f32[3] = ones()\n"
                  "y = batchnorm(x, g, b, rm, rv, momentum=0.2, eps=0.001)\noutput y\n", TRAIN,
                  ARGS(F32("x", x, 2, 3, 2, 3), F32("g", g, 3), F32("b", b, 3)), 7)) {
        set_state3(&t, "rm", rm0);
        set_state3(&t, "rv", rv0);
        for (int step = 0; step < 2 && sess_run(&t); step++) {   /* the buffers move at every step */
            expect_out(&t, "y", TF_DTYPE_F32, DIMS(2, 3, 2, 3), w, TOL);
            for (int c = 0; c < 3; c++) {
                erm[c] = 0.8 * erm[c] + 0.2 * mean[c];
                erv[c] = 0.8 * erv[c] + 0.2 * var[c] * 12.0 / 11.0;
            }
            expect_state3(&t, "rm", erm);
            expect_state3(&t, "rv", erv);
        }
    }
    sess_close(&t);
    /* infer, x [5, 3], default eps 1e-5: running statistics, buffers unchanged */
    const char *itext = "input x : f32[5, 3]\ninput g : f32[3]\ninput b : f32[3]\nbuffer rm : f32[3] = zeros()\n"
                        "buffer rv : f32[3] = ones()\ny = batchnorm(x, g, b, rm, rv)\noutput y\n";
    for (int i = 0; i < 15; i++) w[i] = (x[i] - rm0[i % 3]) / sqrt(rv0[i % 3] + 1e-5) * g[i % 3] + b[i % 3];
    for (int c = 0; c < 3; c++) erm[c] = rm0[c], erv[c] = rv0[c];
    if (sess_open(&t, "batchnorm infer", itext, INFER, ARGS(F32("x", x, 5, 3), F32("g", g, 3), F32("b", b, 3)), 7)) {
        set_state3(&t, "rm", rm0);
        set_state3(&t, "rv", rv0);
        if (sess_run(&t)) {
            expect_out(&t, "y", TF_DTYPE_F32, DIMS(5, 3), w, TOL);
            expect_state3(&t, "rm", erm);
            expect_state3(&t, "rv", erv);
        }
    }
    sess_close(&t);
    /* train on [N, C] (rank 2): statistics over the batch axis only */
    double m2[3] = {0}, v2[3] = {0};
    for (int i = 0; i < 15; i++) m2[i % 3] += x[i] / 5.0;
    for (int i = 0; i < 15; i++) v2[i % 3] += (x[i] - m2[i % 3]) * (x[i] - m2[i % 3]) / 5.0;
    for (int i = 0; i < 15; i++) w[i] = (x[i] - m2[i % 3]) / sqrt(v2[i % 3] + 1e-5) * g[i % 3] + b[i % 3];
    op_case("batchnorm train rank2", itext, TRAIN, ARGS(F32("x", x, 5, 3), F32("g", g, 3), F32("b", b, 3)), "y",
            TF_DTYPE_F32, DIMS(5, 3), w, TOL);
}

static void test_layernorm(void)
{
    static float x[2 * 3 * 5], g[5], b[5];
    fill(x, 30, 91);
    fill(g, 5, 92);
    fill(b, 5, 93);
    double w[30], w2[30];
    for (int r = 0; r < 6; r++) {
        double s = 0, ss = 0;
        for (int j = 0; j < 5; j++) s += x[r * 5 + j];
        for (int j = 0; j < 5; j++) ss += (x[r * 5 + j] - s / 5) * (x[r * 5 + j] - s / 5);
        for (int j = 0; j < 5; j++) {
            w[r * 5 + j] = (x[r * 5 + j] - s / 5) / sqrt(ss / 5 + 1e-5) * g[j] + b[j];
            w2[r * 5 + j] = (x[r * 5 + j] - s / 5) / sqrt(ss / 5 + 0.25) * g[j] + b[j];
        }
    }
    op_case("layernorm", "input x : f32[6, 5]\ninput g : f32[5]\ninput b : f32[5]\ny = layernorm(x, g, b)\noutput y\n",
            INFER, ARGS(F32("x", x, 6, 5), F32("g", g, 5), F32("b", b, 5)), "y", TF_DTYPE_F32, DIMS(6, 5), w, TOL);
    op_case("layernorm eps rank3",
            "input x : f32[2, 3, 5]\ninput g : f32[5]\ninput b : f32[5]\ny = layernorm(x, g, b, eps=0.25)\noutput y\n",
            TRAIN, ARGS(F32("x", x, 2, 3, 5), F32("g", g, 5), F32("b", b, 5)), "y", TF_DTYPE_F32, DIMS(2, 3, 5), w2,
            TOL);
}

/* Normalization runs in fp32 for fp16/bf16 inputs (ops.def: AMP DENY; lower.c's
 * header), so only the result is rounded to bf16/f16: within one ulp of the
 * exact value. Inputs 1, 1+u, 1+2u, 1+4u (u the ulp at 1): the mean
 * (1 + 1.75u) is not representable in bf16/f16, so statistics computed in the
 * narrow type are visibly wrong. */
static void test_norm_half(void)
{
    static const uint16_t xb[4] = {0x3F80, 0x3F81, 0x3F82, 0x3F84}, gb[4] = {0x3F80, 0x3F80, 0x3F80, 0x3F80};
    static const uint16_t xh[4] = {0x3C00, 0x3C01, 0x3C02, 0x3C04}, gh[4] = {0x3C00, 0x3C00, 0x3C00, 0x3C00};
    static const uint16_t zero[4] = {0, 0, 0, 0};
    for (int h = 0; h < 2; h++) {
        double u = ldexp(1, h ? -10 : -7), x[4] = {1, 1 + u, 1 + 2 * u, 1 + 4 * u}, m = 1 + 1.75 * u, v = 0, w[4];
        for (int i = 0; i < 4; i++) v += (x[i] - m) * (x[i] - m) / 4;
        for (int i = 0; i < 4; i++) w[i] = (x[i] - m) / sqrt(v + 1e-5);   /* gamma 1, beta 0 */
        tf_dtype dt = h ? TF_DTYPE_F16 : TF_DTYPE_BF16;
        const char *t = h ? "f16" : "bf16";
        const uint16_t *xs = h ? xh : xb, *g = h ? gh : gb;
        double rtol = u;   /* one ulp is at most u relative; a result computed in f32 is within half an ulp */
        char text[320], label[64];
        snprintf(text, sizeof text, "input x : %s[1, 4]\ninput g : %s[4]\ninput b : %s[4]\ny = layernorm(x, g, b)\n"
                 "output y\n", t, t, t);
        snprintf(label, sizeof label, "layernorm %s", t);
        op_case(label, text, INFER, ARGS(IN("x", dt, xs, 1, 4), IN("g", dt, g, 4), IN("b", dt, zero, 4)), "y", dt,
                DIMS(1, 4), w, rtol, 0);
        snprintf(text, sizeof text, "input x : %s[4, 1]\ninput g : %s[1]\ninput b : %s[1]\nbuffer rm : %s[1]\n"
                 "buffer rv : %s[1] = ones()\ny = batchnorm(x, g, b, rm, rv)\noutput y\n", t, t, t, t, t);
        snprintf(label, sizeof label, "batchnorm train %s", t);
        op_case(label, text, TRAIN, ARGS(IN("x", dt, xs, 4, 1), IN("g", dt, g, 1), IN("b", dt, zero, 1)), "y", dt,
                DIMS(4, 1), w, rtol, 0);
        /* infer: running mean 1+2u, running variance u^2 (bf16 0x3F82 / 0x3880, f16 0x3C02 / 0x0010) */
        const uint16_t rm = h ? 0x3C02 : 0x3F82, rv = h ? 0x0010 : 0x3880;
        for (int i = 0; i < 4; i++) w[i] = (x[i] - (1 + 2 * u)) / sqrt(u * u + 1e-5);
        snprintf(text, sizeof text, "input x : %s[4, 1]\ninput g : %s[1]\ninput b : %s[1]\ninput rm : %s[1]\n"
                 "input rv : %s[1]\ny = batchnorm(x, g, b, rm, rv)\noutput y\n", t, t, t, t, t);
        snprintf(label, sizeof label, "batchnorm infer %s", t);
        op_case(label, text, INFER, ARGS(IN("x", dt, xs, 4, 1), IN("g", dt, g, 1), IN("b", dt, zero, 1),
                                         IN("rm", dt, &rm, 1), IN("rv", dt, &rv, 1)),
                "y", dt, DIMS(4, 1), w, rtol, 1e-6);
    }
}

static void test_softmax(void)
{
    static float x[3 * 5];
    fill(x, 15, 101);
    double xd[15], w[15], xt[15], wt[15];
    to_double(x, 15, xd);
    ref_softmax_rows(xd, 3, 5, false, w);
    op_case("softmax", "input x : f32[3, 5]\ny = softmax(x)\noutput y\n", INFER, ARGS(F32("x", x, 3, 5)), "y",
            TF_DTYPE_F32, DIMS(3, 5), w, TOL);
    ref_softmax_rows(xd, 3, 5, true, w);
    op_case("log_softmax", "input x : f32[3, 5]\ny = log_softmax(x, axis=-1)\noutput y\n", INFER,
            ARGS(F32("x", x, 3, 5)), "y", TF_DTYPE_F32, DIMS(3, 5), w, TOL);
    /* axis 0: softmax of the columns (transpose, rows, transpose back) */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) xt[j * 3 + i] = xd[i * 5 + j];
    for (int lg = 0; lg < 2; lg++) {
        ref_softmax_rows(xt, 5, 3, lg, wt);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 5; j++) w[i * 5 + j] = wt[j * 3 + i];
        op_case(lg ? "log_softmax axis 0" : "softmax axis 0",
                lg ? "input x : f32[3, 5]\ny = log_softmax(x, axis=0)\noutput y\n"
                   : "input x : f32[3, 5]\ny = softmax(x, axis=0)\noutput y\n",
                TRAIN, ARGS(F32("x", x, 3, 5)), "y", TF_DTYPE_F32, DIMS(3, 5), w, TOL);
    }
    /* a middle axis: x [2, 3, 4], softmax over axis 1 */
    static float x3[24];
    fill(x3, 24, 102);
    double w3[24];
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) {
            double s = 0;
            for (int j = 0; j < 3; j++) s += exp(x3[(i * 3 + j) * 4 + k]);
            for (int j = 0; j < 3; j++) w3[(i * 3 + j) * 4 + k] = exp(x3[(i * 3 + j) * 4 + k]) / s;
        }
    op_case("softmax axis 1 of 3", "input x : f32[2, 3, 4]\ny = softmax(x, axis=1)\noutput y\n", INFER,
            ARGS(F32("x", x3, 2, 3, 4)), "y", TF_DTYPE_F32, DIMS(2, 3, 4), w3, TOL);
    for (int i = 0; i < 24; i++) w3[i] = log(w3[i]);
    op_case("log_softmax axis -2 of 3", "input x : f32[2, 3, 4]\ny = log_softmax(x, axis=-2)\noutput y\n", INFER,
            ARGS(F32("x", x3, 2, 3, 4)), "y", TF_DTYPE_F32, DIMS(2, 3, 4), w3, TOL);
    /* large logits: the max is subtracted, nothing overflows */
    static const float big[3] = {1000.0f, 999.0f, 997.0f};
    double e1 = exp(-1.0), e3 = exp(-3.0), z = 1 + e1 + e3;
    op_case("softmax large", "input x : f32[3]\ny = softmax(x)\noutput y\n", INFER, ARGS(F32("x", big, 3)), "y",
            TF_DTYPE_F32, DIMS(3), (const double[]){1 / z, e1 / z, e3 / z}, TOL);
}

static void test_activations(void)
{
    static const float x[9] = {-3.0f, -1.7f, -0.5f, -0.01f, 0.0f, 0.3f, 1.0f, 2.2f, 4.0f};
    double wn[9], wt[9], ws[9];
    for (int i = 0; i < 9; i++) {
        double v = x[i];
        wn[i] = 0.5 * v * (1 + erf(v / sqrt(2.0)));
        wt[i] = 0.5 * v * (1 + tanh(sqrt(2.0 / 3.14159265358979323846) * (v + 0.044715 * v * v * v)));
        ws[i] = v / (1 + exp(-v));
    }
    op_case("gelu", "input x : f32[9]\ny = gelu(x)\noutput y\n", INFER, ARGS(F32("x", x, 9)), "y", TF_DTYPE_F32,
            DIMS(9), wn, TOL);
    op_case("gelu none", "input x : f32[3, 3]\ny = gelu(x, approx=\"none\")\noutput y\n", TRAIN,
            ARGS(F32("x", x, 3, 3)), "y", TF_DTYPE_F32, DIMS(3, 3), wn, TOL);
    op_case("gelu tanh", "input x : f32[9]\ny = gelu(x, approx=\"tanh\")\noutput y\n", INFER, ARGS(F32("x", x, 9)),
            "y", TF_DTYPE_F32, DIMS(9), wt, TOL);
    op_case("silu", "input x : f32[9]\ny = silu(x)\noutput y\n", INFER, ARGS(F32("x", x, 9)), "y", TF_DTYPE_F32,
            DIMS(9), ws, TOL);
}

static void test_losses(void)
{
    static float lg[2 * 3 * 4];
    fill(lg, 24, 111);
    /* cross_entropy = mean over rows of (log sum_j exp(z_j) - z_label) */
    static const int64_t lab[6] = {2, 0, 3, 1, 3, 0};
    double tot = 0;
    for (int r = 0; r < 6; r++) {
        double s = 0;
        for (int j = 0; j < 4; j++) s += exp(lg[r * 4 + j]);
        tot += log(s) - lg[r * 4 + lab[r]];
    }
    op_case("cross_entropy", "input z : f32[6, 4]\ninput l : i64[6]\ny = cross_entropy(z, l)\noutput y\n", INFER,
            ARGS(F32("z", lg, 6, 4), I64("l", lab, 6)), "y", TF_DTYPE_F32, SCALAR, (const double[]){tot / 6}, TOL);
    op_case("cross_entropy rank3", "input z : f32[2, 3, 4]\ninput l : i64[2, 3]\ny = cross_entropy(z, l)\noutput y\n",
            TRAIN, ARGS(F32("z", lg, 2, 3, 4), I64("l", lab, 2, 3)), "y", TF_DTYPE_F32, SCALAR,
            (const double[]){tot / 6}, TOL);
    /* ignore_index (PyTorch's -100 by default): an ignored row adds nothing and the mean counts the others;
     * reduction="sum" adds the kept rows, "none" gives each row's loss (0 where ignored) */
    static const int64_t labi[6] = {2, -100, 3, 1, -100, 0};
    double rows[6], kept = 0, sum3 = 0;
    for (int r = 0; r < 6; r++) {
        double s = 0;
        for (int j = 0; j < 4; j++) s += exp(lg[r * 4 + j]);
        rows[r] = labi[r] == -100 ? 0.0 : log(s) - lg[r * 4 + labi[r]];
        kept += rows[r];
        if (lab[r] != 3) sum3 += log(s) - lg[r * 4 + lab[r]];
    }
    op_case("cross_entropy ignore_index", "input z : f32[6, 4]\ninput l : i64[6]\ny = cross_entropy(z, l)\noutput y\n",
            TRAIN, ARGS(F32("z", lg, 6, 4), I64("l", labi, 6)), "y", TF_DTYPE_F32, SCALAR, (const double[]){kept / 4}, TOL);
    op_case("cross_entropy sum", "input z : f32[6, 4]\ninput l : i64[6]\n"
            "y = cross_entropy(z, l, ignore_index=3, reduction=\"sum\")\noutput y\n", INFER,
            ARGS(F32("z", lg, 6, 4), I64("l", lab, 6)), "y", TF_DTYPE_F32, SCALAR, (const double[]){sum3}, TOL);
    op_case("cross_entropy none", "input z : f32[6, 4]\ninput l : i64[6]\ny = cross_entropy(z, l, reduction=\"none\")\n"
            "output y\n", INFER, ARGS(F32("z", lg, 6, 4), I64("l", labi, 6)), "y", TF_DTYPE_F32, DIMS(6), rows, TOL);
    /* bf16 logits: computed in f32, from the bf16 values (decoded here) */
    static const uint16_t zb[8] = {0x3F80, 0xC040, 0x3E00, 0x4010, 0xBF20, 0x3FC0, 0x0000, 0xC0A0};
    static const int64_t lb[2] = {3, 1};
    double tb = 0;
    for (int r = 0; r < 2; r++) {
        double s = 0;
        for (int j = 0; j < 4; j++) s += exp(bf16_value(zb[r * 4 + j]));
        tb += log(s) - bf16_value(zb[r * 4 + lb[r]]);
    }
    op_case("cross_entropy bf16", "input z : bf16[2, 4]\ninput l : i64[2]\ny = cross_entropy(z, l)\noutput y\n", INFER,
            ARGS(IN("z", TF_DTYPE_BF16, zb, 2, 4), I64("l", lb, 2)), "y", TF_DTYPE_F32, SCALAR,
            (const double[]){tb / 2}, TOL);
    /* a masked (-inf) logit that is not the label's adds exp(-inf) = 0, as in PyTorch; rank-1 logits with a
     * rank-0 label; f64 logits give an f64 loss */
    static const float zi[6] = {-INFINITY, 0.0f, 0.0f, 1.0f, 2.0f, 3.0f}, z1[5] = {0.5f, -1.0f, 2.0f, 0.25f, 3.0f};
    static const double z1d[5] = {0.5, -1.0, 2.0, 0.25, 3.0};
    static const int64_t li[2] = {1, 1}, l1 = 2;
    double ti = (log(2.0) + log(exp(1.0) + exp(2.0) + exp(3.0)) - 2.0) / 2;
    double t1 = log(exp(0.5) + exp(-1.0) + exp(2.0) + exp(0.25) + exp(3.0)) - 2.0;
    sess t;
    if (sess_go(&t, "cross_entropy specials",
                "input zi : f32[2, 3]\ninput li : i64[2]\ninput z1 : f32[5]\ninput l1 : i64\n"
                "input zd : f64[1, 5]\ninput ld : i64[1]\ni = cross_entropy(zi, li)\nr = cross_entropy(z1, l1)\n"
                "d = cross_entropy(zd, ld)\noutput i\noutput r\noutput d\n", INFER,
                ARGS(F32("zi", zi, 2, 3), I64("li", li, 2), F32("z1", z1, 5), ((arg){"l1", TF_DTYPE_I64, 0, {0}, &l1}),
                     IN("zd", TF_DTYPE_F64, z1d, 1, 5), I64("ld", &l1, 1)))) {
        expect_out(&t, "i", TF_DTYPE_F32, SCALAR, (const double[]){ti}, TOL);
        expect_out(&t, "r", TF_DTYPE_F32, SCALAR, (const double[]){t1}, TOL);
        expect_out(&t, "d", TF_DTYPE_F64, SCALAR, (const double[]){t1}, 1e-13, 1e-13);
    }
    sess_close(&t);
    /* mse_loss = mean (p - t)^2 */
    static float p[15], q[15];
    fill(p, 15, 112);
    fill(q, 15, 113);
    double m = 0;
    for (int i = 0; i < 15; i++) m += ((double)p[i] - q[i]) * ((double)p[i] - q[i]);
    op_case("mse_loss", "input p : f32[3, 5]\ninput t : f32[3, 5]\ny = mse_loss(p, t)\noutput y\n", INFER,
            ARGS(F32("p", p, 3, 5), F32("t", q, 3, 5)), "y", TF_DTYPE_F32, SCALAR, (const double[]){m / 15}, TOL);
}

/* ---- dropout ---------------------------------------------------------------------------------- */

enum { DR = 80, DC = 101, DN = DR * DC };

/* Every element 0 or x/(1-p); returns the fraction that is 0. */
static double dropout_check(sess *t, const char *out, const float *x, double p, bool mask_only)
{
    tf_tensor_view v;
    size_t n, zeros = 0, bad = 0;
    if (!sess_view(t, out, TF_DTYPE_F32, DIMS(DR, DC), &v, &n)) return -1;
    const float *y = v.data;
    for (size_t i = 0; i < n; i++) {
        double keep = (mask_only ? 1.0 : x[i]) / (1 - p);
        if (y[i] == 0) zeros++;
        else if (!check_close(y[i], keep, TOL)) bad++;
    }
    CHECK(bad == 0, "%s: %zu elements are neither 0 nor x/(1-p)", t->label, bad);
    return (double)zeros / (double)n;
}

static void test_dropout(void)
{
    static float x[DN];
    for (int i = 0; i < DN; i++) x[i] = (float)(0.5 + (i % 13) * 0.25 - (i % 2) * 4.0);   /* never 0 */
    static double xd[DN];
    to_double(x, DN, xd);
    const char *text = "input x : f32[80, 101]\ny = dropout(x, p=0.3, salt=5)\noutput y\n";
    op_case("dropout infer is identity", text, INFER, ARGS(F32("x", x, DR, DC)), "y", TF_DTYPE_F32, DIMS(DR, DC), xd,
            EXACT);
    op_case("dropout p=0 train is identity", "input x : f32[80, 101]\ny = dropout(x, p=0.0)\noutput y\n", TRAIN,
            ARGS(F32("x", x, DR, DC)), "y", TF_DTYPE_F32, DIMS(DR, DC), xd, EXACT);
    /* train: 0 or x/(1-p); the fraction dropped near p (8080 draws: sd 0.005, bound 0.03) */
    sess t;
    static float first[DN];
    if (sess_open(&t, "dropout train", text, TRAIN, ARGS(F32("x", x, DR, DC)), 7)) {
        if (sess_run(&t)) {
            double f = dropout_check(&t, "y", x, 0.3, false);
            CHECK(fabs(f - 0.3) < 0.03, "dropout train: dropped fraction %.4f, want about 0.3", f);
            tf_tensor_view v;
            if (tf_session_output(t.s, "y", &v) == TF_OK) memcpy(first, v.data, sizeof first);
            /* the next step draws another mask */
            if (sess_run(&t) && tf_session_output(t.s, "y", &v) == TF_OK) {
                double f2 = dropout_check(&t, "y", x, 0.3, false);
                CHECK(fabs(f2 - 0.3) < 0.03, "dropout train step 2: dropped fraction %.4f", f2);
                CHECK(memcmp(first, v.data, sizeof first) != 0, "dropout train: step 2 drew the same mask as step 1");
            }
        }
        sess_close(&t);
    }
    /* the same seed gives the same mask */
    if (sess_open(&t, "dropout train again", text, TRAIN, ARGS(F32("x", x, DR, DC)), 7)) {
        tf_tensor_view v;
        if (sess_run(&t) && tf_session_output(t.s, "y", &v) == TF_OK)
            CHECK(memcmp(first, v.data, sizeof first) == 0, "dropout: the same seed gave another mask");
        sess_close(&t);
    }
    /* dropout_mask: 0 or 1/(1-p); x * mask is dropout with the same salt; another salt, another mask */
    const char *mtext =
        "input x : f32[80, 101]\nm = dropout_mask(x, p=0.6, salt=9)\nxm = mul(x, m)\n"
        "d = dropout(x, p=0.6, salt=9)\ne = dropout(x, p=0.6, salt=10)\n"
        "output m\noutput xm\noutput d\noutput e\n";
    if (sess_open(&t, "dropout_mask", mtext, TRAIN, ARGS(F32("x", x, DR, DC)), 3)) {
        if (sess_run(&t)) {
            double f = dropout_check(&t, "m", x, 0.6, true);
            CHECK(fabs(f - 0.6) < 0.03, "dropout_mask: dropped fraction %.4f, want about 0.6", f);
            f = dropout_check(&t, "e", x, 0.6, false);
            CHECK(fabs(f - 0.6) < 0.03, "dropout salt 10: dropped fraction %.4f, want about 0.6", f);
            tf_tensor_view a, b, e;
            if (!tf_session_output(t.s, "xm", &a) && !tf_session_output(t.s, "d", &b) &&
                !tf_session_output(t.s, "e", &e)) {
                CHECK(memcmp(a.data, b.data, sizeof x) == 0, "dropout_mask: x * mask differs from dropout, same salt");
                CHECK(memcmp(b.data, e.data, sizeof x) != 0, "dropout: salts 9 and 10 drew the same mask");
            }
        }
        sess_close(&t);
    }
}

/* ---- layout ops -------------------------------------------------------------------------------- */

static void test_layout(void)
{
    static float x[2 * 3 * 4];
    fill(x, 24, 121);
    static const int64_t xi[6] = {1, 2, 3, 4, 5, 6};
    double xd[24], wt[24], wp[24], wb[24];
    to_double(x, 24, xd);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) {
                wt[(k * 2 + i) * 3 + j] = x[(i * 3 + j) * 4 + k];   /* perm [2, 0, 1]: t[k][i][j] = x[i][j][k] */
                wp[(j * 2 + i) * 4 + k] = x[(i * 3 + j) * 4 + k];   /* perm [1, 0, 2]: p[j][i][k] = x[i][j][k] */
                wb[(i * 3 + j) * 4 + k] = x[j];                     /* [3, 1] -> [2, 3, 4]: b[i][j][k] = c[j] */
            }
    sess t;
    if (sess_go(&t, "layout", "input x : f32[2, 3, 4]\ninput c : f32[3, 1]\ninput n : i64[2, 3]\n"
                "r = reshape(x, shape=[4, -1])\nf = flatten(x)\nt = transpose(x, perm=[2, 0, 1])\n"
                "p = transpose(x, perm=[1, 0, 2])\nb = broadcast(c, shape=[2, 3, 4])\nnt = transpose(n, perm=[1, 0])\n"
                "output r\noutput f\noutput t\noutput p\noutput b\noutput nt\n", INFER,
                ARGS(F32("x", x, 2, 3, 4), F32("c", x, 3, 1), I64("n", xi, 2, 3)))) {
        expect_out(&t, "r", TF_DTYPE_F32, DIMS(4, 6), xd, EXACT);
        expect_out(&t, "f", TF_DTYPE_F32, DIMS(2, 12), xd, EXACT);
        expect_out(&t, "t", TF_DTYPE_F32, DIMS(4, 2, 3), wt, EXACT);
        expect_out(&t, "p", TF_DTYPE_F32, DIMS(3, 2, 4), wp, EXACT);
        expect_out(&t, "b", TF_DTYPE_F32, DIMS(2, 3, 4), wb, EXACT);
        expect_out(&t, "nt", TF_DTYPE_I64, DIMS(3, 2), (const double[]){1, 4, 2, 5, 3, 6}, EXACT);
    }
    sess_close(&t);
    op_case("flatten rank4", "input x : f32[2, 3, 2, 2]\ny = flatten(x)\noutput y\n", TRAIN,
            ARGS(F32("x", x, 2, 3, 2, 2)), "y", TF_DTYPE_F32, DIMS(2, 12), xd, EXACT);
}

/* Python's x[start:end:step] along one axis of a [3, 7] array. */
static int ref_slice(const double *x, int axis, int start, int end, int step, double *y, int64_t shape[2])
{
    int len = axis ? 7 : 3;
    if (start < 0) start += len;
    if (end < 0) end += len;
    start = start < 0 ? 0 : start > len ? len : start;
    end = end < 0 ? 0 : end > len ? len : end;
    int idx[8], n = 0;
    for (int i = start; i < end; i += step) idx[n++] = i;
    shape[0] = axis ? 3 : n;
    shape[1] = axis ? n : 7;
    int k = 0;
    for (int r = 0; r < shape[0]; r++)
        for (int c = 0; c < shape[1]; c++) y[k++] = axis ? x[r * 7 + idx[c]] : x[idx[r] * 7 + c];
    return k;
}

static void test_slice_concat(void)
{
    static float x[21];
    fill(x, 21, 131);
    double xd[21], w[32];
    to_double(x, 21, xd);
    static const struct { const char *attrs; int axis, start, end, step; } cs[] = {
        {"axis=1, start=-5, end=7, step=2", 1, -5, 7, 2},
        {"axis=0, start=1, end=-1", 0, 1, -1, 1},
        {"axis=-1, start=-100, end=100, step=3", 1, -100, 100, 3},
        {"axis=-2, start=0, end=3, step=2", 0, 0, 3, 2},
        {"axis=1, start=2, end=-2", 1, 2, -2, 1},
    };
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
        char text[160], label[96];
        snprintf(text, sizeof text, "input x : f32[3, 7]\ny = slice(x, %s)\noutput y\n", cs[k].attrs);
        snprintf(label, sizeof label, "slice(%s)", cs[k].attrs);
        int64_t shape[2];
        ref_slice(xd, cs[k].axis, cs[k].start, cs[k].end, cs[k].step, w, shape);
        op_case(label, text, INFER, ARGS(F32("x", x, 3, 7)), "y", TF_DTYPE_F32, 2, shape, w, EXACT);
    }
    /* concat [2,1,3] [2,2,3] [2,3,3] on axis 1 -> [2,6,3]; on axis -1 [2,3] ++ [2,2] -> [2,5];
     * on axis 0 (the default) [2,3] ++ [3,3] -> [5,3] */
    static float a[6], b[12], c[18];
    fill(a, 6, 132);
    fill(b, 12, 133);
    fill(c, 18, 134);
    double w1[36], w2[10], w3[15];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 6; j++)
            for (int k = 0; k < 3; k++)
                w1[(i * 6 + j) * 3 + k] = j < 1 ? a[(i * 1 + j) * 3 + k] : j < 3 ? b[(i * 2 + j - 1) * 3 + k]
                                                                          : c[(i * 3 + j - 3) * 3 + k];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 5; j++) w2[i * 5 + j] = j < 3 ? a[i * 3 + j] : b[i * 2 + j - 3];
    for (int i = 0; i < 15; i++) w3[i] = i < 6 ? a[i] : c[i - 6];
    sess t;
    if (sess_go(&t, "concat", "input a : f32[2, 1, 3]\ninput b : f32[2, 2, 3]\ninput c : f32[2, 3, 3]\n"
                "input a2 : f32[2, 3]\ninput b2 : f32[2, 2]\ninput c2 : f32[3, 3]\ny1 = concat(a, b, c, axis=1)\n"
                "y2 = concat(a2, b2, axis=-1)\ny3 = concat(a2, c2)\noutput y1\noutput y2\noutput y3\n", INFER,
                ARGS(F32("a", a, 2, 1, 3), F32("b", b, 2, 2, 3), F32("c", c, 2, 3, 3), F32("a2", a, 2, 3),
                     F32("b2", b, 2, 2), F32("c2", c, 3, 3)))) {
        expect_out(&t, "y1", TF_DTYPE_F32, DIMS(2, 6, 3), w1, EXACT);
        expect_out(&t, "y2", TF_DTYPE_F32, DIMS(2, 5), w2, EXACT);
        expect_out(&t, "y3", TF_DTYPE_F32, DIMS(5, 3), w3, EXACT);
    }
    sess_close(&t);
}

/* ---- gather family and generators ------------------------------------------------------------ */

static void test_gather(void)
{
    static float tab[5 * 4];
    fill(tab, 20, 141);
    static const int64_t ids[6] = {3, 0, 4, 4, 1, 3};
    static const int32_t ids32[6] = {3, 0, 4, 4, 1, 3};
    static const double t1[5] = {10, 20, 30, 40, 50};
    double w[24], oh[30], io1[24], io2[24], io3[24];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++) w[i * 4 + j] = tab[ids[i] * 4 + j];       /* rows of the table */
    for (int i = 0; i < 6; i++)
        for (int c = 0; c < 5; c++) oh[i * 5 + c] = ids[i] == c;
    for (int i = 0; i < 24; i++) {   /* iota over [2, 3, 4]: the index along axis 1, -1, 0 */
        io1[i] = (i / 4) % 3;
        io2[i] = i % 4;
        io3[i] = i / 12;
    }
    sess t;
    if (sess_go(&t, "gather family",
                "input i : i64[2, 3]\ninput j : i32[6]\ninput t : f32[5, 4]\ninput t3 : f32[5, 2, 2]\n"
                "input t1 : f64[5]\ne = embedding(i, t)\nej = embedding(j, t)\ng = gather(j, t3)\ng1 = gather(i, t1)\n"
                "o = one_hot(i, depth=5)\noj = one_hot(j, depth=5, dtype=i64)\na = iota(shape=[2, 3, 4], axis=1)\n"
                "b = iota(shape=[2, 3, 4], axis=-1, dtype=f32)\nc = iota(shape=[2, 3, 4])\noutput e\noutput ej\n"
                "output g\noutput g1\noutput o\noutput oj\noutput a\noutput b\noutput c\n", INFER,
                ARGS(I64("i", ids, 2, 3), IN("j", TF_DTYPE_I32, ids32, 6), F32("t", tab, 5, 4), F32("t3", tab, 5, 2, 2),
                     IN("t1", TF_DTYPE_F64, t1, 5)))) {
        expect_out(&t, "e", TF_DTYPE_F32, DIMS(2, 3, 4), w, EXACT);
        expect_out(&t, "ej", TF_DTYPE_F32, DIMS(6, 4), w, EXACT);
        expect_out(&t, "g", TF_DTYPE_F32, DIMS(6, 2, 2), w, EXACT);
        expect_out(&t, "g1", TF_DTYPE_F64, DIMS(2, 3), (const double[]){40, 10, 50, 50, 20, 40}, EXACT);
        expect_out(&t, "o", TF_DTYPE_F32, DIMS(2, 3, 5), oh, EXACT);
        expect_out(&t, "oj", TF_DTYPE_I64, DIMS(6, 5), oh, EXACT);
        expect_out(&t, "a", TF_DTYPE_I64, DIMS(2, 3, 4), io1, EXACT);
        expect_out(&t, "b", TF_DTYPE_F32, DIMS(2, 3, 4), io2, EXACT);
        expect_out(&t, "c", TF_DTYPE_I64, DIMS(2, 3, 4), io3, EXACT);
    }
    sess_close(&t);
    op_case("embedding train", "input i : i64[2, 3]\ninput t : f32[5, 4]\ny = embedding(i, t)\noutput y\n", TRAIN,
            ARGS(I64("i", ids, 2, 3), F32("t", tab, 5, 4)), "y", TF_DTYPE_F32, DIMS(2, 3, 4), w, EXACT);
}

/* ---- runtime errors ------------------------------------------------------------------------ */

static void expect_range_error(const char *label, const char *text, tf_mode mode, const arg *args, int nargs)
{
    sess t;
    if (!sess_open(&t, label, text, mode, args, nargs, 7)) return;
    tf_status st = tf_session_run(t.s);
    const char *msg = tf_context_last_error(t.ctx);
    CHECK(st == TF_ERR_RUNTIME, "%s: run returned %s, want runtime error (%s)", label, tf_status_name(st), msg);
    CHECK(strstr(msg, "out of range") != NULL, "%s: message does not say 'out of range': %s", label, msg);
    sess_close(&t);
}

static void test_errors(void)
{
    static const float tab[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, z[6] = {1, 2, 3, 4, 5, 6};
    static const int64_t hi[2] = {1, 4}, neg[2] = {-1, 0}, lab3[2] = {0, 3}, ok[2] = {1, 2};
    const char *emb = "input i : i64[2]\ninput t : f32[4, 3]\ny = embedding(i, t)\noutput y\n";
    expect_range_error("embedding id 4 of 4", emb, INFER, ARGS(I64("i", hi, 2), F32("t", tab, 4, 3)));
    expect_range_error("embedding id -1", emb, TRAIN, ARGS(I64("i", neg, 2), F32("t", tab, 4, 3)));
    expect_range_error("gather id 4 of 4", "input i : i64[2]\ninput t : f32[4, 3]\ny = gather(i, t)\noutput y\n", INFER,
                       ARGS(I64("i", hi, 2), F32("t", tab, 4, 3)));
    const char *ce = "input z : f32[2, 3]\ninput l : i64[2]\ny = cross_entropy(z, l)\noutput y\n";
    expect_range_error("cross_entropy label 3 of 3", ce, INFER, ARGS(F32("z", z, 2, 3), I64("l", lab3, 2)));
    expect_range_error("cross_entropy label -1", ce, TRAIN, ARGS(F32("z", z, 2, 3), I64("l", neg, 2)));
    const char *oh = "input i : i64[2]\ny = one_hot(i, depth=4)\noutput y\n";
    expect_range_error("one_hot 4 of 4", oh, INFER, ARGS(I64("i", hi, 2)));
    expect_range_error("one_hot -1", oh, INFER, ARGS(I64("i", neg, 2)));
    /* the session survives a bad run: fixed data runs fine afterwards */
    sess t;
    if (sess_open(&t, "embedding recovers", emb, INFER, ARGS(I64("i", hi, 2), F32("t", tab, 4, 3)), 7)) {
        CHECK(tf_session_run(t.s) == TF_ERR_RUNTIME, "embedding recovers: first run should fail");
        int64_t shp[1] = {2};
        CHECK(tf_session_bind(t.s, "i", TF_DTYPE_I64, shp, 1, ok) == TF_OK, "embedding recovers: rebind");
        if (sess_run(&t)) expect_out(&t, "y", TF_DTYPE_F32, DIMS(2, 3), (const double[]){4, 5, 6, 7, 8, 9}, EXACT);
        sess_close(&t);
    }
}

int main(void)
{
    void (*tests[])(void) = {test_unary,    test_binary,    test_where,          test_cast,      test_reduce,
                             test_matmul,   test_linear,    test_attention,      test_conv2d,    test_pool,
                             test_global_avgpool, test_batchnorm, test_layernorm, test_norm_half, test_softmax,
                             test_activations, test_losses, test_dropout,     test_layout,    test_slice_concat,
                             test_gather,   test_errors};
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) tests[i]();
    return check_report();
}
