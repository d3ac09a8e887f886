/* verify.c — type inference and the module verifier.
 *
 * Runs after parsing and after every pass (passmgr.c). It re-derives
 * every node's type from its operands through the op table's shape rule, so a
 * pass that builds a wrong graph is caught where it did so. Numbers written
 * as operands take the dtype of the op's other operands (a float constant
 * next to an i64 tensor is an error, not a silent conversion). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

static tf_ir_status check_limits(tf_module *m, const tf_type *t, const tf_loc *loc, const char *what, tf_diag *d)
{
    char b[256];
    int64_t numel = 1;
    for (int i = 0; i < t->rank; i++) {
        int64_t n = t->dims[i].n;
        if (n < 1 || n > TF_MAX_DIM)
            return tf_diag_error(d, TF_IR_ERR_LIMIT, loc, "%s has axis %d of size %lld; sizes must be in [1, 2^40]", what,
                                 i, (long long)n);
        if (numel > TF_MAX_NUMEL / n)
            return tf_diag_error(d, TF_IR_ERR_LIMIT, loc, "%s %s has more than 2^48 elements", what,
                                 tf_type_str(m, t, b));
        numel *= n;
    }
    return TF_IR_OK;
}

/* Give constants the dtype of their op's first non-constant, non-bool
 * operand; with none, f32. A number is never a bool: `eq(b, 1)` on a bool b
 * is a dtype mismatch, not a silent comparison. */
static tf_ir_status type_constants(tf_node *n, tf_diag *d)
{
    tf_dt dt = TF_DT_COUNT;
    for (int i = 0; i < n->nin; i++)
        if (n->in[i]->kind != TF_VAL_CONST && n->in[i]->type.dtype != TF_DT_BOOL) {
            dt = n->in[i]->type.dtype;
            break;
        }
    for (int i = 0; i < n->nin; i++) {
        tf_value *c = n->in[i];
        if (c->kind != TF_VAL_CONST) continue;
        /* no tensor operand to follow (broadcast(1, ...), add(1, 2)): f32 */
        if (dt == TF_DT_COUNT) {
            c->type.dtype = TF_DT_F32;
            c->type.rank = 0;
            continue;
        }
        if (!tf_dtype_is_float(dt) && isfinite(c->cval) && fabs(c->cval) >= 9.2e18)
            return tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc, "%s: operand %d is the number %g, beyond %s's range",
                                 tf_op_info_of(n->op)->name, i + 1, c->cval, tf_dtype_name(dt));
        if (!tf_dtype_is_float(dt) && (c->cval != trunc(c->cval) || !isfinite(c->cval)))
            return tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc,
                                 "%s: operand %d is the number %g, which %s values cannot hold", tf_op_info_of(n->op)->name,
                                 i + 1, c->cval, tf_dtype_name(dt));
        c->type.dtype = dt;
        c->type.rank = 0;
    }
    return TF_IR_OK;
}

tf_ir_status tf_infer_node(tf_module *m, tf_node *n, tf_diag *d)
{
    const tf_op_info *oi = tf_op_info_of(n->op);
    char b[256];
    if (n->nin < oi->min_in || n->nin > oi->max_in)
        return tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc, "%s takes %d to %d operands, found %d", oi->name, oi->min_in,
                             oi->max_in, n->nin);
    for (int i = 0; i < oi->nattrs; i++) {
        const tf_attr *a = &n->attrs[i];
        if (a->kind == TF_ATTR_NONE)
            return tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc, "%s: missing required attribute '%s'", oi->name,
                                 oi->attrs[i].name);
        if (a->kind != oi->attrs[i].kind)
            return tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc, "%s: attribute '%s' has the wrong kind", oi->name,
                                 oi->attrs[i].name);
        if (tf_attr_check(&oi->attrs[i], a, &n->loc, d)) return d->status;
    }
    if (type_constants(n, d)) return d->status;
    if (tf_op_has(n->op, TF_OPF_FLOATIN))
        for (int i = 0; i < n->nin; i++)
            if (!tf_dtype_is_float(n->in[i]->type.dtype))
                return tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc,
                                     "%s: operand %d must be floating (f32, f16, bf16, f64), found %s", oi->name, i + 1,
                                     tf_type_str(m, &n->in[i]->type, b));
    tf_type t = {0};
    if (oi->shape(m, n, &t, d)) return d->status;
    if (check_limits(m, &t, &n->loc, oi->name, d)) return d->status;
    if (n->annotated && !tf_type_equal(&t, &n->annot)) {
        char b2[256];
        return tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc, "%s: the annotated type %s does not match the inferred %s",
                             oi->name, tf_type_str(m, &n->annot, b), tf_type_str(m, &t, b2));
    }
    n->out->type = t;
    return TF_IR_OK;
}

