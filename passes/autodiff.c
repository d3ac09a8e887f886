/* autodiff.c — reverse mode over the forward graph, then the optimizer.
 *
 * In train mode the step becomes: forward ops, the backward ops that the
 * op table's gradient rules build (grad_rules.c), then the update of every
 * param as ordinary core ops, all in one module that later passes (amp, fuse,
 * memplan) treat like any other. The loss is the output named `loss`, else
 * the first scalar floating output; a module with no loss or no params has
 * nothing to train and keeps a forward-only step (said by --explain).
 *
 * Gradients: each param's gradient is the sum of the contributions of its
 * uses; the first is written, later ones added (never a zero fill). Only
 * values that depend on a param get gradients.
 *
 * The optimizer (from the train block; sgd(lr=0.01) without one) becomes
 * update ops: `update w = w.next`, with its state as buffers named
 * `opt.<slot>.<param>` and a step counter `train.step` (i64). The learning
 * rate is computed inside the step from the counter by the schedule and is a
 * module output, `lr`. clip_grad_norm scales every gradient by
 * min(1, clip / (global norm + 1e-6)) first. Formulas are PyTorch's:
 *   sgd    g += wd p; b = g on the first step, else mu b + g;
 *          d = nesterov ? g + mu b : b (or g without momentum); p -= lr d
 *   adam   g += wd p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *          p -= lr m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps)
 *   adamw  p *= 1 - lr wd, then adam without the L2 term
 *   lamb   r = m^/(sqrt(v^) + eps) + wd p; p -= lr (|p| / |r|) r
 *          (trust ratio 1 where either norm is 0)
 * Schedules, with s the 0-based step:
 *   constant; step: lr gamma^floor(s/step_size);
 *   cosine: linear warmup over warmup_steps, then min_lr + (lr-min_lr)(1+cos(pi p))/2;
 *   onecycle: cosine from max_lr/div_factor up to max_lr over pct_start of
 *   the steps, then down to max_lr/div_factor/final_div_factor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"

struct tf_grad_ctx {
    tf_module *m;
    const tf_options *o;
    tf_diag *d;
    int nvals;             /* values that predate the pass (ids below this) */
    int nfwd;              /* the forward ops (the first nfwd nodes) */
    bool *wants;           /* by id: depends on a param */
    tf_value **grad;       /* by id: accumulated gradient */
    bool failed;
};

tf_module *gr_module(tf_grad_ctx *g) { return g->m; }
tf_diag *gr_diag(tf_grad_ctx *g) { return g->d; }

bool gr_wants(const tf_grad_ctx *g, const tf_node *n, int k)
{
    const tf_value *v = n->in[k];
    return v->kind != TF_VAL_CONST && v->id >= 0 && v->id < g->nvals && g->wants[v->id];
}

static tf_value *build(tf_grad_ctx *g, const char *name, const tf_loc *loc, int op, tf_value **in, int nin,
                       const tf_named_attr *attrs, int na)
{
    if (g->failed) return NULL;
    for (int i = 0; i < nin; i++)
        if (!in[i]) {
            g->failed = true;
            return NULL;
        }
    tf_value *v = tf_build(g->m, g->d, op, in, nin, attrs, na, name, loc);
    if (!v) g->failed = true;
    return v;
}

tf_value *gb(tf_grad_ctx *g, const tf_node *n, int op, const char *hint, tf_value **in, int nin,
             const tf_named_attr *attrs, int na)
{
    char name[512];
    snprintf(name, sizeof name, "%s.grad.%s", n->out->name, hint);
    return build(g, name, &n->loc, op, in, nin, attrs, na);
}

tf_value *gb1(tf_grad_ctx *g, const tf_node *n, int op, const char *hint, tf_value *a) { return gb(g, n, op, hint, &a, 1, NULL, 0); }

tf_value *gb2(tf_grad_ctx *g, const tf_node *n, int op, const char *hint, tf_value *a, tf_value *b)
{
    tf_value *in[2] = {a, b};
    return gb(g, n, op, hint, in, 2, NULL, 0);
}

tf_value *gnum(tf_grad_ctx *g, double v)
{
    tf_value *c = tf_const(g->m, v, TF_DT_F32);
    if (!c) {
        g->failed = true;
        tf_diag_error(g->d, TF_IR_ERR_OOM, NULL, "out of memory in autodiff");
    }
    return c;
}

tf_ir_status gr_contrib(tf_grad_ctx *g, const tf_node *n, int k, tf_value *c)
{
    tf_value *v = n->in[k];
    if (!gr_wants(g, n, k)) return TF_IR_OK;
    if (!c) return g->d->status ? g->d->status : TF_IR_ERR_INTERNAL;
    char name[512];
    /* undo broadcasting: sum the axes v was stretched along */
    if (!tf_type_same_shape(&c->type, &v->type)) {
        int extra = c->type.rank - v->type.rank;
        int64_t axes[TF_MAX_RANK];
        int na = 0;
        for (int i = 0; i < c->type.rank; i++)
            if (i < extra || (v->type.dims[i - extra].n == 1 && c->type.dims[i].n != 1)) axes[na++] = i;
        tf_named_attr ra[2] = {{"axes", tf_attr_ints(g->m, axes, na)}, {"keepdims", tf_attr_bool(true)}};
        snprintf(name, sizeof name, "%s.grad.sum", v->name);
        tf_value *s = build(g, name, &n->loc, TF_OP_REDUCE_SUM, &c, 1, ra, 2);
        int64_t shape[TF_MAX_RANK];
        for (int i = 0; i < v->type.rank; i++) shape[i] = v->type.dims[i].n;
        tf_named_attr sa = {"shape", tf_attr_ints(g->m, shape, v->type.rank)};
        snprintf(name, sizeof name, "%s.grad.part", v->name);
        c = build(g, name, &n->loc, TF_OP_RESHAPE, &s, 1, &sa, 1);
        if (!c) return g->d->status;
    }
    if (c->type.dtype != v->type.dtype) {
        tf_named_attr ca = {"to", tf_attr_dtype(v->type.dtype)};
        snprintf(name, sizeof name, "%s.grad.cast", v->name);
        if (!(c = build(g, name, &n->loc, TF_OP_CAST, &c, 1, &ca, 1))) return g->d->status;
    }
    tf_value **acc = &g->grad[v->id];
    if (!*acc) {
        *acc = c;
        return TF_IR_OK;
    }
    tf_value *in[2] = {*acc, c};
    snprintf(name, sizeof name, "%s.grad", v->name);
    *acc = build(g, name, &n->loc, TF_OP_ADD, in, 2, NULL, 0);
    return *acc ? TF_IR_OK : g->d->status;
}

