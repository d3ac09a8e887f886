/* lower.c — rewrite layer ops into core ops.
 *
 * Each layer op becomes the core-op graph that computes the same thing, so
 * every backend only needs core ops and fusion sees every pointwise step.
 * The last op of a rewrite takes the layer op's name (`h = linear(...)`
 * becomes `... h = add(h.mm, b1)`), intermediates are named after it, and
 * nothing else in the module changes. Behaviour that depends on the mode is
 * decided here: batchnorm uses batch statistics and updates its running
 * buffers in train mode, running statistics in infer mode; dropout is a
 * random mask in train mode and disappears in infer mode.
 *
 * Losses and normalization statistics are computed in fp32 even for fp16/
 * bf16 inputs (the op table's policy); the interpreter's layer kernels agree
 * because every result is rounded only to its own dtype. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct lw {
    tf_module *m;
    const tf_options *o;
    tf_diag *d;
    const tf_node *n;       /* the layer op being rewritten */
    const char *base;       /* its result's name */
    const char *final_hint; /* non-NULL: the last op is base.final_hint (a cast takes base) */
    bool failed;
} lw;

/* Build one core op; names are base.hint. Failure sticks in l->failed. */
static tf_value *op(lw *l, int opc, const char *hint, int nin, tf_value **in, const tf_named_attr *attrs, int na)
{
    if (l->failed) return NULL;
    char name[512];
    if (!hint) hint = l->final_hint;
    if (hint) snprintf(name, sizeof name, "%s.%s", l->base, hint);
    tf_value *v = tf_build(l->m, l->d, opc, in, nin, attrs, na, hint ? name : l->base, &l->n->loc);
    if (!v) l->failed = true;
    return v;
}

static tf_value *op1(lw *l, int opc, const char *hint, tf_value *a) { return op(l, opc, hint, 1, &a, NULL, 0); }
static tf_value *op2(lw *l, int opc, const char *hint, tf_value *a, tf_value *b)
{
    tf_value *in[2] = {a, b};
    return op(l, opc, hint, 2, in, NULL, 0);
}
static tf_value *num_of(lw *l, double v, tf_dt dt)
{
    if (l->failed) return NULL;
    tf_value *c = tf_const(l->m, v, dt);
    if (!c) {
        tf_diag_error(l->d, TF_IR_ERR_OOM, &l->n->loc, "out of memory");
        l->failed = true;
    }
    return c;
}
static tf_value *num(lw *l, double v) { return num_of(l, v, TF_DT_F32); }

static tf_value *reduce(lw *l, int opc, const char *hint, tf_value *x, const int64_t *axes, int naxes, bool keep)
{
    if (l->failed) return NULL;
    tf_named_attr a[2] = {{"axes", tf_attr_ints(l->m, axes, naxes)}, {"keepdims", tf_attr_bool(keep)}};
    return op(l, opc, hint, 1, &x, a, 2);
}

static tf_value *reshape(lw *l, const char *hint, tf_value *x, const tf_dim *dims, int rank)
{
    if (l->failed) return NULL;
    int64_t v[TF_MAX_RANK] = {0};
    for (int i = 0; i < rank; i++) v[i] = dims[i].n;
    tf_named_attr a = {"shape", tf_attr_ints(l->m, v, rank)};
    if (a.attr.kind == TF_ATTR_NONE) {
        l->failed = true;
        tf_diag_error(l->d, TF_IR_ERR_OOM, &l->n->loc, "out of memory");
        return NULL;
    }
    for (int i = 0; i < rank; i++) a.attr.u.ints.v[i].sym = dims[i].sym;
    return op(l, TF_OP_RESHAPE, hint, 1, &x, &a, 1);
}

static bool is_half(const tf_value *v) { return v->type.dtype == TF_DT_F16 || v->type.dtype == TF_DT_BF16; }

static tf_value *cast_to(lw *l, const char *hint, tf_value *x, tf_dt dt)
{
    if (!x || x->type.dtype == dt) return x;
    tf_named_attr a = {"to", tf_attr_dtype(dt)};
    return op(l, TF_OP_CAST, hint, 1, &x, &a, 1);
}

