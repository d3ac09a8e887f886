/* module.c — module lifetime, name table, builders, attribute coercion. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

tf_module *tf_module_create(const char *file)
{
    tf_module *m = tf_calloc(1, sizeof *m);
    if (!m) return NULL;
    tf_arena_init(&m->arena);
    if (file && !(m->file = tf_arena_strdup(&m->arena, file))) {
        tf_free(m);
        return NULL;
    }
    m->train.optimizer.fn = m->train.schedule.fn = -1;
    m->train.accumulate = 1;
    return m;
}

void tf_module_swap(tf_module *a, tf_module *b)
{
    tf_module t = *a;
    *a = *b;
    *b = t;
}

void tf_module_free(tf_module *m)
{
    if (!m) return;
    tf_free(m->decls.items);
    tf_free(m->nodes.items);
    tf_free(m->dims);
    tf_free(m->outputs);
    tf_free(m->updates);
    tf_free(m->regions);
    tf_free(m->names.slots);
    tf_arena_release(&m->arena);
    tf_free(m);
}

tf_ir_status tf_vec_push(tf_module *m, tf_vec *v, void *item)
{
    (void)m;
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 16;
        void **items = tf_realloc(v->items, (size_t)cap * sizeof *items);
        if (!items) return TF_IR_ERR_OOM;
        v->items = items;
        v->cap = cap;
    }
    v->items[v->n++] = item;
    return TF_IR_OK;
}

tf_ir_status tf_grow(void **items, int n, int *cap, size_t elem)
{
    if (n < *cap) return TF_IR_OK;
    int c = *cap ? *cap * 2 : 8;
    void *p = tf_realloc(*items, (size_t)c * elem);
    if (!p) return TF_IR_ERR_OOM;
    *items = p;
    *cap = c;
    return TF_IR_OK;
}

tf_ir_status tf_module_add_dim(tf_module *m, const char *name, int64_t value, tf_loc loc)
{
    if (tf_grow((void **)&m->dims, m->ndims, &m->cap_dims, sizeof *m->dims)) return TF_IR_ERR_OOM;
    const char *nm = tf_arena_strdup(&m->arena, name);
    if (!nm) return TF_IR_ERR_OOM;
    m->dims[m->ndims++] = (tf_dim_decl){nm, value, loc};
    return TF_IR_OK;
}

tf_ir_status tf_module_add_output(tf_module *m, const char *name, tf_value *v, tf_loc loc)
{
    if (tf_grow((void **)&m->outputs, m->noutputs, &m->cap_outputs, sizeof *m->outputs)) return TF_IR_ERR_OOM;
    const char *nm = tf_arena_strdup(&m->arena, name);
    if (!nm) return TF_IR_ERR_OOM;
    m->outputs[m->noutputs++] = (tf_output){nm, v, loc};
    return TF_IR_OK;
}

tf_ir_status tf_module_add_update(tf_module *m, tf_value *buffer, tf_value *value, tf_loc loc)
{
    if (tf_grow((void **)&m->updates, m->nupdates, &m->cap_updates, sizeof *m->updates)) return TF_IR_ERR_OOM;
    m->updates[m->nupdates++] = (tf_update){buffer, value, loc};
    return TF_IR_OK;
}

tf_value *tf_module_add_decl(tf_module *m, const char *name, tf_value_kind kind, const tf_type *type, int init_fn)
{
    if (tf_module_find_value(m, name)) return NULL;
    tf_value *v = tf_arena_alloc(&m->arena, sizeof *v);
    if (!v || !(v->name = tf_arena_strdup(&m->arena, name))) return NULL;
    v->kind = kind;
    v->type = *type;
    v->id = -1;
    v->offset = -1;
    v->init.fn = kind == TF_VAL_INPUT ? -1 : init_fn;
    if (kind != TF_VAL_INPUT) {
        const tf_fn_info *f = &tf_init_fns[init_fn];
        v->init.nattr = f->nattrs;
        if (!(v->init.attrs = tf_arena_array(&m->arena, (size_t)(f->nattrs ? f->nattrs : 1), sizeof(tf_attr)))) return NULL;
        tf_diag d = {0};
        if (tf_attrs_fill_defaults(m, f->attrs, f->nattrs, v->init.attrs, &d)) return NULL;
    }
    if (tf_module_add_name(m, v) || tf_vec_push(m, &m->decls, v)) return NULL;
    return v;
}

const char *tf_region_kind_name(tf_region_kind k)
{
    static const char *names[] = {"pointwise", "reduction", "gemm", "multi"};
    return (unsigned)k < TF_REGION_KIND_COUNT ? names[k] : "?";
}

int tf_module_add_region(tf_module *m, const char *name, tf_region_kind kind, tf_loc loc)
{
    if (tf_grow((void **)&m->regions, m->nregions, &m->cap_regions, sizeof *m->regions)) return 0;
    const char *nm = tf_arena_strdup(&m->arena, name);
    if (!nm) return 0;
    m->regions[m->nregions++] = (tf_region){nm, kind, NULL, 0, loc, false};
    return m->nregions;
}

/* n's value could be held wide in a fast region: a 16-bit float result of
 * a pointwise op (not a cast), a reduction or a broadcast. */
