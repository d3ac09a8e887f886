/* backend_interp.c — the `interp` target: the reference interpreter behind
 * the backend interface. Always available; float64 math, slow by design. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "interp.h"
#include "runtime.h"

static const char *interp_unavailable(void) { return NULL; }

static tf_status interp_create(tf_session_t *s)
{
    tf_diag d = {0};
    tf_interp_ctx *ip = tf_interp_create(s->p->m, s->p->mode, s->seed);
    if (!ip) return tf_set_error(s->ctx, TF_ERR_OOM, "out of memory creating an interpreter session");
    if (tf_interp_init_state(ip, &d)) {
        tf_interp_free(ip);
        return tf_from_diag(s->ctx, &d);
    }
    s->impl = ip;
    return TF_OK;
}

static void interp_free(tf_session_t *s)
{
    tf_interp_free(s->impl);
    s->impl = NULL;
}

static tf_status interp_run(tf_session_t *s)
{
    tf_interp_ctx *ip = s->impl;
    tf_diag d = {0};
    const tf_program_t *p = s->p;
    for (int i = 0; i < p->inputs.n; i++) {
        const tf_value *v = p->inputs.items[i];
        tf_tensor *t = tf_interp_tensor(ip, v, &d);
        if (!t) return tf_from_diag(s->ctx, &d);
        for (int64_t k = 0; k < t->numel; k++)
            t->data[k] = tf_dtype_round(v->type.dtype, tf_elem_load(v->type.dtype, s->bound[i], k));
    }
    tf_comm_interp_attach(ip, s->comm);
    if (tf_interp_run(ip, &d)) return tf_from_diag(s->ctx, &d);
    for (int i = 0; i < p->m->noutputs; i++) {
        const tf_value *v = p->m->outputs[i].value;
        tf_tensor *t = tf_interp_tensor(ip, v, &d);
        if (!t) return tf_from_diag(s->ctx, &d);
        for (int64_t k = 0; k < t->numel; k++) tf_elem_store(v->type.dtype, s->out[i], k, t->data[k]);
    }
    return TF_OK;
}

static tf_status interp_state_read(tf_session_t *s, const tf_value *v, void *dst)
{
    tf_diag d = {0};
    tf_tensor *t = tf_interp_tensor(s->impl, v, &d);
    if (!t) return tf_from_diag(s->ctx, &d);
    for (int64_t k = 0; k < t->numel; k++) tf_elem_store(v->type.dtype, dst, k, t->data[k]);
    return TF_OK;
}

static tf_status interp_state_write(tf_session_t *s, const tf_value *v, const void *src)
{
    tf_diag d = {0};
    tf_tensor *t = tf_interp_tensor(s->impl, v, &d);
    if (!t) return tf_from_diag(s->ctx, &d);
    for (int64_t k = 0; k < t->numel; k++) t->data[k] = tf_dtype_round(v->type.dtype, tf_elem_load(v->type.dtype, src, k));
    return TF_OK;
}

static uint64_t interp_step_get(tf_session_t *s) { return tf_interp_step(s->impl); }
static void interp_step_set(tf_session_t *s, uint64_t step) { tf_interp_set_step(s->impl, step); }

static void interp_dropout_seed_set(tf_session_t *s, uint64_t seed) { tf_interp_set_seed(s->impl, seed); }

static const char *interp_op_support(tf_op op, char *detail, size_t n)
{
    snprintf(detail, n, "the float64 reference kernel of %s", tf_op_info_of(op)->name);
    return "interp";
}

const tf_backend tf_backend_interp = {
    .name = "interp",
    .unavailable = interp_unavailable,
    .session_create = interp_create,
    .session_free = interp_free,
    .run = interp_run,
    .state_read = interp_state_read,
    .state_write = interp_state_write,
    .step_get = interp_step_get,
    .step_set = interp_step_set,
    .dropout_seed_set = interp_dropout_seed_set,
    .op_support = interp_op_support,
};
