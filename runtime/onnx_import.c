/* onnx_import.c — ONNX nodes as tfuse ops (onnx_import.h says what
 * becomes what). Each ONNX value is an `ival`: a tfuse value, or a
 * constant known at import time (an initializer, a Constant, a Shape of a
 * static shape, what folding those gave), made a tfuse value only when an
 * op reads it as an operand. Shapes are static: every dim has a value (a
 * named dim's is the one given), as tfuse's types have. */
#include "onnx_import.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "alloc.h"
#include "ops.h"
#include "onnx_fold.h"
#include "onnx_ix.h"
#include "runtime.h"

/* ---- messages ---- */

int ox_fail(importer *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ox_fail(importer *im, const char *fmt, ...)
{
    if (im->failed) return -1;
    im->failed = true;
    int k;
    if (im->node)
        k = snprintf(im->err, im->nerr, "%s: node %d '%.*s' (%.*s, opset %lld): ", im->path, im->node_index + 1, (int)im->node->name.n,
                     im->node->name.p, (int)im->node->op_type.n, im->node->op_type.p, (long long)im->opset);
    else
        k = snprintf(im->err, im->nerr, "%s: ", im->path);
    if (k >= 0 && (size_t)k < im->nerr) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(im->err + k, im->nerr - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return -1;
}

double *ox_own(importer *im, int64_t n)
{
    if (n > MAX_CONST) {
        ox_fail(im, "a constant of %lld elements to fold at import (at most %d)", (long long)n, MAX_CONST);
        return NULL;
    }
    if (im->nowned == im->capowned) {
        int cap = im->capowned ? 2 * im->capowned : 64;
        double **p = tf_realloc(im->owned, (size_t)cap * sizeof *p);
        if (!p) {
            ox_fail(im, "out of memory");
            return NULL;
        }
        im->owned = p, im->capowned = cap;
    }
    double *c = tf_calloc((size_t)(n ? n : 1), sizeof *c);
    if (!c) ox_fail(im, "out of memory");
    else im->owned[im->nowned++] = c;
    return c;
}

/* ---- names and values ---- */

/* An ONNX name as a tfuse name: [A-Za-z_][A-Za-z0-9_.]*, other characters '_'. */
void ox_sanitize(tf_onnx_str s, char *out, size_t n)
{
    size_t k = 0;
    if (!s.n || !((s.p[0] >= 'A' && s.p[0] <= 'Z') || (s.p[0] >= 'a' && s.p[0] <= 'z') || s.p[0] == '_')) out[k++] = 'v';
    for (size_t i = 0; i < s.n && k + 1 < n; i++) {
        char ch = s.p[i];
        bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.';
        out[k++] = ok ? ch : '_';
    }
    out[k] = 0;
    /* the statement keywords cannot name values */
    static const char *const kw[] = {"module", "dim", "input", "param", "buffer", "output", "update", "train", "region", "yield",
                                     "inf", "nan", "true", "false"};   /* and the literals */
    for (size_t i = 0; i < sizeof kw / sizeof *kw; i++)
        if (!strcmp(out, kw[i]) && k + 2 < n) {
            out[k] = '_', out[k + 1] = 0;
            break;
        }
}

entry *ox_find(importer *im, tf_onnx_str name)
{
    for (int i = im->nenv - 1; i >= 0; i--)
        if (im->env[i].name.n == name.n && (!name.n || !memcmp(im->env[i].name.p, name.p, name.n))) return &im->env[i];
    return NULL;
}

ival *ox_bind(importer *im, tf_onnx_str name, const ival *x)
{
    if (im->nenv == im->capenv) {
        int cap = im->capenv ? 2 * im->capenv : 256;
        entry *e = tf_realloc(im->env, (size_t)cap * sizeof *e);
        if (!e) {
            ox_fail(im, "out of memory");
            return NULL;
        }
        im->env = e, im->capenv = cap;
    }
    im->env[im->nenv] = (entry){name, *x};
    return &im->env[im->nenv++].x;
}

/* Elements, saturating at 2^62 (shapes are checked where they enter, by check_dims: this only keeps a bad one from overflowing). */
int64_t ox_numel(const ival *x)
{
    int64_t n = 1;
    for (int i = 0; i < x->rank; i++) {
        if (x->shape[i] < 0) return 0;
        if (x->shape[i] && n > ((int64_t)1 << 62) / x->shape[i]) return (int64_t)1 << 62;
        n *= x->shape[i];
    }
    return n;
}

/* A tensor's dims as a file states them: each at most 2^40, together at most 2^48 elements. */
int ox_check_dims(importer *im, tf_onnx_str name, const int64_t *dims, int rank)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0 || dims[i] > ((int64_t)1 << 40) || (dims[i] && n > ((int64_t)1 << 48) / dims[i]))
            return ox_fail(im, "tensor '%.*s' has a dim of %lld: too large", (int)name.n, name.p, (long long)dims[i]);
        n *= dims[i];
    }
    return 0;
}

bool ox_dt_of_onnx(int32_t t, tf_dt *dt)
{
    switch (t) {
    case TF_ONNX_FLOAT: *dt = TF_DT_F32; return true;
    case TF_ONNX_DOUBLE: *dt = TF_DT_F64; return true;
    case TF_ONNX_FLOAT16: *dt = TF_DT_F16; return true;
    case TF_ONNX_BFLOAT16: *dt = TF_DT_BF16; return true;
    case TF_ONNX_INT64: case TF_ONNX_UINT32: case TF_ONNX_UINT64: *dt = TF_DT_I64; return true;
    case TF_ONNX_INT32: case TF_ONNX_INT16: case TF_ONNX_UINT16: case TF_ONNX_INT8: case TF_ONNX_UINT8: *dt = TF_DT_I32; return true;
    case TF_ONNX_BOOL: *dt = TF_DT_BOOL; return true;
    default: return false;
    }
}

bool ox_is_float(tf_dt t) { return t == TF_DT_F32 || t == TF_DT_F64 || t == TF_DT_F16 || t == TF_DT_BF16; }

/* ---- initializers' data ---- */

/* The bytes of an external tensor's data: read from the file beside the model. */
static unsigned char *read_external(importer *im, const tf_onnx_tensor *t, size_t want)
{
    char loc[1024];
    if (t->location.n >= sizeof loc || memchr(t->location.p, 0, t->location.n)) {
        ox_fail(im, "tensor '%.*s': an external data location that is not a file name", (int)t->name.n, t->name.p);
        return NULL;
    }
    memcpy(loc, t->location.p, t->location.n);
    loc[t->location.n] = 0;
    if (loc[0] == '/' || strstr(loc, "..")) {
        ox_fail(im, "tensor '%.*s': external data at '%s': a location must be a path under the model's directory", (int)t->name.n, t->name.p, loc);
        return NULL;
    }
    char full[5200];
    snprintf(full, sizeof full, "%s/%s", im->dir, loc);
    FILE *f = fopen(full, "rb");
    if (!f) {
        ox_fail(im, "tensor '%.*s': cannot open its external data %s: %s", (int)t->name.n, t->name.p, full, strerror(errno));
        return NULL;
    }
    unsigned char *buf = NULL;
    if (fseeko(f, 0, SEEK_END) == 0) {
        off_t size = ftello(f);
        if (size < 0 || t->offset > (int64_t)size || (int64_t)want > (int64_t)size - t->offset ||
            (t->length >= 0 && (size_t)t->length != want))
            ox_fail(im, "tensor '%.*s': its external data in %s (%lld bytes at offset %lld, length %lld) does not hold its %zu bytes",
                 (int)t->name.n, t->name.p, full, (long long)size, (long long)t->offset, (long long)t->length, want);
        else if ((buf = tf_malloc(want ? want : 1)) && (fseeko(f, t->offset, SEEK_SET) || fread(buf, 1, want, f) != want)) {
            ox_fail(im, "tensor '%.*s': reading its external data from %s failed", (int)t->name.n, t->name.p, full);
            tf_free(buf);
            buf = NULL;
        } else if (!buf) {
            ox_fail(im, "out of memory for tensor '%.*s'", (int)t->name.n, t->name.p);
        }
    }
    fclose(f);
    return buf;
}

/* Element i of initializer t (its ONNX type), as a double. */
static double init_elem(const tf_onnx_tensor *t, const unsigned char *raw, int64_t i)
{
    if (raw) {
        const unsigned char *p = raw + (size_t)i * (size_t)tf_onnx_type_bytes(t->data_type);
        switch (t->data_type) {
        case TF_ONNX_FLOAT: { float v; memcpy(&v, p, 4); return v; }
        case TF_ONNX_DOUBLE: { double v; memcpy(&v, p, 8); return v; }
        case TF_ONNX_FLOAT16: return tf_elem_load(TF_DT_F16, p, 0);
        case TF_ONNX_BFLOAT16: return tf_elem_load(TF_DT_BF16, p, 0);
        case TF_ONNX_INT64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
        case TF_ONNX_UINT64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
        case TF_ONNX_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
        case TF_ONNX_UINT32: { uint32_t v; memcpy(&v, p, 4); return v; }
        case TF_ONNX_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
        case TF_ONNX_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
        case TF_ONNX_INT8: return (int8_t)p[0];
        case TF_ONNX_UINT8: return p[0];
        case TF_ONNX_BOOL: return p[0] != 0;
        default: return NAN;
        }
    }
    /* typed fields: float_data (4-byte floats), int32_data (int32, and the bits of 16-bit floats), int64_data,
     * double_data, uint64_data */
    if (t->val_bytes == 4) {
        uint32_t bits = ((const uint32_t *)t->vals)[i];
        if (t->data_type == TF_ONNX_FLOAT) { float v; memcpy(&v, &bits, 4); return v; }
        uint16_t h = (uint16_t)bits;
        if (t->data_type == TF_ONNX_FLOAT16) return tf_elem_load(TF_DT_F16, &h, 0);
        if (t->data_type == TF_ONNX_BFLOAT16) return tf_elem_load(TF_DT_BF16, &h, 0);
        return t->data_type == TF_ONNX_UINT32 ? (double)bits : (double)(int32_t)bits;
    }
    uint64_t bits = ((const uint64_t *)t->vals)[i];
    if (t->data_type == TF_ONNX_DOUBLE) { double v; memcpy(&v, &bits, 8); return v; }
    return t->data_type == TF_ONNX_UINT64 ? (double)bits : (double)(int64_t)bits;
}

