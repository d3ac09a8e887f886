/* interp.c — the interpreter's driver, initializers and random numbers.
 * Kernels are in interp_kernels.c; see interp.h for the model. */
#include "interp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct tf_interp_ctx {
    tf_module *m;
    tf_ir_mode mode;
    uint64_t seed, step;
    tf_diag *d;
    tf_tensor *vals;        /* by value id */
    int nvals;
    struct { const tf_value *buf; tf_tensor t; } *pending;
    int npending, cap_pending;
};

/* ---- random numbers: splitmix64 over (seed, stream, index) ---- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The part of a draw that depends on (seed, stream) only: a tensor's draws
 * share it, so initializers compute it once (the same bits as computing it
 * per draw). */
static uint64_t rng_key(uint64_t seed, uint64_t stream)
{
    return mix64(seed + 0x9e3779b97f4a7c15ull) ^ mix64(stream + 0x632be59bd9b4e019ull);
}

static double rng_uniform_k(uint64_t key, uint64_t index)
{
    uint64_t h = mix64(key ^ index);
    h = mix64(h + index * 0x9e3779b97f4a7c15ull);
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_normal_k(uint64_t key, uint64_t index)
{
    /* Box-Muller on two draws from disjoint index halves; one output of the
     * pair only (the sine's would be another stream, other values). */
    double u1 = rng_uniform_k(key, 2 * index), u2 = rng_uniform_k(key, 2 * index + 1);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double tf_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) { return rng_uniform_k(rng_key(seed, stream), index); }

double tf_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) { return rng_normal_k(rng_key(seed, stream), index); }

uint64_t tf_rng_stream(const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ull;
    return h;
}

/* ---- tensors ---- */

tf_ir_status tf_tensor_alloc(tf_tensor *t, const tf_type *ty, tf_diag *d)
{
    memset(t, 0, sizeof *t);
    t->dtype = ty->dtype;
    t->rank = ty->rank;
    for (int i = 0; i < ty->rank; i++) t->dims[i] = ty->dims[i].n;
    int64_t n = tf_type_numel(ty);
    if (n < 0 || n > TF_INTERP_MAX_NUMEL)
        return tf_diag_error(d, TF_IR_ERR_LIMIT, NULL,
                             "the interpreter holds tensors of at most 2^28 elements; one here has %lld (use smaller dims)",
                             (long long)n);
    t->numel = n;
    t->data = tf_calloc((size_t)(n ? n : 1), sizeof(double));
    if (!t->data) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory allocating %lld elements", (long long)n);
    return TF_IR_OK;
}

void tf_tensor_release(tf_tensor *t)
{
    tf_free(t->data);
    t->data = NULL;
}

/* ---- context ---- */

tf_interp_ctx *tf_interp_create(tf_module *m, tf_ir_mode mode, uint64_t seed)
{
    tf_module_renumber(m);
    tf_interp_ctx *ip = tf_calloc(1, sizeof *ip);
    if (!ip) return NULL;
    ip->m = m;
    ip->mode = mode;
    ip->seed = seed;
    ip->nvals = m->next_id;
    ip->vals = tf_calloc((size_t)(ip->nvals ? ip->nvals : 1), sizeof *ip->vals);
    if (!ip->vals) {
        tf_free(ip);
        return NULL;
    }
    return ip;
}

static void clear_pending(tf_interp_ctx *ip)
{
    for (int i = 0; i < ip->npending; i++) tf_tensor_release(&ip->pending[i].t);
    ip->npending = 0;
}

void tf_interp_free(tf_interp_ctx *ip)
{
    if (!ip) return;
    for (int i = 0; i < ip->nvals; i++) tf_tensor_release(&ip->vals[i]);
    clear_pending(ip);
    tf_free(ip->pending);
    tf_free(ip->vals);
    tf_free(ip);
}