/* softmax / log_softmax along one axis, max-subtracted. */
static tf_value *softmax(lw *l, tf_value *x, int64_t axis, bool log_, const char *final)
{
    tf_value *mx = reduce(l, TF_OP_REDUCE_MAX, "max", x, &axis, 1, true);
    tf_value *xm = op2(l, TF_OP_SUB, "shifted", x, mx);
    tf_value *e = op1(l, TF_OP_EXP, "exp", xm);
    tf_value *s = reduce(l, TF_OP_REDUCE_SUM, "sum", e, &axis, 1, true);
    if (log_) return op2(l, TF_OP_SUB, final, xm, op1(l, TF_OP_LOG, "logsum", s));
    return op2(l, TF_OP_DIV, final, e, s);
}

static tf_value *lower_batchnorm(lw *l, tf_value **in)
{
    tf_value *x = in[0], *g = in[1], *b = in[2], *rm = in[3], *rv = in[4];
    const tf_node *n = l->n;
    tf_value *bufs[2] = {n->in[3], n->in[4]};   /* in[] may be their fp32 casts */
    double mom = tf_node_float(n, "momentum"), eps = tf_node_float(n, "eps");
    int rank = x->type.rank;
    tf_dim bshape[TF_MAX_RANK], cshape[1] = {x->type.dims[1]};
    int64_t axes[TF_MAX_RANK];
    int na = 0;
    for (int i = 0; i < rank; i++) {
        bshape[i] = i == 1 ? x->type.dims[1] : (tf_dim){1, -1};
        if (i != 1) axes[na++] = i;
    }
    if (l->o->mode == TF_IR_INFER) {
        tf_value *inv = op1(l, TF_OP_RSQRT, "inv_std", op2(l, TF_OP_ADD, "var_eps", rv, num(l, eps)));
        tf_value *scale = op2(l, TF_OP_MUL, "scale", g, inv);
        tf_value *shift = op2(l, TF_OP_SUB, "shift", b, op2(l, TF_OP_MUL, "mean_scaled", rm, scale));
        tf_value *y = op2(l, TF_OP_MUL, "scaled", x, reshape(l, "scale_b", scale, bshape, rank));
        return op2(l, TF_OP_ADD, NULL, y, reshape(l, "shift_b", shift, bshape, rank));
    }
    tf_value *gr = reshape(l, "gamma", g, bshape, rank), *br = reshape(l, "beta", b, bshape, rank);
    tf_value *mu = reduce(l, TF_OP_REDUCE_MEAN, "mean", x, axes, na, true);
    /* synchronized (data parallel): every rank's batch has the same size, so the mean over the ranks of
     * their means is the global batch's mean, and likewise for the mean squared distance from it; each
     * averaged at once (bucket -1), since the next op reads it */
    bool sync = l->o->sync_batchnorm && l->o->data_parallel;
    tf_named_attr alone = {"bucket", tf_attr_int(-1)};
    if (sync) mu = op(l, TF_OP_ALLREDUCE, "mean_ranks", 1, &mu, &alone, 1);
    tf_value *xc = op2(l, TF_OP_SUB, "centered", x, mu);
    tf_value *var = reduce(l, TF_OP_REDUCE_MEAN, "var", op2(l, TF_OP_MUL, "sq", xc, xc), axes, na, true);
    if (sync) var = op(l, TF_OP_ALLREDUCE, "var_ranks", 1, &var, &alone, 1);
    tf_value *inv = op1(l, TF_OP_RSQRT, "inv_std", op2(l, TF_OP_ADD, "var_eps", var, num(l, eps)));
    tf_value *y = op2(l, TF_OP_ADD, NULL, op2(l, TF_OP_MUL, "scaled", op2(l, TF_OP_MUL, "normed", xc, inv), gr), br);
    /* running statistics: PyTorch's update, unbiased variance (synchronized: unbiased with the rank's
     * count, cnt / (cnt - 1), where PyTorch's SyncBatchNorm takes the global batch's: the number of ranks is
     * not known when compiling; the two differ by less than 1 / cnt) */
    double cnt = (double)(tf_type_numel(&x->type) / x->type.dims[1].n);
    double unbias = cnt > 1 ? cnt / (cnt - 1) : 1.0;
    bool narrow = rm != bufs[0];   /* statistics in fp32, stored in the buffers' dtype */
    tf_value *rm_new = op2(l, TF_OP_ADD, narrow ? "running_mean.f32" : "running_mean",
                           op2(l, TF_OP_MUL, "rm_keep", rm, num(l, 1 - mom)),
                           op2(l, TF_OP_MUL, "rm_take", reshape(l, "mean_c", mu, cshape, 1), num(l, mom)));
    tf_value *rv_new = op2(l, TF_OP_ADD, narrow ? "running_var.f32" : "running_var",
                           op2(l, TF_OP_MUL, "rv_keep", rv, num(l, 1 - mom)),
                           op2(l, TF_OP_MUL, "rv_take", reshape(l, "var_c", var, cshape, 1), num(l, mom * unbias)));
    tf_value *vals[2] = {cast_to(l, "running_mean", rm_new, bufs[0]->type.dtype),
                         cast_to(l, "running_var", rv_new, bufs[1]->type.dtype)};
    if (l->failed) return NULL;
    for (int i = 0; i < 2; i++) {
        if (bufs[i]->kind != TF_VAL_BUFFER) {
            tf_diag_error(l->d, TF_IR_ERR_VERIFY, &n->loc,
                          "batchnorm in train mode updates its running statistics: '%s' must be a buffer, not a %s",
                          bufs[i]->name, bufs[i]->kind == TF_VAL_PARAM ? "param" : "computed value");
            l->failed = true;
            return NULL;
        }
        if (tf_module_add_update(l->m, bufs[i], vals[i], n->loc)) {
            tf_diag_error(l->d, TF_IR_ERR_OOM, &n->loc, "out of memory");
            l->failed = true;
            return NULL;
        }
    }
    return y;
}