/* ---- the optimizer ---- */

typedef struct opt {
    tf_grad_ctx *g;
    tf_loc loc;
} opt;

static tf_value *ob(opt *p, const char *name, int op, tf_value *a, tf_value *b)
{
    tf_value *in[2] = {a, b};
    return build(p->g, name, &p->loc, op, in, b ? 2 : 1, NULL, 0);
}
static tf_value *onum(opt *p, double v) { return gnum(p->g, v); }

/* Adam's 1 - beta^t, computed in float64 and rounded once to dt: beta is
 * no float32 number (0.999 is 0.99900001 there) and 1 - beta^t cancels, so
 * in float32 it was 1.3e-5 off at t = 1, and every first Adam step 6.4e-6
 * too small (PyTorch computes it in double). */
static tf_value *bias_correction(opt *p, const char *name, double beta, tf_value *t, tf_dt dt)
{
    if (!t) return NULL;
    char nm[600];
    tf_named_attr to64 = {"to", tf_attr_dtype(TF_DT_F64)}, to = {"to", tf_attr_dtype(dt)};
    tf_value *t64 = build(p->g, "train.t64", &p->loc, TF_OP_CAST, &t, 1, &to64, 1);
    tf_value *b = tf_const(p->g->m, beta, TF_DT_F64), *one = tf_const(p->g->m, 1, TF_DT_F64);
    if (!b || !one) {
        tf_diag_error(p->g->d, TF_IR_ERR_OOM, &p->loc, "out of memory in autodiff");
        p->g->failed = true;
        return NULL;
    }
    snprintf(nm, sizeof nm, "%s.beta_t", name);
    tf_value *bt = ob(p, nm, TF_OP_POW, b, t64);
    snprintf(nm, sizeof nm, "%s.f64", name);
    tf_value *bc = ob(p, nm, TF_OP_SUB, one, bt);
    return bc ? build(p->g, name, &p->loc, TF_OP_CAST, &bc, 1, &to, 1) : NULL;
}

static tf_value *select3(opt *p, const char *name, tf_value *c, tf_value *a, tf_value *b)
{
    tf_value *in[3] = {c, a, b};
    return build(p->g, name, &p->loc, TF_OP_WHERE, in, 3, NULL, 0);
}

/* A declaration tf_module_add_decl could not make: its name is taken, or
 * memory ran out. */
static tf_ir_status decl_failed(tf_module *m, tf_diag *d, const tf_loc *loc, const char *what, const char *name)
{
    if (!tf_module_find_value(m, name)) return tf_diag_error(d, TF_IR_ERR_OOM, loc, "out of memory adding %s '%s'", what, name);
    return tf_diag_error(d, TF_IR_ERR_VERIFY, loc, "cannot add %s '%s': the name is taken", what, name);
}

/* The optimizer slot `slot` of param `of`: a buffer opt.<slot>.<of> shaped
 * like `like` (the param, or its shard under shard_optimizer). */
static tf_value *state(opt *p, const char *slot, const tf_value *of, const tf_value *like, tf_dt dt)
{
    char name[512];
    snprintf(name, sizeof name, "opt.%s.%s", slot, of->name);
    tf_type t = like->type;
    t.dtype = dt;
    tf_value *v = tf_module_add_decl(p->g->m, name, TF_VAL_BUFFER, &t, TF_INIT_ZEROS);
    if (!v) {
        p->g->failed = true;
        decl_failed(p->g->m, p->g->d, &p->loc, "optimizer state", name);
    }
    return v;
}

static tf_ir_status add_update(opt *p, tf_value *target, tf_value *v)
{
    if (p->g->failed || !v) return p->g->d->status ? p->g->d->status : TF_IR_ERR_INTERNAL;
    if (tf_module_add_update(p->g->m, target, v, p->loc)) return tf_diag_error(p->g->d, TF_IR_ERR_OOM, NULL, "out of memory");
    return TF_IR_OK;
}

/* 0.5 (1 + cos(pi x)) between a and b: a + (b - a) (1 - cos(pi x)) / 2 */
static tf_value *cos_anneal(opt *p, const char *name, tf_value *x, double a, double b)
{
    char nm[128];
    snprintf(nm, sizeof nm, "%s.cos", name);
    tf_value *c = ob(p, nm, TF_OP_COS, ob(p, "sched.pix", TF_OP_MUL, x, onum(p, M_PI)), NULL);
    tf_value *w = ob(p, "sched.w", TF_OP_MUL, ob(p, "sched.1mc", TF_OP_SUB, onum(p, 1), c), onum(p, 0.5 * (b - a)));
    return ob(p, name, TF_OP_ADD, w, onum(p, a));
}

static tf_value *clamp01(opt *p, const char *name, tf_value *x)
{
    return ob(p, name, TF_OP_MINIMUM, ob(p, "sched.pos", TF_OP_MAXIMUM, x, onum(p, 0)), onum(p, 1));
}

