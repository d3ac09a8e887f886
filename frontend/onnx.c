/* onnx.c — protobuf's wire format, and the ModelProto subset onnx.h
 * describes, decoded with nothing but libc.
 *
 * The wire format: a message is a sequence of (key, value); the key is a
 * varint holding field_number << 3 | wire_type; wire type 0 is a varint, 1
 * eight bytes, 2 a varint length and that many bytes (strings, bytes,
 * nested messages, packed repeated scalars), 5 four bytes; 3 and 4 (groups)
 * are not used by onnx.proto and are refused. A repeated scalar may come
 * packed (one wire-type-2 run) or one key per element, and proto2 readers
 * take both; so does this one. Unknown fields are skipped. */
#include "onnx.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_DEPTH = 32 };

/* ---- the model's allocations: one list, freed together ---- */

typedef struct block {
    struct block *next;
    _Alignas(16) unsigned char data[];
} block;

typedef struct reader {
    const unsigned char *base;   /* the file */
    size_t n;
    block **arena;
    char *err;
    size_t nerr;
    const char *path[MAX_DEPTH]; /* the field names down to where we are */
    int depth;
    bool failed;
} reader;

static void *alloc(reader *r, size_t bytes)
{
    block *b = malloc(sizeof *b + (bytes ? bytes : 1));
    if (!b) return NULL;
    memset(b->data, 0, bytes);
    b->next = *r->arena;
    *r->arena = b;
    return b->data;
}

