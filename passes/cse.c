/* cse.c — common subexpression elimination.
 *
 * A node that repeats an earlier one (same op, the same operands, equal
 * attributes) computes the same tensor, so its uses are pointed at the
 * earlier result and the node is removed. Operands are the same when they are
 * the same value, or numbers of the same dtype and value; commutative ops
 * (TF_OPF_COMMUTATIVE) also match with their two operands swapped.
 * Attributes compare by value: whether one was written or defaulted (`set`)
 * and whether a list entry was written as a dim name (`sym`) do not matter.
 *
 * One forward sweep with a hash table keyed on that identity: operands are
 * first redirected to the survivors of earlier merges, so chains of
 * duplicates (a2 = a1, then b2 = f(a2) = f(a1) = b1) collapse in the same
 * sweep and the pass is linear in the number of nodes. Every op is a pure
 * function of its operands and attributes (an RNG mask depends only on the
 * seed, salt and step), so merging never changes a number. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* Doubles are equal when they are the same bits, or both NaN (a NaN is a NaN
 * whatever its payload). +0 and -0 differ: x + 0 and x + -0 do too. */
static bool same_double(double a, double b)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;
}

static uint64_t hash_double(double v)
{
    if (isnan(v)) return 0x7ff8000000000000ull;
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static uint64_t hash_operand(const tf_value *v)
{
    if (v->kind == TF_VAL_CONST) return mix(mix(17, (uint64_t)v->type.dtype), hash_double(v->cval));
    return mix(31, (uint64_t)v->id);
}

static bool same_operand(const tf_value *a, const tf_value *b)
{
    if (a == b) return true;
    return a->kind == TF_VAL_CONST && b->kind == TF_VAL_CONST && a->type.dtype == b->type.dtype &&
           same_double(a->cval, b->cval);
}

static uint64_t hash_attr(const tf_attr *a)
{
    uint64_t h = mix(0, (uint64_t)a->kind);
    switch (a->kind) {
    case TF_ATTR_INT: return mix(h, (uint64_t)a->u.i.v);
    case TF_ATTR_FLOAT: return mix(h, hash_double(a->u.f));
    case TF_ATTR_BOOL: return mix(h, a->u.b);
    case TF_ATTR_DTYPE: return mix(h, (uint64_t)a->u.dt);
    case TF_ATTR_STR:
        for (const char *s = a->u.s; s && *s; s++) h = mix(h, (unsigned char)*s);
        return h;
    case TF_ATTR_INTS:
        h = mix(h, (uint64_t)a->u.ints.n);
        for (int i = 0; i < a->u.ints.n; i++) h = mix(h, (uint64_t)a->u.ints.v[i].v);
        return h;
    default: return h;
    }
}

static bool same_attr(const tf_attr *a, const tf_attr *b)
{
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case TF_ATTR_INT: return a->u.i.v == b->u.i.v;
    case TF_ATTR_FLOAT: return same_double(a->u.f, b->u.f);
    case TF_ATTR_BOOL: return a->u.b == b->u.b;
    case TF_ATTR_DTYPE: return a->u.dt == b->u.dt;
    case TF_ATTR_STR: return (a->u.s == b->u.s) || (a->u.s && b->u.s && !strcmp(a->u.s, b->u.s));
    case TF_ATTR_INTS:
        if (a->u.ints.n != b->u.ints.n) return false;
        for (int i = 0; i < a->u.ints.n; i++)
            if (a->u.ints.v[i].v != b->u.ints.v[i].v) return false;
        return true;
    default: return true;
    }
}

static bool commutes(const tf_node *n) { return n->nin == 2 && tf_op_has(n->op, TF_OPF_COMMUTATIVE); }

static uint64_t hash_node(const tf_node *n)
{
    uint64_t h = mix(mix(1, (uint64_t)n->op), (uint64_t)n->nin);
    if (commutes(n)) {   /* order-free: the smaller operand hash first */
        uint64_t a = hash_operand(n->in[0]), b = hash_operand(n->in[1]);
        h = mix(mix(h, a < b ? a : b), a < b ? b : a);
    } else {
        for (int k = 0; k < n->nin; k++) h = mix(h, hash_operand(n->in[k]));
    }
    const tf_op_info *oi = tf_op_info_of(n->op);
    for (int i = 0; i < oi->nattrs; i++) h = mix(h, hash_attr(&n->attrs[i]));
    return h;
}

static bool same_node(const tf_node *a, const tf_node *b)
{
    if (a->op != b->op || a->nin != b->nin) return false;
    const tf_op_info *oi = tf_op_info_of(a->op);
    for (int i = 0; i < oi->nattrs; i++)
        if (!same_attr(&a->attrs[i], &b->attrs[i])) return false;
    bool in_order = true;
    for (int k = 0; k < a->nin && in_order; k++) in_order = same_operand(a->in[k], b->in[k]);
    if (in_order) return true;
    return commutes(a) && same_operand(a->in[0], b->in[1]) && same_operand(a->in[1], b->in[0]);
}

tf_ir_status pass_cse(tf_module *m, const tf_options *o)
{
    tf_module_renumber(m);
    size_t cap = 16;
    while (cap < 2 * (size_t)m->nodes.n) cap *= 2;
    tf_node **slots = tf_calloc(cap, sizeof *slots);
    tf_value **repl = tf_calloc((size_t)(m->next_id ? m->next_id : 1), sizeof *repl);   /* removed -> survivor */
    if (!slots || !repl) {
        tf_free(slots);
        tf_free(repl);
        return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
    }
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        for (int k = 0; k < n->nin; k++)   /* survivors are never replaced, so one step suffices */
            if (n->in[k]->kind != TF_VAL_CONST && repl[n->in[k]->id]) n->in[k] = repl[n->in[k]->id];
        if (n->recompute) continue;   /* checkpoint's recomputation: merging it back would undo it */
        size_t j = hash_node(n) & (cap - 1);
        for (; slots[j]; j = (j + 1) & (cap - 1))
            if (same_node(slots[j], n)) break;
        if (!slots[j]) {
            slots[j] = n;
            continue;
        }
        tf_node *e = slots[j];
        bool swapped = commutes(n) && !same_operand(e->in[0], n->in[0]);
        repl[n->out->id] = e->out;
        tf_explain(o, "cse", &n->loc, "replaced %s by %s (line %d): the same %s of the same operands%s, equal attributes",
                   n->out->name, e->out->name, e->loc.line, tf_op_info_of(n->op)->name,
                   swapped ? " (swapped: it commutes)" : "");
    }
    /* Outputs keep their names (`output y = x`); updates keep their buffers. */
    tf_module_commit_replacements(m, repl);
    tf_free(slots);
    tf_free(repl);
    return TF_IR_OK;
}
