/* grad_rules.c — one gradient rule per differentiable core op, as ops.def's
 * GRAD column names them. Each builds the vector-Jacobian product of its op
 * from dy with ordinary core ops (and the backward ops for conv, pooling,
 * gather and slice). Broadcasting is undone by gr_contrib, so a binary rule
 * hands over dy-shaped contributions. Every rule is checked against central
 * finite differences in float64 (tests/unit/test_grad_rules.c). */
#include <math.h>
#include <string.h>

#include "autodiff.h"

#define X(n) (n->in[0])
#define Y(n) (n->out)

static tf_ir_status give(tf_grad_ctx *g, const tf_node *n, int k, tf_value *c)
{
    if (!c) return gr_diag(g)->status ? gr_diag(g)->status : TF_IR_ERR_INTERNAL;
    return gr_contrib(g, n, k, c);
}

static tf_value *zeros_like_select(tf_grad_ctx *g, const tf_node *n, const char *hint, tf_value *cond, tf_value *dy, bool when)
{
    tf_value *w[3] = {cond, when ? dy : gnum(g, 0), when ? gnum(g, 0) : dy};
    return gb(g, n, TF_OP_WHERE, hint, w, 3, NULL, 0);
}

static tf_ir_status gr_neg(tf_grad_ctx *g, const tf_node *n, tf_value *dy) { return give(g, n, 0, gb1(g, n, TF_OP_NEG, "dx", dy)); }

static tf_ir_status gr_abs(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    /* d|x| = sign(x): +1, -1, and 0 at 0 as PyTorch */
    tf_value *pos = gb2(g, n, TF_OP_GT, "pos", X(n), gnum(g, 0));
    tf_value *neg = gb2(g, n, TF_OP_LT, "neg", X(n), gnum(g, 0));
    tf_value *inner = zeros_like_select(g, n, "dneg", neg, gb1(g, n, TF_OP_NEG, "ndy", dy), true);
    tf_value *w[3] = {pos, dy, inner};
    return give(g, n, 0, gb(g, n, TF_OP_WHERE, "dx", w, 3, NULL, 0));
}

static tf_ir_status gr_exp(tf_grad_ctx *g, const tf_node *n, tf_value *dy) { return give(g, n, 0, gb2(g, n, TF_OP_MUL, "dx", dy, Y(n))); }
static tf_ir_status gr_log(tf_grad_ctx *g, const tf_node *n, tf_value *dy) { return give(g, n, 0, gb2(g, n, TF_OP_DIV, "dx", dy, X(n))); }

static tf_ir_status gr_softplus(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    return give(g, n, 0, gb2(g, n, TF_OP_MUL, "dx", dy, gb1(g, n, TF_OP_SIGMOID, "s", X(n))));
}

static tf_ir_status gr_sqrt(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    return give(g, n, 0, gb2(g, n, TF_OP_DIV, "dx", gb2(g, n, TF_OP_MUL, "half", dy, gnum(g, 0.5)), Y(n)));
}

static tf_ir_status gr_rsqrt(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    /* d x^-1/2 = -1/2 x^-3/2 = -1/2 y / x */
    tf_value *s = gb2(g, n, TF_OP_DIV, "ydivx", Y(n), X(n));
    return give(g, n, 0, gb2(g, n, TF_OP_MUL, "dx", dy, gb2(g, n, TF_OP_MUL, "slope", s, gnum(g, -0.5))));
}

static tf_ir_status gr_tanh(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_value *one_minus = gb2(g, n, TF_OP_SUB, "slope", gnum(g, 1), gb2(g, n, TF_OP_MUL, "y2", Y(n), Y(n)));
    return give(g, n, 0, gb2(g, n, TF_OP_MUL, "dx", dy, one_minus));
}

static tf_ir_status gr_sigmoid(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_value *s = gb2(g, n, TF_OP_MUL, "slope", Y(n), gb2(g, n, TF_OP_SUB, "one_minus", gnum(g, 1), Y(n)));
    return give(g, n, 0, gb2(g, n, TF_OP_MUL, "dx", dy, s));
}