static bool widenable(const tf_module *m, const tf_node *n)
{
    tf_dt t = n->out->type.dtype;
    if (!n->region || (t != TF_DT_F16 && t != TF_DT_BF16) || n->op == TF_OP_CAST) return false;
    if (m->regions[n->region - 1].kind == TF_REGION_MULTI) return false;
    tf_op_exec x = tf_op_exec_of(n->op);
    if (!tf_exec_elementwise(x) && x != TF_OPX_REDUCE && x != TF_OPX_BCAST) return false;
    const tf_region *r = &m->regions[n->region - 1];
    for (int i = 0; i < r->nyields; i++)
        if (r->yields[i] == n->out) return false;
    return true;
}

bool tf_node_wide(const tf_module *m, const tf_node *n)
{
    return n->region && m->regions[n->region - 1].wide && widenable(m, n);
}

bool tf_region_has_wide(const tf_module *m, int region)
{
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        if (n->region == region && widenable(m, n)) return true;
    }
    return false;
}

void tf_module_clear_regions(tf_module *m)
{
    for (int i = 0; i < m->nodes.n; i++) ((tf_node *)m->nodes.items[i])->region = 0;
    m->nregions = 0;
}

tf_ir_status tf_module_append_node(tf_module *m, tf_node *n) { return tf_vec_push(m, &m->nodes, n); }

/* ---- name table: open addressing, FNV-1a ---- */

/* Removal leaves a tombstone (a value with an empty name, which no lookup
 * matches), so probe chains stay intact; growth drops tombstones. */
static tf_value tombstone = {.name = ""};

static uint64_t hash_name(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

tf_value *tf_module_find_valuen(const tf_module *m, const char *name, size_t len)
{
    if (!m->names.cap) return NULL;
    size_t mask = (size_t)m->names.cap - 1, i = hash_name(name, len) & mask;
    for (tf_value *v; (v = m->names.slots[i]); i = (i + 1) & mask)
        if (strlen(v->name) == len && memcmp(v->name, name, len) == 0) return v;
    return NULL;
}

tf_value *tf_module_find_value(const tf_module *m, const char *name)
{
    return tf_module_find_valuen(m, name, strlen(name));
}

static void name_insert(tf_value **slots, int cap, tf_value *v)
{
    size_t mask = (size_t)cap - 1, i = hash_name(v->name, strlen(v->name)) & mask;
    while (slots[i]) i = (i + 1) & mask;
    slots[i] = v;
}

tf_ir_status tf_module_add_name(tf_module *m, tf_value *v)
{
    if ((m->names.count + 1) * 2 > m->names.cap) {
        int cap = m->names.cap ? m->names.cap * 2 : 64;
        tf_value **slots = tf_calloc((size_t)cap, sizeof *slots);
        if (!slots) return TF_IR_ERR_OOM;
        for (int i = 0; i < m->names.cap; i++)
            if (m->names.slots[i] && m->names.slots[i] != &tombstone) name_insert(slots, cap, m->names.slots[i]);
        tf_free(m->names.slots);
        m->names.slots = slots;
        m->names.cap = cap;
    }
    name_insert(m->names.slots, m->names.cap, v);
    m->names.count++;
    return TF_IR_OK;
}

void tf_module_remove_name(tf_module *m, const tf_value *v)
{
    if (!m->names.cap || !v->name) return;
    size_t mask = (size_t)m->names.cap - 1, i = hash_name(v->name, strlen(v->name)) & mask;
    for (tf_value *w; (w = m->names.slots[i]); i = (i + 1) & mask)
        if (w == v) {
            m->names.slots[i] = &tombstone;
            return;
        }
}

int tf_module_find_dim(const tf_module *m, const char *name, size_t len)
{
    for (int i = 0; i < m->ndims; i++)
        if (strlen(m->dims[i].name) == len && memcmp(m->dims[i].name, name, len) == 0) return i;
    return -1;
}

const char *tf_module_unique_name(tf_module *m, const char *hint)
{
    if (!hint || !*hint) hint = "t";
    if (!tf_module_find_value(m, hint) && tf_module_find_dim(m, hint, strlen(hint)) < 0)
        return tf_arena_strdup(&m->arena, hint);
    char buf[256];
    for (int k = 1;; k++) {
        snprintf(buf, sizeof buf, "%.200s.%d", hint, k);
        if (!tf_module_find_value(m, buf)) return tf_arena_strdup(&m->arena, buf);
    }
}

void tf_module_renumber(tf_module *m)
{
    int id = 0;
    for (int i = 0; i < m->decls.n; i++) ((tf_value *)m->decls.items[i])->id = id++;
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k]->kind == TF_VAL_CONST) n->in[k]->id = -1;
        n->out->id = id++;
    }
    m->next_id = id;
}

