/* onnx_fold.c — constant folding at ONNX import (onnx_fold.h). Each op
 * computes in double what ONNX defines on the element type, rounded to the
 * result's type as tfuse stores it (tf_dtype_round): integers exactly (they
 * are shape and index arithmetic, far below 2^53), floats as their type
 * rounds. Broadcasting is NumPy's, as ONNX's is. */
#include "onnx_fold.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"

typedef struct fold {
    const tf_onnx_node *n;
    int64_t opset;
    const tf_onnx_cval *in;
    int nin;
    tf_onnx_fold_alloc alloc;
    void *actx;
    char *err;
    size_t nerr;
} fold;

static int bad(fold *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(fold *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->err, f->nerr, fmt, ap);
    va_end(ap);
    return -1;
}

/* A value as an integer index or size: false when it is not finite or past 2^62 (a cast would be undefined). */
static bool as_int(double v, int64_t *out)
{
    if (!(fabs(v) <= 4611686018427387904.0)) return false;
    *out = (int64_t)v;
    return true;
}

/* Elements, saturating at 2^62 (a result that large is refused when it is allocated). */
static int64_t count(const int64_t *shape, int rank)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] <= 0) return 0;
        if (n > ((int64_t)1 << 62) / shape[i]) return (int64_t)1 << 62;
        n *= shape[i];
    }
    return n;
}

static const tf_onnx_attr *attr(const fold *f, const char *name)
{
    for (int i = 0; i < f->n->nattrs; i++)
        if (tf_onnx_is(f->n->attrs[i].name, name)) return &f->n->attrs[i];
    return NULL;
}
static int64_t attr_i(const fold *f, const char *name, int64_t dflt)
{
    const tf_onnx_attr *a = attr(f, name);
    return a ? a->i : dflt;
}

/* The result: shape and a fresh array. */
static double *result(fold *f, tf_onnx_cval *out, tf_dt dt, const int64_t *shape, int rank)
{
    out->dt = dt;
    out->rank = rank;
    for (int i = 0; i < rank && i < TF_MAX_RANK; i++) {
        if (shape[i] < 0 || shape[i] > ((int64_t)1 << 40)) return NULL;   /* tfuse's dims: at most 2^40 */
        out->shape[i] = shape[i];
    }
    double *c = f->alloc(f->actx, count(shape, rank));
    out->c = c;
    return c;
}

/* NumPy's broadcast of the inputs' shapes into shape/rank; -1 when two dims differ and neither is 1. */
static int broadcast(fold *f, const tf_onnx_cval *const *xs, int k, int64_t *shape, int *rank)
{
    *rank = 0;
    for (int i = 0; i < k; i++)
        if (xs[i]->rank > *rank) *rank = xs[i]->rank;
    for (int d = 0; d < *rank; d++) {
        int64_t s = 1;
        for (int i = 0; i < k; i++) {
            int a = d - (*rank - xs[i]->rank);
            if (a < 0) continue;
            int64_t e = xs[i]->shape[a];
            if (e == s || e == 1) continue;
            if (s != 1) return bad(f, "inputs of shapes that do not broadcast (a dim of %lld against %lld)", (long long)e, (long long)s);
            s = e;
        }
        shape[d] = s;
    }
    return 0;
}

/* The flat index in x of the broadcast result's element at idx (rank r). */
static int64_t at(const tf_onnx_cval *x, const int64_t *idx, int r)
{
    int64_t o = 0;
    for (int a = 0; a < x->rank; a++) {
        int64_t e = x->shape[a], i = idx[r - x->rank + a];
        o = o * e + (e == 1 ? 0 : i);
    }
    return o;
}

static void next(int64_t *idx, const int64_t *shape, int r)
{
    for (int d = r - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return;
        idx[d] = 0;
    }
}