static tf_ir_status gr_relu(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    return give(g, n, 0, zeros_like_select(g, n, "dx", gb2(g, n, TF_OP_GT, "on", X(n), gnum(g, 0)), dy, true));
}

static tf_ir_status gr_erf(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    /* 2/sqrt(pi) exp(-x^2) */
    tf_value *e = gb1(g, n, TF_OP_EXP, "gauss", gb1(g, n, TF_OP_NEG, "nx2", gb2(g, n, TF_OP_MUL, "x2", X(n), X(n))));
    return give(g, n, 0, gb2(g, n, TF_OP_MUL, "dx", dy, gb2(g, n, TF_OP_MUL, "slope", e, gnum(g, 1.1283791670955126))));
}

static tf_ir_status gr_sin(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    return give(g, n, 0, gb2(g, n, TF_OP_MUL, "dx", dy, gb1(g, n, TF_OP_COS, "cos", X(n))));
}

static tf_ir_status gr_cos(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    return give(g, n, 0, gb2(g, n, TF_OP_MUL, "dx", dy, gb1(g, n, TF_OP_NEG, "nsin", gb1(g, n, TF_OP_SIN, "sin", X(n)))));
}

static tf_ir_status gr_add(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_ir_status st = TF_IR_OK;
    if (gr_wants(g, n, 0)) st = give(g, n, 0, dy);
    if (!st && gr_wants(g, n, 1)) st = give(g, n, 1, dy);
    return st;
}

static tf_ir_status gr_sub(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_ir_status st = TF_IR_OK;
    if (gr_wants(g, n, 0)) st = give(g, n, 0, dy);
    if (!st && gr_wants(g, n, 1)) st = give(g, n, 1, gb1(g, n, TF_OP_NEG, "db", dy));
    return st;
}

static tf_ir_status gr_mul(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_ir_status st = TF_IR_OK;
    if (gr_wants(g, n, 0)) st = give(g, n, 0, gb2(g, n, TF_OP_MUL, "da", dy, n->in[1]));
    if (!st && gr_wants(g, n, 1)) st = give(g, n, 1, gb2(g, n, TF_OP_MUL, "db", dy, n->in[0]));
    return st;
}

static tf_ir_status gr_div(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    /* y = a / b: da = dy / b, db = -dy y / b */
    tf_ir_status st = TF_IR_OK;
    if (gr_wants(g, n, 0)) st = give(g, n, 0, gb2(g, n, TF_OP_DIV, "da", dy, n->in[1]));
    if (!st && gr_wants(g, n, 1)) {
        tf_value *t = gb2(g, n, TF_OP_DIV, "ydivb", gb2(g, n, TF_OP_MUL, "dyy", dy, Y(n)), n->in[1]);
        st = give(g, n, 1, gb1(g, n, TF_OP_NEG, "db", t));
    }
    return st;
}

static tf_ir_status gr_pow(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    /* y = a^b: da = dy b a^(b-1), db = dy y log(a) */
    tf_ir_status st = TF_IR_OK;
    tf_value *a = n->in[0], *b = n->in[1];
    if (gr_wants(g, n, 0)) {
        /* b - 1 in a's dtype: a literal exponent folds (gnum's constants are
         * f32, and pow(bf16, f32) is ill-typed) */
        tf_value *bm1 = b->kind == TF_VAL_CONST ? tf_const(gr_module(g), b->cval - 1, a->type.dtype)
                                                : gb2(g, n, TF_OP_SUB, "bm1", b, gnum(g, 1));
        if (!bm1) return tf_diag_error(gr_diag(g), TF_IR_ERR_OOM, &n->loc, "out of memory in autodiff");
        tf_value *p = gb2(g, n, TF_OP_POW, "pow_bm1", a, bm1);
        st = give(g, n, 0, gb2(g, n, TF_OP_MUL, "da", dy, gb2(g, n, TF_OP_MUL, "slope", b, p)));
    }
    if (!st && gr_wants(g, n, 1)) {
        tf_value *l = gb2(g, n, TF_OP_MUL, "ylog", Y(n), gb1(g, n, TF_OP_LOG, "loga", a));
        st = give(g, n, 1, gb2(g, n, TF_OP_MUL, "db", dy, l));
    }
    return st;
}