void tf_module_commit_replacements(tf_module *m, tf_value *const *repl)
{
    for (int i = 0; i < m->noutputs; i++)
        if (repl[m->outputs[i].value->id]) m->outputs[i].value = repl[m->outputs[i].value->id];
    for (int i = 0; i < m->nupdates; i++)
        if (repl[m->updates[i].value->id]) m->updates[i].value = repl[m->updates[i].value->id];
    int kept = 0;
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        if (repl[n->out->id]) tf_module_remove_name(m, n->out);
        else m->nodes.items[kept++] = n;
    }
    m->nodes.n = kept;
    tf_module_renumber(m);
}

void tf_module_replace_uses(tf_module *m, tf_value *from, tf_value *to)
{
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] == from) n->in[k] = to;
    }
    for (int i = 0; i < m->noutputs; i++)
        if (m->outputs[i].value == from) m->outputs[i].value = to;
    for (int i = 0; i < m->nupdates; i++)
        if (m->updates[i].value == from) m->updates[i].value = to;
}

/* ---- attributes ---- */

tf_attr tf_attr_int(int64_t v) { return (tf_attr){.kind = TF_ATTR_INT, .set = true, .u.i = {v, -1}}; }
tf_attr tf_attr_float(double v) { return (tf_attr){.kind = TF_ATTR_FLOAT, .set = true, .u.f = v}; }
tf_attr tf_attr_bool(bool v) { return (tf_attr){.kind = TF_ATTR_BOOL, .set = true, .u.b = v}; }
tf_attr tf_attr_str(const char *s) { return (tf_attr){.kind = TF_ATTR_STR, .set = true, .u.s = s}; }
tf_attr tf_attr_dtype(tf_dt t) { return (tf_attr){.kind = TF_ATTR_DTYPE, .set = true, .u.dt = t}; }

tf_attr tf_attr_ints(tf_module *m, const int64_t *v, int n)
{
    tf_attr a = {.kind = TF_ATTR_INTS, .set = true};
    tf_ival *iv = tf_arena_array(&m->arena, (size_t)(n ? n : 1), sizeof *iv);
    if (!iv) return (tf_attr){0};   /* kind NONE: tf_build reports OOM */
    for (int i = 0; i < n; i++) iv[i] = (tf_ival){v[i], -1};
    a.u.ints.n = n;
    a.u.ints.v = iv;
    return a;
}