/* The raw bytes of initializer t, or its typed field, checked against its shape; *raw NULL: the typed field. *owned: to free. */
static int init_data(importer *im, const tf_onnx_tensor *t, const unsigned char **raw, unsigned char **owned, int64_t *n)
{
    *raw = NULL, *owned = NULL;
    int64_t cnt = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->dims[i] > ((int64_t)1 << 40) || (t->dims[i] && cnt > ((int64_t)1 << 48) / t->dims[i]))
            return ox_fail(im, "tensor '%.*s' is too large", (int)t->name.n, t->name.p);
        cnt *= t->dims[i];
    }
    *n = cnt;
    int eb = tf_onnx_type_bytes(t->data_type);
    if (!eb) return ox_fail(im, "tensor '%.*s' is of type %s, which tfuse does not read", (int)t->name.n, t->name.p, tf_onnx_type_name(t->data_type));
    size_t want = (size_t)cnt * (size_t)eb;
    if (t->external) {
        if (!(*owned = read_external(im, t, want))) return -1;
        *raw = *owned;
        return 0;
    }
    if (t->raw.p) {
        if (t->raw.n != want)
            return ox_fail(im, "tensor '%.*s': raw_data holds %zu bytes, and %lld elements of %s need %zu", (int)t->name.n, t->name.p, t->raw.n,
                        (long long)cnt, tf_onnx_type_name(t->data_type), want);
        *raw = (const unsigned char *)t->raw.p;
        return 0;
    }
    if (t->nvals != cnt)
        return ox_fail(im, "tensor '%.*s': its data has %lld elements, and its shape %lld", (int)t->name.n, t->name.p, (long long)t->nvals,
                    (long long)cnt);
    return 0;
}

/* A constant's elements (an initializer read now); NULL when it is not one (or too large). */
const double *ox_const_of(importer *im, ival *x)
{
    if (x->c) return x->c;
    if (!x->init) return NULL;
    const unsigned char *raw;
    unsigned char *owned;
    int64_t n;
    if (init_data(im, x->init, &raw, &owned, &n)) return NULL;
    double *c = n <= MAX_CONST ? ox_own(im, n) : NULL;
    for (int64_t i = 0; c && i < n; i++) c[i] = tf_dtype_round(x->dt, init_elem(x->init, raw, i));
    tf_free(owned);
    return x->c = c;
}

static int add_param(importer *im, const char *name, tf_dt dt, const int64_t *shape, int rank, void *data, size_t bytes)
{
    if (im->nparams == im->capparams) {
        size_t cap = im->capparams ? 2 * im->capparams : 64;
        tio_tensor *p = tf_realloc(im->params, cap * sizeof *p);
        if (!p) return ox_fail(im, "out of memory");
        im->params = p, im->capparams = cap;
    }
    tio_tensor *t = &im->params[im->nparams];
    memset(t, 0, sizeof *t);
    size_t len = strlen(name);
    if (!(t->name = tf_malloc(len + 1))) return ox_fail(im, "out of memory");
    memcpy(t->name, name, len + 1);
    t->dtype = (tio_dtype)dt;
    t->rank = rank;
    memcpy(t->shape, shape, (size_t)rank * sizeof *shape);
    t->data = data;
    t->nbytes = bytes;
    im->nparams++;
    return 0;
}

tf_loc ox_here(const importer *im) { return (tf_loc){im->path, im->node ? im->node_index + 1 : 0, im->node ? 1 : 0}; }

/* x as a tfuse value: a number, or a param or buffer holding a constant. */
tf_value *ox_val(importer *im, ival *x, const char *hint)
{
    if (x->v) return x->v;
    if (!x->init && !x->c) {
        ox_fail(im, "an operand with no value");
        return NULL;
    }
    int64_t n = ox_numel(x);
    if (n == 1 && x->dt == TF_DT_F32 && ox_const_of(im, x)) {   /* a number (the text's literals are f32), reshaped to the constant's rank */
        tf_value *v = tf_const(im->m, x->c[0], x->dt);
        if (v && x->rank > 0) {
            tf_diag d = {0};
            tf_loc loc = ox_here(im);
            tf_named_attr a = {"shape", tf_attr_ints(im->m, x->shape, x->rank)};
            tf_value *in[1] = {v};
            if (!(v = tf_build(im->m, &d, TF_OP_RESHAPE, in, 1, &a, 1, hint, &loc))) {
                ox_fail(im, "%s", d.msg);
                return NULL;
            }
        }
        if (!v) ox_fail(im, "out of memory");
        return x->v = v;
    }
    /* a declared tensor, its values saved with the params */
    char name[512];
    tf_onnx_str h = {hint, strlen(hint)};
    ox_sanitize(h, name, sizeof name);
    const char *nm = tf_module_unique_name(im->m, name);
    tf_type ty = {x->dt, x->rank, {{0}}};
    for (int i = 0; i < x->rank; i++) ty.dims[i] = (tf_dim){x->shape[i], -1};
    bool trainable = ox_is_float(x->dt) && !x->stat && x->weight;
    tf_value *v = nm ? tf_module_add_decl(im->m, nm, trainable ? TF_VAL_PARAM : TF_VAL_BUFFER, &ty, TF_INIT_ZEROS) : NULL;
    if (!v) {
        ox_fail(im, "out of memory");
        return NULL;
    }
    size_t es = (size_t)tf_dtype_bytes(x->dt), bytes = (size_t)n * es;
    /* an initializer's data first: its shape is only a claim until the bytes that hold it are there */
    const unsigned char *raw = NULL;
    unsigned char *owned = NULL;
    int64_t cnt;
    if (!x->c && init_data(im, x->init, &raw, &owned, &cnt)) return NULL;
    unsigned char *data = tf_malloc(bytes ? bytes : 1);   /* tio_tensor_free frees it */
    if (!data) {
        tf_free(owned);
        ox_fail(im, "out of memory for %s (%zu bytes)", nm, bytes);
        return NULL;
    }
    if (x->c) {
        for (int64_t i = 0; i < n; i++) tf_elem_store(x->dt, data, i, x->c[i]);
    } else {
        if (raw && tf_onnx_type_bytes(x->init->data_type) == (int)es && (x->dt != TF_DT_I32 || x->init->data_type == TF_ONNX_INT32) &&
            (x->dt != TF_DT_I64 || x->init->data_type == TF_ONNX_INT64))
            memcpy(data, raw, bytes);   /* the same layout (little-endian, as tfuse's files are) */
        else
            for (int64_t i = 0; i < n; i++) tf_elem_store(x->dt, data, i, init_elem(x->init, raw, i));
        tf_free(owned);
    }
    if (add_param(im, nm, x->dt, x->shape, x->rank, data, bytes)) {
        tf_free(data);
        return NULL;
    }
    return x->v = v;
}

/* ---- building ---- */

tf_value *ox_op(importer *im, int o, tf_value **in, int nin, const tf_named_attr *a, int na)
{
    if (im->failed) return NULL;
    for (int i = 0; i < nin; i++)
        if (!in[i]) return NULL;
    tf_diag d = {0};
    tf_loc loc = ox_here(im);
    char hint[260] = "t";   /* the value the node's output names is renamed so when it is made (set_out) */
    if (im->node && im->node->nout) {
        ox_sanitize(im->node->out[0], hint, sizeof hint - 4);
        strcat(hint, "_");
    }
    tf_value *v = tf_build(im->m, &d, o, in, nin, a, na, hint, &loc);
    if (!v) ox_fail(im, "%s", d.msg);
    return v;
}
tf_value *ox_op1(importer *im, int o, tf_value *a) { return ox_op(im, o, &a, 1, NULL, 0); }
tf_value *ox_op2(importer *im, int o, tf_value *a, tf_value *b)
{
    tf_value *in[2] = {a, b};
    return ox_op(im, o, in, 2, NULL, 0);
}
tf_value *ox_num(importer *im, double v, tf_dt dt)
{
    tf_value *c = tf_const(im->m, v, dt);
    if (!c) ox_fail(im, "out of memory");
    return c;
}
tf_value *ox_reshape(importer *im, tf_value *x, const int64_t *shape, int rank)
{
    tf_named_attr a = {"shape", tf_attr_ints(im->m, shape, rank)};
    return ox_op(im, TF_OP_RESHAPE, &x, 1, &a, 1);
}