/* maximum/minimum: the winner takes dy; a tie splits it evenly (PyTorch). */
static tf_ir_status minmax(tf_grad_ctx *g, const tf_node *n, tf_value *dy, int win_op)
{
    tf_ir_status st = TF_IR_OK;
    tf_value *half = gb2(g, n, TF_OP_MUL, "half", dy, gnum(g, 0.5));
    tf_value *tie = gb2(g, n, TF_OP_EQ, "tie", n->in[0], n->in[1]);
    for (int k = 0; k < 2 && !st; k++) {
        if (!gr_wants(g, n, k)) continue;
        tf_value *wins = gb2(g, n, win_op, k ? "b_wins" : "a_wins", n->in[k], n->in[1 - k]);
        tf_value *t = zeros_like_select(g, n, k ? "tie_b" : "tie_a", tie, half, true);
        tf_value *w[3] = {wins, dy, t};
        st = give(g, n, k, gb(g, n, TF_OP_WHERE, k ? "db" : "da", w, 3, NULL, 0));
    }
    return st;
}
static tf_ir_status gr_maximum(tf_grad_ctx *g, const tf_node *n, tf_value *dy) { return minmax(g, n, dy, TF_OP_GT); }
static tf_ir_status gr_minimum(tf_grad_ctx *g, const tf_node *n, tf_value *dy) { return minmax(g, n, dy, TF_OP_LT); }

static tf_ir_status gr_where(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_ir_status st = TF_IR_OK;
    if (gr_wants(g, n, 1)) st = give(g, n, 1, zeros_like_select(g, n, "da", n->in[0], dy, true));
    if (!st && gr_wants(g, n, 2)) st = give(g, n, 2, zeros_like_select(g, n, "db", n->in[0], dy, false));
    return st;
}

static tf_ir_status gr_cast(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_named_attr a = {"to", tf_attr_dtype(X(n)->type.dtype)};
    return give(g, n, 0, gb(g, n, TF_OP_CAST, "dx", &dy, 1, &a, 1));
}

/* y = mean over ranks of x: every rank's x reaches every rank's y with
 * weight 1/N, so x's gradient is the mean of the ranks' dy (the whole
 * job's loss is the ranks' losses summed; data_parallel's mean of the
 * gradients makes it their mean). The same bucket as the forward one. */
static tf_ir_status gr_allreduce(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_named_attr a = {"bucket", tf_attr_int(tf_node_int(n, "bucket"))};
    return give(g, n, 0, gb(g, n, TF_OP_ALLREDUCE, "dx", &dy, 1, &a, 1));
}

/* dy of a reduction, with the reduced axes back as size 1. */
static tf_value *keepdims_dy(tf_grad_ctx *g, const tf_node *n, tf_value *dy, unsigned *mask)
{
    const tf_type *x = &X(n)->type;
    const tf_attr *axes = tf_node_attr_named(n, "axes");
    *mask = 0;
    if (axes->u.ints.n == 0) *mask = (1u << x->rank) - 1;
    for (int i = 0; i < axes->u.ints.n; i++) {
        int ax;
        if (tf_axis_norm(axes->u.ints.v[i].v, x->rank, &ax)) *mask |= 1u << ax;
    }
    if (tf_node_bool(n, "keepdims")) return dy;
    int64_t shape[TF_MAX_RANK];
    for (int i = 0; i < x->rank; i++) shape[i] = (*mask >> i) & 1 ? 1 : x->dims[i].n;
    tf_named_attr a = {"shape", tf_attr_ints(gr_module(g), shape, x->rank)};
    return gb(g, n, TF_OP_RESHAPE, "dy_keep", &dy, 1, &a, 1);
}