static tf_value *schedule(opt *p, const tf_train *tr, double base, tf_value *s)
{
    const tf_call *c = &tr->schedule;
    if (c->fn < 0 || c->fn == TF_SCHED_CONSTANT) return ob(p, "lr", TF_OP_ADD, ob(p, "sched.zero", TF_OP_MUL, s, onum(p, 0)), onum(p, base));
    if (c->fn == TF_SCHED_STEP) {
        double size = tf_call_float(tf_schedule_fns, c, "step_size"), gamma = tf_call_float(tf_schedule_fns, c, "gamma");
        tf_named_attr to_i = {"to", tf_attr_dtype(TF_DT_I64)}, to_f = {"to", tf_attr_dtype(TF_DT_F32)};
        tf_value *q = ob(p, "sched.q", TF_OP_DIV, s, onum(p, size));
        tf_value *qi = build(p->g, "sched.qi", &p->loc, TF_OP_CAST, &q, 1, &to_i, 1);
        tf_value *qf = build(p->g, "sched.qf", &p->loc, TF_OP_CAST, &qi, 1, &to_f, 1);
        return ob(p, "lr", TF_OP_MUL, ob(p, "sched.decay", TF_OP_POW, onum(p, gamma), qf), onum(p, base));
    }
    if (c->fn == TF_SCHED_COSINE) {
        double total = tf_call_float(tf_schedule_fns, c, "total_steps"), warm = tf_call_float(tf_schedule_fns, c, "warmup_steps");
        double lo = tf_call_float(tf_schedule_fns, c, "min_lr");
        tf_value *x = clamp01(p, "sched.progress", ob(p, "sched.frac", TF_OP_DIV, ob(p, "sched.after", TF_OP_SUB, s, onum(p, warm)),
                                                       onum(p, total - warm > 1 ? total - warm : 1)));
        tf_value *dec = cos_anneal(p, "sched.decay", x, base, lo);
        if (warm <= 0) return ob(p, "lr", TF_OP_ADD, dec, onum(p, 0));
        tf_value *up = ob(p, "sched.warm", TF_OP_MUL, ob(p, "sched.s1", TF_OP_ADD, s, onum(p, 1)), onum(p, base / warm));
        return select3(p, "lr", ob(p, "sched.in_warmup", TF_OP_LT, s, onum(p, warm)), up, dec);
    }
    /* onecycle */
    double mx = tf_call_float(tf_schedule_fns, c, "max_lr"), total = tf_call_float(tf_schedule_fns, c, "total_steps");
    double pct = tf_call_float(tf_schedule_fns, c, "pct_start"), div = tf_call_float(tf_schedule_fns, c, "div_factor");
    double fdiv = tf_call_float(tf_schedule_fns, c, "final_div_factor");
    double init = mx / div, fin = init / fdiv, up = floor(pct * total) - 1, down = total - 1 - up;
    if (up < 1) up = 1;
    if (down < 1) down = 1;
    tf_value *x1 = clamp01(p, "sched.p1", ob(p, "sched.f1", TF_OP_DIV, s, onum(p, up)));
    tf_value *x2 = clamp01(p, "sched.p2", ob(p, "sched.f2", TF_OP_DIV, ob(p, "sched.a2", TF_OP_SUB, s, onum(p, up)), onum(p, down)));
    tf_value *r1 = cos_anneal(p, "sched.rise", x1, init, mx), *r2 = cos_anneal(p, "sched.fall", x2, mx, fin);
    return select3(p, "lr", ob(p, "sched.rising", TF_OP_LE, s, onum(p, up)), r1, r2);
}

static tf_value *sumsq(opt *p, const char *name, tf_value *x)
{
    tf_named_attr ra[2] = {{"axes", tf_attr_ints(p->g->m, NULL, 0)}, {"keepdims", tf_attr_bool(false)}};
    tf_value *sq = ob(p, "opt.sq", TF_OP_MUL, x, x);
    return build(p->g, name, &p->loc, TF_OP_REDUCE_SUM, &sq, 1, ra, 2);
}

/* shard_optimizer (ZeRO-1): this rank's chunk of x, and the whole of a
 * param's shape from every rank's chunk. */
static tf_value *shard_of(opt *p, const tf_value *param, tf_value *x, const char *what)
{
    char nm[512];
    snprintf(nm, sizeof nm, "%s.%s", param->name, what);
    tf_named_attr a = {"ranks", tf_attr_int(p->g->o->shard_ranks)};
    return build(p->g, nm, &p->loc, TF_OP_SHARD, &x, 1, &a, 1);
}

static tf_value *gather_of(opt *p, const tf_value *param, tf_value *x)
{
    char nm[512];
    int64_t v[TF_MAX_RANK] = {0};
    for (int i = 0; i < param->type.rank; i++) v[i] = param->type.dims[i].n;
    tf_named_attr a[2] = {{"ranks", tf_attr_int(p->g->o->shard_ranks)}, {"shape", tf_attr_ints(p->g->m, v, param->type.rank)}};
    if (a[1].attr.kind == TF_ATTR_NONE) {
        p->g->failed = true;
        tf_diag_error(p->g->d, TF_IR_ERR_OOM, &p->loc, "out of memory");
        return NULL;
    }
    for (int i = 0; i < param->type.rank; i++) a[1].attr.u.ints.v[i].sym = param->type.dims[i].sym;
    snprintf(nm, sizeof nm, "%s.gathered", param->name);
    return build(p->g, nm, &p->loc, TF_OP_ALLGATHER, &x, 1, a, 2);
}