/* The result of the node's output k: a tfuse value, named as the output when that name is free. */
int ox_set_out(importer *im, int k, tf_value *v)
{
    if (!v) return -1;
    if (k >= im->node->nout || !im->node->out[k].n) return 0;
    char want[512];
    ox_sanitize(im->node->out[k], want, sizeof want);
    if (v->kind == TF_VAL_NODE && strcmp(v->name, want) && !tf_module_find_value(im->m, want)) {
        const char *nm = tf_module_unique_name(im->m, want);
        if (!nm) return ox_fail(im, "out of memory");
        tf_module_remove_name(im->m, v);
        v->name = nm;
        if (tf_module_add_name(im->m, v)) return ox_fail(im, "out of memory");
    }
    ival x = {.v = v, .dt = v->type.dtype, .rank = v->type.rank};
    for (int i = 0; i < x.rank; i++) x.shape[i] = v->type.dims[i].n;
    return ox_bind(im, im->node->out[k], &x) ? 0 : -1;
}
/* ... or a constant (c: numel elements, owned by the importer). */
int ox_set_const(importer *im, int k, tf_dt dt, const int64_t *shape, int rank, double *c)
{
    if (!c) return -1;
    if (k >= im->node->nout) return 0;
    ival x = {.dt = dt, .rank = rank, .c = c};
    if (rank) memcpy(x.shape, shape, (size_t)rank * sizeof *shape);
    return ox_bind(im, im->node->out[k], &x) ? 0 : -1;
}

/* ---- the node's inputs and attributes ---- */

ival *ox_input(importer *im, int i)
{
    const tf_onnx_node *n = im->node;
    if (i >= n->nin || !n->in[i].n) return NULL;
    entry *e = ox_find(im, n->in[i]);
    if (!e) {
        ox_fail(im, "input %d '%.*s' is defined by no earlier node, initializer or graph input", i, (int)n->in[i].n, n->in[i].p);
        return NULL;
    }
    return &e->x;
}
ival *ox_need(importer *im, int i)
{
    ival *x = ox_input(im, i);
    if (!x && !im->failed) ox_fail(im, "input %d is required", i);
    return x;
}
tf_value *ox_in_val(importer *im, int i)
{
    ival *x = ox_need(im, i);
    if (!x) return NULL;
    char hint[256];
    ox_sanitize(im->node->in[i], hint, sizeof hint);
    return ox_val(im, x, hint);
}

const tf_onnx_attr *ox_attr(const importer *im, const char *name)
{
    for (int i = 0; i < im->node->nattrs; i++)
        if (tf_onnx_is(im->node->attrs[i].name, name)) return &im->node->attrs[i];
    return NULL;
}
int64_t ox_attr_i(const importer *im, const char *name, int64_t dflt)
{
    const tf_onnx_attr *a = ox_attr(im, name);
    return a ? a->i : dflt;
}
double ox_attr_f(const importer *im, const char *name, double dflt)
{
    const tf_onnx_attr *a = ox_attr(im, name);
    return a ? a->f : dflt;
}
bool ox_attr_s(const importer *im, const char *name, const char *value)
{
    const tf_onnx_attr *a = ox_attr(im, name);
    return a && tf_onnx_is(a->s, value);
}
/* An INTS attribute, or input k as a constant (newer opsets moved them there); *n -1: neither given. */
int ox_ints_of(importer *im, const char *aname, int k, int64_t *out, int *n, int cap)
{
    *n = -1;
    const tf_onnx_attr *a = aname ? ox_attr(im, aname) : NULL;
    if (a) {
        if (a->nints > cap) return ox_fail(im, "attribute %s has %d values (at most %d)", aname, a->nints, cap);
        if (a->nints) memcpy(out, a->ints, (size_t)a->nints * sizeof *out);
        *n = a->nints;
        return 0;
    }
    ival *x = k >= 0 ? ox_input(im, k) : NULL;
    if (im->failed) return -1;
    if (!x) return 0;
    const double *c = ox_const_of(im, x);
    if (!c) return ox_fail(im, "input %d must be known when the model is imported (a constant or initializer): tfuse's shapes are static", k);
    int64_t cnt = ox_numel(x);
    if (cnt > cap) return ox_fail(im, "input %d has %lld values (at most %d)", k, (long long)cnt, cap);
    for (int64_t i = 0; i < cnt; i++) {
        if (!(fabs(c[i]) <= 4611686018427387904.0)) return ox_fail(im, "input %d holds %g, not an integer tfuse takes", k, c[i]);
        out[i] = (int64_t)c[i];
    }
    *n = (int)cnt;
    return 0;
}

int ox_norm_axis(importer *im, int64_t axis, int rank, int64_t *out)
{
    if (axis < -rank || axis >= rank) return ox_fail(im, "axis %lld is outside rank %d", (long long)axis, rank);
    *out = axis < 0 ? axis + rank : axis;
    return 0;
}

/* ---- ops ---- */

typedef int (*import_fn)(importer *im, int arg);

static int unary(importer *im, int o) { return ox_set_out(im, 0, ox_op1(im, o, ox_in_val(im, 0))); }

static int binary(importer *im, int o)
{
    ival *a = ox_need(im, 0), *b = ox_need(im, 1);
    if (!a || !b) return -1;
    if (o == TF_OP_DIV && !ox_is_float(a->dt)) {   /* integers truncate toward zero: in f64 (exact below 2^53), cast back */
        tf_value *x = ox_in_val(im, 0), *y = ox_in_val(im, 1);
        if (!x || !y) return -1;
        tf_named_attr to = {"to", tf_attr_dtype(TF_DT_F64)}, back = {"to", tf_attr_dtype(a->dt)};
        tf_value *q = ox_op2(im, TF_OP_DIV, ox_op(im, TF_OP_CAST, &x, 1, &to, 1), ox_op(im, TF_OP_CAST, &y, 1, &to, 1));
        return ox_set_out(im, 0, q ? ox_op(im, TF_OP_CAST, &q, 1, &back, 1) : NULL);
    }
    if (o == TF_OP_POW && (!ox_is_float(a->dt) || !ox_is_float(b->dt))) {   /* the exponent's type is free; an integer base in f64 */
        tf_value *x = ox_in_val(im, 0), *y = ox_in_val(im, 1);
        if (!x || !y) return -1;
        tf_dt t = ox_is_float(a->dt) ? a->dt : TF_DT_F64;
        tf_named_attr to = {"to", tf_attr_dtype(t)}, back = {"to", tf_attr_dtype(a->dt)};
        if (x->type.dtype != t) x = ox_op(im, TF_OP_CAST, &x, 1, &to, 1);
        if (y->type.dtype != t) y = ox_op(im, TF_OP_CAST, &y, 1, &to, 1);
        tf_value *r = ox_op2(im, TF_OP_POW, x, y);
        return ox_set_out(im, 0, t == a->dt ? r : ox_op(im, TF_OP_CAST, &r, 1, &back, 1));
    }
    return ox_set_out(im, 0, ox_op2(im, o, ox_in_val(im, 0), ox_in_val(im, 1)));
}

/* Max, Min, Sum: a chain; Mean: the sum over the count. */
static int variadic(importer *im, int o)
{
    int n = im->node->nin;
    if (n < 1) return ox_fail(im, "no inputs");
    bool mean = o < 0;
    tf_value *acc = ox_in_val(im, 0);
    for (int i = 1; i < n && acc; i++) acc = ox_op2(im, mean ? TF_OP_ADD : o, acc, ox_in_val(im, i));
    if (mean && acc && n > 1) acc = ox_op2(im, TF_OP_DIV, acc, ox_num(im, n, acc->type.dtype));
    return ox_set_out(im, 0, acc);
}

static int identity(importer *im, int arg)
{
    (void)arg;
    ival *x = ox_need(im, 0);
    if (!x) return -1;
    ival copy = *x;
    if (!ox_bind(im, im->node->out[0], &copy)) return -1;
    if (im->node->nout > 1 && im->node->out[1].n) {   /* Dropout's mask: every element kept in an inference graph */
        if (im->node->nin > 2 && ox_input(im, 2)) {
            ival *t = ox_input(im, 2);
            if (t->v || !ox_const_of(im, t) || t->c[0] != 0)
                return ox_fail(im, "training_mode must be a constant false: tfuse draws dropout itself when it trains");
        }
        tf_value *v = ox_in_val(im, 0), *f = v ? ox_op2(im, TF_OP_NE, v, v) : NULL;
        return ox_set_out(im, 1, f ? ox_op2(im, TF_OP_EQ, f, f) : NULL);
    }
    return 0;
}

static int reciprocal(importer *im, int arg)
{
    (void)arg;
    tf_value *x = ox_in_val(im, 0);
    return ox_set_out(im, 0, x ? ox_op2(im, TF_OP_DIV, ox_num(im, 1, x->type.dtype), x) : NULL);
}

static int compare(importer *im, int o) { return ox_set_out(im, 0, ox_op2(im, o, ox_in_val(im, 0), ox_in_val(im, 1))); }

static int where(importer *im, int arg)
{
    (void)arg;
    tf_value *in[3] = {ox_in_val(im, 0), ox_in_val(im, 1), ox_in_val(im, 2)};
    return ox_set_out(im, 0, ox_op(im, TF_OP_WHERE, in, 3, NULL, 0));
}