static tf_value *broadcast_to_x(tf_grad_ctx *g, const tf_node *n, const char *hint, tf_value *v)
{
    const tf_type *x = &X(n)->type;
    int64_t shape[TF_MAX_RANK];
    for (int i = 0; i < x->rank; i++) shape[i] = x->dims[i].n;
    tf_named_attr a = {"shape", tf_attr_ints(gr_module(g), shape, x->rank)};
    return gb(g, n, TF_OP_BROADCAST, hint, &v, 1, &a, 1);
}

static tf_ir_status gr_reduce_sum(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    unsigned mask;
    tf_value *k = keepdims_dy(g, n, dy, &mask);
    return give(g, n, 0, broadcast_to_x(g, n, "dx", k));
}

static tf_ir_status gr_reduce_mean(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    unsigned mask;
    tf_value *k = keepdims_dy(g, n, dy, &mask);
    double cnt = 1;
    for (int i = 0; i < X(n)->type.rank; i++)
        if ((mask >> i) & 1) cnt *= (double)X(n)->type.dims[i].n;
    return give(g, n, 0, broadcast_to_x(g, n, "dx", gb2(g, n, TF_OP_DIV, "dy_mean", k, gnum(g, cnt))));
}

static tf_ir_status gr_reduce_max(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    /* the maxima share dy evenly */
    unsigned mask;
    tf_value *k = keepdims_dy(g, n, dy, &mask);
    tf_value *yk = Y(n);
    if (!tf_node_bool(n, "keepdims")) {
        const tf_type *x = &X(n)->type;
        int64_t shape[TF_MAX_RANK];
        for (int i = 0; i < x->rank; i++) shape[i] = (mask >> i) & 1 ? 1 : x->dims[i].n;
        tf_named_attr a = {"shape", tf_attr_ints(gr_module(g), shape, x->rank)};
        yk = gb(g, n, TF_OP_RESHAPE, "y_keep", &yk, 1, &a, 1);
    }
    tf_value *hit = gb2(g, n, TF_OP_EQ, "is_max", X(n), yk);
    tf_named_attr to = {"to", tf_attr_dtype(X(n)->type.dtype)};
    tf_value *hitf = gb(g, n, TF_OP_CAST, "is_max_f", &hit, 1, &to, 1);
    int64_t axes[TF_MAX_RANK];
    int na = 0;
    for (int i = 0; i < X(n)->type.rank; i++)
        if ((mask >> i) & 1) axes[na++] = i;
    tf_named_attr ra[2] = {{"axes", tf_attr_ints(gr_module(g), axes, na)}, {"keepdims", tf_attr_bool(true)}};
    tf_value *cnt = gb(g, n, TF_OP_REDUCE_SUM, "count", &hitf, 1, ra, 2);
    tf_value *share = gb2(g, n, TF_OP_DIV, "share", k, cnt);
    return give(g, n, 0, gb2(g, n, TF_OP_MUL, "dx", hitf, share));
}