/* Whether v is computed from a param (and so may need a gradient). seen
 * marks the values of the module as numbered when the pass began (ids below
 * nseen) that are searched already, so a DAG is walked once; values lower
 * made (id -1) are few, and a search past the budget answers yes. */
static bool from_param(const tf_value *v, unsigned char *seen, int nseen, int *budget)
{
    if (--*budget < 0 || v->kind == TF_VAL_PARAM) return true;
    if (v->kind != TF_VAL_NODE) return false;
    if (v->id >= 0 && v->id < nseen) {
        if (seen[v->id]) return false;
        seen[v->id] = 1;
    }
    for (int k = 0; k < v->def->nin; k++)
        if (from_param(v->def->in[k], seen, nseen, budget)) return true;
    return false;
}

/* Why this attention stays decomposed, or NULL: it becomes flash_attention. */
static const char *attention_decomposed_why(lw *l, tf_value **in)
{
    if (l->o->attention_decomposed) return "--attention=decomposed";
    if (l->n->nin < 4 || l->o->mode != TF_IR_TRAIN || in[3]->type.dtype == TF_DT_BOOL) return NULL;
    int budget = 1 << 20, nseen = l->m->next_id;
    unsigned char *seen = tf_calloc((size_t)(nseen > 0 ? nseen : 1), 1);
    bool learned = !seen || from_param(in[3], seen, nseen, &budget);   /* out of memory: the safe answer */
    tf_free(seen);
    return learned ? "its additive mask is computed from a param and needs a gradient, which the fused kernels do not give"
                   : NULL;
}

/* The fused form: flash_attention, in train mode with the log-sum-exp column
 * the backward reads, O sliced out of it (and cast back from f32). */
