/* bias_drop.c — "no bias before BatchNorm", applied by the compiler.
 *
 * Train mode: a training batchnorm subtracts the batch mean of each channel,
 * so a per-channel constant added before it cancels exactly. The bias of a
 * conv2d (channel axis 1) or of a linear with a [N, C] result feeding a
 * batchnorm is such a constant, also through ops that carry a per-channel
 * constant through unchanged (the shift rules below). The conv/linear loses
 * its bias operand; a bias param nothing else reads stays in the module with
 * an exactly zero gradient (zero_grad), so the optimizer treats it as
 * PyTorch's does a bias whose gradient the batchnorm cancels: weight decay
 * still shrinks it, Adam's moments stay zero, and the checkpoint keeps it.
 * The running mean then tracks the batch mean without the bias (it differs
 * by the bias, which is what a model without that bias would hold).
 *
 * Infer mode: a batchnorm with running statistics is a per-channel affine
 * map y = x * scale + shift, so one right after a conv2d/linear folds into it:
 *   scale = gamma * rsqrt(running_var + eps)           [C]
 *   w'    = w * scale  per output channel              (conv [O,1,1,1]; linear [in, out] on its last axis)
 *   b'    = beta + (b - running_mean) * scale          (beta - running_mean * scale without a bias)
 * The new weights are core ops on the params (params are loaded at run time),
 * computed in fp32 for fp16/bf16 layers like batchnorm itself, and placed
 * where the batchnorm was; the folded conv2d/linear takes its name.
 *
 * Every decision, made or declined, goes to --explain with its reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define PASS "bias_drop"

/* ---- the rules: sources of a per-channel bias, ops a per-channel shift passes ---- */

/* conv2d's result is [N, O, H, W] and its bias runs along O = batchnorm's
 * channel axis 1; linear's bias runs along its last axis, axis 1 only for a
 * [N, C] result. */
static bool is_source(const tf_node *n) { return n->op == TF_OP_CONV2D || n->op == TF_OP_LINEAR; }
static bool bias_on_axis1(const tf_node *n) { return n->op == TF_OP_CONV2D || n->out->type.rank == 2; }

static bool no_padding(const tf_node *n)
{
    const tf_attr *p = tf_node_attr_named(n, "padding");
    for (int i = 0; p && i < p->u.ints.n; i++)
        if (p->u.ints.v[i].v != 0) return false;
    return true;
}

/* op(x + c) = op(x) + c for c constant over each channel. */
static const struct shift_rule {
    int op;
    bool (*ok)(const tf_node *n);   /* NULL: always */
    const char *why_not;            /* when ok() fails */
} shift_rules[] = {
    {TF_OP_MAXPOOL2D, NULL, NULL},                  /* pads with -inf: max(x + c) = max(x) + c */
    {TF_OP_AVGPOOL2D, no_padding, "counts padding zeros in its border windows"},
    {TF_OP_GLOBAL_AVGPOOL, NULL, NULL},             /* [N, C, ...] -> [N, C] keeps the channel axis */
};

static const struct shift_rule *shift_rule_of(int op)
{
    for (size_t i = 0; i < sizeof shift_rules / sizeof *shift_rules; i++)
        if (shift_rules[i].op == op) return &shift_rules[i];
    return NULL;
}

static const char *opname(const tf_node *n) { return tf_op_info_of(n->op)->name; }

/* ---- uses ---- */

/* uses[id]: operand slots, outputs and updates that read the value. */
static int *count_uses(tf_module *m)
{
    tf_module_renumber(m);
    int *uses = tf_calloc((size_t)(m->next_id ? m->next_id : 1), sizeof *uses);
    if (!uses) return NULL;
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k]->kind != TF_VAL_CONST) uses[n->in[k]->id]++;
    }
    for (int i = 0; i < m->noutputs; i++) uses[m->outputs[i].value->id]++;
    for (int i = 0; i < m->nupdates; i++) uses[m->updates[i].value->id]++;
    return uses;
}

/* The name of something that reads v, for messages. */
static const char *a_user(const tf_module *m, const tf_value *v)
{
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] == v) return n->out->name;
    }
    for (int i = 0; i < m->noutputs; i++)
        if (m->outputs[i].value == v) return m->outputs[i].name;
    return "an update";
}

/* ---- train mode: drop biases a batch mean cancels ---- */