static tf_ir_status verify_decl(tf_module *m, tf_value *v, tf_diag *d)
{
    char b[256];
    if (check_limits(m, &v->type, &v->loc, v->name, d)) return d->status;
    if (v->kind == TF_VAL_PARAM && !tf_dtype_is_float(v->type.dtype))
        return tf_diag_error(d, TF_IR_ERR_VERIFY, &v->loc, "param '%s' must be floating to be trained, found %s; "
                             "declare integer state as a buffer", v->name, tf_type_str(m, &v->type, b));
    if (v->kind == TF_VAL_INPUT) return TF_IR_OK;
    int fn = v->init.fn;
    if (fn < 0 || fn >= TF_INIT_COUNT)
        return tf_diag_error(d, TF_IR_ERR_VERIFY, &v->loc, "'%s' has no initializer", v->name);
    bool random = fn == TF_INIT_NORMAL || fn == TF_INIT_UNIFORM || fn == TF_INIT_KAIMING_UNIFORM ||
                  fn == TF_INIT_XAVIER_UNIFORM;
    if (random && !tf_dtype_is_float(v->type.dtype))
        return tf_diag_error(d, TF_IR_ERR_VERIFY, &v->init.loc, "%s() fills floating tensors; '%s' is %s",
                             tf_init_fns[fn].name, v->name, tf_type_str(m, &v->type, b));
    if ((fn == TF_INIT_KAIMING_UNIFORM || fn == TF_INIT_XAVIER_UNIFORM) && v->type.rank < 1)
        return tf_diag_error(d, TF_IR_ERR_VERIFY, &v->init.loc, "%s() needs a weight with at least one axis",
                             tf_init_fns[fn].name);
    if (fn == TF_INIT_UNIFORM) {
        double lo = v->init.attrs[0].u.f, hi = v->init.attrs[1].u.f;
        if (!(lo < hi))
            return tf_diag_error(d, TF_IR_ERR_VERIFY, &v->init.loc, "uniform(low, high) needs low < high, found %g, %g",
                                 lo, hi);
    }
    return TF_IR_OK;
}

/* After renumbering: is v one of m's declarations or node results? */
static bool in_module(const tf_module *m, const tf_value *v)
{
    if (v->id < 0 || v->id >= m->next_id) return false;
    if (v->id < m->decls.n) return m->decls.items[v->id] == v;
    return v->kind == TF_VAL_NODE && ((tf_node *)m->nodes.items[v->id - m->decls.n])->out == v;
}

/* Regions: contiguous, non-empty, yields defined inside, private values not
 * used outside (by nodes, outputs or updates). */
static tf_ir_status verify_regions(tf_module *m, tf_diag *d)
{
    if (!m->nregions) {
        for (int i = 0; i < m->nodes.n; i++)
            if (((tf_node *)m->nodes.items[i])->region)
                return tf_diag_error(d, TF_IR_ERR_INTERNAL, NULL, "internal: a node names a region the module lacks");
        return TF_IR_OK;
    }
    tf_ir_status st = TF_IR_OK;
    bool *yielded = tf_calloc((size_t)m->next_id + 1, sizeof *yielded);
    int *count = tf_calloc((size_t)m->nregions + 1, sizeof *count);
    if (!yielded || !count) {
        tf_free(yielded);
        tf_free(count);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    }
    for (int r = 0; r < m->nregions && !st; r++) {
        const tf_region *rg = &m->regions[r];
        for (int k = 0; k < rg->nyields && !st; k++) {
            tf_value *v = rg->yields[k];
            if (!in_module(m, v) || v->kind != TF_VAL_NODE || v->def->region != r + 1)
                st = tf_diag_error(d, TF_IR_ERR_VERIFY, &rg->loc, "region %s yields '%s', which it does not define",
                                   rg->name, v->name ? v->name : "?");
            else if (yielded[v->id])
                st = tf_diag_error(d, TF_IR_ERR_VERIFY, &rg->loc, "region %s yields '%s' twice", rg->name, v->name);
            else
                yielded[v->id] = true;
        }
    }
    int prev = 0;
    for (int i = 0; i < m->nodes.n && !st; i++) {
        tf_node *n = m->nodes.items[i];
        if (n->region < 0 || n->region > m->nregions) {
            st = tf_diag_error(d, TF_IR_ERR_INTERNAL, &n->loc, "internal: node '%s' names region %d of %d", n->out->name,
                               n->region, m->nregions);
            break;
        }
        if (n->region && n->region != prev && count[n->region])
            st = tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc, "region %s is not contiguous: '%s' comes after ops outside it",
                               m->regions[n->region - 1].name, n->out->name);
        if (n->region) count[n->region]++;
        prev = n->region;
        for (int k = 0; k < n->nin && !st; k++) {
            tf_value *v = n->in[k];
            if (v->kind == TF_VAL_NODE && v->def->region && v->def->region != n->region && !yielded[v->id])
                st = tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc, "'%s' is private to region %s; yield it to use it outside",
                                   v->name, m->regions[v->def->region - 1].name);
        }
    }
    for (int r = 0; r < m->nregions && !st; r++)
        if (!count[r + 1]) st = tf_diag_error(d, TF_IR_ERR_VERIFY, &m->regions[r].loc, "region %s is empty", m->regions[r].name);
    for (int i = 0; i < m->noutputs && !st; i++) {
        tf_value *v = m->outputs[i].value;
        if (v->kind == TF_VAL_NODE && v->def->region && !yielded[v->id])
            st = tf_diag_error(d, TF_IR_ERR_VERIFY, &m->outputs[i].loc, "output '%s' is private to region %s; yield it",
                               v->name, m->regions[v->def->region - 1].name);
    }
    for (int i = 0; i < m->nupdates && !st; i++) {
        tf_value *v = m->updates[i].value;
        if (v->kind == TF_VAL_NODE && v->def->region && !yielded[v->id])
            st = tf_diag_error(d, TF_IR_ERR_VERIFY, &m->updates[i].loc, "update value '%s' is private to region %s; yield it",
                               v->name, m->regions[v->def->region - 1].name);
    }
    tf_free(yielded);
    tf_free(count);
    return st;
}