static tf_ir_status update_param(opt *p, const tf_train *tr, tf_value *param, tf_value *gr, tf_value *lr, tf_value *t,
                                 tf_value *first)
{
    const tf_call *c = &tr->optimizer;
    int fn = c->fn < 0 ? TF_OPT_SGD : c->fn;
    double wd = c->fn < 0 ? 0 : tf_call_float(tf_optimizer_fns, c, "weight_decay");
    char nm[512];
    /* sharded: the update runs on this rank's chunk of the param and its gradient, with moments of that size */
    bool sharded = p->g->o->shard_ranks > 0;
    tf_value *w = sharded ? shard_of(p, param, param, "shard") : param;
    if (sharded) gr = shard_of(p, param, gr, "grad_shard");
#define N(fmt) (snprintf(nm, sizeof nm, fmt, param->name), nm)
    /* the update runs in f32, or f64 for f64 params; the step's scalars follow */
    tf_dt dt = w->type.dtype == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32;
    tf_named_attr to = {"to", tf_attr_dtype(dt)};
    if (lr->type.dtype != dt) {
        lr = build(p->g, "train.lr_f64", &p->loc, TF_OP_CAST, &lr, 1, &to, 1);
        t = build(p->g, "train.t_f64", &p->loc, TF_OP_CAST, &t, 1, &to, 1);
    }
    if (gr->type.dtype != dt) gr = build(p->g, N("%s.grad_f32"), &p->loc, TF_OP_CAST, &gr, 1, &to, 1);
    if (!lr || !t || !gr) return p->g->d->status;
    tf_value *next = NULL;
    if (fn == TF_OPT_SGD) {
        double mu = c->fn < 0 ? 0 : tf_call_float(tf_optimizer_fns, c, "momentum");
        bool nesterov = c->fn >= 0 && tf_call_float(tf_optimizer_fns, c, "nesterov") != 0;
        if (wd) gr = ob(p, N("%s.g_wd"), TF_OP_ADD, gr, ob(p, N("%s.wd"), TF_OP_MUL, w, onum(p, wd)));
        tf_value *d = gr;
        if (mu) {
            tf_value *buf = state(p, "momentum", param, w, dt);
            tf_value *b = select3(p, N("%s.buf"), first, gr, ob(p, N("%s.buf_mix"), TF_OP_ADD, ob(p, N("%s.buf_mu"), TF_OP_MUL, buf, onum(p, mu)), gr));
            if (add_update(p, buf, b)) return p->g->d->status;
            d = nesterov ? ob(p, N("%s.nesterov"), TF_OP_ADD, gr, ob(p, N("%s.mu_b"), TF_OP_MUL, b, onum(p, mu))) : b;
        }
        next = ob(p, N("%s.next"), TF_OP_SUB, w, ob(p, N("%s.step"), TF_OP_MUL, d, lr));
    } else {
        double b1 = tf_call_float(tf_optimizer_fns, c, "beta1"), b2 = tf_call_float(tf_optimizer_fns, c, "beta2");
        double eps = tf_call_float(tf_optimizer_fns, c, "eps");
        tf_value *wcur = w;
        if (fn == TF_OPT_ADAM && wd) gr = ob(p, N("%s.g_wd"), TF_OP_ADD, gr, ob(p, N("%s.wd"), TF_OP_MUL, w, onum(p, wd)));
        if (fn == TF_OPT_ADAMW && wd)
            wcur = ob(p, N("%s.decayed"), TF_OP_MUL, w, ob(p, N("%s.keep"), TF_OP_SUB, onum(p, 1), ob(p, N("%s.lrwd"), TF_OP_MUL, lr, onum(p, wd))));
        tf_value *m = state(p, "m", param, w, dt), *v = state(p, "v", param, w, dt);
        tf_value *mn = ob(p, N("%s.m_next"), TF_OP_ADD, ob(p, N("%s.m_keep"), TF_OP_MUL, m, onum(p, b1)), ob(p, N("%s.m_take"), TF_OP_MUL, gr, onum(p, 1 - b1)));
        tf_value *vn = ob(p, N("%s.v_next"), TF_OP_ADD, ob(p, N("%s.v_keep"), TF_OP_MUL, v, onum(p, b2)),
                          ob(p, N("%s.v_take"), TF_OP_MUL, ob(p, N("%s.g2"), TF_OP_MUL, gr, gr), onum(p, 1 - b2)));
        if (add_update(p, m, mn) || add_update(p, v, vn)) return p->g->d->status;
        tf_value *bc1 = bias_correction(p, N("%s.bc1"), b1, t, mn ? mn->type.dtype : TF_DT_F32);
        tf_value *bc2 = bias_correction(p, N("%s.bc2"), b2, t, vn ? vn->type.dtype : TF_DT_F32);
        tf_value *mh = ob(p, N("%s.m_hat"), TF_OP_DIV, mn, bc1), *vh = ob(p, N("%s.v_hat"), TF_OP_DIV, vn, bc2);
        tf_value *r = ob(p, N("%s.adam"), TF_OP_DIV, mh, ob(p, N("%s.denom"), TF_OP_ADD, ob(p, N("%s.rms"), TF_OP_SQRT, vh, NULL), onum(p, eps)));
        if (fn == TF_OPT_LAMB) {
            if (wd) r = ob(p, N("%s.r_wd"), TF_OP_ADD, r, ob(p, N("%s.wd"), TF_OP_MUL, w, onum(p, wd)));
            tf_value *wn = ob(p, N("%s.w_norm"), TF_OP_SQRT, sumsq(p, N("%s.w_sq"), w), NULL);
            tf_value *rn = ob(p, N("%s.r_norm"), TF_OP_SQRT, sumsq(p, N("%s.r_sq"), r), NULL);
            tf_value *ok = ob(p, N("%s.both"), TF_OP_GT, ob(p, N("%s.nprod"), TF_OP_MUL, wn, rn), onum(p, 0));
            tf_value *trust = select3(p, N("%s.trust"), ok, ob(p, N("%s.ratio"), TF_OP_DIV, wn, rn), onum(p, 1));
            r = ob(p, N("%s.r_trust"), TF_OP_MUL, r, trust);
        }
        next = ob(p, N("%s.next"), TF_OP_SUB, wcur, ob(p, N("%s.step"), TF_OP_MUL, r, lr));
    }
#undef N
    if (next && next->type.dtype != param->type.dtype) {
        tf_named_attr ca = {"to", tf_attr_dtype(param->type.dtype)};
        snprintf(nm, sizeof nm, "%s.next_cast", param->name);
        next = build(p->g, nm, &p->loc, TF_OP_CAST, &next, 1, &ca, 1);
    }
    if (sharded && next) next = gather_of(p, param, next);   /* every rank's updated chunk: the whole param */
    return add_update(p, param, next);
}

/* The params with a gradient, in declaration order, and their gradients. */
typedef struct gradset {
    tf_value *params[4096], *grads[4096];
    int n;
} gradset;

static tf_ir_status collect_grads(opt *p, gradset *gs)
{
    tf_grad_ctx *g = p->g;
    tf_module *m = g->m;
    for (int i = 0; i < m->decls.n; i++) {
        tf_value *v = m->decls.items[i];
        if (v->kind != TF_VAL_PARAM || v->id < 0 || v->id >= g->nvals) continue;
        if (!g->grad[v->id] && v->zero_grad)   /* bias_drop's: a zero gradient, still optimized */
            g->grad[v->id] = ob(p, "train.zero_grad", TF_OP_MUL, v, onum(p, 0));
        if (!g->grad[v->id]) {
            tf_explain(g->o, "autodiff", &v->loc, "param %s does not affect the loss: no gradient, not updated", v->name);
            continue;
        }
        if (gs->n == 4096) return tf_diag_error(g->d, TF_IR_ERR_LIMIT, &v->loc, "more than 4096 params");
        gs->params[gs->n] = v;
        gs->grads[gs->n++] = g->grad[v->id];
    }
    return TF_IR_OK;
}

/* The loss's own gradients (unscaled, before accumulation and clipping) as
 * outputs grad.<param>, for checks (tf_options.grad_outputs). */
static tf_ir_status grad_outputs(opt *p, const gradset *gs, tf_value *scale)
{
    tf_grad_ctx *g = p->g;
    for (int i = 0; g->o->grad_outputs && i < gs->n; i++) {
        char nm[512];
        tf_value *gv = gs->grads[i];
        if (scale) {
            tf_value *inv = ob(p, "check.inv_scale", TF_OP_DIV, onum(p, 1), scale);
            if (gv->type.dtype != TF_DT_F32) {
                tf_named_attr ca = {"to", tf_attr_dtype(gv->type.dtype)};
                inv = build(g, "check.inv_scale_cast", &p->loc, TF_OP_CAST, &inv, 1, &ca, 1);
            }
            snprintf(nm, sizeof nm, "%s.grad_check", gs->params[i]->name);
            gv = ob(p, nm, TF_OP_MUL, gv, inv);
        }
        snprintf(nm, sizeof nm, "grad.%s", gs->params[i]->name);
        if (!gv || tf_module_add_output(g->m, nm, gv, p->loc)) return g->d->status ? g->d->status : TF_IR_ERR_OOM;
    }
    return TF_IR_OK;
}