static tf_ir_status gr_matmul(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    bool ta = tf_node_bool(n, "transpose_a"), tb = tf_node_bool(n, "transpose_b");
    tf_value *a = n->in[0], *b = n->in[1];
    tf_ir_status st = TF_IR_OK;
    /* out = op(a) op(b); each case keeps the stored layout of a and b */
    if (gr_wants(g, n, 0)) {
        tf_value *in[2];
        tf_named_attr at[2] = {{"transpose_a", tf_attr_bool(false)}, {"transpose_b", tf_attr_bool(false)}};
        if (!ta) { in[0] = dy; in[1] = b; at[1].attr.u.b = !tb; }                    /* dy op(b)^T */
        else { in[0] = b; in[1] = dy; at[0].attr.u.b = tb; at[1].attr.u.b = true; }   /* op(b) dy^T */
        st = give(g, n, 0, gb(g, n, TF_OP_MATMUL, "da", in, 2, at, 2));
    }
    if (!st && gr_wants(g, n, 1)) {
        tf_value *in[2];
        tf_named_attr at[2] = {{"transpose_a", tf_attr_bool(false)}, {"transpose_b", tf_attr_bool(false)}};
        if (b->type.rank == 2 && a->type.rank > 2 && !ta) {
            /* a weight shared across batch axes (linear on [B, T, in]): fold
             * the batch axes into rows, one [K, N] product instead of a
             * [B, K, N] one summed afterwards */
            int64_t rows = tf_type_numel(&a->type) / a->type.dims[a->type.rank - 1].n;
            int64_t as[2] = {rows, a->type.dims[a->type.rank - 1].n}, ds[2] = {rows, dy->type.dims[dy->type.rank - 1].n};
            tf_named_attr ra = {"shape", tf_attr_ints(gr_module(g), as, 2)}, rd = {"shape", tf_attr_ints(gr_module(g), ds, 2)};
            tf_value *a2 = gb(g, n, TF_OP_RESHAPE, "a_rows", &a, 1, &ra, 1);
            tf_value *d2 = gb(g, n, TF_OP_RESHAPE, "dy_rows", &dy, 1, &rd, 1);
            if (!tb) { in[0] = a2; in[1] = d2; at[0].attr.u.b = true; }               /* a^T dy */
            else { in[0] = d2; in[1] = a2; at[0].attr.u.b = true; }                    /* dy^T a */
        } else if (!tb) { in[0] = a; in[1] = dy; at[0].attr.u.b = !ta; }            /* op(a)^T dy */
        else { in[0] = dy; in[1] = a; at[0].attr.u.b = true; at[1].attr.u.b = ta; }   /* dy^T op(a) */
        st = give(g, n, 1, gb(g, n, TF_OP_MATMUL, "db", in, 2, at, 2));
    }
    return st;
}

/* The forward op's attributes as set by the user, plus `shape`. */
static int copy_attrs(tf_grad_ctx *g, const tf_node *n, int to_op, tf_named_attr *out, const tf_type *shape)
{
    const tf_op_info *oi = tf_op_info_of(n->op);
    int na = 0;
    for (int i = 0; i < oi->nattrs; i++)
        if (n->attrs[i].set && tf_op_attr_index(to_op, oi->attrs[i].name) >= 0)
            out[na++] = (tf_named_attr){oi->attrs[i].name, n->attrs[i]};
    if (shape) {
        int64_t s[TF_MAX_RANK];
        for (int i = 0; i < shape->rank; i++) s[i] = shape->dims[i].n;
        out[na++] = (tf_named_attr){"shape", tf_attr_ints(gr_module(g), s, shape->rank)};
    }
    return na;
}

static tf_ir_status gr_conv2d(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_named_attr a[8];
    tf_ir_status st = TF_IR_OK;
    if (gr_wants(g, n, 0)) {
        int na = copy_attrs(g, n, TF_OP_CONV2D_GRAD_INPUT, a, &n->in[0]->type);
        tf_value *in[2] = {dy, n->in[1]};
        st = give(g, n, 0, gb(g, n, TF_OP_CONV2D_GRAD_INPUT, "dx", in, 2, a, na));
    }
    if (!st && gr_wants(g, n, 1)) {
        int na = copy_attrs(g, n, TF_OP_CONV2D_GRAD_WEIGHT, a, &n->in[1]->type);
        tf_value *in[2] = {n->in[0], dy};
        st = give(g, n, 1, gb(g, n, TF_OP_CONV2D_GRAD_WEIGHT, "dw", in, 2, a, na));
    }
    return st;
}

/* conv2d_grad_input is also the transposed convolution (PyTorch's
 * conv_transpose2d): z = G(u, w) is linear in each operand, and its adjoint in
 * u is the forward conv2d, in w the weight gradient with u as dy. */
