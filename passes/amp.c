/* amp.c — automatic mixed precision: pick fp16/bf16 or fp32 for every op.
 *
 * The train block's `precision = fp16|bf16` (or --precision) names the half
 * type h; fp32 leaves the module alone. Each op's policy comes from the op
 * table's AMP column, as PyTorch's autocast lists do:
 *
 *   ALLOW   (matmul, conv2d)      floating operands other than f64 are cast
 *                                 to h; the op runs, and its result is, in h.
 *   DENY    (reductions, exp, log, pow, avgpool)  f16/bf16 operands are cast
 *                                 to f32: reductions accumulate in fp32.
 *   FOLLOW  (everything else)     runs in the widest floating dtype among its
 *                                 activation operands (f64 > f32 > f16, bf16;
 *                                 f16 with bf16 gives f32, as
 *                                 torch.promote_types); params and buffers
 *                                 (and views of them) follow the activations:
 *                                 a bias after a half matmul is cast to half,
 *                                 as in an autocast linear.
 *
 * Integer and bool operands are never touched, nor are numbers written as
 * operands (the verifier gives them their op's dtype). Result types are
 * re-inferred from the new operands, so a half value flows on through the
 * FOLLOW ops after a matmul until something wider or a DENY op meets it.
 *
 * Declarations never change: params stay f32 masters and are cast at their
 * uses. Outputs and buffer updates keep the dtype they had before the pass
 * (a cast is added at the end; an output keeps its name). There is one cast
 * per (value, dtype): casts already in the module are reused, and a value
 * that is itself an exact widening cast of one already in the wanted dtype
 * (cast(h16, to=f32) wanted in f16) is replaced by that value. After a run
 * every FOLLOW op's operands agree, every ALLOW op's are half and no DENY
 * op's are, so a second run finds nothing to do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct amp {
    tf_module *m;
    const tf_options *o;
    tf_dt half;           /* f16 or bf16 */
    tf_value **casts;     /* [id * TF_DT_COUNT + dt]: the cast of value id to dt */
    int nids;             /* ids below this index casts[] (values that predate the pass) */
    int ninserted;
    char names[512];      /* casts given to the op in hand, for --explain */
    size_t nnames;
} amp;

/* Floating dtypes by width; 0 for integers and bool. f16 and bf16 tie. */
static int width(tf_dt t)
{
    switch (t) {
    case TF_DT_F64: return 3;
    case TF_DT_F32: return 2;
    case TF_DT_F16: case TF_DT_BF16: return 1;
    default: return 0;
    }
}

static bool is_half(tf_dt t) { return width(t) == 1; }

/* The dtype two floating dtypes compute in together. */
static tf_dt promote(tf_dt a, tf_dt b)
{
    if (a == b) return a;
    if (width(a) == width(b)) return TF_DT_F32;   /* f16 with bf16: neither holds the other */
    return width(a) > width(b) ? a : b;
}

/* A cast of v to dt defined before the op in hand: reused, or appended now.
 * name: the new cast's name hint (NULL: "<v>.<dt>"). */
static tf_value *cast_to(amp *a, tf_value *v, tf_dt dt, const char *name, const tf_loc *loc)
{
    if (v->type.dtype == dt) return v;
    if (v->kind == TF_VAL_NODE && v->def->op == TF_OP_CAST) {
        tf_value *src = v->def->in[0];   /* v = cast(src) widened exactly: src is v in dt */
        if (src->kind != TF_VAL_CONST && src->type.dtype == dt && width(dt) > 0 && width(dt) < width(v->type.dtype))
            return src;
    }
    bool cached = v->id >= 0 && v->id < a->nids;
    tf_value **slot = cached ? &a->casts[(size_t)v->id * TF_DT_COUNT + dt] : NULL;
    if (slot && *slot) return *slot;
    char hint[512];
    snprintf(hint, sizeof hint, "%s.%s", name ? name : v->name, tf_dtype_name(dt));
    tf_named_attr to = {"to", tf_attr_dtype(dt)};
    tf_value *c = tf_build(a->m, a->o->diag, TF_OP_CAST, &v, 1, &to, 1, hint, loc);
    if (!c) return NULL;
    c->id = -1;   /* not a key of casts[] */
    if (slot) *slot = c;
    a->ninserted++;
    if (a->nnames < sizeof a->names)
        a->nnames += (size_t)snprintf(a->names + a->nnames, sizeof a->names - a->nnames, "%s%s",
                                      a->nnames ? ", " : "", c->name);
    return c;
}