tf_ir_status tf_verify(tf_module *m, tf_diag *d)
{
    tf_module_renumber(m);
    for (int i = 0; i < m->decls.n; i++) {
        tf_value *v = m->decls.items[i];
        if (v->kind != TF_VAL_INPUT && v->kind != TF_VAL_PARAM && v->kind != TF_VAL_BUFFER)
            return tf_diag_error(d, TF_IR_ERR_INTERNAL, &v->loc, "internal: declaration '%s' of the wrong kind", v->name);
        if (verify_decl(m, v, d)) return d->status;
    }
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        if (n->out->def != n || n->out->kind != TF_VAL_NODE)
            return tf_diag_error(d, TF_IR_ERR_INTERNAL, &n->loc, "internal: node result '%s' is not linked to its node",
                                 n->out->name);
        for (int k = 0; k < n->nin; k++) {
            tf_value *v = n->in[k];
            if (v->kind == TF_VAL_CONST) continue;
            if (!in_module(m, v) || v->id >= n->out->id)
                return tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc, "%s: operand '%s' is used before it is defined%s",
                                     tf_op_info_of(n->op)->name, v->name, v->id == n->out->id ? " (a cycle)" : "");
        }
        if (tf_infer_node(m, n, d)) return d->status;
    }
    if (verify_regions(m, d)) return d->status;
    for (int i = 0; i < m->noutputs; i++)
        if (!in_module(m, m->outputs[i].value))
            return tf_diag_error(d, TF_IR_ERR_INTERNAL, &m->outputs[i].loc, "internal: output '%s' names a value "
                                 "that is not in the module", m->outputs[i].name);
    for (int i = 0; i < m->train.nmetrics; i++) {   /* metrics: scalar float outputs */
        const tf_output *o = NULL;
        for (int k = 0; k < m->noutputs && !o; k++)
            if (!strcmp(m->outputs[k].name, m->train.metrics[i])) o = &m->outputs[k];
        char b1[256];
        if (!o)
            return tf_diag_error(d, TF_IR_ERR_VERIFY, &m->train.metric_locs[i], "metric '%s' is not an output of the model; "
                                 "declare it with 'output %s'", m->train.metrics[i], m->train.metrics[i]);
        if (tf_type_numel(&o->value->type) != 1 || !tf_dtype_is_float(o->value->type.dtype))
            return tf_diag_error(d, TF_IR_ERR_VERIFY, &m->train.metric_locs[i], "metric '%s' is %s; a metric is one floating number "
                                 "(reduce it, e.g. with reduce_mean)", o->name, tf_type_str(m, &o->value->type, b1));
    }
    for (int i = 0; i < m->nupdates; i++) {
        tf_update *u = &m->updates[i];
        if (!in_module(m, u->buffer) || !in_module(m, u->value))
            return tf_diag_error(d, TF_IR_ERR_INTERNAL, &u->loc, "internal: update of '%s' names a value that is "
                                 "not in the module", u->buffer->name);
        char b1[256], b2[256];
        if (u->buffer->kind != TF_VAL_BUFFER && u->buffer->kind != TF_VAL_PARAM)
            return tf_diag_error(d, TF_IR_ERR_VERIFY, &u->loc, "update: '%s' is not a buffer or param", u->buffer->name);
        if (!tf_type_equal(&u->buffer->type, &u->value->type))
            return tf_diag_error(d, TF_IR_ERR_VERIFY, &u->loc, "update: buffer '%s' is %s but '%s' is %s", u->buffer->name,
                                 tf_type_str(m, &u->buffer->type, b1), u->value->name, tf_type_str(m, &u->value->type, b2));
        for (int j = 0; j < i; j++)
            if (m->updates[j].buffer == u->buffer)
                return tf_diag_error(d, TF_IR_ERR_VERIFY, &u->loc, "update: buffer '%s' is updated twice (also at line %d)",
                                     u->buffer->name, m->updates[j].loc.line);
    }
    return TF_IR_OK;
}