enum {
    E_ADD, E_SUB, E_MUL, E_DIV, E_POW, E_MOD, E_MAX, E_MIN, E_EQ, E_LT, E_LE, E_GT, E_GE, E_AND, E_OR, E_XOR,
    E_NEG, E_ABS, E_SQRT, E_EXP, E_LOG, E_RECIP, E_FLOOR, E_CEIL, E_SIGN, E_RELU, E_NOT, E_ISNAN, E_ISINF, E_IDENT, E_WHERE,
};

static bool is_int(tf_dt t) { return t == TF_DT_I64 || t == TF_DT_I32; }

static double apply(fold *f, int op, const double *v, tf_dt dt, bool *fail_div)
{
    double a = v[0], b = v[1];
    switch (op) {
    case E_ADD: return a + b;
    case E_SUB: return a - b;
    case E_MUL: return a * b;
    case E_DIV:
        if (!is_int(dt)) return a / b;
        if (b == 0) *fail_div = true;
        return b == 0 ? 0 : trunc(a / b);
    case E_POW: return pow(a, b);
    case E_MOD:
        if (is_int(dt) && b == 0) *fail_div = true;
        if (b == 0) return 0;
        if (attr_i(f, "fmod", 0) || !is_int(dt)) return fmod(a, b);
        return a - b * floor(a / b);   /* the sign of the divisor, as Python's % */
    case E_MAX: return a != a || b != b ? NAN : a > b ? a : b;
    case E_MIN: return a != a || b != b ? NAN : a < b ? a : b;
    case E_EQ: return a == b;
    case E_LT: return a < b;
    case E_LE: return a <= b;
    case E_GT: return a > b;
    case E_GE: return a >= b;
    case E_AND: return a != 0 && b != 0;
    case E_OR: return a != 0 || b != 0;
    case E_XOR: return (a != 0) != (b != 0);
    case E_NEG: return -a;
    case E_ABS: return fabs(a);
    case E_SQRT: return sqrt(a);
    case E_EXP: return exp(a);
    case E_LOG: return log(a);
    case E_RECIP: return 1 / a;
    case E_FLOOR: return floor(a);
    case E_CEIL: return ceil(a);
    case E_SIGN: return a > 0 ? 1 : a < 0 ? -1 : a;
    case E_RELU: return a > 0 ? a : 0;
    case E_NOT: return a == 0;
    case E_ISNAN: return a != a;
    case E_ISINF: {
        bool neg = attr_i(f, "detect_negative", 1) != 0, pos = attr_i(f, "detect_positive", 1) != 0;
        return (pos && a == INFINITY) || (neg && a == -INFINITY);
    }
    case E_IDENT: return a;
    default: return v[0] != 0 ? v[1] : v[2];   /* E_WHERE */
    }
}

/* An elementwise op over k inputs, broadcast; the result bool for comparisons and logic, else the type of input `typed`. */
static int elementwise(fold *f, int op, int k, tf_onnx_cval *out)
{
    const tf_onnx_cval *xs[3] = {NULL, NULL, NULL};
    for (int i = 0; i < k; i++) {
        if (i >= f->nin || !f->in[i].c) return bad(f, "input %d is required", i);
        xs[i] = &f->in[i];
    }
    int typed = op == E_WHERE ? 1 : 0;
    tf_dt dt = (op >= E_EQ && op <= E_XOR) || op == E_NOT || op == E_ISNAN || op == E_ISINF ? TF_DT_BOOL : xs[typed]->dt;
    int64_t shape[TF_MAX_RANK], idx[TF_MAX_RANK] = {0};
    int r;
    if (broadcast(f, xs, k, shape, &r)) return -1;
    double *c = result(f, out, dt, shape, r);
    if (!c) return bad(f, "a constant too large to fold");
    bool div0 = false;
    for (int64_t o = 0, n = count(shape, r); o < n; o++, next(idx, shape, r)) {
        double v[3] = {0, 0, 0};
        for (int i = 0; i < k; i++) v[i] = xs[i]->c[at(xs[i], idx, r)];
        c[o] = tf_dtype_round(dt, apply(f, op, v, xs[typed]->dt, &div0));
    }
    return div0 ? bad(f, "an integer division by zero") : 1;
}