/* data_parallel: each gradient becomes its mean over the session's ranks
 * (allreduce), and so does each float buffer the forward pass updates
 * (batchnorm's running statistics: every rank keeps the same ones). The
 * values travel in buckets of about o->allreduce_bucket bytes of one dtype,
 * filled in the order the backward pass completes them, and each allreduce
 * is placed right after the op that produces its operand: the runtime
 * sends a bucket when its last member is ready and waits for it only where
 * a reader needs it, so communication overlaps the rest of the backward
 * pass. Before accumulation, loss scaling and clipping, which then see the
 * global gradient (a rank's inf is every rank's: all skip the step). */
typedef struct node_at { const tf_node *n; int at; } node_at;

static int node_at_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const node_at *)a)->n, y = (uintptr_t)((const node_at *)b)->n;
    return x < y ? -1 : x > y;
}

/* Where v's producer stands in m's nodes (-1: not a node's result). */
static int position(const node_at *pos, int n, const tf_value *v)
{
    if (v->kind != TF_VAL_NODE || !v->def) return -1;
    node_at key = {v->def, 0};
    const node_at *f = bsearch(&key, pos, (size_t)n, sizeof *pos, node_at_cmp);
    return f ? f->at : -1;
}

typedef struct dp_item { tf_value **slot; const char *name; int at, order; } dp_item;

static int dp_item_cmp(const void *a, const void *b)
{
    const dp_item *x = a, *y = b;
    return x->at != y->at ? (x->at < y->at ? -1 : 1) : (x->order > y->order) - (x->order < y->order);
}

static tf_ir_status data_parallel(opt *p, gradset *gs)
{
    tf_grad_ctx *g = p->g;
    tf_module *m = g->m;
    if (!g->o->data_parallel) return TF_IR_OK;
    int N = m->nodes.n, nitems = 0;
    node_at *pos = tf_malloc((size_t)(N ? N : 1) * sizeof *pos);
    dp_item *items = tf_malloc((size_t)(gs->n + m->nupdates + 1) * sizeof *items);
    if (!pos || !items) {
        tf_free(pos), tf_free(items);
        return tf_diag_error(g->d, TF_IR_ERR_OOM, NULL, "out of memory");
    }
    for (int i = 0; i < N; i++) pos[i] = (node_at){m->nodes.items[i], i};
    qsort(pos, (size_t)N, sizeof *pos, node_at_cmp);
    /* what is averaged: node results only (a constant or a declared value is the same on every rank); a
     * forward value's allreduce goes first in the backward pass, which keeps the forward ops together */
    for (int i = 0; i < m->nupdates; i++) {
        tf_update *u = &m->updates[i];
        if (tf_dtype_is_float(u->buffer->type.dtype) && position(pos, N, u->value) >= 0)
            items[nitems] = (dp_item){&u->value, u->buffer->name, g->nfwd - 1, nitems}, nitems++;
    }
    int nbuf = nitems;
    for (int i = 0; i < gs->n; i++)
        if (position(pos, N, gs->grads[i]) >= 0)
            items[nitems] = (dp_item){&gs->grads[i], gs->params[i]->name, position(pos, N, gs->grads[i]), nitems}, nitems++;
    qsort(items, (size_t)nitems, sizeof *items, dp_item_cmp);
    /* buckets in completion order; a dtype change starts a new one */
    int bucket = 0, nbuckets = 0;
    int64_t fill = 0, total = 0;
    tf_dt dt = TF_DT_F32;
    for (int i = 0; i < nitems && !g->failed; i++) {
        tf_value *v = *items[i].slot;
        int64_t bytes = tf_type_numel(&v->type) * tf_dtype_bytes(v->type.dtype);
        if (fill > 0 && (fill >= g->o->allreduce_bucket || v->type.dtype != dt)) bucket++, fill = 0;
        dt = v->type.dtype;
        fill += bytes;
        total += bytes;
        nbuckets = bucket + 1;
        char nm[512];
        snprintf(nm, sizeof nm, "%s.%s", items[i].name, items[i].order < nbuf ? "mean_ranks" : "grad_mean_ranks");
        tf_named_attr a = {"bucket", tf_attr_int(bucket)};
        *items[i].slot = build(g, nm, &p->loc, TF_OP_ALLREDUCE, &v, 1, &a, 1);
    }
    /* each allreduce right after its operand's producer (they were appended, in bucket order) */
    if (!g->failed && m->nodes.n != N + nitems) {
        tf_free(pos), tf_free(items);
        return tf_diag_error(g->d, TF_IR_ERR_INTERNAL, &p->loc, "data_parallel: %d ops built for %d allreduces", m->nodes.n - N, nitems);
    }
    if (!g->failed && nitems > 0) {
        tf_node **moved = tf_malloc((size_t)m->nodes.n * sizeof *moved);
        if (!moved) {
            tf_free(pos), tf_free(items);
            return tf_diag_error(g->d, TF_IR_ERR_OOM, NULL, "out of memory");
        }
        int k = 0, j = 0;
        for (int i = 0; i < N; i++) {
            moved[k++] = m->nodes.items[i];
            for (; j < nitems && items[j].at == i; j++) moved[k++] = m->nodes.items[N + j];
        }
        for (; j < nitems; j++) moved[k++] = m->nodes.items[N + j];
        memcpy(m->nodes.items, moved, (size_t)m->nodes.n * sizeof *moved);
        tf_free(moved);
    }
    tf_free(pos), tf_free(items);
    if (g->failed) return g->d->status;
    tf_explain(g->o, "autodiff", &p->loc,
               "data_parallel: %d gradients and %d buffer updates (%lld bytes) averaged over the ranks in %d buckets of "
               "about %lld bytes, in the order the backward pass completes them", nitems - nbuf, nbuf, (long long)total,
               nbuckets, (long long)g->o->allreduce_bucket);
    return TF_IR_OK;
}

/* Gradient accumulation: micro-batch k of n writes (k = 0) or adds to
 * acc.<param>; the optimizer's updates commit on the last one only
 * (*commit, *is_last: that micro-batch's flag; NULL without accumulation). */