static void drop_bias(tf_module *m, const tf_options *o, tf_node *bn, int *uses)
{
    char why[512] = "", via[256] = "";
    size_t vlen = 0;
    tf_value *v = bn->in[0];
    /* Walk up from the batchnorm to a conv2d/linear. Shift-rule ops are
     * passed; a few other ops are walked through only to say why nothing is
     * dropped. */
    for (int depth = 0; v->kind == TF_VAL_NODE && !is_source(v->def); depth++) {
        const tf_node *p = v->def;
        const struct shift_rule *r = shift_rule_of(p->op);
        if (depth == 4 || p->op == TF_OP_BATCHNORM || p->nin < 1 || p->in[0]->kind == TF_VAL_CONST) return;
        if (!why[0] && !r)
            snprintf(why, sizeof why, "%s %s between them does not commute with a per-channel shift", opname(p),
                     p->out->name);
        else if (!why[0] && r->ok && !r->ok(p))
            snprintf(why, sizeof why, "%s %s between them %s, so the shift differs across positions", opname(p),
                     p->out->name, r->why_not);
        else if (!why[0] && uses[p->in[0]->id] != 1)
            snprintf(why, sizeof why, "%s has other uses, which see the bias", p->in[0]->name);
        if (!why[0] && vlen < sizeof via) {
            int k = snprintf(via + vlen, sizeof via - vlen, "%s%s %s", vlen ? ", " : "", opname(p), p->out->name);
            vlen += k > 0 ? (size_t)k : 0;
        }
        v = p->in[0];
    }
    if (v->kind != TF_VAL_NODE || v->def->nin != 3) return;   /* no bias to drop */
    tf_node *c = v->def;
    tf_value *b = c->in[2];
    if (!why[0] && uses[v->id] != 1)
        snprintf(why, sizeof why, "its result has other uses, which see the bias");
    else if (!why[0] && !bias_on_axis1(c))
        snprintf(why, sizeof why, "its result is rank %d, so the bias runs along axis %d, not batchnorm's channel "
                 "axis 1", c->out->type.rank, c->out->type.rank - 1);
    else if (!why[0] && b->kind != TF_VAL_PARAM)
        snprintf(why, sizeof why, "the bias is not a param");
    if (why[0]) {
        tf_explain(o, PASS, &c->loc, "kept bias %s of %s %s before batchnorm %s: %s", b->name ? b->name : "(number)",
                   opname(c), v->name, bn->out->name, why);
        return;
    }
    c->nin = 2;   /* same op, name, attributes and result type, no bias */
    bool gone = --uses[b->id] == 0;
    if (gone) b->zero_grad = true;
    tf_explain(o, PASS, &c->loc, "dropped bias %s of %s %s: batchnorm %s normalizes with the batch mean, which cancels "
               "a per-channel constant%s%s%s; param %s %s%s", b->name, opname(c), v->name, bn->out->name,
               vlen ? " (passed through " : "", via, vlen ? " unchanged)" : "", b->name,
               gone ? "read by nothing now: its gradient is zero, and it stays in the state for the optimizer "
                      "(weight decay still moves it, as PyTorch's does)" : "kept: still used by ",
               gone ? "" : a_user(m, b));
}

/* ---- infer mode: fold batchnorm into the conv2d/linear before it ---- */

typedef struct fold {
    tf_module *m;
    tf_diag *d;
    const tf_node *bn;
    bool half;        /* compute the new weights in fp32, store them in the layer's dtype */
    bool failed;
} fold;

/* One core op named <bn>.<suffix> (suffix NULL: the batchnorm's own name). */
static tf_value *mk(fold *f, int op, const char *suffix, tf_value **in, int nin, const tf_named_attr *a, int na)
{
    if (f->failed) return NULL;
    for (int i = 0; i < nin; i++)
        if (!in[i]) return NULL;
    char name[512];
    if (suffix) snprintf(name, sizeof name, "%s.%s", f->bn->out->name, suffix);
    tf_value *v = tf_build(f->m, f->d, op, in, nin, a, na, suffix ? name : f->bn->out->name, &f->bn->loc);
    if (!v) f->failed = true;
    return v;
}

static tf_value *mk2(fold *f, int op, const char *suffix, tf_value *a, tf_value *b)
{
    tf_value *in[2] = {a, b};
    return mk(f, op, suffix, in, 2, NULL, 0);
}

static tf_value *cast(fold *f, const char *suffix, tf_value *x, tf_dt to)
{
    if (!f->half) return x;
    tf_named_attr a = {"to", tf_attr_dtype(to)};
    return mk(f, TF_OP_CAST, suffix, &x, 1, &a, 1);
}