static tf_value *attention_fused(lw *l, tf_value **in, const tf_attn_geom *g)
{
    bool train = l->o->mode == TF_IR_TRAIN;
    tf_named_attr a[5];
    int na = 0;
    a[na++] = (tf_named_attr){"scale", tf_attr_float(g->scale)};
    if (g->causal) a[na++] = (tf_named_attr){"causal", tf_attr_bool(true)};
    if (train && g->dropout > 0) {
        a[na++] = (tf_named_attr){"dropout", tf_attr_float(g->dropout)};
        a[na++] = (tf_named_attr){"salt", tf_attr_int((int64_t)g->salt)};
    }
    if (train) a[na++] = (tf_named_attr){"lse", tf_attr_bool(true)};
    tf_value *r = op(l, TF_OP_FLASH_ATTENTION, train ? "flash" : NULL, l->n->nin, in, a, na);
    if (!train || !r) return r;
    tf_named_attr sl[3] = {{"axis", tf_attr_int(3)}, {"start", tf_attr_int(0)}, {"end", tf_attr_int(g->Dv)}};
    bool narrow = in[0]->type.dtype != r->type.dtype;
    tf_value *o = op(l, TF_OP_SLICE, narrow ? "out_wide" : NULL, 1, &r, sl, 3);
    return cast_to(l, NULL, o, in[0]->type.dtype);
}

/* The decomposed form: matmul, scale, mask, softmax in fp32, dropout,
 * matmul. Grouped-query heads share a key/value head by viewing q as
 * [B, Hk, G*Tq, D] (views only). With a mask a row may see no key: its
 * max is taken as 0 and its sum as 1, so it comes out 0 as the fused
 * kernel's does (not NaN), and so does its gradient. */
static tf_value *attention_decomposed(lw *l, tf_value **in, const tf_attn_geom *g)
{
    tf_value *q = in[0], *k = in[1], *v = in[2];
    const tf_type *qt = &q->type;
    int64_t G = g->H / g->Hk;
    tf_dim grouped[4] = {qt->dims[0], k->type.dims[1], {G * g->Tq, -1}, qt->dims[3]};
    if (G > 1) q = reshape(l, "q_grouped", q, grouped, 4);
    tf_named_attr tb = {"transpose_b", tf_attr_bool(true)};
    tf_value *qk[2] = {q, k};
    tf_value *s = op(l, TF_OP_MATMUL, "scores", 2, qk, &tb, 1);
    tf_dim full[4] = {qt->dims[0], qt->dims[1], qt->dims[2], k->type.dims[2]};
    if (G > 1) s = reshape(l, "scores_heads", s, full, 4);
    tf_dt sdt = is_half(s) ? TF_DT_F32 : s->type.dtype;   /* the softmax runs in fp32 (f64 for f64) whatever the storage */
    s = cast_to(l, "scores_f32", s, sdt);
    s = op2(l, TF_OP_MUL, "scaled", s, num(l, g->scale));
    if (g->causal) {
        int64_t shape[2] = {g->Tq, g->Tk};
        tf_named_attr rows[2] = {{"shape", tf_attr_ints(l->m, shape, 2)}, {"axis", tf_attr_int(0)}};
        tf_named_attr cols[2] = {{"shape", tf_attr_ints(l->m, shape, 2)}, {"axis", tf_attr_int(1)}};
        tf_value *ri = op(l, TF_OP_IOTA, "row", 0, NULL, rows, 2);
        tf_value *ci = op(l, TF_OP_IOTA, "col", 0, NULL, cols, 2);
        tf_value *w[3] = {op2(l, TF_OP_LE, "causal", ci, ri), s, num(l, -INFINITY)};
        s = op(l, TF_OP_WHERE, "masked", 3, w, NULL, 0);
    }
    tf_value *p;
    int64_t last = -1;
    if (g->mask >= 0) {
        if (g->mask_bool) {
            tf_value *w[3] = {in[3], s, num(l, -INFINITY)};
            s = op(l, TF_OP_WHERE, "mask", 3, w, NULL, 0);
        } else {
            s = op2(l, TF_OP_ADD, "mask", s, cast_to(l, "mask_f32", in[3], sdt));
        }
        tf_value *mx = reduce(l, TF_OP_REDUCE_MAX, "max", s, &last, 1, true);
        tf_value *empty = op2(l, TF_OP_EQ, "empty", mx, num(l, -INFINITY));
        tf_value *w[3] = {empty, num(l, 0), mx};
        tf_value *e = op1(l, TF_OP_EXP, "exp", op2(l, TF_OP_SUB, "shifted", s, op(l, TF_OP_WHERE, "max_safe", 3, w, NULL, 0)));
        tf_value *sum = reduce(l, TF_OP_REDUCE_SUM, "sum", e, &last, 1, true);
        tf_value *z[3] = {empty, num(l, 1), sum};
        p = op2(l, TF_OP_DIV, "probs_f32", e, op(l, TF_OP_WHERE, "sum_safe", 3, z, NULL, 0));
    } else {
        p = softmax(l, s, -1, false, "probs_f32");
    }
    if (l->o->mode == TF_IR_TRAIN && g->dropout > 0) {
        tf_named_attr a[2] = {{"p", tf_attr_float(g->dropout)}, {"salt", tf_attr_int((int64_t)g->salt)}};
        p = op2(l, TF_OP_MUL, "dropped", p, op(l, TF_OP_DROPOUT_MASK, "drop_mask", 1, &p, a, 2));
    }
    p = cast_to(l, "probs", p, v->type.dtype);
    tf_dim pg[4] = {qt->dims[0], k->type.dims[1], {G * g->Tq, -1}, k->type.dims[2]};
    if (G > 1) p = reshape(l, "probs_grouped", p, pg, 4);
    tf_value *pv[2] = {p, v};
    if (G == 1) return op(l, TF_OP_MATMUL, NULL, 2, pv, NULL, 0);
    tf_dim od[4] = {qt->dims[0], qt->dims[1], qt->dims[2], v->type.dims[3]};
    return reshape(l, NULL, op(l, TF_OP_MATMUL, "out_grouped", 2, pv, NULL, 0), od, 4);
}

