/* canonicalize.c — algebraic simplifications, stated as a table of rules.
 *
 * Each row of `rules` is a pattern over one node and its operands (an operand
 * may be any computed value, a given number, any number, or the result of a
 * given op) plus an optional guard, and either
 *   - `to`:   the value that replaces the node's result (x + 0 -> x), or
 *   - `edit`: an edit of the node itself (reshape(reshape(x)) reads x).
 * A replacement is taken only when its type equals the node's result type
 * exactly, dtype and shape: that single check is what keeps mul(x, 1) when
 * the 1 broadcasts x to a bigger shape, cast(x, to=f16) when x is not f16,
 * and reshape/broadcast that change a shape. An edit is taken only when the
 * edited node infers the same type as before.
 *
 * Nodes are visited in order and each is rewritten until no rule applies;
 * operands were visited first and are already in canonical form, so one
 * sweep reaches the fixed point. A replaced node is removed (its uses, its
 * outputs and updates go to the replacement; outputs keep their names); ops
 * left unused by an edit are dce's business. Numbers (x in a rule is never a
 * constant) are constfold's business.
 *
 * Rules that could change a number are left out on purpose: mul(x, 0) (NaN
 * and inf times 0 are NaN), and neg(neg(x)) on integers (the interpreter
 * saturates: neg(INT_MIN) is INT_MAX). The accepted differences are signs
 * of zero: add(x, 0) is +0.0 where x is -0.0, and maximum/minimum of +0.0
 * and -0.0 depend on the operand order (the values compare equal). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* ---- the matcher ---- */

enum { A_X, A_NUM, A_ANYNUM, A_OF };   /* what one operand of a pattern matches */

typedef struct apat {
    int kind;
    double num;   /* A_NUM: the number */
    int op;       /* A_OF: the operand is the result of this op */
} apat;

#define X        {A_X, 0, 0}              /* any value that is not a number; binds x */
#define NUM(v)   {A_NUM, v, 0}            /* a number equal to v (or v broadcast); binds c */
#define ANYNUM   {A_ANYNUM, 0, 0}         /* any number (or a broadcast number); binds c */
#define OF(o)    {A_OF, 0, TF_OP_##o}     /* the result of an `o` node; binds inner, x = its operand */

typedef struct match {
    tf_module *m;
    tf_node *n;       /* the node the rule is applied to (for an edit, a scratch copy) */
    tf_node *inner;   /* A_OF: the operand's node */
    tf_value *x, *c;
} match;

typedef struct rule {
    const char *name;
    int op;                        /* the root op, or -1: any op with `flag` */
    unsigned flag;
    int nin;
    apat in[2];
    bool (*when)(const match *);   /* extra condition, or NULL */
    tf_value *(*to)(const match *);
    bool (*edit)(match *);
} rule;

/* A number written as an operand, or a number broadcast to a shape. */
static bool number(const tf_value *v, double *out)
{
    if (v->kind == TF_VAL_NODE && v->def->op == TF_OP_BROADCAST) v = v->def->in[0];
    if (v->kind != TF_VAL_CONST) return false;
    *out = tf_dtype_round(v->type.dtype, v->cval);   /* the value the op sees */
    return true;
}

static bool match_operand(const apat *p, tf_value *v, match *mt)
{
    double c;
    switch (p->kind) {
    case A_X:
        if (v->kind == TF_VAL_CONST) return false;
        mt->x = v;
        return true;
    case A_NUM:
    case A_ANYNUM:
        if (!number(v, &c) || (p->kind == A_NUM && c != p->num)) return false;
        mt->c = v;
        return true;
    case A_OF:
        if (v->kind != TF_VAL_NODE || v->def->op != p->op || v->def->nin < 1 || v->def->in[0]->kind == TF_VAL_CONST)
            return false;
        mt->inner = v->def;
        mt->x = v->def->in[0];
        return true;
    default: return false;
    }
}

static bool match_rule(const rule *r, tf_node *n, match *mt)
{
    if (r->op >= 0 ? n->op != r->op : !tf_op_has(n->op, r->flag)) return false;
    if (n->nin != r->nin) return false;
    for (int k = 0; k < r->nin; k++)
        if (!match_operand(&r->in[k], n->in[k], mt)) return false;
    return !r->when || r->when(mt);
}

/* ---- guards and rewrites ---- */

static tf_value *to_x(const match *mt) { return mt->x; }

static bool is_float(const match *mt) { return tf_dtype_is_float(mt->x->type.dtype); }

