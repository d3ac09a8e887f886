/* dce.c — remove nodes whose results nothing uses.
 *
 * A node is live when its result reaches a module output or a buffer update
 * through a chain of operands. One backward sweep over the topologically
 * ordered node list marks the live ones; the rest are removed. Declarations
 * (inputs, params, buffers) stay even when unused: they are the model's
 * interface, and dropping one would change what a caller feeds and loads.
 * Every op is a pure function of its operands (RNG ops included: a mask
 * depends on the seed, the salt and the step), so no node is kept for a
 * side effect. */
#include <stdlib.h>

#include "passes.h"

tf_ir_status pass_dce(tf_module *m, const tf_options *o)
{
    tf_module_renumber(m);
    bool *live = tf_calloc((size_t)(m->next_id ? m->next_id : 1), sizeof *live);
    if (!live) return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
    for (int i = 0; i < m->noutputs; i++) live[m->outputs[i].value->id] = true;
    for (int i = 0; i < m->nupdates; i++) live[m->updates[i].value->id] = true;
    for (int i = m->nodes.n - 1; i >= 0; i--) {
        const tf_node *n = m->nodes.items[i];
        if (!live[n->out->id]) continue;
        for (int k = 0; k < n->nin; k++)
            if (n->in[k]->kind != TF_VAL_CONST) live[n->in[k]->id] = true;
    }
    /* Compact in place (only removals: nothing to allocate, nothing to fail). */
    int kept = 0;
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        if (live[n->out->id]) {
            m->nodes.items[kept++] = n;
            continue;
        }
        tf_explain(o, "dce", &n->loc, "removed %s = %s(...): its result is unused (no op, output or update reads it)",
                   n->out->name, tf_op_info_of(n->op)->name);
        tf_module_remove_name(m, n->out);
    }
    m->nodes.n = kept;
    tf_free(live);
    tf_module_renumber(m);
    return TF_IR_OK;
}