static tf_value *lower_attention(lw *l, tf_value **in)
{
    tf_attn_geom g;
    tf_attn_geom_of(l->n, &g);
    const char *why = attention_decomposed_why(l, in);
    char shape[160];
    snprintf(shape, sizeof shape, "B=%lld H=%lld Hk=%lld Tq=%lld Tk=%lld D=%lld Dv=%lld%s%s%s", (long long)g.B,
             (long long)g.H, (long long)g.Hk, (long long)g.Tq, (long long)g.Tk, (long long)g.D, (long long)g.Dv,
             g.causal ? ", causal" : "", g.mask < 0 ? "" : g.mask_bool ? ", bool mask" : ", additive mask",
             g.dropout > 0 && l->o->mode == TF_IR_TRAIN ? ", dropout" : "");
    if (why) {
        tf_explain(l->o, "lower", &l->n->loc, "attention %s (%s): decomposed into matmul, softmax, matmul: %s", l->base,
                   shape, why);
        return attention_decomposed(l, in, &g);
    }
    tf_explain(l->o, "lower", &l->n->loc, "attention %s (%s): fused, one flash_attention kernel%s (no [Tq, Tk] tensor)",
               l->base, shape, l->o->mode == TF_IR_TRAIN ? " and one flash_attention_grad in the backward pass" : "");
    return attention_fused(l, in, &g);
}

/* -log p[label] per row, log p from a max-shifted log_softmax. The label is
 * picked with a select, not a product with a one-hot: -inf * 0 would turn
 * an impossible class into NaN. A row labelled ignore_index (PyTorch's: -100
 * by default) contributes 0 and is not counted by the mean, so the mean of
 * a batch with every row ignored is 0/0 = NaN, as in PyTorch; its label is
 * replaced by class 0 before the one-hot, which still refuses every other
 * label out of [0, C). */
