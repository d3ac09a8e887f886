/* printer.c — the canonical text of a module.
 *
 * The output is the input format: print(parse(text)) parses back to the same
 * module and prints identically. Canonical means: sections in a fixed order
 * (module, dims, declarations, ops, outputs, updates, train), every op result
 * typed, attributes the user left at their defaults omitted, keyword form for
 * every call argument, numbers in the shortest text that reads back exactly. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

typedef tf_strbuf sb;

/* Shortest %g that reads back to the same double; always looks like a float. */
static void fmt_double(double v, char *buf, size_t n)
{
    if (isnan(v)) { snprintf(buf, n, "nan"); return; }
    if (isinf(v)) { snprintf(buf, n, v > 0 ? "inf" : "-inf"); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", n - strlen(buf) - 1);
}

const char *tf_type_str(const tf_module *m, const tf_type *t, char buf[256])
{
    size_t k = (size_t)snprintf(buf, 256, "%s[", tf_dtype_name(t->dtype));
    for (int i = 0; i < t->rank && k < 256; i++) {
        const tf_dim *dm = &t->dims[i];
        if (m && dm->sym >= 0 && dm->sym < m->ndims && m->dims[dm->sym].value == dm->n)
            k += (size_t)snprintf(buf + k, 256 - k, "%s%s", i ? ", " : "", m->dims[dm->sym].name);
        else
            k += (size_t)snprintf(buf + k, 256 - k, "%s%lld", i ? ", " : "", (long long)dm->n);
    }
    if (k < 255) snprintf(buf + k, 256 - k, "]");
    return buf;
}

static void print_ival(sb *s, const tf_module *m, tf_ival v)
{
    if (v.sym >= 0 && v.sym < m->ndims && m->dims[v.sym].value == v.v) tf_strbuf_printf(s, "%s", m->dims[v.sym].name);
    else tf_strbuf_printf(s, "%lld", (long long)v.v);
}

static void print_attr_value(sb *s, const tf_module *m, const tf_attr *a)
{
    char buf[64];
    switch (a->kind) {
    case TF_ATTR_INT: print_ival(s, m, a->u.i); break;
    case TF_ATTR_FLOAT: fmt_double(a->u.f, buf, sizeof buf); tf_strbuf_printf(s, "%s", buf); break;
    case TF_ATTR_BOOL: tf_strbuf_printf(s, "%s", a->u.b ? "true" : "false"); break;
    case TF_ATTR_STR: tf_strbuf_printf(s, "\"%s\"", a->u.s); break;
    case TF_ATTR_DTYPE: tf_strbuf_printf(s, "%s", tf_dtype_name(a->u.dt)); break;
    case TF_ATTR_INTS:
        if (a->scalar && a->u.ints.n == 1) { print_ival(s, m, a->u.ints.v[0]); break; }
        tf_strbuf_printf(s, "[");
        for (int i = 0; i < a->u.ints.n; i++) {
            if (i) tf_strbuf_printf(s, ", ");
            print_ival(s, m, a->u.ints.v[i]);
        }
        tf_strbuf_printf(s, "]");
        break;
    default: break;
    }
}

/* key=value for every attribute set by the user; `sep` starts the first. */
static void print_attrs(sb *s, const tf_module *m, const tf_attr_spec *specs, int n, const tf_attr *attrs, bool first)
{
    for (int i = 0; i < n; i++) {
        if (!attrs[i].set) continue;
        tf_strbuf_printf(s, "%s%s=", first ? "" : ", ", specs[i].name);
        print_attr_value(s, m, &attrs[i]);
        first = false;
    }
}

static void print_call(sb *s, const tf_module *m, const tf_fn_info *fns, const tf_call *c)
{
    const tf_fn_info *f = &fns[c->fn];
    tf_strbuf_printf(s, "%s(", f->name);
    print_attrs(s, m, f->attrs, f->nattrs, c->attrs, true);
    tf_strbuf_printf(s, ")");
}

static void print_operand(sb *s, const tf_value *v)
{
    if (v->kind != TF_VAL_CONST) { tf_strbuf_printf(s, "%s", v->name); return; }
    char buf[64];
    if (tf_dtype_is_float(v->type.dtype)) fmt_double(v->cval, buf, sizeof buf);
    else snprintf(buf, sizeof buf, "%lld", (long long)v->cval);
    tf_strbuf_printf(s, "%s", buf);
}


static void print_node(sb *s, const tf_module *m, const tf_node *n, const char *indent)
{
    const tf_op_info *oi = tf_op_info_of(n->op);
    char b[256];
    tf_strbuf_printf(s, "%s%s : %s = %s(", indent, n->out->name, tf_type_str(m, &n->out->type, b), oi->name);
    for (int i = 0; i < n->nin; i++) {
        if (i) tf_strbuf_printf(s, ", ");
        print_operand(s, n->in[i]);
    }
    print_attrs(s, m, oi->attrs, oi->nattrs, n->attrs, n->nin == 0);
    bool any = n->nin > 0;
    for (int i = 0; i < oi->nattrs; i++) any |= n->attrs[i].set;
    if (n->backward) tf_strbuf_printf(s, "%sbackward=true", any ? ", " : ""), any = true;
    if (n->recompute) tf_strbuf_printf(s, "%srecompute=true", any ? ", " : "");
    tf_strbuf_printf(s, ")\n");
}

char *tf_print_module(const tf_module *m)
{
    sb s = {0};
    char b[256];
    static const char *kinds[] = {"input", "param", "buffer"};
    if (m->name) tf_strbuf_printf(&s, "module %s\n", m->name);
    if (m->ndims) {
        if (s.n) tf_strbuf_printf(&s, "\n");
        for (int i = 0; i < m->ndims; i++) tf_strbuf_printf(&s, "dim %s = %lld\n", m->dims[i].name, (long long)m->dims[i].value);
    }
    if (m->decls.n) {
        if (s.n) tf_strbuf_printf(&s, "\n");
        for (int i = 0; i < m->decls.n; i++) {
            const tf_value *v = m->decls.items[i];
            tf_strbuf_printf(&s, "%-6s %s : %s", kinds[v->kind], v->name, tf_type_str(m, &v->type, b));
            if (v->kind != TF_VAL_INPUT) {
                tf_strbuf_printf(&s, " = ");
                print_call(&s, m, tf_init_fns, &v->init);
            }
            tf_strbuf_printf(&s, "\n");
        }
    }
    if (m->nodes.n) {
        if (s.n) tf_strbuf_printf(&s, "\n");
        int cur = 0;
        for (int i = 0; i <= m->nodes.n; i++) {
            const tf_node *n = i < m->nodes.n ? m->nodes.items[i] : NULL;
            int r = n ? n->region : 0;
            if (r != cur && cur) {   /* close the region being printed */
                const tf_region *rg = &m->regions[cur - 1];
                tf_strbuf_printf(&s, "  yield");
                for (int k = 0; k < rg->nyields; k++) tf_strbuf_printf(&s, "%s %s", k ? "," : "", rg->yields[k]->name);
                tf_strbuf_printf(&s, "\n}\n");
            }
            if (r != cur && r)
                tf_strbuf_printf(&s, "region %s kind=%s%s {\n", m->regions[r - 1].name, tf_region_kind_name(m->regions[r - 1].kind),
                                 m->regions[r - 1].wide ? " numerics=fast" : "");
            cur = r;
            if (n) print_node(&s, m, n, r ? "  " : "");
        }
    }
    if (m->noutputs || m->nupdates) {
        if (s.n) tf_strbuf_printf(&s, "\n");
        for (int i = 0; i < m->noutputs; i++) {
            const tf_output *o = &m->outputs[i];
            if (strcmp(o->name, o->value->name) == 0) tf_strbuf_printf(&s, "output %s\n", o->name);
            else tf_strbuf_printf(&s, "output %s = %s\n", o->name, o->value->name);
        }
        for (int i = 0; i < m->nupdates; i++)
            tf_strbuf_printf(&s, "update %s = %s\n", m->updates[i].buffer->name, m->updates[i].value->name);
    }
    if (m->plan.planned) {   /* comments: a dump still parses, and memplan plans again; runtime/program_pkg.c's
                              * read_plan reads them back from a package's final.ir (change both together) */
        if (s.n) tf_strbuf_printf(&s, "\n");
        tf_strbuf_printf(&s, "# memplan: arena %lld bytes, persistent %lld bytes, peak %lld bytes, %d in place\n",
                  (long long)m->plan.arena_bytes, (long long)m->plan.persistent_bytes,
                  (long long)(m->plan.arena_bytes + m->plan.persistent_bytes), m->plan.reused);
        for (int i = 0; i < m->nodes.n; i++) {
            const tf_value *v = ((const tf_node *)m->nodes.items[i])->out;
            if (v->offset >= 0)
                tf_strbuf_printf(&s, "#   %s @%lld +%lld\n", v->name, (long long)v->offset,
                          (long long)(tf_type_numel(&v->type) * tf_dtype_bytes(v->type.dtype)));
            else if (v->home)
                tf_strbuf_printf(&s, "#   %s in %s\n", v->name, v->home->name);
        }
    }
    const tf_train *t = &m->train;
    if (t->present) {
        static const char *prec[] = {"fp32", "fp16", "bf16"};
        if (s.n) tf_strbuf_printf(&s, "\n");
        tf_strbuf_printf(&s, "train {\n");
        if (t->optimizer.fn >= 0) {
            tf_strbuf_printf(&s, "  optimizer = ");
            print_call(&s, m, tf_optimizer_fns, &t->optimizer);
            tf_strbuf_printf(&s, "\n");
        }
        if (t->schedule.fn >= 0) {
            tf_strbuf_printf(&s, "  schedule = ");
            print_call(&s, m, tf_schedule_fns, &t->schedule);
            tf_strbuf_printf(&s, "\n");
        }
        if (t->has_precision) tf_strbuf_printf(&s, "  precision = %s\n", prec[t->precision]);
        if (t->has_clip) {
            fmt_double(t->clip_grad_norm, b, sizeof b);
            tf_strbuf_printf(&s, "  clip_grad_norm = %s\n", b);
        }
        if (t->has_accumulate) tf_strbuf_printf(&s, "  accumulate = %lld\n", (long long)t->accumulate);
        for (int i = 0; i < t->nmetrics; i++) tf_strbuf_printf(&s, "%s%s%s", i ? ", " : "  metrics = ", t->metrics[i], i == t->nmetrics - 1 ? "\n" : "");
        tf_strbuf_printf(&s, "}\n");
    }
    if (s.oom) {
        tf_free(s.p);
        return NULL;
    }
    if (!s.p) tf_strbuf_printf(&s, "%s", "");
    return s.p;
}