tf_ir_mode tf_interp_mode(const tf_interp_ctx *ip) { return ip->mode; }
uint64_t tf_interp_seed(const tf_interp_ctx *ip) { return ip->seed; }
uint64_t tf_interp_step(const tf_interp_ctx *ip) { return ip->step; }
void tf_interp_set_step(tf_interp_ctx *ip, uint64_t step) { ip->step = step; }
tf_diag *tf_interp_diag(tf_interp_ctx *ip) { return ip->d; }
void tf_interp_set_diag(tf_interp_ctx *ip, tf_diag *d) { ip->d = d; }
tf_module *tf_interp_module(const tf_interp_ctx *ip) { return ip->m; }

tf_tensor *tf_interp_tensor(tf_interp_ctx *ip, const tf_value *v, tf_diag *d)
{
    if (v->id < 0 || v->id >= ip->nvals) {
        tf_diag_error(d, TF_IR_ERR_INTERNAL, &v->loc, "internal: value '%s' is not numbered", v->name ? v->name : "?");
        return NULL;
    }
    tf_tensor *t = &ip->vals[v->id];
    if (!t->data && tf_tensor_alloc(t, &v->type, d)) return NULL;
    return t;
}

tf_ir_status tf_interp_defer_update(tf_interp_ctx *ip, const tf_value *buffer, const tf_tensor *value)
{
    if (ip->npending == ip->cap_pending) {
        int cap = ip->cap_pending ? ip->cap_pending * 2 : 8;
        void *p = tf_realloc(ip->pending, (size_t)cap * sizeof *ip->pending);
        if (!p) return tf_diag_error(ip->d, TF_IR_ERR_OOM, NULL, "out of memory");
        ip->pending = p;
        ip->cap_pending = cap;
    }
    tf_tensor *t = &ip->pending[ip->npending].t;
    if (tf_tensor_alloc(t, &buffer->type, ip->d)) return ip->d->status;
    if (t->numel != value->numel) {
        tf_tensor_release(t);
        return tf_diag_error(ip->d, TF_IR_ERR_INTERNAL, &buffer->loc, "internal: update of '%s' has the wrong size",
                             buffer->name);
    }
    for (int64_t i = 0; i < t->numel; i++) t->data[i] = tf_dtype_round(t->dtype, value->data[i]);
    ip->pending[ip->npending++].buf = buffer;
    return TF_IR_OK;
}

/* ---- initializers ---- */

static void fans(const tf_type *t, double *fan_in, double *fan_out)
{
    if (t->rank == 1) { *fan_in = *fan_out = (double)t->dims[0].n; return; }
    if (t->rank == 2) { *fan_in = (double)t->dims[0].n; *fan_out = (double)t->dims[1].n; return; }
    double rf = 1;
    for (int i = 2; i < t->rank; i++) rf *= (double)t->dims[i].n;
    *fan_in = (double)t->dims[1].n * rf;
    *fan_out = (double)t->dims[0].n * rf;
}

void tf_interp_init_range(const tf_value *v, uint64_t seed, int64_t lo, int64_t hi, double *out)
{
    const tf_call *c = &v->init;
    tf_dt dt = v->type.dtype;
    uint64_t stream = tf_rng_stream(v->name);
    double fi, fo, a = 0, b = 0;
    fans(&v->type, &fi, &fo);
    switch (c->fn) {
    case TF_INIT_ONES: a = 1; break;
    case TF_INIT_CONST: a = tf_call_float(tf_init_fns, c, "value"); break;
    case TF_INIT_NORMAL: a = tf_call_float(tf_init_fns, c, "mean"); b = tf_call_float(tf_init_fns, c, "std"); break;
    case TF_INIT_UNIFORM: a = tf_call_float(tf_init_fns, c, "low"); b = tf_call_float(tf_init_fns, c, "high"); break;
    case TF_INIT_KAIMING_UNIFORM: b = tf_call_float(tf_init_fns, c, "gain") * sqrt(3.0 / fi); a = -b; break;
    case TF_INIT_XAVIER_UNIFORM: b = tf_call_float(tf_init_fns, c, "gain") * sqrt(6.0 / (fi + fo)); a = -b; break;
    default: break;
    }
    uint64_t key = rng_key(seed, stream);
    if (c->fn == TF_INIT_ZEROS || c->fn == TF_INIT_ONES || c->fn == TF_INIT_CONST) {   /* one value, rounded once */
        double x = tf_dtype_round(dt, c->fn == TF_INIT_ZEROS ? 0.0 : a);
        for (int64_t i = lo; i < hi; i++) out[i - lo] = x;
    } else if (c->fn == TF_INIT_NORMAL) {
        for (int64_t i = lo; i < hi; i++) out[i - lo] = tf_dtype_round(dt, a + b * rng_normal_k(key, (uint64_t)i));
    } else {
        for (int64_t i = lo; i < hi; i++) out[i - lo] = tf_dtype_round(dt, a + (b - a) * rng_uniform_k(key, (uint64_t)i));
    }
}