static tf_ir_status accumulate(opt *p, const tf_train *tr, gradset *gs, tf_value **commit, tf_value **is_last)
{
    tf_grad_ctx *g = p->g;
    tf_module *m = g->m;
    int64_t nacc = tr->accumulate > 1 ? tr->accumulate : 1;
    if (nacc <= 1) return TF_IR_OK;
    tf_type scalar_i = {.dtype = TF_DT_I64, .rank = 0};
    tf_value *micro = tf_module_add_decl(m, "train.micro", TF_VAL_BUFFER, &scalar_i, TF_INIT_ZEROS);
    if (!micro) return decl_failed(m, g->d, &p->loc, "the micro-step counter", "train.micro");
    tf_value *is_first = ob(p, "train.micro_first", TF_OP_EQ, micro, tf_const(m, 0, TF_DT_I64));
    *is_last = ob(p, "train.micro_last", TF_OP_EQ, micro, tf_const(m, (double)(nacc - 1), TF_DT_I64));
    for (int i = 0; i < gs->n && !g->failed; i++) {
        char nm[512];
        tf_value *acc = state(p, "acc", gs->params[i], gs->params[i], gs->grads[i]->type.dtype);
        snprintf(nm, sizeof nm, "%s.acc_next", gs->params[i]->name);
        tf_value *sum = select3(p, nm, is_first, gs->grads[i], ob(p, "train.acc_add", TF_OP_ADD, acc, gs->grads[i]));
        if (add_update(p, acc, sum)) return g->d->status;
        snprintf(nm, sizeof nm, "%s.grad_mean", gs->params[i]->name);
        gs->grads[i] = ob(p, nm, TF_OP_DIV, sum, onum(p, (double)nacc));
    }
    tf_value *wrap = select3(p, "train.micro_next", *is_last, tf_const(m, 0, TF_DT_I64),
                             ob(p, "train.micro_inc", TF_OP_ADD, micro, tf_const(m, 1, TF_DT_I64)));
    if (add_update(p, micro, wrap)) return g->d->status;
    *commit = *is_last;
    tf_explain(g->o, "autodiff", &p->loc, "accumulate %lld: micro-batches add into acc.<param>; the optimizer runs on the last",
               (long long)nacc);
    return TF_IR_OK;
}

/* fp16 loss scaling: unscale, check every gradient for inf/NaN (max|g|
 * propagates NaN), skip the step when one is found, halve the scale;
 * double it after 2000 clean steps. */
static tf_ir_status loss_scaling(opt *p, gradset *gs, tf_value *scale, tf_value **commit, tf_value *is_last)
{
    tf_grad_ctx *g = p->g;
    tf_module *m = g->m;
    tf_named_attr to_f = {"to", tf_attr_dtype(TF_DT_F32)};
    tf_value *inv = ob(p, "train.inv_scale", TF_OP_DIV, onum(p, 1), scale), *worst = NULL;
    for (int i = 0; i < gs->n && !g->failed; i++) {
        char nm[512];
        tf_value *cf = inv;
        if (gs->grads[i]->type.dtype != TF_DT_F32) {
            tf_named_attr ca = {"to", tf_attr_dtype(gs->grads[i]->type.dtype)};
            cf = build(g, "train.inv_scale_cast", &p->loc, TF_OP_CAST, &inv, 1, &ca, 1);
        }
        snprintf(nm, sizeof nm, "%s.grad_unscaled", gs->params[i]->name);
        gs->grads[i] = ob(p, nm, TF_OP_MUL, gs->grads[i], cf);
        tf_named_attr ra[2] = {{"axes", tf_attr_ints(m, NULL, 0)}, {"keepdims", tf_attr_bool(false)}};
        tf_value *ab = ob(p, "train.grad_abs", TF_OP_ABS, gs->grads[i], NULL);
        tf_value *mx = build(g, "train.grad_max", &p->loc, TF_OP_REDUCE_MAX, &ab, 1, ra, 2);
        if (mx && mx->type.dtype != TF_DT_F32) mx = build(g, "train.grad_max_f32", &p->loc, TF_OP_CAST, &mx, 1, &to_f, 1);
        worst = worst ? ob(p, "train.grad_worst", TF_OP_MAXIMUM, worst, mx) : mx;
    }
    tf_value *finite = ob(p, "train.grads_finite", TF_OP_ISFINITE, worst, NULL);
    *commit = *commit ? select3(p, "train.commit", *commit, finite, *commit) : finite;
    /* the scale moves only when a full step is checked */
    tf_type scalar_i64 = {.dtype = TF_DT_I64, .rank = 0};
    tf_value *good = tf_module_add_decl(m, "train.good_steps", TF_VAL_BUFFER, &scalar_i64, TF_INIT_ZEROS);
    if (!good) return tf_diag_error(g->d, TF_IR_ERR_VERIFY, &p->loc, "cannot add 'train.good_steps'");
    tf_value *good1 = ob(p, "train.good_inc", TF_OP_ADD, good, tf_const(m, 1, TF_DT_I64));
    tf_value *grow = ob(p, "train.scale_grow", TF_OP_EQ, good1, tf_const(m, 2000, TF_DT_I64));
    tf_value *clean_scale = select3(p, "train.scale_clean", grow, ob(p, "train.scale_x2", TF_OP_MUL, scale, onum(p, 2)), scale);
    tf_value *clean_good = select3(p, "train.good_clean", grow, tf_const(m, 0, TF_DT_I64), good1);
    tf_value *new_scale = select3(p, "train.scale_next", finite, clean_scale, ob(p, "train.scale_half", TF_OP_MUL, scale, onum(p, 0.5)));
    tf_value *new_good = select3(p, "train.good_next", finite, clean_good, tf_const(m, 0, TF_DT_I64));
    if (is_last) {
        new_scale = select3(p, "train.scale_commit", is_last, new_scale, scale);
        new_good = select3(p, "train.good_commit", is_last, new_good, good);
    }
    if (add_update(p, scale, new_scale) || add_update(p, good, new_good)) return g->d->status;
    if (tf_module_add_output(m, "loss_scale", scale, p->loc)) return tf_diag_error(g->d, TF_IR_ERR_OOM, NULL, "out of memory");
    tf_explain(g->o, "autodiff", &p->loc, "fp16 loss scaling: dynamic scale from 65536 (x2 after 2000 clean steps, "
               "x0.5 and the step skipped on inf/NaN); output loss_scale");
    return TF_IR_OK;
}

