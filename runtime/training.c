/* training.c — what a host program asks about training: the names of the
 * precision and checkpoint modes, the train block, checkpoint metadata. */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "tensorio.h"

static const char *const precision_names[] = {
    [TF_PRECISION_DEFAULT] = "default", [TF_PRECISION_FP32] = "fp32",
    [TF_PRECISION_FP16] = "fp16",       [TF_PRECISION_BF16] = "bf16",
};
static const char *const checkpoint_names[] = {[TF_CHECKPOINT_NONE] = "none", [TF_CHECKPOINT_AUTO] = "auto"};
enum { NPRECISIONS = sizeof precision_names / sizeof *precision_names, NCHECKPOINTS = 2 };

/* The index of `name` in names[n], or -1. */
static int find_name(const char *const *names, int n, const char *name)
{
    for (int i = 0; name && i < n; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

const char *tf_precision_name(tf_precision p) { return (unsigned)p < NPRECISIONS ? precision_names[p] : "?"; }
const char *tf_checkpoint_name(tf_checkpoint c) { return (unsigned)c < NCHECKPOINTS ? checkpoint_names[c] : "?"; }

tf_status tf_precision_parse(const char *name, tf_precision *out)
{
    int i = find_name(precision_names, NPRECISIONS, name);
    if (i < 0 || !out) return TF_ERR_INVALID_ARG;
    *out = (tf_precision)i;
    return TF_OK;
}

tf_status tf_checkpoint_parse(const char *name, tf_checkpoint *out)
{
    int i = find_name(checkpoint_names, NCHECKPOINTS, name);
    if (i < 0 || !out) return TF_ERR_INVALID_ARG;
    *out = (tf_checkpoint)i;
    return TF_OK;
}

bool tf_ir_precision_of(tf_precision p, bool *set, tf_ir_precision *out)
{
    *set = p != TF_PRECISION_DEFAULT;
    switch (p) {
    case TF_PRECISION_DEFAULT: return true;
    case TF_PRECISION_FP32: *out = TF_PREC_FP32; return true;
    case TF_PRECISION_FP16: *out = TF_PREC_FP16; return true;
    case TF_PRECISION_BF16: *out = TF_PREC_BF16; return true;
    }
    *set = false;
    return false;
}

tf_precision tf_precision_of_ir(tf_ir_precision p)
{
    return p == TF_PREC_FP16 ? TF_PRECISION_FP16 : p == TF_PREC_BF16 ? TF_PRECISION_BF16 : TF_PRECISION_FP32;
}

/* ---- the train block ---- */

/* Every attribute of a train-block call, as doubles. */
static size_t call_params(const tf_fn_info *fn, const tf_call *c, tf_train_param *out, size_t cap)
{
    size_t n = 0;
    for (int i = 0; i < fn->nattrs && n < cap; i++) {
        const tf_attr *a = &c->attrs[i];
        double v = a->kind == TF_ATTR_INT ? (double)a->u.i.v : a->kind == TF_ATTR_BOOL ? (double)a->u.b : a->u.f;
        out[n++] = (tf_train_param){fn->attrs[i].name, v};
    }
    return n;
}

static void fill_train_config(const tf_module *m, tf_precision precision, tf_train_config *out)
{
    const tf_train *t = &m->train;
    memset(out, 0, sizeof *out);
    out->has_block = t->present;
    if (t->optimizer.fn >= 0) {
        const tf_fn_info *fn = &tf_optimizer_fns[t->optimizer.fn];
        out->optimizer = fn->name;
        out->noptimizer_params = call_params(fn, &t->optimizer, out->optimizer_params, 8);
        out->lr = tf_call_float(tf_optimizer_fns, &t->optimizer, "lr");
    } else {   /* what autodiff does without one: sgd(lr=0.01), its other attributes 0 */
        const tf_fn_info *fn = &tf_optimizer_fns[TF_OPT_SGD];
        out->optimizer = fn->name;
        out->lr = 0.01;
        for (int i = 0; i < fn->nattrs && i < 8; i++)
            out->optimizer_params[out->noptimizer_params++] =
                (tf_train_param){fn->attrs[i].name, strcmp(fn->attrs[i].name, "lr") ? 0 : out->lr};
    }
    const tf_fn_info *sched = &tf_schedule_fns[t->schedule.fn >= 0 ? t->schedule.fn : TF_SCHED_CONSTANT];
    out->schedule = sched->name;
    if (t->schedule.fn >= 0) out->nschedule_params = call_params(sched, &t->schedule, out->schedule_params, 8);
    out->precision = precision;
    out->clip_grad_norm = t->has_clip ? t->clip_grad_norm : 0;
    out->accumulate = t->has_accumulate ? t->accumulate : 1;
    out->metrics = t->metrics;
    out->nmetrics = (size_t)t->nmetrics;
}

tf_status tf_model_train_config(tf_context_t *ctx, const tf_model_t *m, tf_train_config *out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!m || !out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    const tf_train *t = &m->m->train;
    fill_train_config(m->m, t->has_precision ? tf_precision_of_ir(t->precision) : TF_PRECISION_FP32, out);
    return TF_OK;
}

tf_status tf_program_train_config(tf_context_t *ctx, const tf_program_t *p, tf_train_config *out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!p || !out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    fill_train_config(p->m, p->precision, out);
    return TF_OK;
}

/* ---- checkpoint metadata ---- */

static tf_status from_tio(tf_context_t *ctx, tio_status st, const char *err)
{
    tf_status s = st == TIO_ERR_OOM ? TF_ERR_OOM : st == TIO_ERR_ARG ? TF_ERR_INVALID_ARG : TF_ERR_FORMAT;
    return tf_set_error(ctx, s, "error: %s", err);
}

tf_status tf_metadata_get(tf_context_t *ctx, const char *json, const char *key, char **value)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    char err[1024];
    tio_status st = tio_meta_get(json, key, value, err, sizeof err);
    return st ? from_tio(ctx, st, err) : TF_OK;
}

tf_status tf_metadata_set(tf_context_t *ctx, char **json, const char *key, const char *value)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    char err[1024], *text = NULL;
    if (!json) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    tio_status st = tio_meta_set(*json, key, value, &text, err, sizeof err);
    if (st) return from_tio(ctx, st, err);
    tf_libc_free(*json);   /* the caller's, from malloc; text is stdio's */
    *json = text;
    return TF_OK;
}
