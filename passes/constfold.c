/* constfold.c — compute pointwise ops on numbers at compile time.
 *
 * A pointwise op whose operands are all numbers (rank-0 constants) and that
 * has a scalar function in the op table, or a cast of a number, becomes a
 * number: the op's scalar function applied to the operands as the
 * interpreter sees them (each rounded to its dtype), rounded to the result
 * dtype. Only floating and integer results fold; a comparison's bool has no
 * number to stand for it, since numbers are typed by their context.
 *
 * That context is also the catch: a number written as an operand takes the
 * dtype of its op's first operand that is neither a number nor bool (else
 * f32; see verify.c). So a folded value replaces a use only where that rule
 * gives it back its own dtype (and leaves the op's other numbers typed as
 * before); elsewhere, and where the result is a module output or a buffer
 * update (which name values, not numbers), the node stays. A folded node
 * that keeps no use is removed. Visiting nodes in order folds whole chains
 * of numbers in one sweep, so a second run finds nothing to do. */
#include <stdio.h>
#include <stdlib.h>

#include "passes.h"

/* The dtype verify.c gives the numbers among `in`. */
static tf_dt context_dtype(tf_value *const *in, int nin)
{
    for (int k = 0; k < nin; k++)
        if (in[k]->kind != TF_VAL_CONST && in[k]->type.dtype != TF_DT_BOOL) return in[k]->type.dtype;
    return TF_DT_F32;
}

static bool foldable(const tf_node *n)
{
    const tf_op_info *oi = tf_op_info_of(n->op);
    if (oi->kind != TF_OPK_POINTWISE || (n->op != TF_OP_CAST && (!oi->scalar || n->nin < 1 || n->nin > 2))) return false;
    if (n->out->type.rank != 0 || n->out->type.dtype == TF_DT_BOOL) return false;
    for (int k = 0; k < n->nin; k++)
        if (n->in[k]->kind != TF_VAL_CONST) return false;
    return true;
}

static double fold(const tf_node *n)
{
    double a = tf_dtype_round(n->in[0]->type.dtype, n->in[0]->cval);
    double b = n->nin == 2 ? tf_dtype_round(n->in[1]->type.dtype, n->in[1]->cval) : 0.0;
    double r = n->op == TF_OP_CAST ? a : tf_op_info_of(n->op)->scalar(a, b);
    return tf_dtype_round(n->out->type.dtype, r);
}

/* Put folded numbers in place of n's operands, all or none. */
static tf_ir_status substitute(tf_module *m, const tf_options *o, tf_node *n, tf_value **folded, bool *refused)
{
    tf_value *in[64];
    bool any = false;
    for (int k = 0; k < n->nin; k++) {
        tf_value *v = n->in[k];
        in[k] = v->kind != TF_VAL_CONST && folded[v->id] ? folded[v->id] : v;
        any |= in[k] != v;
    }
    if (!any) return TF_IR_OK;
    tf_dt ctx = context_dtype(in, n->nin);
    bool ok = ctx == context_dtype(n->in, n->nin);
    for (int k = 0; k < n->nin && ok; k++)
        if (in[k] != n->in[k] && in[k]->type.dtype != ctx) ok = false;
    if (!ok) {
        *refused = true;
        return TF_IR_OK;
    }
    for (int k = 0; k < n->nin; k++) {
        if (in[k] == n->in[k]) continue;
        tf_value *c = tf_const(m, in[k]->cval, in[k]->type.dtype);   /* one per use, as the parser makes them */
        if (!c) return tf_diag_error(o->diag, TF_IR_ERR_OOM, &n->loc, "out of memory");
        n->in[k] = c;
    }
    return TF_IR_OK;
}

/* "3" or "0.0999755859375", for --explain. */
static const char *number(const tf_value *c, char *buf, size_t cap)
{
    if (!tf_dtype_is_float(c->type.dtype)) {
        snprintf(buf, cap, "%lld", (long long)tf_dtype_round(c->type.dtype, c->cval));   /* in range */
        return buf;
    }
    for (int prec = 1; prec <= 17; prec++) {   /* the shortest text that reads back the same */
        snprintf(buf, cap, "%.*g", prec, c->cval);
        if (strtod(buf, NULL) == c->cval || c->cval != c->cval) break;
    }
    return buf;
}

/* "mul(3, 3)" into buf. */
static const char *describe(const tf_node *n, char *buf, size_t cap)
{
    char b[64];
    size_t k = (size_t)snprintf(buf, cap, "%s(", tf_op_info_of(n->op)->name);
    for (int i = 0; i < n->nin && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? ", " : "", number(n->in[i], b, sizeof b));
    if (n->op == TF_OP_CAST && k < cap)
        k += (size_t)snprintf(buf + k, cap - k, ", to=%s", tf_dtype_name(n->out->type.dtype));
    if (k < cap) snprintf(buf + k, cap - k, ")");
    return buf;
}

tf_ir_status pass_constfold(tf_module *m, const tf_options *o)
{
    tf_module_renumber(m);
    size_t nv = (size_t)(m->next_id ? m->next_id : 1);
    tf_value **folded = tf_calloc(nv, sizeof *folded);   /* node result -> its number */
    int *uses = tf_calloc(nv, sizeof *uses);
    bool *refused = tf_calloc(nv, sizeof *refused);   /* node result -> its operands stayed */
    if (!folded || !uses || !refused) {
        tf_free(folded);
        tf_free(uses);
        tf_free(refused);
        return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
    }
    tf_ir_status st = TF_IR_OK;
    for (int i = 0; i < m->nodes.n && !st; i++) {
        tf_node *n = m->nodes.items[i];
        if ((st = substitute(m, o, n, folded, &refused[n->out->id]))) break;
        if (!foldable(n)) continue;
        if (!(folded[n->out->id] = tf_const(m, fold(n), n->out->type.dtype)))
            st = tf_diag_error(o->diag, TF_IR_ERR_OOM, &n->loc, "out of memory");
    }
    if (st) {
        tf_free(folded);
        tf_free(uses);
        tf_free(refused);
        return st;
    }
    /* Count what still reads each value; a folded node nothing reads goes. */
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k]->kind != TF_VAL_CONST) uses[n->in[k]->id]++;
    }
    for (int i = 0; i < m->noutputs; i++) uses[m->outputs[i].value->id]++;
    for (int i = 0; i < m->nupdates; i++) uses[m->updates[i].value->id]++;
    int kept = 0;
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        tf_value *c = folded[n->out->id];
        if (refused[n->out->id])
            tf_explain(o, "constfold", &n->loc, "%s keeps its operands: a folded operand, written as a number, would "
                       "not keep its dtype here", n->out->name);
        if (!c) {
            m->nodes.items[kept++] = n;
            continue;
        }
        char num[64], what[512];
        number(c, num, sizeof num);
        describe(n, what, sizeof what);
        if (!uses[n->out->id]) {
            tf_explain(o, "constfold", &n->loc, "folded %s = %s to the %s number %s", n->out->name, what,
                       tf_dtype_name(c->type.dtype), num);
            tf_module_remove_name(m, n->out);
            continue;
        }
        tf_explain(o, "constfold", &n->loc, "%s = %s is the number %s but stays: %d use(s) need a named value "
                   "(an output, an update, or an operand whose dtype a number would not keep)",
                   n->out->name, what, num, uses[n->out->id]);
        m->nodes.items[kept++] = n;
    }
    m->nodes.n = kept;
    tf_free(folded);
    tf_free(uses);
    tf_free(refused);
    tf_module_renumber(m);
    return TF_IR_OK;
}