static tf_ir_status gr_conv2d_grad_input(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_named_attr a[8];
    tf_ir_status st = TF_IR_OK;
    if (gr_wants(g, n, 0)) {
        int na = copy_attrs(g, n, TF_OP_CONV2D, a, NULL);
        tf_value *in[2] = {dy, n->in[1]};
        st = give(g, n, 0, gb(g, n, TF_OP_CONV2D, "du", in, 2, a, na));
    }
    if (!st && gr_wants(g, n, 1)) {
        int na = copy_attrs(g, n, TF_OP_CONV2D_GRAD_WEIGHT, a, NULL);
        for (int i = 0; i < na; i++)   /* the weight's shape, not the result's */
            if (!strcmp(a[i].name, "shape")) na = i;
        const tf_type *wt = &n->in[1]->type;
        int64_t s[TF_MAX_RANK];
        for (int i = 0; i < wt->rank; i++) s[i] = wt->dims[i].n;
        a[na++] = (tf_named_attr){"shape", tf_attr_ints(gr_module(g), s, wt->rank)};
        tf_value *in[2] = {dy, n->in[0]};
        st = give(g, n, 1, gb(g, n, TF_OP_CONV2D_GRAD_WEIGHT, "dw", in, 2, a, na));
    }
    return st;
}

static tf_ir_status gr_maxpool2d(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_named_attr a[8];
    int na = copy_attrs(g, n, TF_OP_MAXPOOL2D_GRAD, a, NULL);
    tf_value *in[2] = {X(n), dy};
    return give(g, n, 0, gb(g, n, TF_OP_MAXPOOL2D_GRAD, "dx", in, 2, a, na));
}

static tf_ir_status gr_avgpool2d(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_named_attr a[8];
    int na = copy_attrs(g, n, TF_OP_AVGPOOL2D_GRAD, a, &X(n)->type);
    return give(g, n, 0, gb(g, n, TF_OP_AVGPOOL2D_GRAD, "dx", &dy, 1, a, na));
}

static tf_ir_status gr_reshape(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_named_attr a[1];
    const tf_type *x = &X(n)->type;
    int64_t s[TF_MAX_RANK];
    for (int i = 0; i < x->rank; i++) s[i] = x->dims[i].n;
    a[0] = (tf_named_attr){"shape", tf_attr_ints(gr_module(g), s, x->rank)};
    return give(g, n, 0, gb(g, n, TF_OP_RESHAPE, "dx", &dy, 1, a, 1));
}

static tf_ir_status gr_transpose(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    const tf_attr *p = tf_node_attr_named(n, "perm");
    int64_t inv[TF_MAX_RANK];
    for (int i = 0; i < p->u.ints.n; i++) inv[p->u.ints.v[i].v] = i;
    tf_named_attr a = {"perm", tf_attr_ints(gr_module(g), inv, p->u.ints.n)};
    return give(g, n, 0, gb(g, n, TF_OP_TRANSPOSE, "dx", &dy, 1, &a, 1));
}

static tf_ir_status gr_broadcast(tf_grad_ctx *g, const tf_node *n, tf_value *dy) { return give(g, n, 0, dy); }

static tf_ir_status gr_slice(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_named_attr a[8];
    int na = copy_attrs(g, n, TF_OP_SLICE_GRAD, a, NULL);
    int ax;
    tf_axis_norm(tf_node_int(n, "axis"), X(n)->type.rank, &ax);
    a[na++] = (tf_named_attr){"size", tf_attr_int(X(n)->type.dims[ax].n)};
    /* slice_grad requires axis/start/end even when the forward op left them at defaults */
    static const char *req[] = {"axis", "start", "end"};
    for (int r = 0; r < 3; r++) {
        bool have = false;
        for (int i = 0; i < na; i++) have |= !strcmp(a[i].name, req[r]);
        if (!have) a[na++] = (tf_named_attr){req[r], tf_attr_int(tf_node_int(n, req[r]))};
    }
    return give(g, n, 0, gb(g, n, TF_OP_SLICE_GRAD, "dx", &dy, 1, a, na));
}