/* Not, And, Or, Xor on bools; IsNaN and IsInf: comparisons and where. */
enum { LOGIC_NOT, LOGIC_AND, LOGIC_OR, LOGIC_XOR, LOGIC_ISNAN, LOGIC_ISINF };
static int logic(importer *im, int kind)
{
    tf_value *a = ox_in_val(im, 0), *b = kind >= LOGIC_AND && kind <= LOGIC_XOR ? ox_in_val(im, 1) : NULL;
    if (!a || ((kind >= LOGIC_AND && kind <= LOGIC_XOR) && !b)) return -1;
    if (kind <= LOGIC_XOR && (a->type.dtype != TF_DT_BOOL || (b && b->type.dtype != TF_DT_BOOL)))
        return ox_fail(im, "inputs must be bool");
    /* tfuse's literals are numbers: false is a comparison that fails, x != x for a finite x */
    tf_value *r = NULL;
    switch (kind) {
    case LOGIC_NOT: r = ox_op2(im, TF_OP_EQ, a, ox_op2(im, TF_OP_NE, a, a)); break;
    case LOGIC_AND: r = ox_op(im, TF_OP_WHERE, (tf_value *[]){a, b, a}, 3, NULL, 0); break;
    case LOGIC_OR: r = ox_op(im, TF_OP_WHERE, (tf_value *[]){a, a, b}, 3, NULL, 0); break;
    case LOGIC_XOR: r = ox_op2(im, TF_OP_NE, a, b); break;
    case LOGIC_ISNAN: r = ox_op2(im, TF_OP_NE, a, a); break;
    default: {   /* infinite: not finite and not NaN, of the signs asked for */
        tf_value *fin = ox_op1(im, TF_OP_ISFINITE, a), *no = ox_op2(im, TF_OP_NE, fin, fin);
        tf_value *inf = ox_op(im, TF_OP_WHERE, (tf_value *[]){fin, no, ox_op2(im, TF_OP_EQ, a, a)}, 3, NULL, 0);
        tf_value *zero = ox_num(im, 0, a->type.dtype);
        if (!ox_attr_i(im, "detect_negative", 1)) inf = ox_op(im, TF_OP_WHERE, (tf_value *[]){inf, ox_op2(im, TF_OP_GT, a, zero), inf}, 3, NULL, 0);
        if (!ox_attr_i(im, "detect_positive", 1)) inf = ox_op(im, TF_OP_WHERE, (tf_value *[]){inf, ox_op2(im, TF_OP_LT, a, zero), inf}, 3, NULL, 0);
        r = inf;
    }
    }
    return ox_set_out(im, 0, r);
}

/* Cast to the attribute's type; CastLike (like = 1) to input 1's. */
static int cast(importer *im, int like)
{
    tf_dt to;
    if (like) {
        ival *l = ox_need(im, 1);
        if (!l) return -1;
        to = l->dt;
    } else if (!ox_dt_of_onnx((int32_t)ox_attr_i(im, "to", 0), &to)) {
        return ox_fail(im, "Cast to %s: tfuse has f32 f16 bf16 f64 i64 i32 bool", tf_onnx_type_name((int32_t)ox_attr_i(im, "to", 0)));
    }
    ival *x = ox_need(im, 0);
    if (!x) return -1;
    if (!x->v && !x->weight && ox_const_of(im, x)) {   /* folded (a weight stays a param: a cast of it is computed) */
        int64_t n = ox_numel(x);
        double *c = ox_own(im, n);
        for (int64_t i = 0; c && i < n; i++) c[i] = tf_dtype_round(to, to == TF_DT_BOOL ? x->c[i] != 0 : x->c[i]);
        return ox_set_const(im, 0, to, x->shape, x->rank, c);
    }
    tf_named_attr a = {"to", tf_attr_dtype(to)};
    tf_value *v = ox_in_val(im, 0);
    return ox_set_out(im, 0, v && v->type.dtype == to ? v : ox_op(im, TF_OP_CAST, &v, 1, &a, 1));
}

/* LeakyRelu, Elu, Selu, HardSigmoid, HardSwish, Softsign, Clip, Gelu */
enum { ACT_LEAKY, ACT_ELU, ACT_SELU, ACT_HARDSIGMOID, ACT_HARDSWISH, ACT_SOFTSIGN, ACT_CLIP, ACT_GELU, ACT_SWISH, ACT_MISH,
       ACT_CELU, ACT_SHRINK };
static int activation(importer *im, int kind)
{
    tf_value *x = ox_in_val(im, 0);
    if (!x) return -1;
    tf_dt dt = x->type.dtype;
    tf_value *r = NULL;
    switch (kind) {
    case ACT_LEAKY: {
        tf_value *pos = ox_op2(im, TF_OP_GT, x, ox_num(im, 0, dt)), *neg = ox_op2(im, TF_OP_MUL, x, ox_num(im, ox_attr_f(im, "alpha", 0.01), dt));
        tf_value *in[3] = {pos, x, neg};
        r = ox_op(im, TF_OP_WHERE, in, 3, NULL, 0);
        break;
    }
    case ACT_ELU: case ACT_SELU: {
        double alpha = ox_attr_f(im, "alpha", kind == ACT_ELU ? 1.0 : 1.67326319217681884765625);
        tf_value *pos = ox_op2(im, TF_OP_GT, x, ox_num(im, 0, dt));
        tf_value *e = ox_op2(im, TF_OP_MUL, ox_op2(im, TF_OP_SUB, ox_op1(im, TF_OP_EXP, x), ox_num(im, 1, dt)), ox_num(im, alpha, dt));
        tf_value *in[3] = {pos, x, e};
        r = ox_op(im, TF_OP_WHERE, in, 3, NULL, 0);
        if (kind == ACT_SELU) r = ox_op2(im, TF_OP_MUL, r, ox_num(im, ox_attr_f(im, "gamma", 1.05070102214813232421875), dt));
        break;
    }
    case ACT_HARDSIGMOID: case ACT_HARDSWISH: {
        double alpha = kind == ACT_HARDSWISH ? 1.0 / 6 : ox_attr_f(im, "alpha", 0.2), beta = kind == ACT_HARDSWISH ? 0.5 : ox_attr_f(im, "beta", 0.5);
        tf_value *t = ox_op2(im, TF_OP_ADD, ox_op2(im, TF_OP_MUL, x, ox_num(im, alpha, dt)), ox_num(im, beta, dt));
        r = ox_op2(im, TF_OP_MAXIMUM, ox_op2(im, TF_OP_MINIMUM, t, ox_num(im, 1, dt)), ox_num(im, 0, dt));
        if (kind == ACT_HARDSWISH) r = ox_op2(im, TF_OP_MUL, x, r);
        break;
    }
    case ACT_SOFTSIGN: r = ox_op2(im, TF_OP_DIV, x, ox_op2(im, TF_OP_ADD, ox_op1(im, TF_OP_ABS, x), ox_num(im, 1, dt))); break;
    case ACT_CLIP: {
        r = x;
        ival *lo = ox_input(im, 1), *hi = ox_input(im, 2);
        if (im->failed) return -1;
        if (im->opset < 11) {
            const tf_onnx_attr *a = ox_attr(im, "min"), *b = ox_attr(im, "max");
            if (a) r = ox_op2(im, TF_OP_MAXIMUM, r, ox_num(im, a->f, dt));
            if (b) r = ox_op2(im, TF_OP_MINIMUM, r, ox_num(im, b->f, dt));
        } else {
            if (lo) r = ox_op2(im, TF_OP_MAXIMUM, r, ox_val(im, lo, "clip_min"));
            if (hi) r = ox_op2(im, TF_OP_MINIMUM, r, ox_val(im, hi, "clip_max"));
        }
        break;
    }
    case ACT_SWISH: r = ox_op2(im, TF_OP_MUL, x, ox_op1(im, TF_OP_SIGMOID, ox_op2(im, TF_OP_MUL, x, ox_num(im, ox_attr_f(im, "alpha", 1.0), dt)))); break;
    case ACT_MISH: r = ox_op2(im, TF_OP_MUL, x, ox_op1(im, TF_OP_TANH, ox_op1(im, TF_OP_SOFTPLUS, x))); break;
    case ACT_CELU: {   /* max(0, x) + min(0, alpha (exp(x / alpha) - 1)) */
        tf_value *alpha = ox_num(im, ox_attr_f(im, "alpha", 1.0), dt), *zero = ox_num(im, 0, dt);
        tf_value *e = ox_op2(im, TF_OP_MUL, alpha, ox_op2(im, TF_OP_SUB, ox_op1(im, TF_OP_EXP, ox_op2(im, TF_OP_DIV, x, alpha)), ox_num(im, 1, dt)));
        r = ox_op2(im, TF_OP_ADD, ox_op2(im, TF_OP_MAXIMUM, x, zero), ox_op2(im, TF_OP_MINIMUM, e, zero));
        break;
    }
    case ACT_SHRINK: {   /* x + bias below -lambd, x - bias above lambd, else 0 */
        double lambd = ox_attr_f(im, "lambd", 0.5), bias = ox_attr_f(im, "bias", 0.0);
        tf_value *hi = ox_op(im, TF_OP_WHERE, (tf_value *[]){ox_op2(im, TF_OP_GT, x, ox_num(im, lambd, dt)), ox_op2(im, TF_OP_SUB, x, ox_num(im, bias, dt)),
                                                          ox_num(im, 0, dt)}, 3, NULL, 0);
        r = ox_op(im, TF_OP_WHERE, (tf_value *[]){ox_op2(im, TF_OP_LT, x, ox_num(im, -lambd, dt)), ox_op2(im, TF_OP_ADD, x, ox_num(im, bias, dt)), hi}, 3,
               NULL, 0);
        break;
    }
    case ACT_GELU: {
        const char *approx = ox_attr_s(im, "approximate", "tanh") ? "tanh" : "none";
        if (ox_attr(im, "approximate") && !ox_attr_s(im, "approximate", "tanh") && !ox_attr_s(im, "approximate", "none"))
            return ox_fail(im, "approximate must be \"none\" or \"tanh\"");
        tf_named_attr a = {"approx", tf_attr_str(approx)};
        r = ox_op(im, TF_OP_GELU, &x, 1, &a, 1);
        break;
    }
    }
    return ox_set_out(im, 0, r);
}