tf_ir_status tf_attr_parse_default(tf_module *m, const char *t, tf_attr *a)
{
    memset(a, 0, sizeof *a);
    if (t[0] == '"') {
        size_t n = strlen(t);
        a->kind = TF_ATTR_STR;
        a->u.s = tf_arena_strndup(&m->arena, t + 1, n >= 2 ? n - 2 : 0);
        return a->u.s ? TF_IR_OK : TF_IR_ERR_OOM;
    }
    if (t[0] == '[') {   /* only "[]" and "[a, b]" of ints occur in schemas */
        int64_t v[TF_MAX_RANK];
        int n = 0;
        for (const char *p = t + 1; *p && *p != ']' && n < TF_MAX_RANK;) {
            char *end;
            v[n++] = strtoll(p, &end, 10);
            p = end;
            while (*p == ',' || *p == ' ') p++;
        }
        *a = tf_attr_ints(m, v, n);
        return a->kind ? TF_IR_OK : TF_IR_ERR_OOM;
    }
    if (!strcmp(t, "true") || !strcmp(t, "false")) {
        *a = tf_attr_bool(t[0] == 't');
        return TF_IR_OK;
    }
    tf_dt dt;
    if (tf_dtype_from_name(t, strlen(t), &dt)) {
        *a = tf_attr_dtype(dt);
        return TF_IR_OK;
    }
    if (strpbrk(t, ".eE")) *a = tf_attr_float(strtod(t, NULL));
    else *a = tf_attr_int(strtoll(t, NULL, 10));
    return TF_IR_OK;
}

static const char *kind_name(tf_attr_kind k)
{
    switch (k) {
    case TF_ATTR_INT: return "an int";
    case TF_ATTR_FLOAT: return "a number";
    case TF_ATTR_BOOL: return "true or false";
    case TF_ATTR_STR: return "a string";
    case TF_ATTR_INTS: return "a list of ints";
    case TF_ATTR_DTYPE: return "a dtype (f32, f16, bf16, f64, i64, i32, bool)";
    default: return "nothing";
    }
}

tf_ir_status tf_attr_coerce(tf_module *m, const tf_attr_spec *spec, tf_attr *a, const tf_loc *loc, tf_diag *d)
{
    if (a->kind == spec->kind) return TF_IR_OK;
    switch (spec->kind) {
    case TF_ATTR_FLOAT:
        if (a->kind == TF_ATTR_INT) {
            double f = (double)a->u.i.v;
            a->kind = TF_ATTR_FLOAT;
            a->u.f = f;
            return TF_IR_OK;
        }
        break;
    case TF_ATTR_INTS:
        if (a->kind == TF_ATTR_INT) {   /* stride=2 means [2] written short; printed short again */
            tf_ival *v = tf_arena_alloc(&m->arena, sizeof *v);
            if (!v) return tf_diag_error(d, TF_IR_ERR_OOM, loc, "out of memory");
            *v = a->u.i;
            a->kind = TF_ATTR_INTS;
            a->scalar = true;
            a->u.ints.n = 1;
            a->u.ints.v = v;
            return TF_IR_OK;
        }
        break;
    case TF_ATTR_DTYPE:
        if (a->kind == TF_ATTR_STR) {
            tf_dt dt;
            if (tf_dtype_from_name(a->u.s, strlen(a->u.s), &dt)) {
                a->kind = TF_ATTR_DTYPE;
                a->u.dt = dt;
                return TF_IR_OK;
            }
            return tf_diag_error(d, TF_IR_ERR_VERIFY, loc, "attribute '%s' expects %s, found '%s'", spec->name,
                                 kind_name(spec->kind), a->u.s);
        }
        break;
    default: break;
    }
    return tf_diag_error(d, TF_IR_ERR_VERIFY, loc, "attribute '%s' expects %s, found %s", spec->name,
                         kind_name(spec->kind), kind_name(a->kind));
}

static bool in_range(const tf_attr_spec *s, double v) { return s->min > s->max || (v >= s->min && v <= s->max); }