static tf_value *lower_cross_entropy(lw *l, tf_value **in)
{
    const tf_node *n = l->n;
    tf_value *x = in[0], *y = in[1];
    int rank = x->type.rank;
    const char *red = tf_node_str(n, "reduction");
    tf_value *ls = softmax(l, x, -1, true, "log_probs");
    tf_value *keep = op2(l, TF_OP_NE, "kept", y, num_of(l, (double)tf_node_int(n, "ignore_index"), y->type.dtype));
    tf_value *sel[3] = {keep, y, num_of(l, 0, y->type.dtype)};
    tf_value *label = op(l, TF_OP_WHERE, "label", 3, sel, NULL, 0);
    tf_named_attr a[2] = {{"depth", tf_attr_int(x->type.dims[rank - 1].n)}, {"dtype", tf_attr_dtype(TF_DT_BOOL)}};
    a[0].attr.u.i.sym = x->type.dims[rank - 1].sym;
    tf_value *oh = op(l, TF_OP_ONE_HOT, "onehot", 1, &label, a, 2);
    tf_value *w[3] = {oh, ls, num(l, 0)};
    int64_t last = -1;
    tf_value *pick = reduce(l, TF_OP_REDUCE_SUM, "picked", op(l, TF_OP_WHERE, "masked", 3, w, NULL, 0), &last, 1, false);
    tf_value *z[3] = {keep, pick, num(l, 0)};
    tf_value *kept = op(l, TF_OP_WHERE, "picked_kept", 3, z, NULL, 0);
    if (!strcmp(red, "none")) return op1(l, TF_OP_NEG, NULL, kept);
    tf_value *total = reduce(l, TF_OP_REDUCE_SUM, "total", kept, NULL, 0, false);
    if (!strcmp(red, "sum")) return op1(l, TF_OP_NEG, NULL, total);
    tf_named_attr f = {"to", tf_attr_dtype(total ? total->type.dtype : TF_DT_F32)};
    tf_value *cnt = reduce(l, TF_OP_REDUCE_SUM, "count", op(l, TF_OP_CAST, "kept_n", 1, &keep, &f, 1), NULL, 0, false);
    return op1(l, TF_OP_NEG, NULL, op2(l, TF_OP_DIV, "mean", total, cnt));
}