/* Every value of dtype `from` is exactly a value of dtype `to`. */
static bool holds(tf_dt from, tf_dt to)
{
    if (from == to) return true;
    switch (from) {
    case TF_DT_BOOL: return true;   /* 0 and 1 */
    case TF_DT_F16: case TF_DT_BF16: return to == TF_DT_F32 || to == TF_DT_F64;
    case TF_DT_F32: return to == TF_DT_F64;
    case TF_DT_I32: return to == TF_DT_I64 || to == TF_DT_F64;
    default: return false;   /* i64 does not fit f64's 53 bits; nothing narrower holds f64 */
    }
}

static tf_dt cast_to(const tf_node *n) { return tf_node_attr_named(n, "to")->u.dt; }

/* cast(cast(x, to=A), to=B): the inner cast loses nothing. */
static bool inner_exact(const match *mt) { return holds(mt->x->type.dtype, cast_to(mt->inner)); }
static bool inner_exact_other(const match *mt) { return inner_exact(mt) && cast_to(mt->n) != mt->x->type.dtype; }

static bool identity_perm(const match *mt)
{
    const tf_attr *p = tf_node_attr_named(mt->n, "perm");
    for (int i = 0; i < p->u.ints.n; i++)
        if (p->u.ints.v[i].v != i) return false;
    return true;
}

static bool second_not_number(const match *mt)
{
    double c;
    return !number(mt->n->in[1], &c);
}

/* The node reads x in place of its operand (the inner op's result). */
static bool read_x(match *mt)
{
    mt->n->in[0] = mt->x;
    return true;
}

/* transpose(transpose(x, p1), p2) = transpose(x, q) with q[i] = p1[p2[i]]. */
static bool compose_perm(match *mt)
{
    const tf_attr *p1 = tf_node_attr_named(mt->inner, "perm"), *p2 = tf_node_attr_named(mt->n, "perm");
    int64_t q[TF_MAX_RANK];
    int r = p2->u.ints.n;
    if (r > TF_MAX_RANK || p1->u.ints.n != r) return false;
    for (int i = 0; i < r; i++) {
        int64_t j = p2->u.ints.v[i].v;
        if (j < 0 || j >= r) return false;
        q[i] = p1->u.ints.v[j].v;
    }
    tf_attr a = tf_attr_ints(mt->m, q, r);   /* fresh: attribute lists may be shared between nodes */
    if (a.kind == TF_ATTR_NONE) return false;
    mt->n->attrs[tf_op_attr_index(TF_OP_TRANSPOSE, "perm")] = a;
    mt->n->in[0] = mt->x;
    return true;
}

static bool swap_operands(match *mt)
{
    tf_value *t = mt->n->in[0];
    mt->n->in[0] = mt->n->in[1];
    mt->n->in[1] = t;
    return true;
}

/* ---- the rules ---- */

static const rule rules[] = {
/*   name                   root          flag                nin operands            when               to     edit */
    {"add-zero",            TF_OP_ADD,    0,                  2, {X, NUM(0)},         NULL,              to_x,  NULL},
    {"sub-zero",            TF_OP_SUB,    0,                  2, {X, NUM(0)},         NULL,              to_x,  NULL},
    {"mul-one",             TF_OP_MUL,    0,                  2, {X, NUM(1)},         NULL,              to_x,  NULL},
    {"div-one",             TF_OP_DIV,    0,                  2, {X, NUM(1)},         NULL,              to_x,  NULL},
    {"neg-neg",             TF_OP_NEG,    0,                  1, {OF(NEG)},           is_float,          to_x,  NULL},
    {"cast-same",           TF_OP_CAST,   0,                  1, {X},                 NULL,              to_x,  NULL},
    {"cast-cast-cancel",    TF_OP_CAST,   0,                  1, {OF(CAST)},          inner_exact,       to_x,  NULL},
    {"cast-cast-merge",     TF_OP_CAST,   0,                  1, {OF(CAST)},          inner_exact_other, NULL,  read_x},
    {"reshape-same",        TF_OP_RESHAPE, 0,                 1, {X},                 NULL,              to_x,  NULL},
    {"reshape-reshape",     TF_OP_RESHAPE, 0,                 1, {OF(RESHAPE)},       NULL,              NULL,  read_x},
    {"transpose-identity",  TF_OP_TRANSPOSE, 0,               1, {X},                 identity_perm,     to_x,  NULL},
    {"transpose-transpose", TF_OP_TRANSPOSE, 0,               1, {OF(TRANSPOSE)},     NULL,              NULL,  compose_perm},
    {"broadcast-same",      TF_OP_BROADCAST, 0,               1, {X},                 NULL,              to_x,  NULL},
    {"number-second",       -1,           TF_OPF_COMMUTATIVE, 2, {ANYNUM, X},         second_not_number, NULL,  swap_operands},
};
enum { NRULES = (int)(sizeof rules / sizeof rules[0]) };