tf_ir_status tf_attr_check(const tf_attr_spec *spec, const tf_attr *a, const tf_loc *loc, tf_diag *d)
{
    switch (a->kind) {
    case TF_ATTR_INT:
        if (!in_range(spec, (double)a->u.i.v))
            return tf_diag_error(d, TF_IR_ERR_VERIFY, loc, "attribute '%s' must be in [%.17g, %.17g], found %lld",
                                 spec->name, spec->min, spec->max, (long long)a->u.i.v);
        break;
    case TF_ATTR_FLOAT: {
        /* a range of [-inf, inf] takes the infinities too (const(value=-inf): a max pool's padding) */
        bool any = spec->min == -INFINITY && spec->max == INFINITY;
        if ((!isfinite(a->u.f) && !(any && isinf(a->u.f))) || !in_range(spec, a->u.f)) {
            if (spec->min > spec->max)
                return tf_diag_error(d, TF_IR_ERR_VERIFY, loc, "attribute '%s' must be a finite number, found %g",
                                     spec->name, a->u.f);
            return tf_diag_error(d, TF_IR_ERR_VERIFY, loc, "attribute '%s' must be a %snumber in [%g, %g], found %g",
                                 spec->name, any ? "" : "finite ", spec->min, spec->max, a->u.f);
        }
        break;
    }
    case TF_ATTR_INTS:
        if (a->u.ints.n > 64)
            return tf_diag_error(d, TF_IR_ERR_VERIFY, loc, "attribute '%s' has %d entries, at most 64", spec->name,
                                 a->u.ints.n);
        for (int i = 0; i < a->u.ints.n; i++)
            if (!in_range(spec, (double)a->u.ints.v[i].v))
                return tf_diag_error(d, TF_IR_ERR_VERIFY, loc,
                                     "attribute '%s': entry %d must be in [%.17g, %.17g], found %lld", spec->name, i,
                                     spec->min, spec->max, (long long)a->u.ints.v[i].v);
        break;
    case TF_ATTR_STR:
        if (spec->choices) {
            size_t n = strlen(a->u.s);
            for (const char *c = spec->choices; *c;) {
                const char *bar = strchr(c, '|');
                size_t k = bar ? (size_t)(bar - c) : strlen(c);
                if (k == n && memcmp(c, a->u.s, n) == 0) return TF_IR_OK;
                c += k + (bar ? 1 : 0);
            }
            return tf_diag_error(d, TF_IR_ERR_VERIFY, loc, "attribute '%s' must be one of %s, found \"%s\"", spec->name,
                                 spec->choices, a->u.s);
        }
        break;
    default: break;
    }
    return TF_IR_OK;
}

tf_ir_status tf_attrs_fill_defaults(tf_module *m, const tf_attr_spec *specs, int nspecs, tf_attr *attrs, tf_diag *d)
{
    for (int i = 0; i < nspecs; i++) {
        if (attrs[i].kind != TF_ATTR_NONE) continue;
        if (!specs[i].dflt) continue;   /* required: the caller reports it with a location */
        tf_attr a;
        if (tf_attr_parse_default(m, specs[i].dflt, &a))
            return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
        if (tf_attr_coerce(m, &specs[i], &a, NULL, d)) return d->status;
        a.set = false;
        attrs[i] = a;
    }
    return TF_IR_OK;
}

/* ---- builders ---- */

tf_value *tf_const(tf_module *m, double v, tf_dt dt)
{
    tf_value *c = tf_arena_alloc(&m->arena, sizeof *c);
    if (!c) return NULL;
    c->kind = TF_VAL_CONST;
    c->cval = v;
    c->type.dtype = dt;
    c->type.rank = 0;
    c->id = -1;
    return c;
}

tf_value *tf_build(tf_module *m, tf_diag *d, int op, tf_value **in, int nin, const tf_named_attr *attrs, int nattrs,
                   const char *hint, const tf_loc *loc)
{
    const tf_op_info *oi = tf_op_info_of(op);
    tf_loc l = loc ? *loc : (tf_loc){0};
    tf_node *n = tf_arena_alloc(&m->arena, sizeof *n);
    tf_value *out = tf_arena_alloc(&m->arena, sizeof *out);
    tf_value **ins = tf_arena_array(&m->arena, (size_t)(nin ? nin : 1), sizeof *ins);
    tf_attr *as = tf_arena_array(&m->arena, (size_t)(oi->nattrs ? oi->nattrs : 1), sizeof *as);
    if (!n || !out || !ins || !as) {
        tf_diag_error(d, TF_IR_ERR_OOM, &l, "out of memory building %s", oi->name);
        return NULL;
    }
    if (nin) memcpy(ins, in, (size_t)nin * sizeof *ins);
    n->op = op;
    n->nin = nin;
    n->in = ins;
    n->attrs = as;
    n->loc = l;
    for (int i = 0; i < nattrs; i++) {
        int k = tf_op_attr_index(op, attrs[i].name);
        if (k < 0 || attrs[i].attr.kind == TF_ATTR_NONE) {
            tf_diag_error(d, TF_IR_ERR_INTERNAL, &l, "internal: %s has no attribute '%s'", oi->name, attrs[i].name);
            return NULL;
        }
        as[k] = attrs[i].attr;
        if (tf_attr_coerce(m, &oi->attrs[k], &as[k], &l, d) || tf_attr_check(&oi->attrs[k], &as[k], &l, d)) return NULL;
    }
    if (tf_attrs_fill_defaults(m, oi->attrs, oi->nattrs, as, d)) return NULL;
    out->kind = TF_VAL_NODE;
    out->def = n;
    out->loc = l;
    out->id = -1;          /* numbered by the next tf_module_renumber */
    out->offset = -1;
    n->out = out;
    if (!(out->name = tf_module_unique_name(m, hint))) {
        tf_diag_error(d, TF_IR_ERR_OOM, &l, "out of memory");
        return NULL;
    }
    if (tf_infer_node(m, n, d)) return NULL;
    if (tf_module_add_name(m, out) || tf_module_append_node(m, n)) {
        tf_diag_error(d, TF_IR_ERR_OOM, &l, "out of memory");
        return NULL;
    }
    return out;
}