static tf_value *lower_node(lw *l, tf_value **in)
{
    const tf_node *n = l->n;
    tf_value *x = in[0];
    int rank = x->type.rank;
    switch (n->op) {
    case TF_OP_LINEAR: {
        bool vec = rank == 1;
        if (vec) {
            tf_dim row[2] = {{1, -1}, x->type.dims[0]};
            x = reshape(l, "row", x, row, 2);
        }
        tf_value *xw[2] = {x, in[1]};
        tf_value *y = op(l, TF_OP_MATMUL, n->nin == 3 || vec ? "mm" : NULL, 2, xw, NULL, 0);
        if (vec) {
            tf_dim out[1] = {in[1]->type.dims[1]};
            y = reshape(l, n->nin == 3 ? "mm_vec" : NULL, y, out, 1);
        }
        return n->nin == 3 ? op2(l, TF_OP_ADD, NULL, y, in[2]) : y;
    }
    case TF_OP_CONV2D: {   /* only with a bias: conv2d(x, w) + b[O, 1, 1] */
        tf_named_attr a[4];
        const tf_op_info *oi = tf_op_info_of(TF_OP_CONV2D);
        int na = 0;
        for (int i = 0; i < oi->nattrs; i++)
            if (n->attrs[i].set) a[na++] = (tf_named_attr){oi->attrs[i].name, n->attrs[i]};
        tf_value *c = op(l, TF_OP_CONV2D, "conv", 2, in, a, na);
        tf_dim bs[3] = {in[1]->type.dims[0], {1, -1}, {1, -1}};
        return op2(l, TF_OP_ADD, NULL, c, reshape(l, "bias", in[2], bs, 3));
    }
    case TF_OP_BATCHNORM: return lower_batchnorm(l, in);
    case TF_OP_LAYERNORM: {
        int64_t ax = -1;
        tf_value *mu = reduce(l, TF_OP_REDUCE_MEAN, "mean", x, &ax, 1, true);
        tf_value *xc = op2(l, TF_OP_SUB, "centered", x, mu);
        tf_value *var = reduce(l, TF_OP_REDUCE_MEAN, "var", op2(l, TF_OP_MUL, "sq", xc, xc), &ax, 1, true);
        tf_value *inv = op1(l, TF_OP_RSQRT, "inv_std", op2(l, TF_OP_ADD, "var_eps", var, num(l, tf_node_float(n, "eps"))));
        tf_value *y = op2(l, TF_OP_MUL, "scaled", op2(l, TF_OP_MUL, "normed", xc, inv), in[1]);
        return op2(l, TF_OP_ADD, NULL, y, in[2]);
    }
    case TF_OP_SOFTMAX: return softmax(l, x, tf_node_int(n, "axis"), false, NULL);
    case TF_OP_LOG_SOFTMAX: return softmax(l, x, tf_node_int(n, "axis"), true, NULL);
    case TF_OP_GELU:
        if (!strcmp(tf_node_str(n, "approx"), "tanh")) {
            tf_value *x3 = op2(l, TF_OP_MUL, "cube", op2(l, TF_OP_MUL, "sq", x, x), x);
            tf_value *inner = op2(l, TF_OP_ADD, "inner", x, op2(l, TF_OP_MUL, "cube_s", x3, num(l, 0.044715)));
            tf_value *t = op1(l, TF_OP_TANH, "tanh", op2(l, TF_OP_MUL, "inner_s", inner, num(l, 0.7978845608028654)));
            return op2(l, TF_OP_MUL, NULL, op2(l, TF_OP_MUL, "half", x, num(l, 0.5)), op2(l, TF_OP_ADD, "one_plus", t, num(l, 1)));
        } else {
            tf_value *e = op1(l, TF_OP_ERF, "erf", op2(l, TF_OP_MUL, "scaled", x, num(l, 0.7071067811865476)));
            return op2(l, TF_OP_MUL, NULL, op2(l, TF_OP_MUL, "half", x, num(l, 0.5)), op2(l, TF_OP_ADD, "one_plus", e, num(l, 1)));
        }
    case TF_OP_SILU: return op2(l, TF_OP_MUL, NULL, x, op1(l, TF_OP_SIGMOID, "sigmoid", x));
    case TF_OP_ATTENTION: return lower_attention(l, in);
    case TF_OP_EMBEDDING: {
        tf_named_attr a = {"padding_idx", tf_attr_int(tf_node_int(n, "padding_idx"))};
        return op(l, TF_OP_GATHER, NULL, 2, in, &a, 1);
    }
    case TF_OP_DROPOUT: {
        if (l->o->mode == TF_IR_INFER || tf_node_float(n, "p") == 0) return x;   /* identity */
        tf_named_attr a[2] = {{"p", tf_attr_float(tf_node_float(n, "p"))}, {"salt", tf_attr_int(tf_node_int(n, "salt"))}};
        tf_value *mask = op(l, TF_OP_DROPOUT_MASK, "mask", 1, &x, a, 2);
        return op2(l, TF_OP_MUL, NULL, x, mask);
    }
    case TF_OP_GLOBAL_AVGPOOL: {
        int64_t axes[TF_MAX_RANK];
        for (int i = 2; i < rank; i++) axes[i - 2] = i;
        return reduce(l, TF_OP_REDUCE_MEAN, NULL, x, axes, rank - 2, false);
    }
    case TF_OP_FLATTEN: return reshape(l, NULL, x, n->out->type.dims, 2);
    case TF_OP_CROSS_ENTROPY: return lower_cross_entropy(l, in);
    case TF_OP_MSE_LOSS: {
        tf_value *d = op2(l, TF_OP_SUB, "diff", x, in[1]);
        return reduce(l, TF_OP_REDUCE_MEAN, NULL, op2(l, TF_OP_MUL, "sq", d, d), NULL, 0, false);
    }
    case TF_OP_SUM: case TF_OP_MEAN: case TF_OP_MAX: {
        int core = n->op == TF_OP_SUM ? TF_OP_REDUCE_SUM : n->op == TF_OP_MEAN ? TF_OP_REDUCE_MEAN : TF_OP_REDUCE_MAX;
        tf_named_attr a[2] = {{"axes", *tf_node_attr_named(n, "axes")}, {"keepdims", *tf_node_attr_named(n, "keepdims")}};
        a[0].attr.set = a[1].attr.set = true;
        return op(l, core, NULL, 1, &x, a, 2);
    }
    default:
        tf_diag_error(l->d, TF_IR_ERR_INTERNAL, &n->loc, "internal: lower has no rule for layer op %s",
                      tf_op_info_of(n->op)->name);
        l->failed = true;
        return NULL;
    }
}