static tf_ir_status gr_concat(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    int ax;
    tf_axis_norm(tf_node_int(n, "axis"), Y(n)->type.rank, &ax);
    int64_t off = 0;
    tf_ir_status st = TF_IR_OK;
    for (int k = 0; k < n->nin && !st; k++) {
        int64_t len = n->in[k]->type.dims[ax].n;
        if (gr_wants(g, n, k)) {
            tf_named_attr a[3] = {{"axis", tf_attr_int(ax)}, {"start", tf_attr_int(off)}, {"end", tf_attr_int(off + len)}};
            st = give(g, n, k, gb(g, n, TF_OP_SLICE, "dpart", &dy, 1, a, 3));
        }
        off += len;
    }
    return st;
}

static tf_ir_status gr_gather(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    if (!gr_wants(g, n, 1)) return TF_IR_OK;
    tf_named_attr a[1];
    const tf_type *t = &n->in[1]->type;
    int64_t s[TF_MAX_RANK];
    for (int i = 0; i < t->rank; i++) s[i] = t->dims[i].n;
    a[0] = (tf_named_attr){"shape", tf_attr_ints(gr_module(g), s, t->rank)};
    int64_t pad = tf_node_int(n, "padding_idx");
    if (pad >= 0) {   /* the padding row gets nothing: zero the gradient of every id equal to it */
        const tf_type *ids = &n->in[0]->type;
        tf_value *padv = tf_const(gr_module(g), (double)pad, ids->dtype);
        if (!padv) return tf_diag_error(gr_diag(g), TF_IR_ERR_OOM, &n->loc, "out of memory in autodiff");
        tf_value *ne_in[2] = {n->in[0], padv};
        tf_value *keep = gb(g, n, TF_OP_NE, "not_padding", ne_in, 2, NULL, 0);
        int64_t ks[TF_MAX_RANK];
        for (int i = 0; i < dy->type.rank; i++) ks[i] = i < ids->rank ? ids->dims[i].n : 1;
        tf_named_attr r = {"shape", tf_attr_ints(gr_module(g), ks, dy->type.rank)};
        if (keep && dy->type.rank > ids->rank) keep = gb(g, n, TF_OP_RESHAPE, "not_padding_b", &keep, 1, &r, 1);
        tf_value *w[3] = {keep, dy, gnum(g, 0)};
        dy = gb(g, n, TF_OP_WHERE, "dkept", w, 3, NULL, 0);
    }
    tf_value *in[2] = {n->in[0], dy};
    return give(g, n, 1, gb(g, n, TF_OP_SCATTER_ADD, "dtable", in, 2, a, 1));
}

/* One kernel gives dq, dk and dv, flattened one after another (ir/attention.c);
 * each is sliced out, reshaped and cast back to its operand's dtype. A forward
 * without the log-sum-exp column (a flash_attention written by hand) is run
 * once more with it. */