static int fail(reader *r, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(reader *r, size_t at, const char *fmt, ...)
{
    if (r->failed) return -1;
    r->failed = true;
    int k = snprintf(r->err, r->nerr, "byte %zu: ", at);
    for (int i = 0; i < r->depth && k >= 0 && (size_t)k < r->nerr; i++)
        k += snprintf(r->err + k, r->nerr - (size_t)k, "%s%s", i ? "." : "", r->path[i]);
    if (k >= 0 && (size_t)k < r->nerr) k += snprintf(r->err + k, r->nerr - (size_t)k, "%s", r->depth ? ": " : "");
    if (k >= 0 && (size_t)k < r->nerr) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err + k, r->nerr - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int oom(reader *r, size_t at) { return fail(r, at, "out of memory"); }

/* ---- the wire ---- */

typedef struct span {
    size_t at, end;   /* [at, end) of the file */
} span;

static int varint(reader *r, span *s, uint64_t *v)
{
    uint64_t x = 0;
    size_t start = s->at;
    for (int shift = 0; shift < 70; shift += 7) {
        if (s->at >= s->end) return fail(r, start, "a varint runs past the end of its message");
        unsigned char b = r->base[s->at++];
        if (shift == 63 && b > 1) return fail(r, start, "a varint longer than 64 bits");
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return fail(r, start, "a varint longer than 10 bytes");
}

static int fixed(reader *r, span *s, int bytes, uint64_t *v)
{
    if (s->end - s->at < (size_t)bytes) return fail(r, s->at, "a %d-byte value runs past the end of its message", bytes);
    uint64_t x = 0;
    for (int i = 0; i < bytes; i++) x |= (uint64_t)r->base[s->at + (size_t)i] << (8 * i);
    s->at += (size_t)bytes;
    *v = x;
    return 0;
}

/* The next field: its number, wire type and, for wire type 2, its bytes as a span. */
typedef struct field {
    uint32_t num;
    int wt;
    size_t at;        /* the key's offset */
    uint64_t v;       /* wire types 0, 1, 5 */
    span body;        /* wire type 2 */
} field;

static int next(reader *r, span *s, field *f)
{
    f->at = s->at;
    uint64_t key = 0;
    if (varint(r, s, &key)) return -1;
    f->num = (uint32_t)(key >> 3);
    f->wt = (int)(key & 7);
    if (f->num == 0 || key >> 3 > 0x1fffffff) return fail(r, f->at, "field number %llu is not a protobuf field number", (unsigned long long)(key >> 3));
    switch (f->wt) {
    case 0: return varint(r, s, &f->v);
    case 1: return fixed(r, s, 8, &f->v);
    case 5: return fixed(r, s, 4, &f->v);
    case 2: {
        uint64_t len = 0;
        if (varint(r, s, &len)) return -1;
        if (len > s->end - s->at)
            return fail(r, f->at, "field %u says %llu bytes follow, and its message has %zu left", f->num, (unsigned long long)len,
                        s->end - s->at);
        f->body = (span){s->at, s->at + (size_t)len};
        s->at += (size_t)len;
        return 0;
    }
    default: return fail(r, f->at, "field %u has wire type %d (groups and unknown wire types are not ONNX's)", f->num, f->wt);
    }
}

static int want(reader *r, const field *f, int wt, const char *what)
{
    if (f->wt == wt) return 0;
    return fail(r, f->at, "%s (field %u) has wire type %d where %d belongs", what, f->num, f->wt, wt);
}

static int enter(reader *r, size_t at, const char *name)
{
    if (r->depth == MAX_DEPTH) return fail(r, at, "messages nested more than %d deep", MAX_DEPTH);
    r->path[r->depth++] = name;
    return 0;
}
static void leave(reader *r) { r->depth--; }

static tf_onnx_str str_of(const reader *r, span b) { return (tf_onnx_str){(const char *)r->base + b.at, b.end - b.at}; }

/* Elements of a repeated scalar field in one occurrence: packed (wire type 2, its bytes) or one element. */
static int64_t count_in(const reader *r, const field *f, int elem_wt)
{
    if (f->wt != 2) return 1;
    if (elem_wt == 5) return (int64_t)((f->body.end - f->body.at) / 4);
    if (elem_wt == 1) return (int64_t)((f->body.end - f->body.at) / 8);
    int64_t n = 0;   /* varints: one per byte without the continuation bit */
    for (size_t i = f->body.at; i < f->body.end; i++) n += !(r->base[i] & 0x80);
    return n;
}

/* Append one occurrence's elements (varints as int64, fixed32 or fixed64 as raw bits) to out[*n], at most cap. */
static int take(reader *r, const field *f, int elem_wt, int bytes, void *out, int64_t *n, int64_t cap, const char *what)
{
    if (f->wt != 2 && f->wt != elem_wt) return want(r, f, elem_wt, what);
    span s = f->wt == 2 ? f->body : (span){0, 0};
    if (f->wt == 2 && elem_wt != 0 && (f->body.end - f->body.at) % (size_t)bytes)
        return fail(r, f->at, "%s: a packed run of %zu bytes is not whole %d-byte elements", what, f->body.end - f->body.at, bytes);
    for (bool one = f->wt != 2; one || s.at < s.end; one = false) {
        uint64_t v = f->v;
        if (!one && (elem_wt == 0 ? varint(r, &s, &v) : fixed(r, &s, bytes, &v))) return -1;
        if (*n >= cap) return fail(r, f->at, "%s: more elements than counted", what);
        if (bytes == 8) ((uint64_t *)out)[*n] = v;
        else ((uint32_t *)out)[*n] = (uint32_t)v;
        (*n)++;
        if (one) break;
    }
    return 0;
}

/* ---- messages ---- */

typedef int (*repeated_fn)(reader *r, const field *f, void *item);

/* Count the occurrences of field num in [b], allocate that many items of size bytes. */
static void *repeated(reader *r, span b, uint32_t num, size_t size, int *count)
{
    *count = 0;
    span s = b;
    field f;
    int n = 0;
    while (s.at < s.end) {
        if (next(r, &s, &f)) return NULL;
        n += f.num == num;
        if (n < 0) {
            fail(r, f.at, "too many elements");
            return NULL;
        }
    }
    void *p = alloc(r, (size_t)n * size);
    if (!p) oom(r, b.at);
    else *count = n;
    return p;
}

static int read_tensor(reader *r, span b, tf_onnx_tensor *t);

static int read_entry(reader *r, span b, tf_onnx_str *key, tf_onnx_str *value)
{
    field f;
    while (b.at < b.end) {
        if (next(r, &b, &f)) return -1;
        if ((f.num == 1 || f.num == 2) && want(r, &f, 2, f.num == 1 ? "key" : "value")) return -1;
        if (f.num == 1) *key = str_of(r, f.body);
        if (f.num == 2) *value = str_of(r, f.body);
    }
    return 0;
}

static int parse_int(reader *r, size_t at, tf_onnx_str s, int64_t *out, const char *what)
{
    char buf[32];
    if (!s.n || s.n >= sizeof buf) return fail(r, at, "external data's %s is not a number", what);
    memcpy(buf, s.p, s.n);
    buf[s.n] = 0;
    char *end;
    long long v = strtoll(buf, &end, 10);
    if (*end || v < 0) return fail(r, at, "external data's %s '%s' is not a byte count", what, buf);
    *out = v;
    return 0;
}

static int read_tensor(reader *r, span b, tf_onnx_tensor *t)
{
    t->length = -1;
    /* first pass: the typed field's element count, to allocate it whole */
    int64_t counts[16] = {0};
    static const int elem_wt[16] = {[4] = 5, [5] = 0, [7] = 0, [10] = 1, [11] = 0};
    span s = b;
    field f;
    while (s.at < s.end) {
        if (next(r, &s, &f)) return -1;
        if (f.num == 4 || f.num == 5 || f.num == 7 || f.num == 10 || f.num == 11) counts[f.num] += count_in(r, &f, elem_wt[f.num]);
    }
    int typed = 0;
    for (int k = 0; k < 16; k++)
        if (counts[k]) {
            if (typed) return fail(r, b.at, "a tensor with two typed data fields (%d and %d)", typed, k);
            typed = k;
        }
    if (typed) {
        t->val_bytes = typed == 4 || typed == 5 ? 4 : 8;
        if (!(t->vals = alloc(r, (size_t)counts[typed] * (size_t)t->val_bytes))) return oom(r, b.at);
    }
    int ndims = 0;
    while (b.at < b.end) {
        if (next(r, &b, &f)) return -1;
        switch (f.num) {
        case 1:   /* dims */
            if (f.wt == 2) {
                span d = f.body;
                while (d.at < d.end) {
                    uint64_t v = 0;
                    if (varint(r, &d, &v)) return -1;
                    if (ndims == TF_ONNX_MAX_RANK) return fail(r, f.at, "a tensor of more than %d dims", TF_ONNX_MAX_RANK);
                    t->dims[ndims++] = (int64_t)v;
                }
            } else {
                if (want(r, &f, 0, "dims")) return -1;
                if (ndims == TF_ONNX_MAX_RANK) return fail(r, f.at, "a tensor of more than %d dims", TF_ONNX_MAX_RANK);
                t->dims[ndims++] = (int64_t)f.v;
            }
            break;
        case 2:
            if (want(r, &f, 0, "data_type")) return -1;
            t->data_type = (int32_t)f.v;
            break;
        case 8:
            if (want(r, &f, 2, "name")) return -1;
            t->name = str_of(r, f.body);
            break;
        case 9:
            if (want(r, &f, 2, "raw_data")) return -1;
            t->raw = str_of(r, f.body);
            break;
        case 4: case 5: case 7: case 10: case 11:
            if (f.num != (uint32_t)typed) break;   /* an empty packed run of another typed field: nothing */
            if (take(r, &f, elem_wt[f.num], t->val_bytes, t->vals, &t->nvals, counts[f.num], "a tensor's data")) return -1;
            break;
        case 13: {   /* external_data: location, offset, length */
            if (want(r, &f, 2, "external_data")) return -1;
            tf_onnx_str k = {0}, v = {0};
            if (read_entry(r, f.body, &k, &v)) return -1;
            if (tf_onnx_is(k, "location")) t->location = v;
            else if (tf_onnx_is(k, "offset") && parse_int(r, f.at, v, &t->offset, "offset")) return -1;
            else if (tf_onnx_is(k, "length") && parse_int(r, f.at, v, &t->length, "length")) return -1;
            break;
        }
        case 14:
            if (want(r, &f, 0, "data_location")) return -1;
            t->external = f.v == 1;
            break;
        default: break;
        }
    }
    for (int i = 0; i < ndims; i++)
        if (t->dims[i] < 0) return fail(r, b.at, "a tensor dim of %lld", (long long)t->dims[i]);
    t->rank = ndims;
    if (t->external && !t->location.n) return fail(r, b.at, "tensor '%.*s': external data without a location", (int)t->name.n, t->name.p);
    return 0;
}

static int read_attr(reader *r, span b, tf_onnx_attr *a)
{
    int64_t nf = 0, ni = 0;
    span s = b;
    field f;
    int ns = 0;
    while (s.at < s.end) {   /* counts first */
        if (next(r, &s, &f)) return -1;
        if (f.num == 7) nf += count_in(r, &f, 5);
        if (f.num == 8) ni += count_in(r, &f, 0);
        if (f.num == 9) ns++;
    }
    if ((nf && !(a->floats = alloc(r, (size_t)nf * 4))) || (ni && !(a->ints = alloc(r, (size_t)ni * 8))) ||
        (ns && !(a->strings = alloc(r, (size_t)ns * sizeof *a->strings))))
        return oom(r, b.at);
    int64_t gotf = 0, goti = 0;
    while (b.at < b.end) {
        if (next(r, &b, &f)) return -1;
        switch (f.num) {
        case 1:
            if (want(r, &f, 2, "name")) return -1;
            a->name = str_of(r, f.body);
            break;
        case 20:
            if (want(r, &f, 0, "type")) return -1;
            a->type = (int32_t)f.v;
            break;
        case 2: {
            if (want(r, &f, 5, "f")) return -1;
            uint32_t bits = (uint32_t)f.v;
            memcpy(&a->f, &bits, 4);
            break;
        }
        case 3:
            if (want(r, &f, 0, "i")) return -1;
            a->i = (int64_t)f.v;
            break;
        case 4:
            if (want(r, &f, 2, "s")) return -1;
            a->s = str_of(r, f.body);
            break;
        case 5:
            if (want(r, &f, 2, "t")) return -1;
            if (!(a->t = alloc(r, sizeof *a->t))) return oom(r, f.at);
            if (enter(r, f.at, "t") || read_tensor(r, f.body, a->t)) return -1;
            leave(r);
            break;
        case 6: a->has_graph = true; break;
        case 7:
            if (take(r, &f, 5, 4, a->floats, &gotf, nf, "floats")) return -1;
            break;
        case 8:
            if (take(r, &f, 0, 8, a->ints, &goti, ni, "ints")) return -1;
            break;
        case 9:
            if (want(r, &f, 2, "strings")) return -1;
            a->strings[a->nstrings++] = str_of(r, f.body);
            break;
        default: break;
        }
    }
    a->nfloats = (int)gotf, a->nints = (int)goti;
    if (gotf > 0x7fffffff || goti > 0x7fffffff) return fail(r, b.at, "an attribute of more than 2^31 elements");
    return 0;
}

static int read_node(reader *r, span b, tf_onnx_node *nd)
{
    nd->at = b.at;
    if (!(nd->in = repeated(r, b, 1, sizeof *nd->in, &nd->nin)) || !(nd->out = repeated(r, b, 2, sizeof *nd->out, &nd->nout)) ||
        !(nd->attrs = repeated(r, b, 5, sizeof *nd->attrs, &nd->nattrs)))
        return -1;
    int ki = 0, ko = 0, ka = 0;
    field f;
    while (b.at < b.end) {
        if (next(r, &b, &f)) return -1;
        switch (f.num) {
        case 1: if (want(r, &f, 2, "input")) return -1; nd->in[ki++] = str_of(r, f.body); break;
        case 2: if (want(r, &f, 2, "output")) return -1; nd->out[ko++] = str_of(r, f.body); break;
        case 3: if (want(r, &f, 2, "name")) return -1; nd->name = str_of(r, f.body); break;
        case 4: if (want(r, &f, 2, "op_type")) return -1; nd->op_type = str_of(r, f.body); break;
        case 7: if (want(r, &f, 2, "domain")) return -1; nd->domain = str_of(r, f.body); break;
        case 5:
            if (want(r, &f, 2, "attribute") || enter(r, f.at, "attribute") || read_attr(r, f.body, &nd->attrs[ka++])) return -1;
            leave(r);
            break;
        default: break;
        }
    }
    return 0;
}

static int read_shape(reader *r, span b, tf_onnx_value *v)
{
    field f;
    v->has_shape = true;
    while (b.at < b.end) {
        if (next(r, &b, &f)) return -1;
        if (f.num != 1) continue;
        if (want(r, &f, 2, "dim")) return -1;
        if (v->rank == TF_ONNX_MAX_RANK) return fail(r, f.at, "a shape of more than %d dims", TF_ONNX_MAX_RANK);
        tf_onnx_dim *d = &v->dims[v->rank++];
        d->value = -1;
        span s = f.body;
        field g;
        while (s.at < s.end) {
            if (next(r, &s, &g)) return -1;
            if (g.num == 1) {
                if (want(r, &g, 0, "dim_value")) return -1;
                if ((int64_t)g.v < 0) return fail(r, g.at, "a dim_value of %lld", (long long)(int64_t)g.v);
                d->value = (int64_t)g.v;
            } else if (g.num == 2) {
                if (want(r, &g, 2, "dim_param")) return -1;
                d->param = str_of(r, g.body);
            }
        }
    }
    return 0;
}

static int read_value(reader *r, span b, tf_onnx_value *v)
{
    field f;
    while (b.at < b.end) {
        if (next(r, &b, &f)) return -1;
        if (f.num == 1) {
            if (want(r, &f, 2, "name")) return -1;
            v->name = str_of(r, f.body);
        } else if (f.num == 2) {   /* TypeProto: tensor_type (1) */
            if (want(r, &f, 2, "type")) return -1;
            span s = f.body;
            field g;
            while (s.at < s.end) {
                if (next(r, &s, &g)) return -1;
                if (g.num != 1) continue;
                if (want(r, &g, 2, "tensor_type")) return -1;
                span t = g.body;
                field h;
                while (t.at < t.end) {
                    if (next(r, &t, &h)) return -1;
                    if (h.num == 1) {
                        if (want(r, &h, 0, "elem_type")) return -1;
                        v->elem_type = (int32_t)h.v;
                    } else if (h.num == 2) {
                        if (want(r, &h, 2, "shape") || enter(r, h.at, "type.tensor_type.shape") || read_shape(r, h.body, v)) return -1;
                        leave(r);
                    }
                }
            }
        }
    }
    return 0;
}

static int read_graph(reader *r, span b, tf_onnx_graph *g)
{
    if (!(g->nodes = repeated(r, b, 1, sizeof *g->nodes, &g->nnodes)) || !(g->inits = repeated(r, b, 5, sizeof *g->inits, &g->ninits)) ||
        !(g->inputs = repeated(r, b, 11, sizeof *g->inputs, &g->ninputs)) ||
        !(g->outputs = repeated(r, b, 12, sizeof *g->outputs, &g->noutputs)) ||
        !(g->infos = repeated(r, b, 13, sizeof *g->infos, &g->ninfos)))
        return -1;
    int kn = 0, kt = 0, ki = 0, ko = 0, kv = 0;
    field f;
    while (b.at < b.end) {
        if (next(r, &b, &f)) return -1;
        int st = 0;
        switch (f.num) {
        case 1: st = want(r, &f, 2, "node") || enter(r, f.at, "node") || read_node(r, f.body, &g->nodes[kn++]); break;
        case 2:
            if (want(r, &f, 2, "name")) return -1;
            g->name = str_of(r, f.body);
            continue;
        case 5: st = want(r, &f, 2, "initializer") || enter(r, f.at, "initializer") || read_tensor(r, f.body, &g->inits[kt++]); break;
        case 11: st = want(r, &f, 2, "input") || enter(r, f.at, "input") || read_value(r, f.body, &g->inputs[ki++]); break;
        case 12: st = want(r, &f, 2, "output") || enter(r, f.at, "output") || read_value(r, f.body, &g->outputs[ko++]); break;
        case 13: st = want(r, &f, 2, "value_info") || enter(r, f.at, "value_info") || read_value(r, f.body, &g->infos[kv++]); break;
        case 15: return fail(r, f.at, "sparse initializers are not read");
        default: continue;
        }
        if (st) return -1;
        leave(r);
    }
    return 0;
}

int tf_onnx_read(const void *buf, size_t n, tf_onnx_model *m, char *err, size_t nerr)
{
    memset(m, 0, sizeof *m);
    block *arena = NULL;
    reader r = {.base = buf, .n = n, .arena = &arena, .err = err, .nerr = nerr};
    if (nerr) err[0] = 0;
    span b = {0, n};
    int st = 0;
    if (!(m->opsets = repeated(&r, b, 8, sizeof *m->opsets, &m->nopsets))) st = -1;
    field f;
    int ko = 0;
    while (!st && b.at < b.end) {
        if (next(&r, &b, &f)) {
            st = -1;
            break;
        }
        switch (f.num) {
        case 1: st = want(&r, &f, 0, "ir_version"); m->ir_version = (int64_t)f.v; break;
        case 2: st = want(&r, &f, 2, "producer_name"); m->producer = str_of(&r, f.body); break;
        case 3: st = want(&r, &f, 2, "producer_version"); m->producer_version = str_of(&r, f.body); break;
        case 7:
            if ((st = want(&r, &f, 2, "graph") || enter(&r, f.at, "graph"))) break;
            st = read_graph(&r, f.body, &m->graph);
            m->has_graph = true;
            leave(&r);
            break;
        case 8: {
            if ((st = want(&r, &f, 2, "opset_import") || enter(&r, f.at, "opset_import"))) break;
            tf_onnx_opset *o = &m->opsets[ko++];
            span s = f.body;
            field g;
            while (!st && s.at < s.end) {
                if ((st = next(&r, &s, &g))) break;
                if (g.num == 1 && !(st = want(&r, &g, 2, "domain"))) o->domain = str_of(&r, g.body);
                if (g.num == 2 && !(st = want(&r, &g, 0, "version"))) o->version = (int64_t)g.v;
            }
            leave(&r);
            break;
        }
        default: break;
        }
    }
    if (!st && !m->has_graph) st = fail(&r, n, "no graph (ModelProto.graph, field 7): %s", n ? "is this an ONNX model?" : "the file is empty");
    m->arena = arena;
    if (st) {
        if (!r.failed) fail(&r, b.at, "malformed");
        return -1;
    }
    return 0;
}

void tf_onnx_free(tf_onnx_model *m)
{
    if (!m) return;
    for (block *b = m->arena, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    memset(m, 0, sizeof *m);
}

bool tf_onnx_is(tf_onnx_str s, const char *z)
{
    size_t n = strlen(z);
    return s.n == n && (!n || !memcmp(s.p, z, n));
}

int64_t tf_onnx_opset_version(const tf_onnx_model *m)
{
    for (int i = 0; i < m->nopsets; i++)
        if (!m->opsets[i].domain.n || tf_onnx_is(m->opsets[i].domain, "ai.onnx")) return m->opsets[i].version;
    return 0;
}

int tf_onnx_type_bytes(int32_t t)
{
    switch (t) {
    case TF_ONNX_FLOAT: case TF_ONNX_INT32: case TF_ONNX_UINT32: return 4;
    case TF_ONNX_DOUBLE: case TF_ONNX_INT64: case TF_ONNX_UINT64: return 8;
    case TF_ONNX_FLOAT16: case TF_ONNX_BFLOAT16: case TF_ONNX_INT16: case TF_ONNX_UINT16: return 2;
    case TF_ONNX_BOOL: case TF_ONNX_INT8: case TF_ONNX_UINT8: return 1;
    default: return 0;
    }
}

const char *tf_onnx_type_name(int32_t t)
{
    static const char *const names[] = {"undefined", "float", "uint8", "int8", "uint16", "int16", "int32", "int64", "string", "bool",
                                        "float16", "double", "uint32", "uint64", "complex64", "complex128", "bfloat16"};
    return t >= 0 && t < (int32_t)(sizeof names / sizeof *names) ? names[t] : "a float8/int4 or unknown type";
}