static bool needs_lowering(const tf_node *n)
{
    return tf_op_has(n->op, TF_OPF_LAYER) || (n->op == TF_OP_CONV2D && n->nin == 3);
}

tf_ir_status pass_lower(tf_module *m, const tf_options *o)
{
    tf_module_renumber(m);
    tf_value **map = tf_calloc((size_t)(m->next_id ? m->next_id : 1), sizeof *map);
    tf_vec old = m->nodes;
    if (!map) return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
    memset(&m->nodes, 0, sizeof m->nodes);
    tf_ir_status st = TF_IR_OK;
    int nupdates = m->nupdates;   /* those written by the user; batchnorm adds more */
    for (int i = 0; i < old.n && !st; i++) {
        tf_node *n = old.items[i];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k]->kind != TF_VAL_CONST && map[n->in[k]->id]) n->in[k] = map[n->in[k]->id];
        if (!needs_lowering(n)) {
            if (tf_module_append_node(m, n)) st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
            continue;
        }
        lw l = {m, o, o->diag, n, n->out->name, NULL, false};
        tf_module_remove_name(m, n->out);   /* the rewrite's last op takes the name */
        /* Ops the op table keeps in fp32 (norms, softmax, losses, reductions)
         * compute in fp32 on fp16/bf16 operands; the result is cast back to
         * the op's own type when that is half precision. */
        tf_value *ins[64];
        memcpy(ins, n->in, (size_t)n->nin * sizeof *ins);
        bool widen = false;
        if (tf_op_info_of(n->op)->amp == TF_AMP_DENY)
            for (int k = 0; k < n->nin; k++)
                if (is_half(ins[k])) {
                    char hint[32];
                    snprintf(hint, sizeof hint, "in%d.f32", k);
                    ins[k] = cast_to(&l, hint, ins[k], TF_DT_F32);
                    widen = true;
                }
        if (widen && is_half(n->out)) l.final_hint = "f32";
        tf_value *r = lower_node(&l, ins);
        if (r && widen && is_half(n->out)) {
            l.final_hint = NULL;
            r = cast_to(&l, NULL, r, n->out->type.dtype);
        }
        if (!r) { st = o->diag->status ? o->diag->status : TF_IR_ERR_INTERNAL; break; }
        if (!tf_type_equal(&r->type, &n->out->type)) {
            char b1[256], b2[256];
            st = tf_diag_error(o->diag, TF_IR_ERR_INTERNAL, &n->loc, "internal: lowering %s gave %s, expected %s",
                               tf_op_info_of(n->op)->name, tf_type_str(m, &r->type, b1), tf_type_str(m, &n->out->type, b2));
            break;
        }
        map[n->out->id] = r;
    }
    if (!st) {
        for (int i = 0; i < m->noutputs; i++)
            if (map[m->outputs[i].value->id]) m->outputs[i].value = map[m->outputs[i].value->id];
        for (int i = 0; i < nupdates; i++)
            if (map[m->updates[i].value->id]) m->updates[i].value = map[m->updates[i].value->id];
    }
    tf_free(map);
    tf_free(old.items);
    if (st) return st;
    tf_module_renumber(m);
    return TF_IR_OK;
}