static tf_ir_status gr_flash_attention(tf_grad_ctx *g, const tf_node *n, tf_value *dy)
{
    tf_attn_geom ag;
    tf_attn_geom_of(n, &ag);
    if (ag.mask >= 0 && gr_wants(g, n, ag.mask))
        return tf_diag_error(gr_diag(g), TF_IR_ERR_VERIFY, &n->loc,
                             "flash_attention gives its mask no gradient, and '%s' needs one (it depends on a param): "
                             "write `attention`, which tfuse keeps decomposed when its mask is learned",
                             n->in[ag.mask]->name);
    tf_named_attr a[8];
    int na = copy_attrs(g, n, TF_OP_FLASH_ATTENTION_GRAD, a, NULL);
    tf_value *out = n->out;
    if (!ag.lse) {
        tf_named_attr b[8];
        int nb = copy_attrs(g, n, TF_OP_FLASH_ATTENTION, b, NULL);
        b[nb++] = (tf_named_attr){"lse", tf_attr_bool(true)};
        if (!(out = gb(g, n, TF_OP_FLASH_ATTENTION, "with_lse", n->in, n->nin, b, nb))) return give(g, n, 0, NULL);
    }
    tf_value *in[6] = {n->in[0], n->in[1], n->in[2], out, dy, ag.mask >= 0 ? n->in[ag.mask] : NULL};
    tf_value *r = gb(g, n, TF_OP_FLASH_ATTENTION_GRAD, "dqkv", in, ag.mask >= 0 ? 6 : 5, a, na);
    if (!r) return give(g, n, 0, NULL);
    int64_t off = 0;
    static const char *hint[3] = {"dq", "dk", "dv"};
    for (int k = 0; k < 3; k++) {
        const tf_type *t = &n->in[k]->type;
        int64_t len = tf_type_numel(t), s[TF_MAX_RANK];
        if (gr_wants(g, n, k)) {
            tf_named_attr sl[3] = {{"axis", tf_attr_int(0)}, {"start", tf_attr_int(off)}, {"end", tf_attr_int(off + len)}};
            tf_value *c = gb(g, n, TF_OP_SLICE, hint[k], &r, 1, sl, 3);
            for (int i = 0; i < t->rank; i++) s[i] = t->dims[i].n;
            tf_named_attr sh = {"shape", tf_attr_ints(gr_module(g), s, t->rank)};
            if (c) c = gb(g, n, TF_OP_RESHAPE, hint[k], &c, 1, &sh, 1);
            if (c && t->dtype != r->type.dtype) {
                tf_named_attr to = {"to", tf_attr_dtype(t->dtype)};
                c = gb(g, n, TF_OP_CAST, hint[k], &c, 1, &to, 1);
            }
            tf_ir_status st = give(g, n, k, c);
            if (st) return st;
        }
        off += len;
    }
    return TF_IR_OK;
}

/* The ops without a rule, and why (ops.def's GRAD column names none_<why>). */
#define gr_none_layer NULL
#define gr_none_bool NULL
#define gr_none_index NULL
#define gr_none_generator NULL
#define gr_none_random NULL
#define gr_none_backward NULL
static const struct { const char *name, *why; } no_rule[] = {
    {"none_layer", "a layer op, lowered into core ops before autodiff"},
    {"none_bool", "its result is boolean: nothing flows back through it"},
    {"none_index", "its operand is an integer index"},
    {"none_generator", "it has no operands"},
    {"none_random", "its operand gives only the shape of the random mask"},
    {"none_backward", "a gradient op itself: tfuse takes no second derivatives"},
};

static const tf_grad_fn rules[TF_OP_COUNT] = {
#define TF_OP(E, NAME, MIN, MAX, KIND, EXEC, FLAGS, ATTRS, SHAPE, INTERP, SCALAR, LOWER, AMP, GRAD) [TF_OP_##E] = gr_##GRAD,
#include "ops.def"
#undef TF_OP
};

static const char *const rule_names[TF_OP_COUNT] = {
#define TF_OP(E, NAME, MIN, MAX, KIND, EXEC, FLAGS, ATTRS, SHAPE, INTERP, SCALAR, LOWER, AMP, GRAD) [TF_OP_##E] = #GRAD,
#include "ops.def"
#undef TF_OP
};

tf_grad_fn tf_grad_rule(int op) { return (unsigned)op < TF_OP_COUNT ? rules[op] : NULL; }

const char *tf_grad_none_reason(int op)
{
    if ((unsigned)op >= TF_OP_COUNT || rules[op]) return NULL;
    for (size_t i = 0; i < sizeof no_rule / sizeof *no_rule; i++)
        if (!strcmp(rule_names[op], no_rule[i].name)) return no_rule[i].why;
    return NULL;
}