/* An existing cast becomes the one every later use of its operand shares. */
static void remember_cast(amp *a, const tf_node *n)
{
    const tf_value *src = n->in[0];
    tf_dt dt = n->out->type.dtype;
    if (n->op != TF_OP_CAST || src->kind == TF_VAL_CONST || src->id < 0 || src->id >= a->nids) return;
    tf_value **slot = &a->casts[(size_t)src->id * TF_DT_COUNT + dt];
    if (!*slot) *slot = n->out;
}

/* Params and buffers, and layout views or casts of them: state that adapts
 * to the precision of the activations it meets (a bias follows its matmul). */
static bool is_state(const tf_value *v)
{
    for (int depth = 0; depth < 16; depth++) {
        if (v->kind == TF_VAL_PARAM || v->kind == TF_VAL_BUFFER) return true;
        if (v->kind != TF_VAL_NODE) return false;
        const tf_node *d = v->def;
        if (d->op != TF_OP_CAST && tf_op_info_of(d->op)->kind != TF_OPK_LAYOUT) return false;
        v = d->in[0];
    }
    return false;
}

/* The dtype the op should compute in under its policy; TF_DT_COUNT: none
 * (no floating tensor operand, or a policy that leaves these operands be).
 * FOLLOW: the widest activation operand decides; state operands follow it
 * (an op on state alone takes the widest state dtype). */
static tf_dt wanted(const amp *a, const tf_node *n, tf_amp_policy pol)
{
    tf_dt want = TF_DT_COUNT, want_state = TF_DT_COUNT;
    int nin = tf_op_has(n->op, TF_OPF_AMP_QKV) && n->nin > 3 ? 3 : n->nin;
    for (int k = 0; k < nin; k++) {
        const tf_value *v = n->in[k];
        tf_dt t = v->type.dtype;
        if (v->kind == TF_VAL_CONST || width(t) == 0) continue;
        if (pol == TF_AMP_ALLOW && t != TF_DT_F64) return a->half;
        if (pol == TF_AMP_DENY && is_half(t)) return TF_DT_F32;
        if (pol != TF_AMP_FOLLOW) continue;
        tf_dt *w = is_state(v) ? &want_state : &want;
        *w = *w == TF_DT_COUNT ? t : promote(*w, t);
    }
    return want != TF_DT_COUNT ? want : want_state;
}

static const char *policy_name(tf_amp_policy p)
{
    return p == TF_AMP_ALLOW ? "allow" : p == TF_AMP_DENY ? "deny: fp32 for range and accumulation"
                                                          : "follow: widest activation operand";
}

/* Re-derive the result type; a type annotation the source wrote was checked
 * when the module was read and gives way to the precision chosen here. */
static tf_ir_status reinfer(amp *a, tf_node *n)
{
    bool annotated = n->annotated;
    n->annotated = false;
    if (tf_infer_node(a->m, n, a->o->diag)) return a->o->diag->status;
    n->annotated = annotated && tf_type_equal(&n->annot, &n->out->type);
    return TF_IR_OK;
}

static tf_ir_status rewrite_node(amp *a, tf_node *n)
{
    const tf_op_info *oi = tf_op_info_of(n->op);
    tf_dt before = n->out->type.dtype, want = wanted(a, n, oi->amp);
    int inserted = a->ninserted;
    a->nnames = 0;
    a->names[0] = 0;
    int nin = tf_op_has(n->op, TF_OPF_AMP_QKV) && n->nin > 3 ? 3 : n->nin;   /* a mask, a saved result keep theirs */
    for (int k = 0; k < nin && want != TF_DT_COUNT; k++) {
        tf_value *v = n->in[k];
        tf_dt t = v->type.dtype;
        if (v->kind == TF_VAL_CONST || width(t) == 0 || t == want) continue;
        if (oi->amp == TF_AMP_ALLOW && t == TF_DT_F64) continue;
        if (oi->amp == TF_AMP_DENY && !is_half(t)) continue;
        int made = a->ninserted;
        if (!(n->in[k] = cast_to(a, v, want, NULL, &n->loc))) return a->o->diag->status;
        if (a->ninserted > made) n->in[k]->def->backward = n->backward;   /* a cast made for a backward use belongs there */
    }
    if (tf_module_append_node(a->m, n))
        return tf_diag_error(a->o->diag, TF_IR_ERR_OOM, &n->loc, "out of memory");
    if (reinfer(a, n)) return a->o->diag->status;
    remember_cast(a, n);
    if (a->ninserted == inserted && n->out->type.dtype == before) return TF_IR_OK;
    tf_dt runs = want != TF_DT_COUNT ? want : n->out->type.dtype;
    if (a->ninserted > inserted)
        tf_explain(a->o, "amp", &n->loc, "%s %s runs in %s (policy %s); operands cast: %s", oi->name, n->out->name,
                   tf_dtype_name(runs), policy_name(oi->amp), a->names);
    else
        tf_explain(a->o, "amp", &n->loc, "%s %s runs in %s (policy %s)", oi->name, n->out->name,
                   tf_dtype_name(runs), policy_name(oi->amp));
    return TF_IR_OK;
}