/* Max, Min, Sum, Mean of one or more inputs. */
static int variadic(fold *f, int op, bool mean, tf_onnx_cval *out)
{
    if (f->nin < 1 || !f->in[0].c) return bad(f, "input 0 is required");
    tf_onnx_cval acc = f->in[0], tmp;
    for (int i = 1; i < f->nin; i++) {
        fold g = *f;
        tf_onnx_cval two[2] = {acc, f->in[i]};
        g.in = two, g.nin = 2;
        if (elementwise(&g, op, 2, &tmp) < 0) return -1;
        acc = tmp;
    }
    if (mean) {
        double *c = result(f, &tmp, acc.dt, acc.shape, acc.rank);
        if (!c) return bad(f, "a constant too large to fold");
        for (int64_t i = 0, n = count(acc.shape, acc.rank); i < n; i++) c[i] = tf_dtype_round(acc.dt, acc.c[i] / f->nin);
        acc = tmp;
    }
    *out = acc;
    return 1;
}

/* A 1-D integer input as a list (shapes, axes, indices). */
static int ints(fold *f, int k, int64_t *v, int *n, int cap)
{
    if (k >= f->nin || !f->in[k].c) return bad(f, "input %d is required", k);
    const tf_onnx_cval *x = &f->in[k];
    int64_t m = count(x->shape, x->rank);
    if (x->rank > 1 || m > cap) return bad(f, "input %d: expected a list of at most %d integers", k, cap);
    for (int64_t i = 0; i < m; i++)
        if (!as_int(x->c[i], &v[i])) return bad(f, "input %d holds %g, not an integer tfuse takes", k, x->c[i]);
    *n = (int)m;
    return 0;
}

static int expand(fold *f, tf_onnx_cval *out)
{
    int64_t s[TF_MAX_RANK];
    int n;
    if (ints(f, 1, s, &n, TF_MAX_RANK)) return -1;
    tf_onnx_cval target = {f->in[0].dt, n, {0}, f->in[0].c};
    memcpy(target.shape, s, (size_t)n * sizeof *s);
    for (int i = 0; i < n; i++)
        if (s[i] < 0) return bad(f, "Expand to a negative dim %lld", (long long)s[i]);
    const tf_onnx_cval *xs[2] = {&f->in[0], &target};
    int64_t shape[TF_MAX_RANK], idx[TF_MAX_RANK] = {0};
    int r;
    if (broadcast(f, xs, 2, shape, &r)) return -1;
    double *c = result(f, out, f->in[0].dt, shape, r);
    if (!c) return bad(f, "a constant too large to fold");
    for (int64_t o = 0, m = count(shape, r); o < m; o++, next(idx, shape, r)) c[o] = f->in[0].c[at(&f->in[0], idx, r)];
    return 1;
}

static int range(fold *f, tf_onnx_cval *out)
{
    for (int i = 0; i < 3; i++)
        if (i >= f->nin || !f->in[i].c || f->in[i].rank != 0) return bad(f, "Range takes three scalars");
    double start = f->in[0].c[0], limit = f->in[1].c[0], delta = f->in[2].c[0];
    if (delta == 0) return bad(f, "Range with delta 0");
    double steps = ceil((limit - start) / delta);
    int64_t n = 0;
    if (steps > 0 && !as_int(steps, &n)) return bad(f, "Range of %g elements", steps);
    double *c = result(f, out, f->in[0].dt, &n, 1);
    if (!c) return bad(f, "a constant too large to fold");
    for (int64_t i = 0; i < n; i++) c[i] = tf_dtype_round(f->in[0].dt, start + (double)i * delta);
    return 1;
}