static int matmul(importer *im, int arg)
{
    (void)arg;
    tf_value *a = ox_in_val(im, 0), *b = ox_in_val(im, 1);
    if (!a || !b) return -1;
    int ra = a->type.rank, rb = b->type.rank;
    /* 1-D operands as numpy does: a row (prepended 1) and a column (appended 1), removed after */
    if (ra == 1) a = ox_reshape(im, a, (int64_t[]){1, a->type.dims[0].n}, 2);
    if (rb == 1) b = ox_reshape(im, b, (int64_t[]){b->type.dims[0].n, 1}, 2);
    tf_value *r = ox_op2(im, TF_OP_MATMUL, a, b);
    if (r && (ra == 1 || rb == 1)) {
        int64_t shape[TF_MAX_RANK];
        int k = 0;
        for (int i = 0; i < r->type.rank; i++) {
            if ((ra == 1 && i == r->type.rank - 2) || (rb == 1 && i == r->type.rank - 1)) continue;
            shape[k++] = r->type.dims[i].n;
        }
        r = ox_reshape(im, r, shape, k);
    }
    return ox_set_out(im, 0, r);
}

static int gemm(importer *im, int arg)
{
    (void)arg;
    tf_value *a = ox_in_val(im, 0), *b = ox_in_val(im, 1);
    if (!a || !b) return -1;
    if (a->type.rank != 2 || b->type.rank != 2) return ox_fail(im, "Gemm takes 2-D A and B");
    tf_named_attr at[2] = {{"transpose_a", tf_attr_bool(ox_attr_i(im, "transA", 0) != 0)}, {"transpose_b", tf_attr_bool(ox_attr_i(im, "transB", 0) != 0)}};
    tf_value *in[2] = {a, b};
    tf_value *r = ox_op(im, TF_OP_MATMUL, in, 2, at, 2);
    double alpha = ox_attr_f(im, "alpha", 1), beta = ox_attr_f(im, "beta", 1);
    if (r && alpha != 1) r = ox_op2(im, TF_OP_MUL, r, ox_num(im, alpha, r->type.dtype));
    if (r && ox_input(im, 2)) {
        tf_value *c = ox_in_val(im, 2);
        if (c && beta != 1) c = ox_op2(im, TF_OP_MUL, c, ox_num(im, beta, c->type.dtype));
        r = ox_op2(im, TF_OP_ADD, r, c);
    }
    return ox_set_out(im, 0, r);
}