/* ---- the driver ---- */

/* "transpose(x, perm=[1, 0])" into buf, for --explain. */
static const char *describe(const tf_node *n, char *buf, size_t cap)
{
    const tf_op_info *oi = tf_op_info_of(n->op);
    size_t k = (size_t)snprintf(buf, cap, "%s(", oi->name);
    for (int i = 0; i < n->nin && k < cap; i++) {
        const tf_value *v = n->in[i];
        if (v->kind == TF_VAL_CONST) k += (size_t)snprintf(buf + k, cap - k, "%s%g", i ? ", " : "", v->cval);
        else k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? ", " : "", v->name);
    }
    for (int i = 0; i < oi->nattrs && k < cap; i++) {
        const tf_attr *a = &n->attrs[i];
        if (a->kind == TF_ATTR_DTYPE)
            k += (size_t)snprintf(buf + k, cap - k, ", %s=%s", oi->attrs[i].name, tf_dtype_name(a->u.dt));
        if (a->kind != TF_ATTR_INTS) continue;
        k += (size_t)snprintf(buf + k, cap - k, ", %s=[", oi->attrs[i].name);
        for (int j = 0; j < a->u.ints.n && k < cap; j++)
            k += (size_t)snprintf(buf + k, cap - k, "%s%lld", j ? ", " : "", (long long)a->u.ints.v[j].v);
        if (k < cap) k += (size_t)snprintf(buf + k, cap - k, "]");
    }
    if (k < cap) snprintf(buf + k, cap - k, ")");
    return buf;
}

enum { NO_RULE, EDITED, REPLACED };

/* Try the rules in order on n; the first that applies wins. */
static int rewrite_once(tf_module *m, const tf_options *o, tf_node *n, tf_value **repl)
{
    char b1[512], b2[512];
    const tf_op_info *oi = tf_op_info_of(n->op);
    for (int i = 0; i < NRULES; i++) {
        const rule *r = &rules[i];
        match mt = {m, n, NULL, NULL, NULL};
        if (!match_rule(r, n, &mt)) continue;
        if (r->to) {
            tf_value *v = r->to(&mt);
            if (!v || v->kind == TF_VAL_CONST || !tf_type_equal(&v->type, &n->out->type)) continue;
            repl[n->out->id] = v;
            tf_explain(o, "canonicalize", &n->loc, "%s: %s = %s -> %s", r->name, n->out->name,
                       describe(n, b1, sizeof b1), v->name);
            return REPLACED;
        }
        /* An edit works on a scratch copy, kept only if the type stays. */
        tf_value *in[2] = {n->in[0], n->nin > 1 ? n->in[1] : NULL};
        tf_attr attrs[16];
        if (oi->nattrs > 16) continue;
        memcpy(attrs, n->attrs, (size_t)oi->nattrs * sizeof *attrs);
        tf_node s = *n;
        s.in = in;
        s.attrs = attrs;
        mt.n = &s;
        if (!r->edit(&mt)) continue;
        tf_type before = n->out->type;
        tf_diag d = {0};
        if (tf_infer_node(m, &s, &d) || !tf_type_equal(&before, &n->out->type)) {
            n->out->type = before;
            continue;
        }
        describe(n, b1, sizeof b1);
        memcpy(n->in, in, (size_t)n->nin * sizeof *in);
        memcpy(n->attrs, attrs, (size_t)oi->nattrs * sizeof *attrs);
        tf_explain(o, "canonicalize", &n->loc, "%s: %s = %s -> %s", r->name, n->out->name, b1,
                   describe(n, b2, sizeof b2));
        return EDITED;
    }
    return NO_RULE;
}

tf_ir_status pass_canonicalize(tf_module *m, const tf_options *o)
{
    tf_module_renumber(m);
    tf_value **repl = tf_calloc((size_t)(m->next_id ? m->next_id : 1), sizeof *repl);   /* replaced -> replacement */
    if (!repl) return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        /* A replacement is an earlier value that is itself never replaced. */
        for (int k = 0; k < n->nin; k++)
            if (n->in[k]->kind != TF_VAL_CONST && repl[n->in[k]->id]) n->in[k] = repl[n->in[k]->id];
        /* Each edit shortens a chain or orders operands, so this ends; the
         * bound only guards against a table that would loop. */
        for (int step = 0; step < 64; step++)
            if (rewrite_once(m, o, n, repl) != EDITED) break;
    }
    tf_module_commit_replacements(m, repl);
    tf_free(repl);
    return TF_IR_OK;
}
