/* checkpoint.c — activation checkpointing: for each forward value the
 * backward pass reads, keep it or compute it again where it is needed.
 *
 * `--checkpoint=auto --memory-budget=BYTES`: forward values that are cheap
 * to recompute are computed again just before their first backward use, so
 * the forward copy dies early. Candidates (tf_checkpoint_candidates) are
 * forward results that a backward op reads: pointwise ops (activations
 * included) first, then layout ops (reshape, transpose, broadcast), then
 * pooling; within a class, the larger first. Which of them to recompute is
 * not decided here: tf_fit_pipeline (fit.c) searches for the set that makes
 * the rest of the pipeline plan within the budget, and this pass applies the
 * set it is given in o->recompute, nothing else (it runs no other pass). A
 * recomputation reads the original forward operands (no recompute chains).
 * Recomputed ops print with `recompute=true` (cse leaves them be) and
 * --explain lists each with the bytes it frees. Gradients are the same: a
 * recomputation is the same op on the same operands. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct cand {
    int node;              /* index of the forward node */
    int cls;               /* 0 pointwise, 1 layout, 2 pool */
    int64_t bytes;
} cand;

static int cand_order(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->cls != y->cls) return x->cls - y->cls;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    return x->node - y->node;
}

static int64_t bytes_of(const tf_value *v) { return tf_type_numel(&v->type) * tf_dtype_bytes(v->type.dtype); }

/* Recompute nodes[0..k) of m (forward node indices, as renumbered). */
static tf_ir_status apply(tf_module *m, const tf_options *o, const int *nodes, int k)
{
    tf_module_renumber(m);
    int N = m->nodes.n, bs = m->backward_start;
    tf_node **old = tf_malloc((size_t)N * sizeof *old);
    int *first_use = tf_malloc((size_t)N * sizeof *first_use);
    tf_value **clone_of = tf_calloc((size_t)m->next_id + 1, sizeof *clone_of);
    bool *chosen = tf_calloc((size_t)N + 1, sizeof *chosen);
    tf_ir_status st = TF_IR_OK;
    if (!old || !first_use || !clone_of || !chosen) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
        goto done;
    }
    memcpy(old, m->nodes.items, (size_t)N * sizeof *old);
    for (int i = 0; i < k; i++) {
        if (nodes[i] < 0 || nodes[i] >= bs) {
            st = tf_diag_error(o->diag, TF_IR_ERR_INTERNAL, NULL, "checkpoint: asked to recompute node %d, which is not "
                               "one of the %d forward nodes", nodes[i], bs);
            goto done;
        }
        chosen[nodes[i]] = true;
    }
    for (int i = 0; i < N; i++) first_use[i] = -1;
    for (int j = bs; j < N; j++)
        for (int q = 0; q < old[j]->nin; q++) {
            tf_value *v = old[j]->in[q];
            if (v->kind != TF_VAL_NODE) continue;
            int i = v->id - m->decls.n;
            if (i >= 0 && i < bs && chosen[i] && first_use[i] < 0) first_use[i] = j;
        }
    m->nodes.n = 0;
    for (int j = 0; j < N && !st; j++) {
        if (j >= bs)   /* recomputations due here come first */
            for (int i = 0; i < bs && !st; i++) {
                if (!chosen[i] || first_use[i] != j) continue;
                tf_node *src = old[i], *n = tf_arena_alloc(&m->arena, sizeof *n);
                tf_value *v = tf_arena_alloc(&m->arena, sizeof *v);
                char name[512];
                snprintf(name, sizeof name, "%s.recompute", src->out->name);
                if (!n || !v) {
                    st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
                    break;
                }
                *n = *src;
                /* own operand and attribute arrays: later passes rewrite them in place */
                n->in = tf_arena_array(&m->arena, (size_t)(src->nin ? src->nin : 1), sizeof *n->in);
                n->attrs = tf_arena_array(&m->arena, (size_t)(tf_op_info_of(src->op)->nattrs ? tf_op_info_of(src->op)->nattrs : 1),
                                          sizeof *n->attrs);
                if (!n->in || !n->attrs) {
                    st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
                    break;
                }
                memcpy(n->in, src->in, (size_t)src->nin * sizeof *n->in);
                memcpy(n->attrs, src->attrs, (size_t)tf_op_info_of(src->op)->nattrs * sizeof *n->attrs);
                n->recompute = true;
                n->backward = true;
                n->region = 0;
                n->annotated = false;
                *v = *src->out;
                if (!(v->name = tf_module_unique_name(m, name))) {
                    st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
                    break;
                }
                v->def = n;
                v->id = -1;
                n->out = v;
                if (tf_module_add_name(m, v) || tf_module_append_node(m, n)) {
                    st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
                    break;
                }
                clone_of[src->out->id] = v;
                tf_explain(o, "checkpoint", &src->loc, "recompute %s (%s, %lld bytes) before the backward pass needs it, "
                           "instead of keeping it from the forward pass", src->out->name, tf_op_info_of(src->op)->name,
                           (long long)bytes_of(src->out));
            }
        tf_node *n = old[j];
        if (j >= bs)
            for (int q = 0; q < n->nin; q++)
                if (n->in[q]->kind == TF_VAL_NODE && n->in[q]->id >= 0 && clone_of[n->in[q]->id]) n->in[q] = clone_of[n->in[q]->id];
        if (tf_module_append_node(m, n)) st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
    }
    tf_module_renumber(m);