/* Gather (0) and GatherElements (1) on constants, negative indices counted from the end. */
static int gather(fold *f, bool elements, tf_onnx_cval *out)
{
    if (f->nin < 2 || !f->in[0].c || !f->in[1].c) return bad(f, "inputs 0 and 1 are required");
    const tf_onnx_cval *x = &f->in[0], *ix = &f->in[1];
    int64_t axis = attr_i(f, "axis", 0);
    if (x->rank < 1 || axis < -x->rank || axis >= x->rank) return bad(f, "axis %lld outside rank %d", (long long)axis, x->rank);
    if (axis < 0) axis += x->rank;
    int64_t e = x->shape[axis], shape[TF_MAX_RANK];
    int r;
    if (elements) {
        if (ix->rank != x->rank) return bad(f, "GatherElements' indices must have the data's rank");
        for (int a = 0; a < x->rank; a++)
            if (a != axis && ix->shape[a] > x->shape[a])
                return bad(f, "GatherElements' indices are %lld long on axis %d, where the data is %lld", (long long)ix->shape[a], a,
                           (long long)x->shape[a]);
        r = ix->rank;
        memcpy(shape, ix->shape, (size_t)r * sizeof *shape);
    } else {
        r = x->rank - 1 + ix->rank;
        if (r > TF_MAX_RANK) return bad(f, "a result of rank %d (at most %d)", r, TF_MAX_RANK);
        int k = 0;
        for (int a = 0; a < axis; a++) shape[k++] = x->shape[a];
        for (int a = 0; a < ix->rank; a++) shape[k++] = ix->shape[a];
        for (int a = (int)axis + 1; a < x->rank; a++) shape[k++] = x->shape[a];
    }
    double *c = result(f, out, x->dt, shape, r);
    if (!c) return bad(f, "a constant too large to fold");
    int64_t idx[TF_MAX_RANK] = {0}, src[TF_MAX_RANK];
    for (int64_t o = 0, n = count(shape, r); o < n; o++, next(idx, shape, r)) {
        double iv = ix->c[elements ? o : at(ix, idx + axis, ix->rank)];
        int64_t i = 0;
        if (!as_int(iv, &i) || i < -e || i >= e) return bad(f, "index %g outside a dim of %lld", iv, (long long)e);
        if (i < 0) i += e;
        if (elements) {
            memcpy(src, idx, (size_t)r * sizeof *src);
            src[axis] = i;
        } else {
            for (int a = 0; a < axis; a++) src[a] = idx[a];
            src[axis] = i;
            for (int a = (int)axis + 1; a < x->rank; a++) src[a] = idx[a - 1 + ix->rank];
        }
        int64_t off = 0;
        for (int a = 0; a < x->rank; a++) off = off * x->shape[a] + src[a];
        c[o] = x->c[off];
    }
    return 1;
}

/* The same elements under another shape: Reshape (0 copies a dim unless allowzero, -1 the rest), Flatten, Squeeze,
 * Unsqueeze. */