bool tf_interp_init_is_zero(const tf_value *v) { return v->init.fn == TF_INIT_ZEROS; }

tf_ir_status tf_interp_init_state(tf_interp_ctx *ip, tf_diag *d)
{
    for (int i = 0; i < ip->m->decls.n; i++) {
        tf_value *v = ip->m->decls.items[i];
        if (v->kind == TF_VAL_INPUT) continue;
        tf_tensor *t = tf_interp_tensor(ip, v, d);
        if (!t) return d->status;
        tf_interp_init_range(v, ip->seed, 0, t->numel, t->data);
    }
    return TF_IR_OK;
}

/* ---- running ---- */

tf_ir_status tf_interp_run(tf_interp_ctx *ip, tf_diag *d)
{
    ip->d = d;
    clear_pending(ip);
    tf_ir_status st = TF_IR_OK;
    tf_tensor consts[64];
    double cvals[64];   /* numbers written as operands, rounded to their dtype like any value */
    for (int i = 0; i < ip->m->nodes.n && !st; i++) {
        tf_node *n = ip->m->nodes.items[i];
        const tf_tensor *in[64];
        int nconst = 0;
        for (int k = 0; k < n->nin && !st; k++) {
            tf_value *v = n->in[k];
            if (v->kind == TF_VAL_CONST) {
                tf_tensor *c = &consts[nconst++];
                memset(c, 0, sizeof *c);
                c->dtype = v->type.dtype;
                c->numel = 1;
                cvals[nconst - 1] = tf_dtype_round(v->type.dtype, v->cval);
                c->data = &cvals[nconst - 1];
                in[k] = c;
            } else if (!(in[k] = tf_interp_tensor(ip, v, d))) {
                st = d->status;
            }
        }
        if (st) break;
        tf_tensor *out = &ip->vals[n->out->id];
        tf_tensor_release(out);
        if ((st = tf_tensor_alloc(out, &n->out->type, d))) break;
        if ((st = tf_op_info_of(n->op)->interp(ip, n, in, out))) break;
        for (int64_t j = 0; j < out->numel; j++) out->data[j] = tf_dtype_round(out->dtype, out->data[j]);
    }
    for (int i = 0; i < ip->m->nupdates && !st; i++) {
        tf_tensor *t = tf_interp_tensor(ip, ip->m->updates[i].value, d);
        if (!t) st = d->status;
        else st = tf_interp_defer_update(ip, ip->m->updates[i].buffer, t);
    }
    if (!st)
        for (int i = 0; i < ip->npending; i++) {
            tf_tensor *dst = tf_interp_tensor(ip, ip->pending[i].buf, d);
            if (!dst) { st = d->status; break; }
            memcpy(dst->data, ip->pending[i].t.data, (size_t)dst->numel * sizeof(double));
        }
    clear_pending(ip);
    ip->step++;
    ip->d = NULL;
    return st;
}