static void retarget_type(tf_type *t, int k, int64_t value)
{
    for (int i = 0; i < t->rank; i++)
        if (t->dims[i].sym == k) t->dims[i].n = value;
}

static void retarget_attr(tf_attr *a, int k, int64_t value)
{
    if (a->kind == TF_ATTR_INT && a->u.i.sym == k) a->u.i.v = value;
    if (a->kind == TF_ATTR_INTS)
        for (int i = 0; i < a->u.ints.n; i++)
            if (a->u.ints.v[i].sym == k) a->u.ints.v[i].v = value;
}

tf_ir_status tf_module_set_dim(tf_module *m, int k, int64_t value, tf_diag *d)
{
    if (k < 0 || k >= m->ndims || value < 1 || value > TF_MAX_DIM)
        return tf_diag_error(d, TF_IR_ERR_VERIFY, NULL, "dim value %lld out of range", (long long)value);
    m->dims[k].value = value;
    for (int i = 0; i < m->decls.n; i++) retarget_type(&((tf_value *)m->decls.items[i])->type, k, value);
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i];
        if (n->annotated) retarget_type(&n->annot, k, value);
        for (int j = 0; j < tf_op_info_of(n->op)->nattrs; j++) retarget_attr(&n->attrs[j], k, value);
    }
    return tf_verify(m, d);
}

/* ---- clone ---- */

static tf_attr *clone_attrs(tf_module *dst, const tf_attr *src, int n)
{
    tf_attr *a = tf_arena_array(&dst->arena, (size_t)(n ? n : 1), sizeof *a);
    if (!a) return NULL;
    for (int i = 0; i < n; i++) {
        a[i] = src[i];
        if (src[i].kind == TF_ATTR_STR && src[i].u.s && !(a[i].u.s = tf_arena_strdup(&dst->arena, src[i].u.s)))
            return NULL;
        if (src[i].kind == TF_ATTR_INTS) {
            tf_ival *v = tf_arena_array(&dst->arena, (size_t)(src[i].u.ints.n ? src[i].u.ints.n : 1), sizeof *v);
            if (!v) return NULL;
            memcpy(v, src[i].u.ints.v, (size_t)src[i].u.ints.n * sizeof *v);
            a[i].u.ints.v = v;
        }
    }
    return a;
}

static bool clone_call(tf_module *dst, tf_call *c, const tf_call *src)
{
    *c = *src;
    c->loc.file = dst->file;
    if (src->nattr == 0) return true;
    return (c->attrs = clone_attrs(dst, src->attrs, src->nattr)) != NULL;
}

static tf_value *clone_value(tf_module *dst, const tf_value *v)
{
    tf_value *c = tf_arena_alloc(&dst->arena, sizeof *c);
    if (!c) return NULL;
    *c = *v;
    c->def = NULL;
    c->loc.file = dst->file;
    if (v->name && !(c->name = tf_arena_strdup(&dst->arena, v->name))) return NULL;
    if ((v->kind == TF_VAL_PARAM || v->kind == TF_VAL_BUFFER) && !clone_call(dst, &c->init, &v->init)) return NULL;
    if (v->name && tf_module_add_name(dst, c)) return NULL;
    return c;
}