static int reshape(fold *f, const char *op, tf_onnx_cval *out)
{
    const tf_onnx_cval *x = &f->in[0];
    int64_t n = count(x->shape, x->rank), s[TF_MAX_RANK], axes[TF_MAX_RANK];
    int r = 0, na = 0;
    if (!strcmp(op, "Reshape")) {
        if (ints(f, 1, s, &r, TF_MAX_RANK)) return -1;
        int minus = -1;
        int64_t known = 1;
        for (int i = 0; i < r; i++) {
            if (s[i] == 0 && !attr_i(f, "allowzero", 0)) {
                if (i >= x->rank) return bad(f, "Reshape copies dim %d of a rank-%d input", i, x->rank);
                s[i] = x->shape[i];
            }
            if (s[i] == -1) {
                if (minus >= 0) return bad(f, "Reshape with two -1 dims");
                minus = i;
            } else if (s[i] < 0) {
                return bad(f, "Reshape to a dim of %lld", (long long)s[i]);
            } else {
                known = count((int64_t[]){known, s[i]}, 2);
            }
        }
        if (minus >= 0) s[minus] = known ? n / known : 0;
    } else if (!strcmp(op, "Flatten")) {
        int64_t axis = attr_i(f, "axis", 1);
        if (axis < -x->rank || axis > x->rank) return bad(f, "axis %lld outside rank %d", (long long)axis, x->rank);
        if (axis < 0) axis += x->rank;
        s[0] = count(x->shape, (int)axis), s[1] = axis ? n / (s[0] ? s[0] : 1) : n, r = 2;
    } else {
        const tf_onnx_attr *a = attr(f, "axes");
        bool unsq = !strcmp(op, "Unsqueeze");
        if (a && a->nints > TF_MAX_RANK) return bad(f, "%d axes (at most %d)", a->nints, TF_MAX_RANK);
        if (a) {
            na = a->nints;
            if (na) memcpy(axes, a->ints, (size_t)na * sizeof *axes);
        } else if (f->nin > 1 && f->in[1].c && ints(f, 1, axes, &na, TF_MAX_RANK)) return -1;
        int out_rank = unsq ? x->rank + na : x->rank;
        if (out_rank > TF_MAX_RANK) return bad(f, "a result of rank %d (at most %d)", out_rank, TF_MAX_RANK);
        bool mark[TF_MAX_RANK] = {false};
        for (int i = 0; i < na; i++) {
            int64_t ax = axes[i] < 0 ? axes[i] + out_rank : axes[i];
            if (ax < 0 || ax >= out_rank) return bad(f, "axis %lld outside rank %d", (long long)axes[i], out_rank);
            mark[ax] = true;
        }
        for (int i = 0, k = 0; i < out_rank; i++) {
            if (unsq) {
                s[r++] = mark[i] ? 1 : x->shape[k++];
            } else if (na ? !mark[i] : x->shape[i] != 1) {
                s[r++] = x->shape[i];
            } else if (x->shape[i] != 1) {
                return bad(f, "Squeeze of axis %d, whose dim is %lld", i, (long long)x->shape[i]);
            }
        }
    }
    if (count(s, r) != n) return bad(f, "%s of %lld elements to a shape of %lld", op, (long long)n, (long long)count(s, r));
    double *c = result(f, out, x->dt, s, r);
    if (!c) return bad(f, "a constant too large to fold");
    memcpy(c, x->c, (size_t)n * sizeof *c);
    return 1;
}

/* Slice: starts, ends, axes, steps (attributes before opset 10, inputs 1-4 after), each axis clamped as ONNX says
 * (negative steps walk back; an empty result is a dim of 0). */
