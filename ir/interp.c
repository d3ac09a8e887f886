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
    tf_interp_comm comm;      /* the session's ranks; comm.mean NULL: one rank */
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

/* Normal draws: z = Phi^-1(u), the inverse of the normal CDF at
 * u = (k + 1/2) / 2^52, k the top 52 bits of the hash rng_uniform_k draws
 * from (k = floor(tf_rng_uniform(seed, stream, i) * 2^52)), so that u and
 * 1 - u are exact and never 0 or 1 and |z| <= 8.2. Phi^-1 is Wichura's
 * AS241 (PPND16, Applied Statistics 37, 1988; relative error about 1e-16):
 * a degree-7 rational in (u - 1/2)^2 for the central 85% of draws, without
 * a transcendental function (a chunk of them vectorizes), and a rational in
 * sqrt(-log(min(u, 1 - u))) for the tails. One hash per draw, each draw a
 * function of its index alone: a backend fills storage in any order, on any
 * number of threads, with the same bits. Every target gets its initial
 * params from tf_interp_init_range, so they all start from the same bits;
 * the operations are fixed (C11 contracts no a*b+c into an FMA), so they
 * depend on the C library's log and sqrt only, in the tails. This replaced
 * Box-Muller (a log, a square root and a cosine per draw, over two hashes:
 * three times slower). */
static double rng_open_uniform_k(uint64_t key, uint64_t index)
{
    uint64_t h = mix64(key ^ index);
    h = mix64(h + index * 0x9e3779b97f4a7c15ull);
    return ((double)(h >> 12) + 0.5) * (1.0 / 4503599627370496.0);
}

enum { NORMAL_CHUNK = 256 };
#define AS241_SPLIT 0.425

/* Phi^-1(1/2 + q) for |q| <= 0.425 */
static inline double as241_central(double q)
{
    double r = 0.180625 - q * q;
    return q *
           (((((((2.5090809287301226727e3 * r + 3.3430575583588128105e4) * r + 6.7265770927008700853e4) * r +
                4.5921953931549871457e4) * r + 1.3731693765509461125e4) * r + 1.9715909503065514427e3) * r +
             1.3314166789178437745e2) * r + 3.3871328727963666080e0) /
           (((((((5.2264952788528545610e3 * r + 2.8729085735721942674e4) * r + 3.9307895800092710610e4) * r +
                2.1213794301586595867e4) * r + 5.3941960214247511077e3) * r + 6.8718700749205790830e2) * r +
             4.2313330701600911252e1) * r + 1.0);
}

/* Phi^-1(u) for |q| = |u - 1/2| > 0.425, 0 < u < 1 */
static double as241_tail(double u, double q)
{
    double r = sqrt(-log(q < 0 ? u : 1.0 - u)), z;
    if (r <= 5.0) {
        r -= 1.6;
        z = (((((((7.74545014278341407640e-4 * r + 2.27238449892691845833e-2) * r + 2.41780725177450611770e-1) * r +
                 1.27045825245236838258e0) * r + 3.64784832476320460504e0) * r + 5.76949722146069140550e0) * r +
              4.63033784615654529590e0) * r + 1.42343711074968357734e0) /
            (((((((1.05075007164441684324e-9 * r + 5.47593808499534494600e-4) * r + 1.51986665636164571966e-2) * r +
                 1.48103976427480074590e-1) * r + 6.89767334985100004550e-1) * r + 1.67638483018380384940e0) * r +
              2.05319162663775882187e0) * r + 1.0);
    } else {
        r -= 5.0;
        z = (((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r + 1.24266094738807843860e-3) * r +
                 2.65321895265761230930e-2) * r + 2.96560571828504891230e-1) * r + 1.78482653991729133580e0) * r +
              5.46378491116411436990e0) * r + 6.65790464350110377720e0) /
            (((((((2.04426310338993978564e-15 * r + 1.42151175831644588870e-7) * r + 1.84631831751005468180e-5) * r +
                 7.86869131145613259100e-4) * r + 1.48753612908506148525e-2) * r + 1.36929880922735805310e-1) * r +
              5.99832206555887937690e-1) * r + 1.0);
    }
    return q < 0 ? -z : z;
}

double tf_normal_quantile(double p)
{
    if (!(p > 0 && p < 1)) return p == 0 ? -INFINITY : p == 1 ? INFINITY : NAN;
    double q = p - 0.5;
    return fabs(q) <= AS241_SPLIT ? as241_central(q) : as241_tail(p, q);
}

static double rng_normal_k(uint64_t key, uint64_t index) { return tf_normal_quantile(rng_open_uniform_k(key, index)); }

/* rng_normal_k(key, lo + k) into z[k] for k < n <= NORMAL_CHUNK, the same
 * bits, in passes: the hashes, the central rational over all of them (a
 * loop without branches or calls), then the tails over it. */
static void rng_normal_chunk(uint64_t key, int64_t lo, int n, double *z)
{
    double u[NORMAL_CHUNK];
    int tail[NORMAL_CHUNK], nt = 0;
    for (int k = 0; k < n; k++) u[k] = rng_open_uniform_k(key, (uint64_t)(lo + k));
    for (int k = 0; k < n; k++) z[k] = as241_central(u[k] - 0.5);
    for (int k = 0; k < n; k++) {   /* the tails' indices, without a branch (15% of them, at random) */
        tail[nt] = k;
        nt += fabs(u[k] - 0.5) > AS241_SPLIT;
    }
    for (int t = 0; t < nt; t++) z[tail[t]] = as241_tail(u[tail[t]], u[tail[t]] - 0.5);
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
void tf_interp_set_seed(tf_interp_ctx *ip, uint64_t seed) { ip->seed = seed; }
uint64_t tf_interp_step(const tf_interp_ctx *ip) { return ip->step; }
void tf_interp_set_step(tf_interp_ctx *ip, uint64_t step) { ip->step = step; }
tf_diag *tf_interp_diag(tf_interp_ctx *ip) { return ip->d; }
void tf_interp_set_diag(tf_interp_ctx *ip, tf_diag *d) { ip->d = d; }
tf_module *tf_interp_module(const tf_interp_ctx *ip) { return ip->m; }

void tf_interp_set_comm(tf_interp_ctx *ip, const tf_interp_comm *c)
{
    ip->comm = c ? *c : (tf_interp_comm){0};
}

const tf_interp_comm *tf_interp_comm_of(const tf_interp_ctx *ip) { return ip->comm.mean ? &ip->comm : NULL; }

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
        for (int64_t i = lo; i < hi; i += NORMAL_CHUNK) {
            int n = hi - i < NORMAL_CHUNK ? (int)(hi - i) : NORMAL_CHUNK;
            double *z = out + (i - lo);
            rng_normal_chunk(key, i, n, z);
            if (dt == TF_DT_F32)   /* tf_dtype_round's f32 case, inline */
                for (int k = 0; k < n; k++) z[k] = (double)(float)(a + b * z[k]);
            else
                for (int k = 0; k < n; k++) z[k] = tf_dtype_round(dt, a + b * z[k]);
        }
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
        tf_dt held = tf_node_wide(ip->m, n) ? TF_DT_F32 : out->dtype;   /* a fast region's f32-held value */
        for (int64_t j = 0; j < out->numel; j++) out->data[j] = tf_dtype_round(held, out->data[j]);
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