tf_module *tf_module_clone(tf_module *m)
{
    tf_module_renumber(m);
    tf_module *c = tf_module_create(m->file);
    tf_value **map = tf_calloc((size_t)(m->next_id ? m->next_id : 1), sizeof *map);
    if (!c || !map) goto fail;
    if (m->name && !(c->name = tf_arena_strdup(&c->arena, m->name))) goto fail;
    for (int i = 0; i < m->ndims; i++)
        if (tf_module_add_dim(c, m->dims[i].name, m->dims[i].value, (tf_loc){c->file, m->dims[i].loc.line, m->dims[i].loc.col}))
            goto fail;
    for (int i = 0; i < m->decls.n; i++) {
        tf_value *v = m->decls.items[i];
        if (!(map[v->id] = clone_value(c, v)) || tf_vec_push(c, &c->decls, map[v->id])) goto fail;
    }
    for (int i = 0; i < m->nodes.n; i++) {
        tf_node *n = m->nodes.items[i], *k = tf_arena_alloc(&c->arena, sizeof *k);
        if (!k) goto fail;
        *k = *n;
        k->loc.file = c->file;
        k->in = tf_arena_array(&c->arena, (size_t)(n->nin ? n->nin : 1), sizeof *k->in);
        k->attrs = clone_attrs(c, n->attrs, tf_op_info_of(n->op)->nattrs);
        if (!k->in || !k->attrs) goto fail;
        for (int j = 0; j < n->nin; j++) {
            tf_value *v = n->in[j];
            k->in[j] = v->kind == TF_VAL_CONST ? clone_value(c, v) : map[v->id];
            if (!k->in[j]) goto fail;
        }
        if (!(k->out = map[n->out->id] = clone_value(c, n->out))) goto fail;
        k->out->def = k;
        if (tf_vec_push(c, &c->nodes, k)) goto fail;
    }
    for (int i = 0; i < m->noutputs; i++) {
        const tf_output *o = &m->outputs[i];
        if (tf_module_add_output(c, o->name, map[o->value->id], (tf_loc){c->file, o->loc.line, o->loc.col})) goto fail;
    }
    for (int i = 0; i < m->nupdates; i++) {
        const tf_update *u = &m->updates[i];
        if (tf_module_add_update(c, map[u->buffer->id], map[u->value->id], (tf_loc){c->file, u->loc.line, u->loc.col}))
            goto fail;
    }
    for (int i = 0; i < m->nregions; i++) {
        const tf_region *r = &m->regions[i];
        if (!tf_module_add_region(c, r->name, r->kind, (tf_loc){c->file, r->loc.line, r->loc.col})) goto fail;
        tf_region *cr = &c->regions[i];
        cr->wide = r->wide;
        if (!(cr->yields = tf_arena_array(&c->arena, (size_t)(r->nyields ? r->nyields : 1), sizeof *cr->yields))) goto fail;
        for (int k = 0; k < r->nyields; k++) cr->yields[k] = map[r->yields[k]->id];
        cr->nyields = r->nyields;
    }
    c->backward_start = m->backward_start;
    c->train = m->train;
    c->train.loc.file = c->file;
    if (!clone_call(c, &c->train.optimizer, &m->train.optimizer) ||
        !clone_call(c, &c->train.schedule, &m->train.schedule))
        goto fail;
    if (m->train.nmetrics) {   /* the names into c's arena */
        if (!(c->train.metrics = tf_arena_array(&c->arena, (size_t)m->train.nmetrics, sizeof *c->train.metrics)) ||
            !(c->train.metric_locs = tf_arena_array(&c->arena, (size_t)m->train.nmetrics, sizeof *c->train.metric_locs)))
            goto fail;
        for (int i = 0; i < m->train.nmetrics; i++) {
            if (!(c->train.metrics[i] = tf_arena_strdup(&c->arena, m->train.metrics[i]))) goto fail;
            c->train.metric_locs[i] = (tf_loc){c->file, m->train.metric_locs[i].line, m->train.metric_locs[i].col};
        }
    }
    tf_free(map);
    tf_module_renumber(c);
    return c;
fail:
    tf_free(map);
    tf_module_free(c);
    return NULL;
}