static int slice(fold *f, tf_onnx_cval *out)
{
    const tf_onnx_cval *x = &f->in[0];
    int64_t st[TF_MAX_RANK], en[TF_MAX_RANK], ax[TF_MAX_RANK], sp[TF_MAX_RANK];
    int ns, ne, na = -1, np = -1;
    if (f->opset < 10) {
        const tf_onnx_attr *a = attr(f, "starts"), *b = attr(f, "ends"), *c = attr(f, "axes");
        if (!a || !b || a->nints > TF_MAX_RANK || b->nints != a->nints || (c && c->nints != a->nints))
            return bad(f, "Slice needs starts and ends of one length (at most %d)", TF_MAX_RANK);
        ns = ne = a->nints;
        if (ns) memcpy(st, a->ints, (size_t)ns * sizeof *st);
        if (ne) memcpy(en, b->ints, (size_t)ne * sizeof *en);
        if (c && (na = c->nints)) memcpy(ax, c->ints, (size_t)na * sizeof *ax);
    } else {
        if (ints(f, 1, st, &ns, TF_MAX_RANK) || ints(f, 2, en, &ne, TF_MAX_RANK)) return -1;
        if (f->nin > 3 && f->in[3].c && ints(f, 3, ax, &na, TF_MAX_RANK)) return -1;
        if (f->nin > 4 && f->in[4].c && ints(f, 4, sp, &np, TF_MAX_RANK)) return -1;
        if (ne != ns || (na >= 0 && na != ns) || (np >= 0 && np != ns)) return bad(f, "Slice's starts, ends, axes and steps differ in length");
    }
    int64_t lo[TF_MAX_RANK], step[TF_MAX_RANK], shape[TF_MAX_RANK];
    for (int d = 0; d < x->rank; d++) lo[d] = 0, step[d] = 1, shape[d] = x->shape[d];
    bool seen[TF_MAX_RANK] = {false};
    for (int i = 0; i < ns; i++) {
        int64_t a = na >= 0 ? ax[i] : i, k = np >= 0 ? sp[i] : 1, dim;
        if (a < -x->rank || a >= x->rank) return bad(f, "axis %lld outside rank %d", (long long)a, x->rank);
        if (a < 0) a += x->rank;
        if (seen[a]) return bad(f, "axis %lld sliced twice", (long long)a);
        seen[a] = true;
        if (k == 0) return bad(f, "a step of 0");
        dim = x->shape[a];
        int64_t s0 = st[i] < 0 ? st[i] + dim : st[i], e0 = en[i] < 0 ? en[i] + dim : en[i], len;
        if (st[i] < -((int64_t)1 << 62) || en[i] < -((int64_t)1 << 62)) return bad(f, "a start or end past -2^62");
        if (k > 0) {
            s0 = s0 < 0 ? 0 : s0 > dim ? dim : s0;
            e0 = e0 < 0 ? 0 : e0 > dim ? dim : e0;
            len = e0 > s0 ? (e0 - s0 + k - 1) / k : 0;
        } else {
            s0 = s0 < 0 ? -1 : s0 > dim - 1 ? dim - 1 : s0;
            e0 = e0 < -1 ? -1 : e0 > dim - 1 ? dim - 1 : e0;
            len = s0 > e0 ? (s0 - e0 + (-k) - 1) / (-k) : 0;
        }
        lo[a] = s0, step[a] = k, shape[a] = len;
    }
    double *c = result(f, out, x->dt, shape, x->rank);
    if (!c) return bad(f, "a constant too large to fold");
    int64_t idx[TF_MAX_RANK] = {0};
    for (int64_t o = 0, n = count(shape, x->rank); o < n; o++, next(idx, shape, x->rank)) {
        int64_t off = 0;
        for (int d = 0; d < x->rank; d++) off = off * x->shape[d] + lo[d] + idx[d] * step[d];
        c[o] = x->c[off];
    }
    return 1;
}

/* Concat of constants on any axis. */
static int concat(fold *f, tf_onnx_cval *out)
{
    const tf_onnx_cval *x = &f->in[0];
    int64_t axis = attr_i(f, "axis", 0);
    if (x->rank < 1 || axis < -x->rank || axis >= x->rank) return bad(f, "axis %lld outside rank %d", (long long)axis, x->rank);
    if (axis < 0) axis += x->rank;
    int64_t shape[TF_MAX_RANK], inner, outer;
    memcpy(shape, x->shape, (size_t)x->rank * sizeof *shape);
    shape[axis] = 0;
    for (int i = 0; i < f->nin; i++) {
        const tf_onnx_cval *y = &f->in[i];
        if (!y->c || y->rank != x->rank || y->dt != x->dt) return bad(f, "Concat of inputs of other ranks or types");
        for (int d = 0; d < x->rank; d++)
            if (d != axis && y->shape[d] != x->shape[d]) return bad(f, "Concat of inputs that differ off the axis");
        shape[axis] += y->shape[axis];
    }
    double *c = result(f, out, x->dt, shape, x->rank);
    if (!c) return bad(f, "a constant too large to fold");
    if (!count(shape, x->rank)) return 1;   /* empty: nothing to copy, however many rows of nothing */
    outer = count(x->shape, (int)axis), inner = count(x->shape + axis + 1, x->rank - (int)axis - 1);   /* both within the result */
    int64_t at_ = 0;
    for (int64_t o = 0; o < outer; o++)
        for (int i = 0; i < f->nin; i++) {
            int64_t len = f->in[i].shape[axis] * inner;
            memcpy(c + at_, f->in[i].c + o * len, (size_t)len * sizeof *c);
            at_ += len;
        }
    return 1;
}