static tf_ir_status rename_value(amp *a, tf_value *v, const char *hint)
{
    tf_module_remove_name(a->m, v);
    if (!(v->name = tf_module_unique_name(a->m, hint)) || tf_module_add_name(a->m, v))
        return tf_diag_error(a->o->diag, TF_IR_ERR_OOM, &v->loc, "out of memory");
    return TF_IR_OK;
}

/* Outputs and buffer updates keep the dtype they had before the pass. An
 * output keeps its name too; when that is the name of the value it read
 * (`output z`), the value becomes z.<its dtype> and the cast takes the name z,
 * since an output may not name one value and read another. */
static tf_ir_status restore_boundaries(amp *a, const tf_dt *out_dt)
{
    for (int i = 0; i < a->m->noutputs; i++) {
        tf_output *out = &a->m->outputs[i];
        tf_value *v = out->value;
        if (v->type.dtype == out_dt[i]) continue;
        if (!(out->value = cast_to(a, v, out_dt[i], out->name, &out->loc))) return a->o->diag->status;
        tf_value *clash = tf_module_find_value(a->m, out->name);
        if (clash && clash != out->value) {
            char hint[512];
            snprintf(hint, sizeof hint, "%s.%s", out->name, tf_dtype_name(clash->type.dtype));
            if (rename_value(a, clash, hint) || rename_value(a, out->value, out->name)) return a->o->diag->status;
        }
        tf_explain(a->o, "amp", &out->loc, "output %s keeps %s: %s is %s, read through %s", out->name,
                   tf_dtype_name(out_dt[i]), v->name, tf_dtype_name(v->type.dtype), out->value->name);
    }
    for (int i = 0; i < a->m->nupdates; i++) {
        tf_update *u = &a->m->updates[i];
        tf_dt from = u->value->type.dtype;
        if (from == u->buffer->type.dtype) continue;
        tf_value *src = u->value;
        if (!(u->value = cast_to(a, u->value, u->buffer->type.dtype, NULL, &u->loc))) return a->o->diag->status;
        if (src->kind == TF_VAL_NODE && u->value->kind == TF_VAL_NODE) u->value->def->backward |= src->def->backward;
        tf_explain(a->o, "amp", &u->loc, "update %s keeps %s: the new value is %s, stored through %s", u->buffer->name,
                   tf_dtype_name(u->buffer->type.dtype), tf_dtype_name(from), u->value->name);
    }
    return TF_IR_OK;
}

tf_ir_status pass_amp(tf_module *m, const tf_options *o)
{
    tf_ir_precision p = tf_options_precision(o, m);
    if (p == TF_PREC_FP32) {
        tf_explain(o, "amp", NULL, "precision fp32: every value stays f32");
        return TF_IR_OK;
    }
    tf_module_renumber(m);
    amp a = {.m = m, .o = o, .half = p == TF_PREC_FP16 ? TF_DT_F16 : TF_DT_BF16, .nids = m->next_id};
    a.casts = tf_calloc((size_t)(a.nids ? a.nids : 1) * TF_DT_COUNT, sizeof *a.casts);
    tf_dt *out_dt = tf_malloc((size_t)(m->noutputs ? m->noutputs : 1) * sizeof *out_dt);
    tf_vec old = m->nodes;
    if (!a.casts || !out_dt) {
        tf_free(a.casts);
        tf_free(out_dt);
        return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
    }
    for (int i = 0; i < m->noutputs; i++) out_dt[i] = m->outputs[i].value->type.dtype;
    /* Rebuild the node list in order: each op's casts go just before it. */
    memset(&m->nodes, 0, sizeof m->nodes);
    tf_ir_status st = TF_IR_OK;
    for (int i = 0; i < old.n && !st; i++) st = rewrite_node(&a, old.items[i]);
    if (!st) st = restore_boundaries(&a, out_dt);
    tf_free(old.items);
    tf_free(a.casts);
    tf_free(out_dt);
    if (st) return st;
    tf_explain(o, "amp", NULL, "inserted %d casts (precision %s: matmul/conv in %s, reductions in f32)", a.ninserted,
               p == TF_PREC_FP16 ? "fp16" : "bf16", tf_dtype_name(a.half));
    tf_module_renumber(m);
    return TF_IR_OK;
}