/* Build the folded layer where the batchnorm was; returns its result. */
static tf_value *fold_bn(fold *f, const tf_node *c)
{
    const tf_node *bn = f->bn;
    tf_dt dt = c->out->type.dtype;
    tf_value *g = cast(f, "gamma.f32", bn->in[1], TF_DT_F32), *beta = cast(f, "beta.f32", bn->in[2], TF_DT_F32);
    tf_value *rm = cast(f, "mean.f32", bn->in[3], TF_DT_F32), *rv = cast(f, "var.f32", bn->in[4], TF_DT_F32);
    tf_value *w = cast(f, "w_in.f32", c->in[1], TF_DT_F32), *b = c->nin == 3 ? cast(f, "b_in.f32", c->in[2], TF_DT_F32) : NULL;
    tf_value *eps = tf_const(f->m, tf_node_float(bn, "eps"), TF_DT_F32);
    if (!eps) {
        tf_diag_error(f->d, TF_IR_ERR_OOM, &bn->loc, "out of memory");
        f->failed = true;
    }
    tf_value *scale = mk2(f, TF_OP_MUL, "scale", g, mk(f, TF_OP_RSQRT, "inv_std", (tf_value *[]){mk2(f, TF_OP_ADD, "var_eps", rv, eps)}, 1, NULL, 0));
    tf_value *wscale = scale;
    if (c->op == TF_OP_CONV2D && !f->failed) {   /* [O] -> [O, 1, 1, 1] */
        int64_t shape[4] = {c->out->type.dims[1].n, 1, 1, 1};
        tf_named_attr a = {"shape", tf_attr_ints(f->m, shape, 4)};
        if (a.attr.kind == TF_ATTR_NONE) {
            tf_diag_error(f->d, TF_IR_ERR_OOM, &bn->loc, "out of memory");
            f->failed = true;
            return NULL;
        }
        a.attr.u.ints.v[0].sym = c->out->type.dims[1].sym;
        wscale = mk(f, TF_OP_RESHAPE, "scale_w", &scale, 1, &a, 1);
    }
    tf_value *nw = mk2(f, TF_OP_MUL, f->half ? "w.f32" : "w", w, wscale);
    tf_value *nb = b ? mk2(f, TF_OP_ADD, f->half ? "b.f32" : "b", beta, mk2(f, TF_OP_MUL, "bias_s", mk2(f, TF_OP_SUB, "bias_c", b, rm), scale))
                     : mk2(f, TF_OP_SUB, f->half ? "b.f32" : "b", beta, mk2(f, TF_OP_MUL, "mean_s", rm, scale));
    tf_value *in[3] = {c->in[0], cast(f, "w", nw, dt), cast(f, "b", nb, dt)};
    tf_named_attr attrs[8];
    const tf_op_info *oi = tf_op_info_of(c->op);
    int na = 0;
    for (int i = 0; i < oi->nattrs && na < 8; i++)
        if (c->attrs[i].set) attrs[na++] = (tf_named_attr){oi->attrs[i].name, c->attrs[i]};
    return mk(f, c->op, NULL, in, 3, attrs, na);
}

/* NULL if batchnorm bn folds into the conv2d/linear that computes its input,
 * else why not. */
static const char *fold_blocker(const tf_node *bn, const int *uses)
{
    const tf_value *x = bn->in[0];
    if (x->kind != TF_VAL_NODE || !is_source(x->def)) return "it is not a conv2d or linear result";
    if (uses[x->id] != 1) return "it has other uses, which need it unscaled";
    if (!bias_on_axis1(x->def)) return "it is not [N, C], so the linear's output axis is not batchnorm's channel axis 1";
    return NULL;
}

static void explain_fold(const tf_options *o, const tf_node *bn, const tf_node *c, const tf_value *r, bool half)
{
    const tf_node *f = r->def;
    char bias[256];
    if (c->nin == 3) snprintf(bias, sizeof bias, "%s + (%s - %s) * scale", bn->in[2]->name, c->in[2]->name, bn->in[3]->name);
    else snprintf(bias, sizeof bias, "%s - %s * scale", bn->in[2]->name, bn->in[3]->name);
    tf_explain(o, PASS, &bn->loc, "folded batchnorm %s into %s %s: in inference its running statistics are constants, "
               "so it is a per-channel scale and shift; %s = %s(%s, %s, %s) with %s = %s * scale, %s = %s, scale = %s * "
               "rsqrt(%s + eps)%s, computed from the params at run time", bn->out->name, opname(c), c->out->name, r->name,
               opname(c), f->in[0]->name, f->in[1]->name, f->in[2]->name, f->in[1]->name, c->in[1]->name,
               f->in[2]->name, bias, bn->in[1]->name, bn->in[4]->name, half ? " (in fp32)" : "");
}

