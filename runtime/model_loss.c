/* model_loss.c — tf_model_add_loss: a loss (and an optimizer) for a model
 * that has none, so that an inference model (an ONNX file above all) can be
 * trained: `tfuse train model.onnx --loss "cross_entropy(logits, labels)"`.
 *
 * The loss reads one value of the model and one new input, whose type
 * follows from the loss: cross_entropy's labels are i64 class indices shaped
 * like the logits without their last axis, mse_loss's target has the
 * prediction's type. The model is printed, the lines are added (before a
 * train block, when it has one), and the text is parsed again, so the new
 * model is checked like any other; its initial values (an ONNX model's)
 * stay with it. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "runtime.h"

/* An identifier at *p (skipping spaces) into out; false when there is none or it is too long. */
static bool ident(const char **p, char *out, size_t n)
{
    while (isspace((unsigned char)**p)) (*p)++;
    size_t k = 0;
    if (!isalpha((unsigned char)**p) && **p != '_') return false;
    while ((isalnum((unsigned char)**p) || **p == '_' || **p == '.') && k + 1 < n) out[k++] = *(*p)++;
    out[k] = 0;
    return !(isalnum((unsigned char)**p) || **p == '_' || **p == '.');
}

static bool punct(const char **p, char c)
{
    while (isspace((unsigned char)**p)) (*p)++;
    if (**p != c) return false;
    (*p)++;
    return true;
}

/* The model's outputs, "a, b, c", into buf. */
static const char *outputs_of(const tf_module *m, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < m->noutputs && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "", m->outputs[i].value->name ? m->outputs[i].value->name : "?");
    return buf;
}

tf_status tf_model_add_loss(tf_context_t *ctx, tf_model_t *model, const char *loss, const char *optimizer)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !model || (!loss && !optimizer)) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    const tf_module *m = model->m;
    const char *src = m->file ? m->file : "<model>";
    char fn[64], a[256], b[256], outs[512], ty[256];
    tf_strbuf add = {0};
    if (loss) {
        const char *p = loss;
        if (!ident(&p, fn, sizeof fn) || !punct(&p, '(') || !ident(&p, a, sizeof a) || !punct(&p, ',') || !ident(&p, b, sizeof b) ||
            !punct(&p, ')') || *(p += strspn(p, " \t\n")))
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: --loss '%s': expected cross_entropy(OUTPUT, LABELS) or "
                                "mse_loss(OUTPUT, TARGET)", loss);
        bool ce = !strcmp(fn, "cross_entropy");
        if (!ce && strcmp(fn, "mse_loss"))
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: --loss '%s': the loss is cross_entropy or mse_loss, not '%s'", loss, fn);
        if (tf_module_find_value(m, "loss"))
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "%s: error: --loss: the model has a value named 'loss' already%s", src,
                                m->train.present ? " and a train block: train it as it is" : "");
        const tf_value *v = tf_module_find_value(m, a);
        if (!v)
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "%s: error: --loss '%s': the model has no value named '%s' (its outputs: %s)",
                                src, loss, a, outputs_of(m, outs, sizeof outs));
        if (tf_module_find_value(m, b))
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "%s: error: --loss '%s': '%s' names a value of the model already; the loss's "
                                "second operand is a new input, the %s the data gives", src, loss, b, ce ? "labels" : "target");
        if (!tf_dtype_is_float(v->type.dtype) || v->type.rank < (ce ? 1 : 0))
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "%s: error: --loss '%s': '%s' is %s; %s takes %s", src, loss, a,
                                tf_type_str(m, &v->type, ty), fn, ce ? "floating logits [..., classes]" : "a floating prediction");
        tf_type t = v->type;
        if (ce) t.rank--, t.dtype = TF_DT_I64;
        tf_strbuf_printf(&add, "# added by --loss %s\ninput %s : %s\nloss = %s(%s, %s)\noutput loss\n", loss, b, tf_type_str(m, &t, ty),
                         fn, a, b);
    }
    if (optimizer) {
        if (m->train.present && m->train.optimizer.fn >= 0) {
            tf_free(add.p);
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "%s: error: --optimizer: the model's train block names its optimizer already",
                                src);
        }
        if (strchr(optimizer, '\n') || strchr(optimizer, '}')) {
            tf_free(add.p);
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: --optimizer '%s': expected one call such as adamw(lr=1e-3)", optimizer);
        }
    }
    char *text = tf_print_module(m);
    if (!text || add.oom) {
        tf_free(text);
        tf_free(add.p);
        return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    }
    /* the lines go before the train block (the printer writes it last), which takes the optimizer */
    char *train = strstr(text, "\ntrain {\n");
    size_t head = train ? (size_t)(train - text) + 1 : strlen(text);
    tf_strbuf all = {0};
    tf_strbuf_append(&all, text, head);
    if (head && text[head - 1] != '\n') tf_strbuf_append(&all, "\n", 1);
    if (add.p) tf_strbuf_append(&all, add.p, add.n);
    if (optimizer && train) tf_strbuf_printf(&all, "train {\n  optimizer = %s\n%s", optimizer, text + head + strlen("train {\n"));
    else if (optimizer) tf_strbuf_printf(&all, "train {\n  optimizer = %s\n}\n", optimizer);
    else if (train) tf_strbuf_append(&all, text + head, strlen(text + head));
    tf_free(text);
    tf_free(add.p);
    if (all.oom || !all.p) {
        tf_free(all.p);
        return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    }
    tf_model_t *nm = NULL;
    tf_dim_override auto_dim = {model->auto_dim >= 0 ? m->dims[model->auto_dim].name : NULL, -1};
    char name[600];   /* a mistake in what was added is placed in the text it was added to */
    snprintf(name, sizeof name, "%s, with %s%s%s", src, loss ? "--loss" : "", loss && optimizer ? " and " : "", optimizer ? "--optimizer" : "");
    tf_status st = tf_model_parse_string(ctx, name, all.p, all.n, auto_dim.name ? &auto_dim : NULL, auto_dim.name ? 1 : 0, &nm);
    tf_free(all.p);
    if (st) return st;
    tf_module_free(model->m);   /* the same model, with the loss: its initial values stay */
    model->m = nm->m;
    model->auto_dim = nm->auto_dim;
    nm->m = NULL;
    tf_model_free(nm);
    return TF_OK;
}