/* Conv's and the pools' pads: symmetric, per spatial axis; auto_pad resolved. */
static int pads2d(importer *im, const int64_t *in_hw, const int64_t *k, const int64_t *s, const int64_t *d, int64_t *pad)
{
    int64_t p[8] = {0};
    int np;
    for (int i = 0; i < 2; i++)
        if (k[i] < 1 || s[i] < 1 || d[i] < 1 || k[i] > (1 << 20) || s[i] > (1 << 20) || d[i] > (1 << 20))
            return ox_fail(im, "kernel %lld, stride %lld, dilation %lld: each must be from 1 to 2^20", (long long)k[i], (long long)s[i], (long long)d[i]);
    if (ox_ints_of(im, "pads", -1, p, &np, 8)) return -1;
    bool same = ox_attr_s(im, "auto_pad", "SAME_UPPER") || ox_attr_s(im, "auto_pad", "SAME_LOWER");
    if (same) {
        for (int i = 0; i < 2; i++) {
            int64_t out = (in_hw[i] + s[i] - 1) / s[i], need = (out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_hw[i];
            if (need < 0) need = 0;
            if (need % 2) return ox_fail(im, "auto_pad SAME needs %lld padding rows on axis %d, unevenly split: tfuse pads symmetrically", (long long)need, i + 2);
            pad[i] = need / 2;
        }
        return 0;
    }
    if (np > 0 && np != 4) return ox_fail(im, "pads of %d values for a 2-D op (want 4)", np);
    for (int i = 0; i < 2; i++) {
        if (np > 0 && p[i] != p[i + 2])
            return ox_fail(im, "asymmetric pads [%lld, %lld, %lld, %lld]: tfuse pads each side alike", (long long)p[0], (long long)p[1],
                        (long long)p[2], (long long)p[3]);
        pad[i] = np > 0 ? p[i] : 0;
    }
    return 0;
}

static int conv(importer *im, int arg)
{
    (void)arg;
    tf_value *x = ox_in_val(im, 0), *w = ox_in_val(im, 1);
    if (!x || !w) return -1;
    if (x->type.rank != 4 || w->type.rank != 4) return ox_fail(im, "Conv of rank %d: tfuse convolves 2-D images (NCHW)", x->type.rank);
    int64_t k[2] = {w->type.dims[2].n, w->type.dims[3].n}, s[2] = {1, 1}, d[2] = {1, 1}, pad[2], hw[2] = {x->type.dims[2].n, x->type.dims[3].n};
    int n;
    int64_t tmp[8];
    if (ox_ints_of(im, "strides", -1, tmp, &n, 8)) return -1;
    if (n == 2) s[0] = tmp[0], s[1] = tmp[1];
    if (ox_ints_of(im, "dilations", -1, tmp, &n, 8)) return -1;
    if (n == 2) d[0] = tmp[0], d[1] = tmp[1];
    if (pads2d(im, hw, k, s, d, pad)) return -1;
    tf_named_attr a[4] = {{"stride", tf_attr_ints(im->m, s, 2)}, {"padding", tf_attr_ints(im->m, pad, 2)},
                          {"dilation", tf_attr_ints(im->m, d, 2)}, {"groups", tf_attr_int(ox_attr_i(im, "group", 1))}};
    tf_value *in[3] = {x, w, NULL};
    int nin = 2;
    if (ox_input(im, 2)) in[nin++] = ox_in_val(im, 2);
    return ox_set_out(im, 0, ox_op(im, TF_OP_CONV2D, in, nin, a, 4));
}

static int pool(importer *im, int o)
{
    tf_value *x = ox_in_val(im, 0);
    if (!x) return -1;
    if (x->type.rank != 4) return ox_fail(im, "a pool over rank %d: tfuse pools 2-D images (NCHW)", x->type.rank);
    int64_t k[8], s[8] = {1, 1}, d[2] = {1, 1}, pad[2], hw[2] = {x->type.dims[2].n, x->type.dims[3].n};
    int nk, ns, nd;
    if (ox_ints_of(im, "kernel_shape", -1, k, &nk, 8) || ox_ints_of(im, "strides", -1, s, &ns, 8) || ox_ints_of(im, "dilations", -1, d, &nd, 8)) return -1;
    if (nk != 2) return ox_fail(im, "kernel_shape must give 2 sizes");
    if (ns < 0) s[0] = s[1] = 1;
    if (nd == 2 && (d[0] != 1 || d[1] != 1)) return ox_fail(im, "dilated pooling is not in tfuse");
    if (ox_attr_i(im, "ceil_mode", 0)) return ox_fail(im, "ceil_mode=1: tfuse's pools round the output size down");
    if (pads2d(im, hw, k, s, (int64_t[]){1, 1}, pad)) return -1;
    if (o == TF_OP_AVGPOOL2D && (pad[0] || pad[1]) && !ox_attr_i(im, "count_include_pad", 0))
        return ox_fail(im, "count_include_pad=0 with padding: tfuse's avgpool2d divides by the whole window, padding included");
    tf_named_attr a[3] = {{"kernel", tf_attr_ints(im->m, k, 2)}, {"stride", tf_attr_ints(im->m, s, 2)}, {"padding", tf_attr_ints(im->m, pad, 2)}};
    return ox_set_out(im, 0, ox_op(im, o, &x, 1, a, 3));
}

static int global_pool(importer *im, int o)
{
    tf_value *x = ox_in_val(im, 0);
    if (!x) return -1;
    int r = x->type.rank;
    if (r < 3) return ox_fail(im, "a global pool of rank %d", r);
    int64_t axes[TF_MAX_RANK];
    for (int i = 2; i < r; i++) axes[i - 2] = i;
    tf_named_attr a[2] = {{"axes", tf_attr_ints(im->m, axes, r - 2)}, {"keepdims", tf_attr_bool(true)}};
    return ox_set_out(im, 0, ox_op(im, o, &x, 1, a, 2));
}

/* Reshape's target: 0 copies the input's dim (unless allowzero), -1 is inferred by tfuse's reshape. */
static int reshape_op(importer *im, int arg)
{
    (void)arg;
    ival *x = ox_need(im, 0);
    int64_t shape[TF_MAX_RANK];
    int n;
    if (!x || ox_ints_of(im, "shape", 1, shape, &n, TF_MAX_RANK)) return -1;
    if (n < 0) return ox_fail(im, "no target shape");
    bool allowzero = ox_attr_i(im, "allowzero", 0) != 0;
    for (int i = 0; i < n; i++)
        if (shape[i] == 0 && !allowzero) {
            if (i >= x->rank) return ox_fail(im, "shape[%d] = 0 copies a dim the input (rank %d) lacks", i, x->rank);
            shape[i] = x->shape[i];
        }
    tf_value *v = ox_in_val(im, 0);
    return ox_set_out(im, 0, v ? ox_reshape(im, v, shape, n) : NULL);
}

static int flatten(importer *im, int arg)
{
    (void)arg;
    tf_value *x = ox_in_val(im, 0);
    if (!x) return -1;
    int64_t axis = ox_attr_i(im, "axis", 1), r = x->type.rank;   /* in [-r, r]; a negative one counts from the end */
    if (axis < -r || axis > r) return ox_fail(im, "axis %lld is outside [-%lld, %lld]", (long long)axis, (long long)r, (long long)r);
    if (axis < 0) axis += r;
    int64_t a = 1, b = 1;
    for (int i = 0; i < x->type.rank; i++) *(i < axis ? &a : &b) *= x->type.dims[i].n;
    return ox_set_out(im, 0, ox_reshape(im, x, (int64_t[]){a, b}, 2));
}

/* Squeeze and Unsqueeze as reshapes (their axes from the attribute, or input 1 from opset 13) */
static int squeeze(importer *im, int unsq)
{
    ival *x = ox_need(im, 0);
    int64_t axes[TF_MAX_RANK];
    int n;
    if (!x || ox_ints_of(im, "axes", 1, axes, &n, TF_MAX_RANK)) return -1;
    int out_rank = unsq ? x->rank + (n > 0 ? n : 0) : x->rank;
    bool mark[TF_MAX_RANK * 2] = {false};
    if (unsq && n < 0) return ox_fail(im, "Unsqueeze needs axes");
    for (int i = 0; i < (n > 0 ? n : 0); i++) {
        int64_t a = 0;
        if (ox_norm_axis(im, axes[i], out_rank, &a)) return -1;
        mark[a] = true;
    }
    int64_t shape[TF_MAX_RANK * 2];
    int k = 0, j = 0;
    if (unsq) {
        if (out_rank > TF_MAX_RANK) return ox_fail(im, "a result of rank %d (tfuse's limit is %d)", out_rank, TF_MAX_RANK);
        for (int i = 0; i < out_rank; i++) shape[k++] = mark[i] ? 1 : x->shape[j++];
    } else {
        for (int i = 0; i < x->rank; i++) {
            bool drop = n > 0 ? mark[i] : x->shape[i] == 1;
            if (drop && x->shape[i] != 1) return ox_fail(im, "axis %d has size %lld, not 1", i, (long long)x->shape[i]);
            if (!drop) shape[k++] = x->shape[i];
        }
    }
    tf_value *v = ox_in_val(im, 0);
    return ox_set_out(im, 0, v ? ox_reshape(im, v, shape, k) : NULL);
}

static int transpose(importer *im, int arg)
{
    (void)arg;
    tf_value *x = ox_in_val(im, 0);
    if (!x) return -1;
    int64_t perm[TF_MAX_RANK];
    int n;
    if (ox_ints_of(im, "perm", -1, perm, &n, TF_MAX_RANK)) return -1;
    if (n < 0)
        for (n = 0; n < x->type.rank; n++) perm[n] = x->type.rank - 1 - n;
    tf_named_attr a = {"perm", tf_attr_ints(im->m, perm, n)};
    return ox_set_out(im, 0, ox_op(im, TF_OP_TRANSPOSE, &x, 1, &a, 1));
}

static int concat(importer *im, int arg)
{
    (void)arg;
    int n = im->node->nin;
    if (n < 1 || n > 64) return ox_fail(im, "Concat of %d inputs (1 to 64)", n);
    ival *first = ox_need(im, 0);
    if (!first) return -1;
    int64_t axis = 0;
    if (ox_norm_axis(im, ox_attr_i(im, "axis", 0), first->rank, &axis)) return -1;
    for (int i = 0; i < n; i++)
        if (!ox_need(im, i)) return -1;
    tf_value *in[64];
    for (int i = 0; i < n; i++) in[i] = ox_in_val(im, i);
    tf_named_attr a = {"axis", tf_attr_int(axis)};
    return ox_set_out(im, 0, ox_op(im, TF_OP_CONCAT, in, n, &a, 1));
}

/* Softmax and LogSoftmax: before opset 13, the input is seen as 2-D at axis (default 1). */
static int softmax(importer *im, int o)
{
    tf_value *x = ox_in_val(im, 0);
    if (!x) return -1;
    int r = x->type.rank;
    int64_t axis = 0;
    if (ox_norm_axis(im, ox_attr_i(im, "axis", im->opset < 13 ? 1 : -1), r, &axis)) return -1;
    if (im->opset >= 13 || axis == r - 1) {
        tf_named_attr a = {"axis", tf_attr_int(axis)};
        return ox_set_out(im, 0, ox_op(im, o, &x, 1, &a, 1));
    }
    int64_t a = 1, b = 1, shape[TF_MAX_RANK];
    for (int i = 0; i < r; i++) *(i < axis ? &a : &b) *= x->type.dims[i].n, shape[i] = x->type.dims[i].n;
    tf_named_attr at = {"axis", tf_attr_int(-1)};
    tf_value *f = ox_reshape(im, x, (int64_t[]){a, b}, 2);
    return ox_set_out(im, 0, ox_reshape(im, ox_op(im, o, &f, 1, &at, 1), shape, r));
}

/* ReduceSum/Mean/Max: axes from the attribute, or input 1 (ReduceSum from opset 13, the others from 18). */
/* ReduceMin, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp: tfuse's reductions of a pointwise op */
enum { RED_MIN = -1, RED_SUMSQ = -2, RED_L1 = -3, RED_L2 = -4, RED_LOGSUM = -5, RED_LOGSUMEXP = -6 };

static int reduce(importer *im, int o)
{
    tf_value *x = ox_in_val(im, 0);
    if (!x) return -1;
    int64_t axes[TF_MAX_RANK];
    int n;
    if (ox_ints_of(im, "axes", 1, axes, &n, TF_MAX_RANK)) return -1;
    if (n <= 0) {
        if (ox_attr_i(im, "noop_with_empty_axes", 0)) return ox_set_out(im, 0, x);
        n = 0;   /* every axis */
    }
    tf_named_attr a[2] = {{"axes", tf_attr_ints(im->m, axes, n)}, {"keepdims", tf_attr_bool(ox_attr_i(im, "keepdims", 1) != 0)}};
    if (n == 0 && x->type.rank == 0) return ox_set_out(im, 0, x);
    if (x->type.dtype == TF_DT_BOOL && (o == TF_OP_REDUCE_MAX || o == RED_MIN)) {   /* any, all: as i32 */
        tf_named_attr to = {"to", tf_attr_dtype(TF_DT_I32)}, back = {"to", tf_attr_dtype(TF_DT_BOOL)};
        tf_value *i = ox_op(im, TF_OP_CAST, &x, 1, &to, 1);
        if (o == RED_MIN) i = ox_op1(im, TF_OP_NEG, i);
        tf_value *r = ox_op(im, TF_OP_REDUCE_MAX, &i, 1, a, 2);
        if (o == RED_MIN) r = ox_op1(im, TF_OP_NEG, r);
        return ox_set_out(im, 0, ox_op(im, TF_OP_CAST, &r, 1, &back, 1));
    }
    if (o >= 0) return ox_set_out(im, 0, ox_op(im, o, &x, 1, a, 2));
    if (!ox_is_float(x->type.dtype) && o != RED_MIN)
        return ox_fail(im, "an input of %s: tfuse computes this reduction in floating point", tf_dtype_name(x->type.dtype));
    tf_value *r = NULL;
    switch (o) {
    case RED_MIN: r = ox_op1(im, TF_OP_NEG, ox_op(im, TF_OP_REDUCE_MAX, (tf_value *[]){ox_op1(im, TF_OP_NEG, x)}, 1, a, 2)); break;
    case RED_SUMSQ: r = ox_op(im, TF_OP_REDUCE_SUM, (tf_value *[]){ox_op2(im, TF_OP_MUL, x, x)}, 1, a, 2); break;
    case RED_L1: r = ox_op(im, TF_OP_REDUCE_SUM, (tf_value *[]){ox_op1(im, TF_OP_ABS, x)}, 1, a, 2); break;
    case RED_L2: r = ox_op1(im, TF_OP_SQRT, ox_op(im, TF_OP_REDUCE_SUM, (tf_value *[]){ox_op2(im, TF_OP_MUL, x, x)}, 1, a, 2)); break;
    case RED_LOGSUM: r = ox_op1(im, TF_OP_LOG, ox_op(im, TF_OP_REDUCE_SUM, &x, 1, a, 2)); break;
    default: {   /* log sum exp, shifted by the max (kept as dims of 1 to broadcast back) */
        tf_named_attr k[2] = {a[0], {"keepdims", tf_attr_bool(true)}};
        tf_value *m = ox_op(im, TF_OP_REDUCE_MAX, &x, 1, k, 2), *fin = ox_op1(im, TF_OP_ISFINITE, m);
        tf_value *zero = ox_num(im, 0, x->type.dtype), *mm = ox_op(im, TF_OP_WHERE, (tf_value *[]){fin, m, zero}, 3, NULL, 0);
        tf_value *e = ox_op1(im, TF_OP_EXP, ox_op2(im, TF_OP_SUB, x, mm));
        tf_value *lse = ox_op2(im, TF_OP_ADD, ox_op1(im, TF_OP_LOG, ox_op(im, TF_OP_REDUCE_SUM, &e, 1, k, 2)), mm);
        r = ox_attr_i(im, "keepdims", 1) ? lse : ox_op(im, TF_OP_REDUCE_SUM, &lse, 1, a, 2);   /* dims of 1 dropped: a sum over them */
    }
    }
    return ox_set_out(im, 0, r);
}

static int batchnorm(importer *im, int arg)
{
    (void)arg;
    if (ox_attr_i(im, "training_mode", 0)) return ox_fail(im, "training_mode=1: import an inference graph (tfuse trains batch norm itself)");
    for (int i = 3; i < 5; i++) {
        ival *s = ox_need(im, i);
        if (!s) return -1;
        s->stat = true;
    }
    tf_value *in[5];
    for (int i = 0; i < 5; i++) in[i] = ox_in_val(im, i);
    tf_named_attr a[2] = {{"eps", tf_attr_float(ox_attr_f(im, "epsilon", 1e-5))}, {"momentum", tf_attr_float(1 - ox_attr_f(im, "momentum", 0.9))}};
    return ox_set_out(im, 0, ox_op(im, TF_OP_BATCHNORM, in, 5, a, 2));
}

static int shape_op(importer *im, int size)
{
    ival *x = ox_need(im, 0);
    if (!x) return -1;
    if (size) {
        double *c = ox_own(im, 1);
        if (c) c[0] = (double)ox_numel(x);
        return ox_set_const(im, 0, TF_DT_I64, NULL, 0, c);
    }
    int64_t start = ox_attr_i(im, "start", 0), end = ox_attr_i(im, "end", x->rank);
    if (start < 0) start += x->rank;
    if (end < 0) end += x->rank;
    start = start < 0 ? 0 : start > x->rank ? x->rank : start;
    end = end < start ? start : end > x->rank ? x->rank : end;
    double *c = ox_own(im, end - start);
    for (int64_t i = start; c && i < end; i++) c[i - start] = (double)x->shape[i];
    return ox_set_const(im, 0, TF_DT_I64, (int64_t[]){end - start}, 1, c);
}

static int constant(importer *im, int arg)
{
    (void)arg;
    const tf_onnx_node *n = im->node;
    if (n->nattrs != 1) return ox_fail(im, "Constant takes exactly one value attribute");
    const tf_onnx_attr *a = &n->attrs[0];
    ival x = {0};
    if (tf_onnx_is(a->name, "value") && a->t) {
        if (!ox_dt_of_onnx(a->t->data_type, &x.dt)) return ox_fail(im, "a constant of type %s", tf_onnx_type_name(a->t->data_type));
        x.rank = a->t->rank;
        memcpy(x.shape, a->t->dims, (size_t)x.rank * sizeof *x.shape);
        if (ox_check_dims(im, a->name, a->t->dims, a->t->rank)) return -1;
        x.init = a->t;
        if (ox_numel(&x) <= MAX_CONST && !ox_const_of(im, &x)) return -1;
    } else if (tf_onnx_is(a->name, "value_float") || tf_onnx_is(a->name, "value_int")) {
        x.dt = tf_onnx_is(a->name, "value_float") ? TF_DT_F32 : TF_DT_I64;
        if (!(x.c = ox_own(im, 1))) return -1;
        x.c[0] = x.dt == TF_DT_F32 ? a->f : (double)a->i;
    } else if (tf_onnx_is(a->name, "value_floats") || tf_onnx_is(a->name, "value_ints")) {
        bool fl = tf_onnx_is(a->name, "value_floats");
        x.dt = fl ? TF_DT_F32 : TF_DT_I64;
        x.rank = 1;
        x.shape[0] = fl ? a->nfloats : a->nints;
        if (!(x.c = ox_own(im, x.shape[0]))) return -1;
        for (int64_t i = 0; i < x.shape[0]; i++) x.c[i] = fl ? a->floats[i] : (double)a->ints[i];
    } else {
        return ox_fail(im, "Constant's %.*s attribute is not read (value, value_float(s), value_int(s) are)", (int)a->name.n, a->name.p);
    }
    return ox_bind(im, n->out[0], &x) ? 0 : -1;
}

static int constant_of_shape(importer *im, int arg)
{
    (void)arg;
    int64_t shape[TF_MAX_RANK];
    int n;
    if (ox_ints_of(im, NULL, 0, shape, &n, TF_MAX_RANK)) return -1;
    if (n < 0) return ox_fail(im, "no shape input");
    const tf_onnx_attr *a = ox_attr(im, "value");
    tf_dt dt = TF_DT_F32;
    double v = 0;
    if (a && a->t) {
        ival t = {.init = a->t};
        if (!ox_dt_of_onnx(a->t->data_type, &t.dt)) return ox_fail(im, "a value of type %s", tf_onnx_type_name(a->t->data_type));
        dt = t.dt;
        t.rank = a->t->rank;
        memcpy(t.shape, a->t->dims, (size_t)t.rank * sizeof *t.shape);
        if (ox_check_dims(im, a->name, a->t->dims, a->t->rank)) return -1;
        const double *c = ox_const_of(im, &t);
        if (!c || ox_numel(&t) != 1) return ox_fail(im, "value must be one element");
        v = c[0];
    }
    int64_t cnt = 1;
    for (int i = 0; i < n; i++) {
        if (shape[i] < 1 || shape[i] > ((int64_t)1 << 40)) return ox_fail(im, "shape[%d] = %lld: tfuse's sizes are positive", i, (long long)shape[i]);
        if (cnt > ((int64_t)1 << 48) / shape[i]) return ox_fail(im, "a shape of more than 2^48 elements");
        cnt *= shape[i];
    }
    if (cnt <= 4096) {
        double *c = ox_own(im, cnt);
        for (int64_t i = 0; c && i < cnt; i++) c[i] = v;
        return ox_set_const(im, 0, dt, shape, n, c);
    }
    tf_value *s = ox_num(im, v, dt);
    tf_named_attr at = {"shape", tf_attr_ints(im->m, shape, n)};
    return ox_set_out(im, 0, s ? ox_op(im, TF_OP_BROADCAST, &s, 1, &at, 1) : NULL);
}

typedef struct op_entry {
    const char *name;
    import_fn fn;
    int arg;
} op_entry;

static const op_entry ops[] = {
    {"Add", binary, TF_OP_ADD}, {"Sub", binary, TF_OP_SUB}, {"Mul", binary, TF_OP_MUL}, {"Div", binary, TF_OP_DIV},
    {"Pow", binary, TF_OP_POW}, {"Max", variadic, TF_OP_MAXIMUM}, {"Min", variadic, TF_OP_MINIMUM}, {"Sum", variadic, TF_OP_ADD},
    {"Mean", variadic, -1}, {"Equal", compare, TF_OP_EQ}, {"Less", compare, TF_OP_LT}, {"LessOrEqual", compare, TF_OP_LE},
    {"Greater", compare, TF_OP_GT}, {"GreaterOrEqual", compare, TF_OP_GE}, {"Where", where, 0},
    {"Neg", unary, TF_OP_NEG}, {"Abs", unary, TF_OP_ABS}, {"Exp", unary, TF_OP_EXP}, {"Log", unary, TF_OP_LOG},
    {"Sqrt", unary, TF_OP_SQRT}, {"Tanh", unary, TF_OP_TANH}, {"Sigmoid", unary, TF_OP_SIGMOID}, {"Relu", unary, TF_OP_RELU},
    {"Sin", unary, TF_OP_SIN}, {"Cos", unary, TF_OP_COS}, {"Erf", unary, TF_OP_ERF}, {"Softplus", unary, TF_OP_SOFTPLUS},
    {"Reciprocal", reciprocal, 0}, {"Identity", identity, 0}, {"Dropout", identity, 0}, {"Cast", cast, 0}, {"CastLike", cast, 1},
    {"LeakyRelu", activation, ACT_LEAKY}, {"Elu", activation, ACT_ELU}, {"Selu", activation, ACT_SELU},
    {"HardSigmoid", activation, ACT_HARDSIGMOID}, {"HardSwish", activation, ACT_HARDSWISH}, {"Softsign", activation, ACT_SOFTSIGN},
    {"Clip", activation, ACT_CLIP}, {"Gelu", activation, ACT_GELU}, {"Swish", activation, ACT_SWISH}, {"Mish", activation, ACT_MISH},
    {"Attention", ox_attention, 0}, {"Celu", activation, ACT_CELU}, {"Shrink", activation, ACT_SHRINK},
    {"RMSNormalization", ox_rmsnorm, 0}, {"Tile", ox_tile, 0},
    {"MatMul", matmul, 0}, {"Gemm", gemm, 0}, {"Conv", conv, 0}, {"MaxPool", pool, TF_OP_MAXPOOL2D},
    {"AveragePool", pool, TF_OP_AVGPOOL2D}, {"GlobalAveragePool", global_pool, TF_OP_REDUCE_MEAN},
    {"GlobalMaxPool", global_pool, TF_OP_REDUCE_MAX}, {"Reshape", reshape_op, 0}, {"Flatten", flatten, 0},
    {"Squeeze", squeeze, 0}, {"Unsqueeze", squeeze, 1}, {"Transpose", transpose, 0}, {"Concat", concat, 0},
    {"Softmax", softmax, TF_OP_SOFTMAX}, {"LogSoftmax", softmax, TF_OP_LOG_SOFTMAX}, {"ReduceSum", reduce, TF_OP_REDUCE_SUM},
    {"ReduceMean", reduce, TF_OP_REDUCE_MEAN}, {"ReduceMax", reduce, TF_OP_REDUCE_MAX}, {"ReduceMin", reduce, RED_MIN},
    {"ReduceSumSquare", reduce, RED_SUMSQ}, {"ReduceL1", reduce, RED_L1}, {"ReduceL2", reduce, RED_L2},
    {"ReduceLogSum", reduce, RED_LOGSUM}, {"ReduceLogSumExp", reduce, RED_LOGSUMEXP}, {"BatchNormalization", batchnorm, 0},
    {"LayerNormalization", ox_layernorm, 0}, {"Shape", shape_op, 0}, {"Size", shape_op, 1}, {"Constant", constant, 0},
    {"ConstantOfShape", constant_of_shape, 0}, {"Expand", ox_expand, 0}, {"Gather", ox_gather, 0}, {"Slice", ox_slice, 0},
    {"Split", ox_split, 0}, {"Not", logic, LOGIC_NOT}, {"And", logic, LOGIC_AND}, {"Or", logic, LOGIC_OR}, {"Xor", logic, LOGIC_XOR},
    {"IsNaN", logic, LOGIC_ISNAN}, {"IsInf", logic, LOGIC_ISINF}, {"Pad", ox_pad, 0},
};

/* ---- constants: a node whose inputs are all known is evaluated here (onnx_fold.c) ---- */

static double *fold_alloc(void *ctx, int64_t n) { return ox_own(ctx, n); }

/* 1: the node's outputs are constants now; 0: it is imported as ops; -1: failed. Float initializers are params, not
 * constants: a node that reads one is the model's computation. */
static int fold_node(importer *im)
{
    const tf_onnx_node *n = im->node;
    if (n->nin < 1 || n->nin > 8) return 0;
    tf_onnx_cval in[8];
    for (int i = 0; i < n->nin; i++) {
        memset(&in[i], 0, sizeof in[i]);
        ival *x = ox_input(im, i);
        if (im->failed) return -1;
        if (!x) continue;   /* an optional input left out */
        if (x->v || (x->weight && ox_is_float(x->dt))) return 0;
        const double *c = ox_const_of(im, x);
        if (!c) return im->failed ? -1 : 0;
        in[i] = (tf_onnx_cval){x->dt, x->rank, {0}, c};
        memcpy(in[i].shape, x->shape, (size_t)x->rank * sizeof *x->shape);
    }
    tf_onnx_cval out[4];
    int nout = 0;
    char why[512];
    int r = tf_onnx_fold(n, im->opset, in, n->nin, out, &nout, fold_alloc, im, why, sizeof why);
    if (r < 0) return im->failed ? -1 : ox_fail(im, "%s", why);
    for (int k = 0; r > 0 && k < nout; k++)
        if (ox_set_const(im, k, out[k].dt, out[k].shape, out[k].rank, (double *)out[k].c)) return -1;
    return r;
}

/* Ops imported only when their inputs are constants (they have no tfuse op of their own). */
static int not_constant(importer *im, int arg)
{
    (void)arg;
    return ox_fail(im, "imported only when its inputs are known at import (constants), and an input here is computed by the model");
}
static const op_entry fold_only = {"", not_constant, 0};
static bool folds_only(const tf_onnx_node *n)
{
    static const char *const names[] = {"Range", "GatherElements", "Mod", "Floor", "Ceil", "Sign"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (tf_onnx_is(n->op_type, names[i])) return true;
    return false;
}

/* ---- the graph ---- */

static int64_t dim_value(const importer *im, const char *name)
{
    for (int i = 0; i < im->ndims; i++)
        if (!strcmp(im->dims[i].name, name)) return im->dims[i].value;
    return 1;
}

static int import_inputs(importer *im)
{
    const tf_onnx_graph *g = &im->om->graph;
    for (int i = 0; i < g->ninits; i++) {
        const tf_onnx_tensor *t = &g->inits[i];
        ival x = {.init = t, .rank = t->rank, .weight = true};
        if (!ox_dt_of_onnx(t->data_type, &x.dt))
            return ox_fail(im, "initializer '%.*s' is of type %s, which tfuse does not have", (int)t->name.n, t->name.p, tf_onnx_type_name(t->data_type));
        memcpy(x.shape, t->dims, (size_t)t->rank * sizeof *x.shape);
        if (ox_check_dims(im, t->name, t->dims, t->rank) || !ox_bind(im, t->name, &x)) return -1;
    }
    for (int i = 0; i < g->ninputs; i++) {
        const tf_onnx_value *in = &g->inputs[i];
        if (ox_find(im, in->name)) continue;   /* an initializer listed as an input (IR version 3 and before) */
        tf_dt dt;
        if (!ox_dt_of_onnx(in->elem_type, &dt))
            return ox_fail(im, "input '%.*s' is of type %s: tfuse's inputs are tensors of f32 f16 bf16 f64 i64 i32 bool", (int)in->name.n, in->name.p,
                        tf_onnx_type_name(in->elem_type));
        if (!in->has_shape) return ox_fail(im, "input '%.*s' has no shape: tfuse needs each input's rank", (int)in->name.n, in->name.p);
        char name[512];
        ox_sanitize(in->name, name, sizeof name);
        tf_type ty = {dt, in->rank, {{0}}};
        for (int k = 0; k < in->rank; k++) {
            const tf_onnx_dim *d = &in->dims[k];
            if (d->value >= 1) {
                ty.dims[k] = (tf_dim){d->value, -1};
                continue;
            }
            if (d->value == 0)
                return ox_fail(im, "input '%.*s' has a dim of 0: tfuse's sizes are positive (an empty tensor has nothing to compute)",
                            (int)in->name.n, in->name.p);
            char dn[600];
            if (d->param.n) ox_sanitize(d->param, dn, sizeof dn);
            else snprintf(dn, sizeof dn, "%s_d%d", name, k);   /* no size and no name: one of its own */
            int sym = tf_module_find_dim(im->m, dn, strlen(dn));
            if (sym < 0) {
                tf_loc loc = {im->path, 0, 0};
                if (tf_module_add_dim(im->m, dn, dim_value(im, dn), loc)) return ox_fail(im, "out of memory");
                sym = tf_module_find_dim(im->m, dn, strlen(dn));
            }
            ty.dims[k] = (tf_dim){im->m->dims[sym].value, sym};
        }
        int64_t dims[TF_MAX_RANK];
        for (int k = 0; k < in->rank; k++) dims[k] = ty.dims[k].n;
        if (ox_check_dims(im, in->name, dims, in->rank)) return -1;
        tf_value *v = tf_module_add_decl(im->m, tf_module_unique_name(im->m, name), TF_VAL_INPUT, &ty, -1);
        if (!v) return ox_fail(im, "out of memory");
        ival x = {.v = v, .dt = dt, .rank = in->rank};
        for (int k = 0; k < in->rank; k++) x.shape[k] = ty.dims[k].n;
        if (!ox_bind(im, in->name, &x)) return -1;
    }
    return 0;
}

int tf_onnx_import_model(const tf_onnx_model *om, const char *path, const tf_onnx_dim_value *dims, int ndims, tf_onnx_imported *out,
                         char *err, size_t nerr)
{
    memset(out, 0, sizeof *out);
    importer im = {.om = om, .path = path, .dims = dims, .ndims = ndims, .err = err, .nerr = nerr};
    if (nerr) err[0] = 0;
    snprintf(im.dir, sizeof im.dir, "%s", path);
    char *slash = strrchr(im.dir, '/');
    if (slash) *slash = 0;
    else snprintf(im.dir, sizeof im.dir, ".");
    im.opset = tf_onnx_opset_version(om);
    if (!im.opset) ox_fail(&im, "the model imports no opset of the default domain (ai.onnx)");
    else if (im.opset < 7) ox_fail(&im, "opset %lld: tfuse reads opsets 7 and later", (long long)im.opset);
    /* other domains' opsets: an error only where a node uses one */
    if (!im.failed && !(im.m = tf_module_create(path))) ox_fail(&im, "out of memory");
    if (!im.failed) import_inputs(&im);
    const tf_onnx_graph *g = &om->graph;
    for (int i = 0; !im.failed && i < g->nnodes; i++) {
        im.node = &g->nodes[i];
        im.node_index = i;
        if (im.node->domain.n && !tf_onnx_is(im.node->domain, "ai.onnx")) {
            ox_fail(&im, "an op of domain '%.*s': tfuse reads the default domain's ops", (int)im.node->domain.n, im.node->domain.p);
            break;
        }
        const op_entry *e = NULL;
        for (size_t k = 0; k < sizeof ops / sizeof *ops && !e; k++)
            if (tf_onnx_is(im.node->op_type, ops[k].name)) e = &ops[k];
        if (!e && folds_only(im.node)) e = &fold_only;
        if (!e) {
            ox_fail(&im, "tfuse has no import for this op (docs/onnx.md lists the ops it reads)");
            break;
        }
        if (im.node->nout < 1 || !im.node->out[0].n) {
            ox_fail(&im, "a node whose first output has no name");
            break;
        }
        for (int a = 0; a < im.node->nattrs; a++)
            if (im.node->attrs[a].has_graph) {
                ox_fail(&im, "attribute %.*s is a subgraph: control flow (If, Loop, Scan) is not imported", (int)im.node->attrs[a].name.n,
                     im.node->attrs[a].name.p);
                break;
            }
        if (im.failed) break;
        int folded = fold_node(&im);
        if (folded < 0) break;
        if (!folded && e->fn(&im, e->arg) && !im.failed) ox_fail(&im, "not imported");
    }
    im.node = NULL;
    for (int i = 0; !im.failed && i < g->noutputs; i++) {
        entry *e = ox_find(&im, g->outputs[i].name);
        if (!e) {
            ox_fail(&im, "graph output '%.*s' is computed by no node", (int)g->outputs[i].name.n, g->outputs[i].name.p);
            break;
        }
        char name[512];
        ox_sanitize(g->outputs[i].name, name, sizeof name);
        tf_value *v = ox_val(&im, &e->x, name);
        tf_loc loc = {path, 0, 0};
        if (v && tf_module_add_output(im.m, name, v, loc)) ox_fail(&im, "out of memory");
    }
    for (int i = 0; i < im.nowned; i++) tf_free(im.owned[i]);
    tf_free(im.owned);
    tf_free(im.env);
    out->m = im.m;
    out->params = im.params;
    out->nparams = im.nparams;
    if (im.failed) {
        tf_onnx_import_free(out);
        return -1;
    }
    tf_diag d = {0};
    if (tf_verify(out->m, &d)) {
        snprintf(err, nerr, "%s: the imported module does not verify: %s", path, d.msg);
        tf_onnx_import_free(out);
        return -1;
    }
    return 0;
}

void tf_onnx_import_free(tf_onnx_imported *im)
{
    if (!im) return;
    if (im->m) tf_module_free(im->m);
    for (size_t i = 0; i < im->nparams; i++) tio_tensor_free(&im->params[i]);
    tf_free(im->params);
    memset(im, 0, sizeof *im);
}