/* One round of folds; *nfolded says how many. A round that folds nothing
 * explains every batchnorm it leaves (only the last round: a fold can make
 * another possible, as in batchnorm(batchnorm(conv2d))). */
static tf_ir_status fold_round(tf_module *m, const tf_options *o, const int *uses, int *nfolded)
{
    size_t cap = (size_t)(m->next_id ? m->next_id : 1);
    tf_node **fold_of = tf_calloc(cap, sizeof *fold_of);   /* batchnorm id -> the conv2d/linear it folds into */
    bool *dead = tf_calloc(cap, sizeof *dead);             /* conv2d/linear ids folded away */
    tf_value **map = tf_calloc(cap, sizeof *map);          /* batchnorm id -> folded layer */
    tf_ir_status st = TF_IR_OK;
    *nfolded = 0;
    if (!fold_of || !dead || !map) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
        goto done;
    }
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        if (n->op != TF_OP_BATCHNORM) continue;
        const char *why = fold_blocker(n, uses);
        if (!why) {
            fold_of[n->out->id] = n->in[0]->def;
            dead[n->in[0]->id] = true;
            ++*nfolded;
        }
    }
    for (int i = 0; i < m->nodes.n && !*nfolded; i++) {
        const tf_node *n = m->nodes.items[i];
        const tf_value *x = n->in[0];
        if (n->op == TF_OP_BATCHNORM)
            tf_explain(o, PASS, &n->loc, "batchnorm %s not folded into its input %s (%s): %s; lower makes it a "
                       "per-channel scale and shift", n->out->name, x->name, x->kind == TF_VAL_NODE ? opname(x->def) :
                       "a declaration", fold_blocker(n, uses));
    }
    if (!*nfolded) goto done;
    tf_vec old = m->nodes;   /* rebuild the list: folded layers go where their batchnorm was */
    memset(&m->nodes, 0, sizeof m->nodes);
    for (int i = 0; i < old.n && !st; i++) {
        tf_node *n = old.items[i], *c = fold_of[n->out->id];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k]->kind != TF_VAL_CONST && map[n->in[k]->id]) n->in[k] = map[n->in[k]->id];
        if (dead[n->out->id]) {
            tf_module_remove_name(m, n->out);
            continue;
        }
        if (!c) {
            if (tf_module_append_node(m, n)) st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
            continue;
        }
        fold f = {m, o->diag, n, c->out->type.dtype == TF_DT_F16 || c->out->type.dtype == TF_DT_BF16, false};
        tf_module_remove_name(m, n->out);   /* the folded layer takes the batchnorm's name */
        tf_value *r = fold_bn(&f, c);
        if (!r) {
            st = o->diag->status ? o->diag->status : TF_IR_ERR_INTERNAL;
        } else if (!tf_type_equal(&r->type, &n->out->type)) {
            char b1[256], b2[256];
            st = tf_diag_error(o->diag, TF_IR_ERR_INTERNAL, &n->loc, "internal: folding batchnorm %s gave %s, expected %s",
                               n->out->name, tf_type_str(m, &r->type, b1), tf_type_str(m, &n->out->type, b2));
        } else {
            map[n->out->id] = r;
            explain_fold(o, n, c, r, f.half);
        }
    }
    if (!st) {
        for (int i = 0; i < m->noutputs; i++)
            if (map[m->outputs[i].value->id]) m->outputs[i].value = map[m->outputs[i].value->id];
        for (int i = 0; i < m->nupdates; i++)
            if (map[m->updates[i].value->id]) m->updates[i].value = map[m->updates[i].value->id];
    }
    tf_free(old.items);
done:
    tf_free(fold_of);
    tf_free(dead);
    tf_free(map);
    return st;
}

tf_ir_status pass_bias_drop(tf_module *m, const tf_options *o)
{
    tf_ir_status st = TF_IR_OK;
    for (int nfolded = 1; nfolded && !st;) {
        int *uses = count_uses(m);
        if (!uses) return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
        nfolded = 0;
        if (o->mode == TF_IR_TRAIN) {
            for (int i = 0; i < m->nodes.n; i++) {
                tf_node *n = m->nodes.items[i];
                if (n->op == TF_OP_BATCHNORM) drop_bias(m, o, n, uses);
            }
        } else {
            st = fold_round(m, o, uses, &nfolded);
        }
        tf_free(uses);
    }
    tf_module_renumber(m);
    return st;
}