/* clip_grad_norm: every gradient scaled by min(1, max_norm / global norm). */
static void clip_grads(opt *p, const tf_train *tr, gradset *gs)
{
    tf_grad_ctx *g = p->g;
    tf_named_attr to_f = {"to", tf_attr_dtype(TF_DT_F32)};
    tf_value *total = NULL;
    for (int i = 0; i < gs->n; i++) {
        char nm[512];
        snprintf(nm, sizeof nm, "%s.grad_sq", gs->params[i]->name);
        tf_value *sq = sumsq(p, nm, gs->grads[i]);
        if (sq && sq->type.dtype != TF_DT_F32) sq = build(g, nm, &p->loc, TF_OP_CAST, &sq, 1, &to_f, 1);
        total = total ? ob(p, "clip.total", TF_OP_ADD, total, sq) : sq;
    }
    tf_value *norm = ob(p, "clip.norm", TF_OP_SQRT, total, NULL);
    tf_value *coef = ob(p, "clip.coef", TF_OP_MINIMUM,
                        ob(p, "clip.ratio", TF_OP_DIV, onum(p, tr->clip_grad_norm), ob(p, "clip.norm_eps", TF_OP_ADD, norm, onum(p, 1e-6))),
                        onum(p, 1));
    for (int i = 0; i < gs->n && !g->failed; i++) {
        char nm[512];
        snprintf(nm, sizeof nm, "%s.grad_clipped", gs->params[i]->name);
        tf_value *cf = coef;
        if (gs->grads[i]->type.dtype != TF_DT_F32) {
            tf_named_attr ca = {"to", tf_attr_dtype(gs->grads[i]->type.dtype)};
            cf = build(g, "clip.coef_cast", &p->loc, TF_OP_CAST, &coef, 1, &ca, 1);
        }
        gs->grads[i] = ob(p, nm, TF_OP_MUL, gs->grads[i], cf);
    }
    tf_explain(g->o, "autodiff", &p->loc, "clip_grad_norm %g: every gradient scaled by min(1, %g / global norm)",
               tr->clip_grad_norm, tr->clip_grad_norm);
}

static tf_ir_status optimizer(tf_grad_ctx *g, tf_value *loss, tf_value *scale)
{
    tf_module *m = g->m;
    const tf_train *tr = &m->train;
    opt p = {g, tr->present ? tr->loc : loss->loc};
    tf_type scalar_i = {.dtype = TF_DT_I64, .rank = 0};
    tf_value *step = tf_module_add_decl(m, "train.step", TF_VAL_BUFFER, &scalar_i, TF_INIT_ZEROS);
    if (!step) return decl_failed(m, g->d, &p.loc, "the step counter", "train.step");
    tf_named_attr to_f = {"to", tf_attr_dtype(TF_DT_F32)};
    tf_value *s = build(g, "train.s", &p.loc, TF_OP_CAST, &step, 1, &to_f, 1);
    tf_value *t = ob(&p, "train.t", TF_OP_ADD, s, onum(&p, 1));
    tf_value *first = ob(&p, "train.first", TF_OP_EQ, s, onum(&p, 0));
    double base = tr->optimizer.fn < 0 ? 0.01 : tf_call_float(tf_optimizer_fns, &tr->optimizer, "lr");
    if (tr->schedule.fn == TF_SCHED_ONECYCLE) base = tf_call_float(tf_schedule_fns, &tr->schedule, "max_lr");
    tf_value *lr = schedule(&p, tr, base, s);
    if (g->failed) return g->d->status;
    if (g->o->shard_ranks && tr->optimizer.fn == TF_OPT_LAMB)
        return tf_diag_error(g->d, TF_IR_ERR_VERIFY, &tr->optimizer.loc, "lamb with shard_optimizer: its trust ratio needs the "
                             "norms of whole params, and each rank updates a chunk of each; use adamw, adam or sgd, or leave "
                             "the optimizer state unsharded");
    gradset *gs = tf_calloc(1, sizeof *gs);
    if (!gs) return tf_diag_error(g->d, TF_IR_ERR_OOM, NULL, "out of memory");
    tf_value *commit = NULL, *is_last = NULL;   /* bool: apply this step's updates; the last micro-batch */
    tf_ir_status st = collect_grads(&p, gs);
    if (!st) st = grad_outputs(&p, gs, scale);
    if (!st) st = data_parallel(&p, gs);
    if (!st) st = accumulate(&p, tr, gs, &commit, &is_last);
    if (!st && scale) st = loss_scaling(&p, gs, scale, &commit, is_last);
    int first_guarded = m->nupdates;
    if (!st && tr->has_clip) clip_grads(&p, tr, gs);
    for (int i = 0; !st && i < gs->n; i++)
        if (update_param(&p, tr, gs->params[i], gs->grads[i], lr, t, first)) st = g->d->status;
    int np = gs->n;
    tf_free(gs);
    if (st) return st;
    tf_value *next = ob(&p, "train.step_next", TF_OP_ADD, step, tf_const(m, 1, TF_DT_I64));
    if (add_update(&p, step, next)) return g->d->status;
    /* a step that does not commit (inf/NaN under fp16, a micro-batch before
     * the last) leaves params, optimizer state and the step counter as they were */
    for (int i = first_guarded; commit && i < m->nupdates && !g->failed; i++) {
        tf_update *u = &m->updates[i];
        char nm[512];
        snprintf(nm, sizeof nm, "%s.commit", u->buffer->name);
        u->value = select3(&p, nm, commit, u->value, u->buffer);
    }
    if (tf_module_add_output(m, "lr", lr, p.loc)) return tf_diag_error(g->d, TF_IR_ERR_OOM, NULL, "out of memory");
    if (g->o->shard_ranks)
        tf_explain(g->o, "autodiff", &p.loc, "shard_optimizer: each of %d ranks updates 1/%d of every param (shard) and keeps the "
                   "optimizer state of that chunk; the params are gathered back (allgather)", g->o->shard_ranks, g->o->shard_ranks);
    const char *oname = tr->optimizer.fn < 0 ? "sgd (no train block optimizer: lr=0.01)" : tf_optimizer_fns[tr->optimizer.fn].name;
    tf_explain(g->o, "autodiff", &p.loc, "%d params updated by %s, schedule %s; the learning rate is output lr", np, oname,
               tr->schedule.fn < 0 ? "constant" : tf_schedule_fns[tr->schedule.fn].name);
    return g->failed ? g->d->status : TF_IR_OK;
}

static tf_value *find_loss(const tf_module *m)
{
    for (int i = 0; i < m->noutputs; i++)
        if (!strcmp(m->outputs[i].name, "loss")) return m->outputs[i].value;
    for (int i = 0; i < m->noutputs; i++)
        if (m->outputs[i].value->type.rank == 0 && tf_dtype_is_float(m->outputs[i].value->type.dtype))
            return m->outputs[i].value;
    return NULL;
}

/* The output named loss must be one floating number: a tensor would be
 * trained on the sum of its elements, rarely what was meant. */