int tf_onnx_fold(const tf_onnx_node *n, int64_t opset, const tf_onnx_cval *in, int nin, tf_onnx_cval *out, int *nout,
                 tf_onnx_fold_alloc alloc, void *actx, char *err, size_t nerr)
{
    static const struct { const char *op; int e, k; } ew[] = {
        {"Add", E_ADD, 2}, {"Sub", E_SUB, 2}, {"Mul", E_MUL, 2}, {"Div", E_DIV, 2}, {"Pow", E_POW, 2}, {"Mod", E_MOD, 2},
        {"Equal", E_EQ, 2}, {"Less", E_LT, 2}, {"LessOrEqual", E_LE, 2}, {"Greater", E_GT, 2}, {"GreaterOrEqual", E_GE, 2},
        {"And", E_AND, 2}, {"Or", E_OR, 2}, {"Xor", E_XOR, 2}, {"Neg", E_NEG, 1}, {"Abs", E_ABS, 1}, {"Sqrt", E_SQRT, 1},
        {"Exp", E_EXP, 1}, {"Log", E_LOG, 1}, {"Reciprocal", E_RECIP, 1}, {"Floor", E_FLOOR, 1}, {"Ceil", E_CEIL, 1},
        {"Sign", E_SIGN, 1}, {"Relu", E_RELU, 1}, {"Not", E_NOT, 1}, {"IsNaN", E_ISNAN, 1}, {"IsInf", E_ISINF, 1},
        {"Identity", E_IDENT, 1}, {"Where", E_WHERE, 3},
    };
    fold f = {n, opset, in, nin, alloc, actx, err, nerr};
    *nout = 1;
    for (size_t i = 0; i < sizeof ew / sizeof *ew; i++)
        if (tf_onnx_is(n->op_type, ew[i].op)) return elementwise(&f, ew[i].e, ew[i].k, out);
    if (tf_onnx_is(n->op_type, "Max")) return variadic(&f, E_MAX, false, out);
    if (tf_onnx_is(n->op_type, "Min")) return variadic(&f, E_MIN, false, out);
    if (tf_onnx_is(n->op_type, "Sum")) return variadic(&f, E_ADD, false, out);
    if (tf_onnx_is(n->op_type, "Mean")) return variadic(&f, E_ADD, true, out);
    if (tf_onnx_is(n->op_type, "Expand")) return expand(&f, out);
    if (tf_onnx_is(n->op_type, "Range")) return range(&f, out);
    if (tf_onnx_is(n->op_type, "Gather")) return gather(&f, false, out);
    if (tf_onnx_is(n->op_type, "GatherElements")) return gather(&f, true, out);
    if (tf_onnx_is(n->op_type, "Slice")) return nin < 1 || !in[0].c ? bad(&f, "input 0 is required") : slice(&f, out);
    if (tf_onnx_is(n->op_type, "Concat")) return nin < 1 || !in[0].c ? bad(&f, "input 0 is required") : concat(&f, out);
    static const char *const shaping[] = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"};
    for (size_t i = 0; i < sizeof shaping / sizeof *shaping; i++)
        if (tf_onnx_is(n->op_type, shaping[i])) {
            if (nin < 1 || !in[0].c) return bad(&f, "input 0 is required");
            return reshape(&f, shaping[i], out);
        }
    (void)opset;
    *nout = 0;
    return 0;
}