done:
    tf_free(old);
    tf_free(first_use);
    tf_free(clone_of);
    tf_free(chosen);
    return st;
}

tf_ir_status tf_checkpoint_candidates(tf_module *m, tf_diag *d, int **nodes, int *n)
{
    tf_module_renumber(m);
    int N = m->nodes.n, bs = m->backward_start, nc = 0;
    cand *c = tf_malloc((size_t)(bs ? bs : 1) * sizeof *c);
    bool *read_back = tf_calloc((size_t)(bs ? bs : 1), sizeof *read_back);
    *nodes = tf_malloc((size_t)(bs ? bs : 1) * sizeof **nodes);
    *n = 0;
    if (!c || !read_back || !*nodes) {
        tf_free(c);
        tf_free(read_back);
        tf_free(*nodes);
        *nodes = NULL;
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
    }
    for (int j = bs; j < N; j++) {
        tf_node *nd = m->nodes.items[j];
        for (int q = 0; q < nd->nin; q++) {
            tf_value *v = nd->in[q];
            int i = v->kind == TF_VAL_NODE ? v->id - m->decls.n : -1;
            if (i >= 0 && i < bs) read_back[i] = true;
        }
    }
    for (int i = 0; i < bs; i++) {
        tf_node *nd = m->nodes.items[i];
        tf_op_kind k = tf_op_info_of(nd->op)->kind;
        int cls = k == TF_OPK_POINTWISE ? 0 : k == TF_OPK_LAYOUT && nd->op != TF_OP_CONCAT && nd->op != TF_OP_SLICE ? 1
                  : k == TF_OPK_POOL && nd->op != TF_OP_MAXPOOL2D_GRAD && nd->op != TF_OP_AVGPOOL2D_GRAD ? 2 : -1;
        if (read_back[i] && cls >= 0) c[nc++] = (cand){i, cls, bytes_of(nd->out)};
    }
    tf_free(read_back);
    qsort(c, (size_t)nc, sizeof *c, cand_order);
    for (int i = 0; i < nc; i++) (*nodes)[i] = c[i].node;
    *n = nc;
    tf_free(c);
    return TF_IR_OK;
}

tf_ir_status pass_checkpoint(tf_module *m, const tf_options *o)
{
    if (o->mode != TF_IR_TRAIN || o->checkpoint == TF_IR_CHECKPOINT_NONE) {
        tf_explain(o, "checkpoint", NULL, "%s: every forward value the backward pass reads is kept",
                   o->mode != TF_IR_TRAIN ? "infer mode" : "--checkpoint=none");
        return TF_IR_OK;
    }
    if (!m->backward_start) {
        tf_explain(o, "checkpoint", NULL, "no backward pass right before this pass (run it after autodiff): nothing to do");
        return TF_IR_OK;
    }
    if (o->memory_budget <= 0) {
        tf_explain(o, "checkpoint", NULL, "--checkpoint=auto without --memory-budget: nothing to fit, nothing recomputed");
        return TF_IR_OK;
    }
    const tf_recompute *r = o->recompute;
    if (!r) {
        tf_explain(o, "checkpoint", NULL, "no recompute set given (tf_fit_pipeline chooses one): nothing recomputed");
        return TF_IR_OK;
    }
    if (!r->n) {
        tf_explain(o, "checkpoint", NULL, "planned peak %lld bytes fits --memory-budget=%lld: nothing recomputed",
                   (long long)r->peak_before, (long long)o->memory_budget);
        return TF_IR_OK;
    }
    tf_ir_status st = apply(m, o, r->nodes, r->n);
    if (!st)
        tf_explain(o, "checkpoint", NULL, "recomputed %d of %d candidates: planned peak %lld -> %lld bytes, within "
                   "--memory-budget=%lld", r->n, r->ncand, (long long)r->peak_before, (long long)r->peak_after,
                   (long long)o->memory_budget);
    return st;
}