static tf_ir_status check_loss(const tf_module *m, const tf_options *o)
{
    for (int i = 0; i < m->noutputs; i++) {
        const tf_output *out = &m->outputs[i];
        const tf_type *t = &out->value->type;
        if (strcmp(out->name, "loss") || (tf_type_numel(t) == 1 && tf_dtype_is_float(t->dtype))) continue;
        char buf[256];
        return tf_diag_error(o->diag, TF_IR_ERR_VERIFY, &out->loc,
                             "the loss '%s' is %s, and training minimizes one floating number: %s", out->value->name,
                             tf_type_str(m, t, buf),
                             tf_dtype_is_float(t->dtype) ? "reduce it to a scalar first (mean or sum with axes=[])"
                                                         : "a loss is a floating value");
    }
    return TF_IR_OK;
}

/* A trained param lives in f32 (or f64): the optimizer's update and slots
 * are computed there, and adding a small step to a 16-bit weight loses it
 * to rounding. 16-bit training is the train block's precision, which keeps
 * f32 masters and casts them for the forward and backward passes. */
static tf_ir_status check_params(const tf_module *m, const tf_options *o)
{
    for (int i = 0; i < m->decls.n; i++) {
        const tf_value *v = m->decls.items[i];
        if (v->kind != TF_VAL_PARAM || (v->type.dtype != TF_DT_F16 && v->type.dtype != TF_DT_BF16)) continue;
        const char *dt = tf_dtype_name(v->type.dtype);
        return tf_diag_error(o->diag, TF_IR_ERR_VERIFY, &v->loc,
                             "param '%s' is %s, and a trained param is kept in f32 (the optimizer's update would round "
                             "away in %s): declare it f32 and train with precision = %s in the train block (or "
                             "--precision=%s), which keeps f32 masters and computes in %s",
                             v->name, dt, dt, v->type.dtype == TF_DT_F16 ? "fp16" : "bf16",
                             v->type.dtype == TF_DT_F16 ? "fp16" : "bf16", dt);
    }
    return TF_IR_OK;
}

tf_ir_status pass_autodiff(tf_module *m, const tf_options *o)
{
    if (o->mode != TF_IR_TRAIN) {
        tf_explain(o, "autodiff", NULL, "infer mode: forward only, nothing saved for a backward pass");
        return TF_IR_OK;
    }
    if (tf_module_find_value(m, "train.step")) {
        tf_explain(o, "autodiff", NULL, "the module is already a training step (train.step exists)");
        return TF_IR_OK;
    }
    if (check_loss(m, o)) return o->diag->status;
    tf_value *loss = find_loss(m);
    bool any_param = false;
    for (int i = 0; i < m->decls.n; i++) any_param |= ((tf_value *)m->decls.items[i])->kind == TF_VAL_PARAM;
    if (!loss || !any_param) {   /* nothing to train: train-mode semantics, forward only */
        tf_explain(o, "autodiff", NULL, "%s: the step runs forward only (batch statistics, dropout on), no backward",
                   !loss ? "no loss output (an output named 'loss' or a scalar floating one)" : "no params");
        return TF_IR_OK;
    }
    if (check_params(m, o)) return o->diag->status;
    /* fp16: the loss is scaled before the backward pass (dynamic scale,
     * a buffer) so small gradients survive half precision; bf16 needs none.
     * Declared before numbering: the gradient tables are indexed by id. */
    tf_value *scale = NULL;
    if (tf_options_precision(o, m) == TF_PREC_FP16) {
        tf_type scalar_f = {.dtype = TF_DT_F32, .rank = 0};
        scale = tf_module_add_decl(m, "train.loss_scale", TF_VAL_BUFFER, &scalar_f, TF_INIT_CONST);
        if (!scale)
            return decl_failed(m, o->diag, &loss->loc, "the loss scale", "train.loss_scale");
        scale->init.attrs[0] = tf_attr_float(65536.0);
    }
    tf_module_renumber(m);
    tf_grad_ctx g = {.m = m, .o = o, .d = o->diag, .nvals = m->next_id};
    g.wants = tf_calloc((size_t)(g.nvals ? g.nvals : 1), sizeof *g.wants);
    g.grad = tf_calloc((size_t)(g.nvals ? g.nvals : 1), sizeof *g.grad);
    tf_ir_status st = TF_IR_OK;
    if (!g.wants || !g.grad) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in autodiff");
        goto done;
    }
    for (int i = 0; i < m->decls.n; i++) g.wants[((tf_value *)m->decls.items[i])->id] = ((tf_value *)m->decls.items[i])->kind == TF_VAL_PARAM;
    int nfwd = g.nfwd = m->nodes.n;
    for (int i = 0; i < nfwd; i++) {
        tf_node *n = m->nodes.items[i];
        if (!tf_grad_rule(n->op)) continue;
        for (int k = 0; k < n->nin; k++)
            if (gr_wants(&g, n, k)) g.wants[n->out->id] = true;
    }
    if (loss->kind != TF_VAL_NODE || !g.wants[loss->id]) {
        st = tf_diag_error(o->diag, TF_IR_ERR_VERIFY, &loss->loc, "the loss '%s' does not depend on any param: nothing to train",
                           loss->name);
        goto done;
    }
    g.grad[loss->id] = scale ? scale : gnum(&g, 1.0);
    if (scale && loss->type.dtype != TF_DT_F32) {
        tf_named_attr to = {"to", tf_attr_dtype(loss->type.dtype)};
        g.grad[loss->id] = build(&g, "train.loss_scale_cast", &loss->loc, TF_OP_CAST, &scale, 1, &to, 1);
    }
    if (!g.grad[loss->id]) {
        st = o->diag->status;
        goto done;
    }
    int nback = 0;
    for (int i = nfwd - 1; i >= 0 && !st; i--) {
        tf_node *n = m->nodes.items[i];
        tf_value *dy = g.grad[n->out->id];
        if (!dy || !g.wants[n->out->id]) continue;
        int before = m->nodes.n;
        st = tf_grad_rule(n->op)(&g, n, dy);
        if (!st && g.failed) st = o->diag->status ? o->diag->status : TF_IR_ERR_INTERNAL;
        nback += m->nodes.n - before;
    }
    if (!st) {
        tf_explain(o, "autodiff", &loss->loc, "backward of %s: %d ops for %d forward ops", loss->name, nback, nfwd);
        st = optimizer(&g, loss, scale);
    }
    if (!st) {   /* everything after the forward ops: backward pass and optimizer */
        for (int i = nfwd; i < m->nodes.n; i++) ((tf_node *)m->nodes.items[i])->backward = true;
        m->backward_start = nfwd;
    }
    if (!st) tf_module_renumber(m);
done:
    tf_free(g.wants);
    tf_free(g.grad);
    return st;
}
