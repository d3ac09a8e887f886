/* difftest.c — a differential model generator: random valid models, run on
 * every target this build has, compared with the reference interpreter.
 *
 *   tfuse_difftest [--models N] [--seed S] [--mode train|infer|both] [--time-limit SEC]
 *                  [--verbose] [--print SEED] [--file MODEL.ir ...] [--no-shrink]
 *
 * A seed gives one model (text, as a person would write it) and its data.
 * Each model is compiled and run on:
 *   interp       the float64 reference interpreter, full pipeline: the oracle
 *   interp-O0    the interpreter on the --O0 program (only the passes a program needs)
 *   cpu-t1       the cpu target, one thread
 *   cpu-t3       the cpu target, three threads
 *   (cuda-emu    to come: see TARGETS below)
 * Infer mode runs once; train mode runs two steps (fresh data each step) and
 * compares the outputs of both steps and then every param and buffer,
 * optimizer slots ("opt.*") and counters ("train.*") included.
 *
 * A failure is shrunk (delta debugging over the model's statements, dims,
 * attributes and dtypes) to a minimal model that still fails the same way,
 * which is printed with the seed, the targets that differ and by how much.
 * A model that the parser, verifier or compiler rejects is a generator bug
 * and fails the run too. Exit 0: all agree; 1: a mismatch or a generator
 * bug; 2: bad flags.
 *
 * Only the public API (tfuse.h) is used, as by any host program. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tfuse.h"

/* ------------------------------------------------------------------------
 * Tolerances.
 *
 * The error of a tensor is its normalized max error
 *     err = max_i |got_i - ref_i| / max(1, max_i |ref_i|)
 * (the reference's finite values; a NaN must meet a NaN and an infinity the
 * same infinity, else err = inf). The floor of 1 is the scale of the data:
 * every input is O(1) (N(0,1) draws), so a tensor far below 1 is the result
 * of cancellation between O(1) values and carries their absolute rounding
 * noise, not its own relative precision.
 *
 * The bound is a small multiple of the machine epsilon of the coarsest
 * floating type the model computes in (its storage dtypes and the train
 * block's precision):
 *   f32:  512 * 2^-23 = 6.1e-5. The cpu target's elementwise kernels store
 *         the interpreter's bits; GEMM/conv run in fp32 (OpenBLAS) against the
 *         interpreter's float64 accumulation, an error of about sqrt(K) eps
 *         per GEMM, carried through a few layers and two optimizer steps.
 *   f16:    8 * 2^-10 = 7.8e-3, and
 *   bf16:   8 * 2^-7  = 6.3e-2: a GEMM result that differs in its last fp32
 *         bits rounds to a neighbouring 16-bit value, one ulp of the storage
 *         type per value, carried through a few ops.
 * The same bound serves interp-O0, whose program skips the optimizing
 * passes (fusion, folding, cse) but computes the same math.
 * ------------------------------------------------------------------------ */
enum { TOL_F32, TOL_F16, TOL_BF16 };
static const double tol_of_class[] = {512.0 / 8388608.0, 8.0 / 1024.0, 8.0 / 128.0};
static const char *const tol_class_name[] = {"f32", "f16", "bf16"};

/* ------------------------------------------------------------------------
 * Targets. The first row is the reference every other row is compared with.
 * ------------------------------------------------------------------------ */
typedef struct target_spec {
    const char *name;
    tf_target target;
    int opt_level, threads;
    bool exact;          /* --numerics=exact, compared with the reference compiled so too: --O0 does not fuse, and
                          * fused regions hold 16-bit values at f32 under the default (docs/numerics.md) */
} target_spec;

static const target_spec TARGETS[] = {
    {"interp", TF_TARGET_INTERP, 1, 0, false},
    {"interp-O0", TF_TARGET_INTERP, 0, 0, true},
    {"cpu-t1", TF_TARGET_CPU, 1, 1, false},
    {"cpu-t3", TF_TARGET_CPU, 1, 3, false},
    /* cuda-emu: the cuda backend over stand-in CUDA libraries. Add its row
     * here when the target exists, e.g. {"cuda-emu", TF_TARGET_CUDA, 1, 0};
     * a target whose tf_session_create says TF_ERR_UNAVAILABLE is skipped. */
};
#define NTARGETS ((int)(sizeof TARGETS / sizeof *TARGETS))

/* ------------------------------------------------------------------------
 * Small utilities: a growing string, a seeded generator.
 * ------------------------------------------------------------------------ */
typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "tfuse_difftest: out of memory\n");
        exit(3);
    }
    return q;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(xrealloc(NULL, n), s, n);
}

static void sb_vprintf(sbuf *b, const char *fmt, va_list ap)
{
    va_list aq;
    va_copy(aq, ap);
    int k = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = (b->n + (size_t)k + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
    }
    vsnprintf(b->s + b->n, (size_t)k + 1, fmt, ap);
    b->n += (size_t)k;
}

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(b, fmt, ap);
    va_end(ap);
}

static const char *sb_str(sbuf *b) { return b->s ? b->s : ""; }

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int rng_int(rng *r, int n) { return n <= 1 ? 0 : (int)(rng_next(r) % (uint64_t)n); }
static bool rng_chance(rng *r, double p) { return (double)(rng_next(r) >> 11) * 0x1.0p-53 < p; }
static double rng_unit(rng *r) { return ((double)(rng_next(r) >> 11) + 0.5) * 0x1.0p-53; }
static double rng_normal(rng *r) { return sqrt(-2.0 * log(rng_unit(r))) * cos(6.283185307179586 * rng_unit(r)); }

static uint64_t hash_str(uint64_t h, const char *s)
{
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001B3ull;
    return h;
}

/* ------------------------------------------------------------------------
 * 16-bit floats, for inputs in f16/bf16 and for reading such outputs.
 * ------------------------------------------------------------------------ */
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float f16_to_f32(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (float)((h & 0x8000) ? -v : v);
}

static uint16_t f32_to_f16(float f)
{
    /* exact round-to-nearest-even through double: the inputs are N(0,1) */
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a != a) return 0x7e00;
    if (a >= 65520.0) return sign | 0x7c00;
    if (a < ldexp(1, -14)) return sign | (uint16_t)nearbyint(a * ldexp(1, 24));
    int e;
    frexp(a, &e);   /* a = f * 2^e, f in [0.5, 1) */
    double m = nearbyint(ldexp(a, 11 - e));   /* 11 significant bits */
    if (m >= 2048) { m /= 2; e++; }
    return sign | (uint16_t)(((e + 14) << 10) | ((int)m - 1024));
}

static double load_elem(tf_dtype t, const void *p, int64_t i)
{
    switch (t) {
    case TF_DTYPE_F32: return ((const float *)p)[i];
    case TF_DTYPE_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    case TF_DTYPE_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case TF_DTYPE_F64: return ((const double *)p)[i];
    case TF_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case TF_DTYPE_I32: return ((const int32_t *)p)[i];
    case TF_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    }
    return NAN;
}

static int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    return n;
}

/* ========================================================================
 * The generator: a seed -> the text of a valid model.
 *
 * It keeps a pool of the float values built so far (name, shape, whether a
 * param reaches it) and applies random blocks to the current value: pointwise
 * chains with broadcast operands, linear/matmul, conv2d, pooling, norms,
 * layout ops, reductions followed by broadcast pointwise ops, activations,
 * dtype round trips. Sizes are declared as `dim D<n> = n` and used by name in
 * every declared type, so the shrinker can make them smaller in one place.
 * ======================================================================== */
#define MAXPOOL 256
#define MAX_NUMEL 3000

typedef struct gval {
    char name[24];
    int rank;
    int64_t sh[8];
    bool has_param;   /* a param reaches this value (it has a gradient) */
} gval;

typedef struct gen {
    rng r;
    sbuf dims, decls, ops, outs;
    int64_t dimvals[64];
    int ndims;
    gval pool[MAXPOOL];
    int npool, cur;   /* cur: index of the value the chain continues from */
    int nval, nin, nparam, nbuf, salt;
    const char *dt;   /* the model's float storage dtype */
    bool train;
} gen;

static const char *dimref(gen *g, int64_t v, char *buf)
{
    if (v == 1) return "1";
    int i;
    for (i = 0; i < g->ndims && g->dimvals[i] != v; i++) {}
    if (i == g->ndims && g->ndims < 64) {
        g->dimvals[g->ndims++] = v;
        sb_printf(&g->dims, "dim D%lld = %lld\n", (long long)v, (long long)v);
    }
    snprintf(buf, 24, "D%lld", (long long)v);
    return buf;
}

/* "[D5, 1, D3]" */
static void shape_str(gen *g, int rank, const int64_t *sh, char *out, size_t cap)
{
    size_t at = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < rank; i++) {
        char b[24];
        at += (size_t)snprintf(out + at, cap - at, "%s%s", i ? ", " : "", dimref(g, sh[i], b));
    }
    snprintf(out + at, cap - at, "]");
}

static gval *pool_add(gen *g, const char *name, int rank, const int64_t *sh, bool has_param)
{
    if (g->npool == MAXPOOL) g->npool--;   /* overwrite the last one: the generator stays bounded */
    gval *v = &g->pool[g->npool];
    snprintf(v->name, sizeof v->name, "%s", name);
    v->rank = rank;
    for (int i = 0; i < rank; i++) v->sh[i] = sh[i];
    v->has_param = has_param;
    g->cur = g->npool++;
    return v;
}

static const char *vname(gen *g, char *buf)
{
    snprintf(buf, 24, "v%d", g->nval++);
    return buf;
}

/* Declare an input/param/buffer of the model's dtype (or `dt`). */
static const char *declare(gen *g, const char *kind, const char *dt, int rank, const int64_t *sh, const char *init,
                           char *buf)
{
    char s[256];
    shape_str(g, rank, sh, s, sizeof s);
    if (!strcmp(kind, "input")) snprintf(buf, 24, "x%d", g->nin++);
    else if (!strcmp(kind, "param")) snprintf(buf, 24, "w%d", g->nparam++);
    else snprintf(buf, 24, "s%d", g->nbuf++);
    /* A training model keeps 16-bit params as f32 masters, cast where used:
     * a param declared f16/bf16 is an error in train mode (FOUND.md #1). */
    bool master = g->train && !strcmp(kind, "param") && strcmp(dt, "f32") && strcmp(dt, "f64");
    sb_printf(&g->decls, "%s %s : %s%s%s%s\n", kind, buf, master ? "f32" : dt, s, init ? " = " : "", init ? init : "");
    if (master) {
        sb_printf(&g->ops, "%sh = cast(%s, to=%s)\n", buf, buf, dt);
        strcat(buf, "h");
    }
    return buf;
}

/* A param in train mode (half the time), else an input: an operand from outside. */
static const char *leaf(gen *g, int rank, const int64_t *sh, bool *is_param, char *buf)
{
    bool p = g->train && rng_chance(&g->r, 0.5);
    if (is_param) *is_param = p;
    return p ? declare(g, "param", g->dt, rank, sh, "uniform()", buf) : declare(g, "input", g->dt, rank, sh, NULL, buf);
}

static int64_t pick(rng *r, const int64_t *v, int n) { return v[rng_int(r, n)]; }
static const int64_t SIZES[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17};
#define NSIZES ((int)(sizeof SIZES / sizeof *SIZES))

static int64_t gnumel(const gval *v) { return numel(v->rank, v->sh); }

/* Emit `name = text` and make it the current value. */
static gval *emit(gen *g, int rank, const int64_t *sh, bool has_param, const char *fmt, ...)
{
    char nm[24];
    vname(g, nm);
    sb_printf(&g->ops, "%s = ", nm);
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(&g->ops, fmt, ap);
    va_end(ap);
    sb_printf(&g->ops, "\n");
    return pool_add(g, nm, rank, sh, has_param);
}

/* A shape that broadcasts against sh (rank r): a suffix of it with some axes 1. */
static int bcast_shape(gen *g, int r, const int64_t *sh, int64_t *out)
{
    if (r == 4 && rng_chance(&g->r, 0.25)) {   /* a per-channel [C, 1, 1] (a layer scale), or [1, C, 1, 1] */
        int k = rng_chance(&g->r, 0.5) ? 3 : 4;
        for (int i = 0; i < k; i++) out[i] = 1;
        out[k - 3] = sh[1];
        return k;
    }
    int k = rng_int(&g->r, r + 1);
    if (k == 0 && r > 0) k = 1;
    for (int i = 0; i < k; i++) out[i] = rng_chance(&g->r, 0.4) ? 1 : sh[r - k + i];
    return k;
}

/* A second operand for a binary op on cur: a literal, a broadcast leaf, cur itself
 * or another pool value of the same shape. Writes its name into buf; returns
 * whether a param reaches it. */
static bool operand_for(gen *g, const gval *cur, char *buf)
{
    int c = rng_int(&g->r, 10);
    if (c < 2) {
        static const char *lits[] = {"0.5", "2.0", "-1.5", "3.0", "0.25"};
        strcpy(buf, lits[rng_int(&g->r, 5)]);
        return false;
    }
    if (c < 8) {
        int64_t sh[8];
        int k = bcast_shape(g, cur->rank, cur->sh, sh);
        bool p;
        leaf(g, k, sh, &p, buf);
        return p;
    }
    for (int tries = 0; tries < 8; tries++) {
        const gval *o = &g->pool[rng_int(&g->r, g->npool)];
        bool same = o->rank == cur->rank;
        for (int i = 0; same && i < o->rank; i++) same = o->sh[i] == cur->sh[i];
        if (same) {
            strcpy(buf, o->name);
            return o->has_param;
        }
    }
    strcpy(buf, cur->name);
    return cur->has_param;
}

/* One pointwise op on the current value, safe for any finite input. */
static void pointwise_op(gen *g)
{
    gval c = g->pool[g->cur];
    char o[24], t[24], t2[24];
    int k = rng_int(&g->r, 23);
    switch (k) {
    case 0: case 1: case 2: case 3: case 4: {
        static const char *bin[] = {"add", "sub", "mul", "maximum", "minimum"};
        bool p = operand_for(g, &c, o);
        if (rng_chance(&g->r, 0.3) && !isdigit((unsigned char)o[0]) && o[0] != '-')
            emit(g, c.rank, c.sh, c.has_param || p, "%s(%s, %s)", bin[k], o, c.name);   /* broadcast operand first */
        else
            emit(g, c.rank, c.sh, c.has_param || p, "%s(%s, %s)", bin[k], c.name, o);
        return;
    }
    case 5: {   /* div by something >= 1 */
        bool p = operand_for(g, &c, o);
        if (isdigit((unsigned char)o[0]) || o[0] == '-') { emit(g, c.rank, c.sh, c.has_param, "div(%s, %s)", c.name, o); return; }
        char a[24], b[24];
        vname(g, a);
        sb_printf(&g->ops, "%s = abs(%s)\n", a, o);
        vname(g, b);
        sb_printf(&g->ops, "%s = add(%s, 1.0)\n", b, a);
        emit(g, c.rank, c.sh, c.has_param || p, "div(%s, %s)", c.name, b);
        return;
    }
    case 6: {   /* log(|x| + 1) */
        vname(g, t);
        sb_printf(&g->ops, "%s = abs(%s)\n", t, c.name);
        vname(g, t2);
        sb_printf(&g->ops, "%s = add(%s, 1.0)\n", t2, t);
        emit(g, c.rank, c.sh, c.has_param, "log(%s)", t2);
        return;
    }
    case 7: {   /* sqrt / rsqrt of |x| + 0.5 */
        vname(g, t);
        sb_printf(&g->ops, "%s = abs(%s)\n", t, c.name);
        vname(g, t2);
        sb_printf(&g->ops, "%s = add(%s, 0.5)\n", t2, t);
        emit(g, c.rank, c.sh, c.has_param, "%s(%s)", rng_chance(&g->r, 0.5) ? "sqrt" : "rsqrt", t2);
        return;
    }
    case 8: {   /* exp of something bounded */
        vname(g, t);
        if (rng_chance(&g->r, 0.5)) sb_printf(&g->ops, "%s = tanh(%s)\n", t, c.name);
        else sb_printf(&g->ops, "%s = minimum(%s, 3.0)\n", t, c.name);
        emit(g, c.rank, c.sh, c.has_param, "exp(%s)", t);
        return;
    }
    case 9: {   /* pow(|x| + 0.5, e) */
        vname(g, t);
        sb_printf(&g->ops, "%s = abs(%s)\n", t, c.name);
        vname(g, t2);
        sb_printf(&g->ops, "%s = add(%s, 0.5)\n", t2, t);
        static const char *ex[] = {"2.0", "0.5", "-1.0", "3.0"};
        emit(g, c.rank, c.sh, c.has_param, "pow(%s, %s)", t2, ex[rng_int(&g->r, 4)]);
        return;
    }
    case 10: {   /* where(cmp(x, y), x, y') */
        static const char *cmp[] = {"lt", "le", "gt", "ge", "eq", "ne"};
        bool p = operand_for(g, &c, o);
        vname(g, t);
        sb_printf(&g->ops, "%s = %s(%s, %s)\n", t, cmp[rng_int(&g->r, 6)], c.name, o);
        char o2[24];
        bool p2 = operand_for(g, &c, o2);
        (void)p;   /* the condition carries no gradient */
        if (isdigit((unsigned char)o2[0]) || o2[0] == '-') emit(g, c.rank, c.sh, c.has_param, "where(%s, %s, %s)", t, c.name, o2);
        else emit(g, c.rank, c.sh, c.has_param || p2, "where(%s, %s, %s)", t, o2, c.name);
        return;
    }
    default: {
        static const char *un[] = {"neg", "abs", "relu", "tanh", "sigmoid", "erf", "sin", "cos", "silu", "gelu", "gelu",
                                   "softplus"};
        const char *u = un[k - 11];
        if (!strcmp(u, "gelu") && k == 21) emit(g, c.rank, c.sh, c.has_param, "gelu(%s, approx=\"tanh\")", c.name);
        else emit(g, c.rank, c.sh, c.has_param, "%s(%s)", u, c.name);
        return;
    }
    }
}

static void blk_pointwise(gen *g)
{
    int n = 1 + rng_int(&g->r, 4);
    for (int i = 0; i < n; i++) pointwise_op(g);
}

/* linear(x[..., F], w[F, F2], b[F2]?) */
static bool blk_linear(gen *g)
{
    gval c = g->pool[g->cur];
    if (c.rank < 1) return false;
    int64_t f = c.sh[c.rank - 1], f2 = pick(&g->r, SIZES, NSIZES);
    if (gnumel(&c) / f * f2 > MAX_NUMEL) return false;
    char w[24], b[24];
    int64_t wsh[2] = {f, f2};
    declare(g, "param", g->dt, 2, wsh, rng_chance(&g->r, 0.5) ? "kaiming_uniform()" : "xavier_uniform()", w);
    int64_t sh[8];
    memcpy(sh, c.sh, sizeof sh);
    sh[c.rank - 1] = f2;
    if (rng_chance(&g->r, 0.5)) {
        declare(g, "param", g->dt, 1, &f2, "uniform()", b);
        emit(g, c.rank, sh, true, "linear(%s, %s, %s)", c.name, w, b);
    } else {
        emit(g, c.rank, sh, true, "linear(%s, %s)", c.name, w);
    }
    return true;
}

/* matmul(a[..., M, K], b[batch..., K, N]) with transposes and broadcast batch axes */
static bool blk_matmul(gen *g)
{
    gval c = g->pool[g->cur];
    if (c.rank < 2) return false;
    bool ta = rng_chance(&g->r, 0.25), tb = rng_chance(&g->r, 0.3);
    int64_t m = c.sh[c.rank - (ta ? 1 : 2)], k = c.sh[c.rank - (ta ? 2 : 1)];
    int64_t sh[8];
    memcpy(sh, c.sh, sizeof sh);
    char b[24];
    bool p = false;
    if (rng_chance(&g->r, 0.15)) {   /* c times itself: [.., M, K] x [.., M, K]^T */
        if (gnumel(&c) / (m * k) * m * m > MAX_NUMEL) return false;
        sh[c.rank - 2] = m;
        sh[c.rank - 1] = m;
        emit(g, c.rank, sh, c.has_param, "matmul(%s, %s%s%s)", c.name, c.name, ta ? ", transpose_a=true" : "",
             ta ? ", transpose_b=false" : ", transpose_b=true");
        return true;
    }
    int64_t n = pick(&g->r, SIZES, NSIZES);
    int nb = rng_int(&g->r, c.rank - 1);   /* batch axes of b: a suffix of c's, some 1 */
    int64_t bsh[8];
    for (int i = 0; i < nb; i++) bsh[i] = rng_chance(&g->r, 0.5) ? 1 : c.sh[c.rank - 2 - nb + i];
    bsh[nb] = tb ? n : k;
    bsh[nb + 1] = tb ? k : n;
    if (gnumel(&c) / (m * k) * m * n > MAX_NUMEL) return false;
    if (g->train && rng_chance(&g->r, 0.7)) {
        declare(g, "param", g->dt, nb + 2, bsh, "kaiming_uniform()", b);
        p = true;
    } else {
        declare(g, "input", g->dt, nb + 2, bsh, NULL, b);
    }
    sh[c.rank - 2] = m;
    sh[c.rank - 1] = n;
    sbuf a = {0};
    if (ta) sb_printf(&a, ", transpose_a=true");
    if (tb) sb_printf(&a, ", transpose_b=true");
    emit(g, c.rank, sh, c.has_param || p, "matmul(%s, %s%s)", c.name, b, sb_str(&a));
    free(a.s);
    return true;
}

/* conv2d on [N, C, H, W] with stride, padding, dilation, groups, bias */
static bool blk_conv(gen *g)
{
    gval c = g->pool[g->cur];
    if (c.rank != 4) return false;
    int64_t C = c.sh[1], H = c.sh[2], W = c.sh[3];
    int64_t grp = 1;
    if (rng_chance(&g->r, 0.3))
        for (int64_t d = C; d > 1; d--)
            if (C % d == 0 && rng_chance(&g->r, 0.5)) { grp = d; break; }
    int64_t o = grp * (1 + rng_int(&g->r, 3));
    int64_t kh = 1 + rng_int(&g->r, 3), kw = 1 + rng_int(&g->r, 3);
    int64_t s = 1 + rng_int(&g->r, 2), p = rng_int(&g->r, 2), dl = rng_chance(&g->r, 0.2) ? 2 : 1;
    int64_t sph = dl * (kh - 1) + 1, spw = dl * (kw - 1) + 1;
    if (H + 2 * p < sph || W + 2 * p < spw) return false;
    int64_t ho = (H + 2 * p - sph) / s + 1, wo = (W + 2 * p - spw) / s + 1;
    int64_t sh[4] = {c.sh[0], o, ho, wo};
    if (numel(4, sh) > MAX_NUMEL) return false;
    char w[24], b[24];
    int64_t wsh[4] = {o, C / grp, kh, kw};
    declare(g, "param", g->dt, 4, wsh, "kaiming_uniform()", w);
    sbuf a = {0};
    if (s > 1) sb_printf(&a, ", stride=%lld", (long long)s);
    if (p) sb_printf(&a, ", padding=%lld", (long long)p);
    if (dl > 1) sb_printf(&a, ", dilation=%lld", (long long)dl);
    if (grp > 1) sb_printf(&a, ", groups=%lld", (long long)grp);
    if (rng_chance(&g->r, 0.5)) {
        declare(g, "param", g->dt, 1, &o, "uniform()", b);
        emit(g, 4, sh, true, "conv2d(%s, %s, %s%s)", c.name, w, b, sb_str(&a));
    } else {
        emit(g, 4, sh, true, "conv2d(%s, %s%s)", c.name, w, sb_str(&a));
    }
    free(a.s);
    return true;
}

/* maxpool2d / avgpool2d / global_avgpool on [N, C, H, W] */
static bool blk_pool(gen *g)
{
    gval c = g->pool[g->cur];
    if (c.rank != 4) return false;
    if (rng_chance(&g->r, 0.25)) {
        int64_t sh[2] = {c.sh[0], c.sh[1]};
        emit(g, 2, sh, c.has_param, "global_avgpool(%s)", c.name);
        return true;
    }
    bool mx = rng_chance(&g->r, 0.5);
    int64_t k = 1 + rng_int(&g->r, 3), p = rng_int(&g->r, (int)(k / 2) + 1), s = rng_chance(&g->r, 0.5) ? 0 : 1 + rng_int(&g->r, 2);
    int64_t es = s ? s : k;
    if (rng_chance(&g->r, 0.25) && k > 1) {
        /* a ceil_mode window as tfuse.export writes one: the input grown on
         * the bottom and the right by a constant (-inf for
         * a max pool, 0 for an average) before the pool */
        int64_t e = 1 + rng_int(&g->r, (int)k - 1), rsh[4] = {c.sh[0], c.sh[1], e, c.sh[3]};
        char fill[24], fill2[24];
        const char *init = mx ? "const(value=-inf)" : "zeros()";
        declare(g, "buffer", g->dt, 4, rsh, init, fill);
        int64_t tall[4] = {c.sh[0], c.sh[1], c.sh[2] + e, c.sh[3]};
        gval *t = emit(g, 4, tall, c.has_param, "concat(%s, %s, axis=2)", c.name, fill);
        int64_t csh[4] = {c.sh[0], c.sh[1], tall[2], e};
        declare(g, "buffer", g->dt, 4, csh, init, fill2);
        int64_t wide[4] = {c.sh[0], c.sh[1], tall[2], c.sh[3] + e};
        emit(g, 4, wide, c.has_param, "concat(%s, %s, axis=3)", t->name, fill2);
        c = g->pool[g->cur];
    }
    if (c.sh[2] + 2 * p < k || c.sh[3] + 2 * p < k) return false;
    int64_t sh[4] = {c.sh[0], c.sh[1], (c.sh[2] + 2 * p - k) / es + 1, (c.sh[3] + 2 * p - k) / es + 1};
    sbuf a = {0};
    if (s) sb_printf(&a, ", stride=%lld", (long long)s);
    if (p) sb_printf(&a, ", padding=%lld", (long long)p);
    emit(g, 4, sh, c.has_param, "%s(%s, kernel=%lld%s)", mx ? "maxpool2d" : "avgpool2d", c.name, (long long)k, sb_str(&a));
    free(a.s);
    return true;
}

/* softmax / log_softmax / layernorm / batchnorm */
static bool blk_norm(gen *g)
{
    gval c = g->pool[g->cur];
    if (c.rank < 1) return false;
    int k = rng_int(&g->r, 4);
    char ga[24], be[24];
    if (k == 0 || k == 1) {
        int ax = rng_int(&g->r, c.rank);
        if (rng_chance(&g->r, 0.3)) ax -= c.rank;
        if (ax == -1 && rng_chance(&g->r, 0.5))
            emit(g, c.rank, c.sh, c.has_param, "%s(%s)", k ? "log_softmax" : "softmax", c.name);
        else
            emit(g, c.rank, c.sh, c.has_param, "%s(%s, axis=%d)", k ? "log_softmax" : "softmax", c.name, ax);
        return true;
    }
    if (k == 2) {
        int64_t f = c.sh[c.rank - 1];
        declare(g, "param", g->dt, 1, &f, rng_chance(&g->r, 0.5) ? "ones()" : "uniform(low=0.5, high=1.5)", ga);
        declare(g, "param", g->dt, 1, &f, rng_chance(&g->r, 0.5) ? "zeros()" : "uniform()", be);
        if (c.rank == 4 && rng_chance(&g->r, 0.6)) {   /* channels last around it, as ConvNeXt's LayerNorm2d */
            int64_t cl[4] = {c.sh[0], c.sh[2], c.sh[3], c.sh[1]};
            char g2[24], b2[24];
            declare(g, "param", g->dt, 1, &cl[3], "uniform(low=0.5, high=1.5)", g2);
            declare(g, "param", g->dt, 1, &cl[3], "uniform()", b2);
            gval *t = emit(g, 4, cl, c.has_param, "transpose(%s, perm=[0, 2, 3, 1])", c.name);
            gval *n = emit(g, 4, cl, true, "layernorm(%s, %s, %s)", t->name, g2, b2);
            emit(g, 4, c.sh, true, "transpose(%s, perm=[0, 3, 1, 2])", n->name);
            return true;
        }
        emit(g, c.rank, c.sh, true, "layernorm(%s, %s, %s%s)", c.name, ga, be, rng_chance(&g->r, 0.3) ? ", eps=0.001" : "");
        return true;
    }
    if (c.rank < 2) return false;
    /* batchnorm: train mode needs more than one value per channel (unbiased variance) */
    if (g->train && gnumel(&c) / c.sh[1] < 2) return false;
    int64_t ch = c.sh[1];
    char rm[24], rv[24];
    declare(g, "param", g->dt, 1, &ch, "uniform(low=0.5, high=1.5)", ga);
    declare(g, "param", g->dt, 1, &ch, "uniform()", be);
    declare(g, "buffer", g->dt, 1, &ch, "uniform()", rm);
    declare(g, "buffer", g->dt, 1, &ch, "uniform(low=0.5, high=2.0)", rv);
    emit(g, c.rank, c.sh, true, "batchnorm(%s, %s, %s, %s, %s%s)", c.name, ga, be, rm, rv,
         rng_chance(&g->r, 0.3) ? ", momentum=0.3" : "");
    return true;
}

/* attention on [B, H, T, D]: grouped-query heads (Hk of H), other key and
 * value lengths and widths, a bool mask or an additive one (from an input,
 * a buffer or, in train mode, a param: that one stays decomposed), causal,
 * a scale, dropout in train mode */
static bool blk_attention(gen *g)
{
    gval c = g->pool[g->cur];
    if (c.rank != 4) return false;
    static const int64_t SP[] = {1, 2, 3, 5, 7, 8, 13};
    int64_t B = c.sh[0], H = c.sh[1], T = c.sh[2], D = c.sh[3];
    int64_t Hk = rng_chance(&g->r, 0.5) ? H : rng_chance(&g->r, 0.5) || H % 2 ? 1 : H / 2;
    int64_t Tk = rng_chance(&g->r, 0.5) ? T : pick(&g->r, SP, 7), Dv = rng_chance(&g->r, 0.5) ? D : pick(&g->r, SP, 7);
    int64_t ksh[4] = {B, Hk, Tk, D}, vsh[4] = {B, Hk, Tk, Dv}, osh[4] = {B, H, T, Dv};
    char k[24], v[24], m[24], mb[24];
    const char *kind = g->train ? "param" : "input";
    declare(g, kind, g->dt, 4, ksh, g->train ? "normal()" : NULL, k);
    declare(g, kind, g->dt, 4, vsh, g->train ? "normal()" : NULL, v);
    sbuf a = {0};
    int mk = rng_int(&g->r, g->train ? 4 : 3);
    if (mk) {   /* [B or 1, 1, T or 1, Tk] */
        int64_t msh[4] = {rng_chance(&g->r, 0.5) ? B : 1, 1, rng_chance(&g->r, 0.5) ? T : 1, Tk};
        if (mk == 1) {
            declare(g, "input", "f32", 4, msh, NULL, mb);
            vname(g, m);   /* not in the pool: a bool that later blocks would take up as an operand */
            sb_printf(&g->ops, "%s = ge(%s, -0.8)\n", m, mb);
        } else {
            declare(g, mk == 2 ? "buffer" : "param", g->dt, 4, msh, "uniform()", m);
        }
        sb_printf(&a, ", %s", m);
    }
    if (rng_chance(&g->r, 0.5)) sb_printf(&a, ", causal=true");
    if (rng_chance(&g->r, 0.3)) sb_printf(&a, ", scale=0.7");
    if (g->train && rng_chance(&g->r, 0.3)) sb_printf(&a, ", dropout=0.25, salt=%d", 1 + rng_int(&g->r, 100));
    /* q through tanh: the chain may carry -inf (a ceil-mode pool's fill), and what an inf or NaN operand does
     * through a masked pair is not pinned (docs/attention.md) */
    gval *qt = emit(g, 4, c.sh, c.has_param, "tanh(%s)", c.name);
    emit(g, 4, osh, c.has_param || g->train, "attention(%s, %s, %s%s)", qt->name, k, v, sb_str(&a));
    free(a.s);
    return true;
}

/* reshape / flatten / transpose / broadcast / slice / concat */
static bool blk_layout(gen *g)
{
    gval c = g->pool[g->cur];
    int64_t sh[8];
    memcpy(sh, c.sh, sizeof sh);
    char b[24], s[256];
    int k = rng_int(&g->r, 7);
    if (k == 0 && c.rank >= 2) {   /* merge two adjacent axes (the merged one written -1) */
        int i = rng_int(&g->r, c.rank - 1);
        sbuf a = {0};
        for (int j = 0, o = 0; j < c.rank; j++) {
            if (j == i + 1) continue;
            sb_printf(&a, "%s%s", o++ ? ", " : "", j == i ? "-1" : dimref(g, c.sh[j], b));
        }
        sh[i] = c.sh[i] * c.sh[i + 1];
        for (int j = i + 1; j < c.rank - 1; j++) sh[j] = c.sh[j + 1];
        emit(g, c.rank - 1, sh, c.has_param, "reshape(%s, shape=[%s])", c.name, sb_str(&a));
        free(a.s);
        return true;
    }
    if (k == 1 && c.rank >= 1 && c.rank < 6) {   /* split an axis into f x rest */
        int i = rng_int(&g->r, c.rank);
        int64_t n = c.sh[i], f = 0;
        for (int64_t d = 2; d < n; d++)
            if (n % d == 0) { f = d; if (rng_chance(&g->r, 0.5)) break; }
        if (!f) {
            if (!rng_chance(&g->r, 0.5)) return false;
            f = 1;   /* a new size-1 axis */
        }
        sbuf a = {0};
        for (int j = 0, o = 0; j < c.rank; j++) {
            if (j == i) sb_printf(&a, "%s%s, -1", o++ ? ", " : "", dimref(g, f, b));
            else sb_printf(&a, "%s%s", o++ ? ", " : "", dimref(g, c.sh[j], b));
        }
        for (int j = c.rank; j > i + 1; j--) sh[j] = c.sh[j - 1];
        sh[i] = f;
        sh[i + 1] = n / f;
        emit(g, c.rank + 1, sh, c.has_param, "reshape(%s, shape=[%s])", c.name, sb_str(&a));
        free(a.s);
        return true;
    }
    if (k == 2 && c.rank >= 2) {
        if (rng_chance(&g->r, 0.3)) {
            sh[1] = gnumel(&c) / c.sh[0];
            emit(g, 2, sh, c.has_param, "flatten(%s)", c.name);
            return true;
        }
        int perm[8];
        for (int i = 0; i < c.rank; i++) perm[i] = i;
        for (int i = c.rank - 1; i > 0; i--) {
            int j = rng_int(&g->r, i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        sbuf a = {0};
        for (int i = 0; i < c.rank; i++) {
            sb_printf(&a, "%s%d", i ? ", " : "", perm[i]);
            sh[i] = c.sh[perm[i]];
        }
        emit(g, c.rank, sh, c.has_param, "transpose(%s, perm=[%s])", c.name, sb_str(&a));
        free(a.s);
        return true;
    }
    if (k == 3 && c.rank < 6) {   /* broadcast: a new leading axis and/or size-1 axes expanded */
        int r = c.rank;
        int64_t lead = rng_chance(&g->r, 0.6) ? 2 + rng_int(&g->r, 2) : 0;
        if (lead) { for (int i = r; i > 0; i--) sh[i] = sh[i - 1]; sh[0] = lead; r++; }
        bool grew = lead > 0;
        for (int i = 0; i < r; i++)
            if (sh[i] == 1 && rng_chance(&g->r, 0.7)) { sh[i] = 2 + rng_int(&g->r, 3); grew = true; }
        if (!grew || numel(r, sh) > MAX_NUMEL) return false;
        shape_str(g, r, sh, s, sizeof s);
        emit(g, r, sh, c.has_param, "broadcast(%s, shape=%s)", c.name, s);
        return true;
    }
    if (k == 4 && c.rank >= 1) {   /* slice */
        int ax = rng_int(&g->r, c.rank);
        int64_t n = c.sh[ax];
        if (n < 2) return false;
        int64_t st = rng_int(&g->r, (int)n - 1), en = st + 1 + rng_int(&g->r, (int)(n - st)), step = 1 + rng_int(&g->r, 3);
        sh[ax] = (en - st + step - 1) / step;
        long long ws = rng_chance(&g->r, 0.3) ? st - n : st, we = rng_chance(&g->r, 0.3) && en < n ? en - n : en;
        if (step > 1)
            emit(g, c.rank, sh, c.has_param, "slice(%s, axis=%d, start=%lld, end=%lld, step=%lld)", c.name, ax, ws, we, (long long)step);
        else
            emit(g, c.rank, sh, c.has_param, "slice(%s, axis=%d, start=%lld, end=%lld)", c.name, ax, ws, we);
        return true;
    }
    if (k >= 5 && c.rank >= 1) {   /* concat with itself or a new leaf */
        int ax = rng_int(&g->r, c.rank);
        if (rng_chance(&g->r, 0.3)) {
            sh[ax] = 2 * c.sh[ax];
            if (numel(c.rank, sh) > MAX_NUMEL) return false;
            emit(g, c.rank, sh, c.has_param, "concat(%s, %s, axis=%d)", c.name, c.name, ax);
            return true;
        }
        int64_t osh[8];
        memcpy(osh, c.sh, sizeof osh);
        osh[ax] = 1 + rng_int(&g->r, 3);
        sh[ax] = c.sh[ax] + osh[ax];
        if (numel(c.rank, sh) > MAX_NUMEL) return false;
        bool p;
        leaf(g, c.rank, osh, &p, b);
        if (rng_chance(&g->r, 0.5)) emit(g, c.rank, sh, c.has_param || p, "concat(%s, %s, axis=%d)", b, c.name, ax - (rng_chance(&g->r, 0.3) ? c.rank : 0));
        else emit(g, c.rank, sh, c.has_param || p, "concat(%s, %s, axis=%d)", c.name, b, ax);
        return true;
    }
    return false;
}

/* reduce_sum/mean/max (or the layer ops sum/mean/max) over some axes, then,
 * most of the time, a pointwise op with a broadcast operand on the result. */
static bool blk_reduce(gen *g)
{
    gval c = g->pool[g->cur];
    if (c.rank < 1) return false;
    static const char *ops[] = {"reduce_sum", "reduce_mean", "reduce_max", "sum", "mean", "max"};
    const char *op = ops[rng_int(&g->r, 6)];
    bool red[8] = {0}, all = rng_chance(&g->r, 0.1), keep = rng_chance(&g->r, 0.4);
    sbuf a = {0};
    int nred = 0;
    if (!all) {
        for (int i = 0; i < c.rank; i++)
            if (rng_chance(&g->r, 0.4)) {
                red[i] = true;
                sb_printf(&a, "%s%d", nred++ ? ", " : "", rng_chance(&g->r, 0.3) ? i - c.rank : i);
            }
        if (!nred) {
            int i = rng_int(&g->r, c.rank);
            red[i] = true;
            sb_printf(&a, "%d", i);
        }
    } else {
        for (int i = 0; i < c.rank; i++) red[i] = true;
    }
    int64_t sh[8];
    int r = 0;
    for (int i = 0; i < c.rank; i++) {
        if (!red[i]) sh[r++] = c.sh[i];
        else if (keep) sh[r++] = 1;
    }
    emit(g, r, sh, c.has_param, "%s(%s, axes=[%s]%s)", op, c.name, sb_str(&a), keep ? ", keepdims=true" : "");
    free(a.s);
    if (r > 0 && rng_chance(&g->r, 0.7)) {   /* the pattern that found the broadcast-axis bug */
        gval cc = g->pool[g->cur];
        static const char *bin[] = {"add", "mul", "sub", "maximum", "div"};
        int64_t osh[8];
        int k = bcast_shape(g, r, sh, osh);
        char o[24];
        bool p;
        leaf(g, k, osh, &p, o);
        int b = rng_int(&g->r, 5);
        if (b == 4) {
            char t1[24], t2[24];
            vname(g, t1);
            sb_printf(&g->ops, "%s = abs(%s)\n", t1, o);
            vname(g, t2);
            sb_printf(&g->ops, "%s = add(%s, 1.0)\n", t2, t1);
            emit(g, r, sh, cc.has_param || p, "div(%s, %s)", cc.name, t2);
        } else {
            emit(g, r, sh, cc.has_param || p, "%s(%s, %s)", bin[b], cc.name, o);
        }
    }
    return true;
}

static bool blk_activation(gen *g)
{
    gval c = g->pool[g->cur];
    int k = rng_int(&g->r, 4);
    if (k == 0) emit(g, c.rank, c.sh, c.has_param, "gelu(%s%s)", c.name, rng_chance(&g->r, 0.5) ? ", approx=\"tanh\"" : "");
    else if (k == 1) emit(g, c.rank, c.sh, c.has_param, "silu(%s)", c.name);
    else if (k == 2) emit(g, c.rank, c.sh, c.has_param, "dropout(%s, p=%s, salt=%d)", c.name, rng_chance(&g->r, 0.5) ? "0.1" : "0.5", ++g->salt);
    else emit(g, c.rank, c.sh, c.has_param, "relu(%s)", c.name);
    return true;
}

/* cast to another float dtype, an op there, and back */
static bool blk_cast(gen *g)
{
    gval c = g->pool[g->cur];
    static const char *dts[] = {"f32", "f16", "bf16", "f64"};
    const char *to = dts[rng_int(&g->r, 4)];
    if (!strcmp(to, g->dt)) return false;
    char t1[24], t2[24];
    vname(g, t1);
    sb_printf(&g->ops, "%s = cast(%s, to=%s)\n", t1, c.name, to);
    vname(g, t2);
    sb_printf(&g->ops, "%s = %s(%s)\n", t2, rng_chance(&g->r, 0.5) ? "tanh" : "neg", t1);
    emit(g, c.rank, c.sh, c.has_param, "cast(%s, to=%s)", t2, g->dt);
    return true;
}

/* Continue from some other value of the pool now and then: side branches. */
static void maybe_switch(gen *g)
{
    if (g->npool > 1 && rng_chance(&g->r, 0.2)) g->cur = rng_int(&g->r, g->npool);
}

/* The model text for a seed (malloc'd); *train says which mode it is for. */
static char *generate(uint64_t seed, int mode_pref /* 0 train, 1 infer, 2 either */, bool *train_out)
{
    gen g;
    memset(&g, 0, sizeof g);
    g.r.s = hash_str(0xcbf29ce484222325ull, "model") ^ (seed * 0x9E3779B97F4A7C15ull);
    rng_next(&g.r);
    g.train = mode_pref == 0 ? true : mode_pref == 1 ? false : rng_chance(&g.r, 0.5);
    int d = rng_int(&g.r, 10);
    g.dt = d < 6 ? "f32" : d < 8 ? "f16" : "bf16";
    static const int64_t BATCH[] = {1, 2, 3, 4};
    static const int64_t SP[] = {1, 3, 4, 5, 6, 7, 9};
    int64_t sh[8];
    char b[24];
    int start = rng_int(&g.r, 9);
    if (start < 2) {
        sh[0] = pick(&g.r, BATCH, 4);
        sh[1] = pick(&g.r, SIZES, NSIZES);
        pool_add(&g, declare(&g, "input", g.dt, 2, sh, NULL, b), 2, sh, false);
    } else if (start < 4) {
        sh[0] = pick(&g.r, BATCH, 4);
        sh[1] = pick(&g.r, SIZES, NSIZES);
        sh[2] = pick(&g.r, SIZES, NSIZES);
        pool_add(&g, declare(&g, "input", g.dt, 3, sh, NULL, b), 3, sh, false);
    } else if (start < 7) {
        sh[0] = pick(&g.r, BATCH, 4);
        sh[1] = 1 + rng_int(&g.r, 4);
        sh[2] = pick(&g.r, SP, 7);
        sh[3] = pick(&g.r, SP, 7);
        pool_add(&g, declare(&g, "input", g.dt, 4, sh, NULL, b), 4, sh, false);
    } else if (start < 8) {   /* embedding: ids -> rows of a table */
        int64_t ids[2] = {pick(&g.r, BATCH, 4), pick(&g.r, SIZES, NSIZES)}, tab[2] = {pick(&g.r, SIZES, NSIZES), pick(&g.r, SIZES, NSIZES)};
        char t[24];
        declare(&g, "input", rng_chance(&g.r, 0.7) ? "i64" : "i32", 2, ids, NULL, b);
        if (g.train) declare(&g, "param", g.dt, 2, tab, "normal()", t);
        else declare(&g, "input", g.dt, 2, tab, NULL, t);
        sh[0] = ids[0];
        sh[1] = ids[1];
        sh[2] = tab[1];
        emit(&g, 3, sh, g.train, "%s(%s, %s)", rng_chance(&g.r, 0.7) ? "embedding" : "gather", b, t);
    } else {
        sh[0] = pick(&g.r, SIZES, NSIZES);
        pool_add(&g, declare(&g, "input", g.dt, 1, sh, NULL, b), 1, sh, false);
    }
    int nblocks = 1 + rng_int(&g.r, 6);
    for (int i = 0, tries = 0; i < nblocks && tries < 50; tries++) {
        bool ok;
        switch (rng_int(&g.r, 12)) {
        case 0: case 1: blk_pointwise(&g); ok = true; break;
        case 2: ok = blk_linear(&g); break;
        case 3: ok = blk_matmul(&g); break;
        case 4: ok = blk_conv(&g); break;
        case 5: ok = blk_pool(&g); break;
        case 6: ok = blk_norm(&g); break;
        case 7: ok = blk_layout(&g); break;
        case 8: ok = blk_reduce(&g); break;
        case 9: ok = blk_activation(&g); break;
        case 10: ok = blk_attention(&g); break;
        default: ok = blk_cast(&g); break;
        }
        if (ok) { i++; maybe_switch(&g); }
    }
    /* outputs: the chain's end, and a few side values */
    gval last = g.pool[g.cur];
    if (g.train) {
        if (!last.has_param || last.rank == 0 || rng_chance(&g.r, 0.2)) {   /* make a param reach the loss */
            int64_t osh[8];
            int k = bcast_shape(&g, last.rank, last.sh, osh);
            declare(&g, "param", g.dt, k, osh, "uniform()", b);
            last = *emit(&g, last.rank, last.sh, true, "mul(%s, %s)", last.name, b);
        }
        int l = rng_int(&g.r, 3);
        if (l == 0 || (l == 1 && last.rank < 2)) {
            declare(&g, "input", g.dt, last.rank, last.sh, NULL, b);
            sb_printf(&g.ops, "loss = mse_loss(%s, %s)\n", last.name, b);
        } else if (l == 1) {
            declare(&g, "input", rng_chance(&g.r, 0.7) ? "i64" : "i32", last.rank - 1, last.sh, NULL, b);
            sb_printf(&g.ops, "loss = cross_entropy(%s, %s)\n", last.name, b);
        } else {
            char t[24];
            vname(&g, t);
            sb_printf(&g.ops, "%s = mul(%s, %s)\n", t, last.name, last.name);
            sb_printf(&g.ops, "loss = %s(%s, axes=[])\n", rng_chance(&g.r, 0.5) ? "mean" : "reduce_mean", t);
        }
        sb_printf(&g.outs, "output loss\n");
    } else {
        sb_printf(&g.outs, "output %s\n", last.name);
    }
    int extra = rng_int(&g.r, 3);
    for (int i = 0; i < extra && g.npool > 1; i++) {
        const gval *v = &g.pool[rng_int(&g.r, g.npool)];
        if (strstr(sb_str(&g.outs), v->name) && strlen(v->name) > 0) {
            char pat[40];
            snprintf(pat, sizeof pat, "output %s\n", v->name);
            if (strstr(sb_str(&g.outs), pat)) continue;
        }
        if (!strcmp(v->name, last.name) && !g.train) continue;
        if (!strncmp(v->name, "x", 1)) continue;   /* an input as an output: allowed, but says nothing */
        sb_printf(&g.outs, "output %s\n", v->name);
    }
    /* the train block: in train mode always, in infer mode now and then for its precision */
    sbuf tb = {0};
    int pr = rng_int(&g.r, 10);
    const char *prec = pr < 6 ? NULL : pr < 8 ? "fp16" : "bf16";
    if (g.train) {
        sb_printf(&tb, "train {\n");
        int o = rng_int(&g.r, 4);
        if (o == 0) sb_printf(&tb, "  optimizer = sgd(lr=0.1)\n");
        else if (o == 1) sb_printf(&tb, "  optimizer = sgd(lr=0.05, momentum=0.9%s)\n", rng_chance(&g.r, 0.3) ? ", nesterov=true" : "");
        else if (o == 2) sb_printf(&tb, "  optimizer = adamw(lr=0.01, weight_decay=0.01)\n");
        else sb_printf(&tb, "  optimizer = adam(lr=0.01)\n");
        int s = rng_int(&g.r, 6);
        if (s == 0) sb_printf(&tb, "  schedule = cosine(total_steps=10, warmup_steps=1)\n");
        else if (s == 1) sb_printf(&tb, "  schedule = onecycle(max_lr=0.05, total_steps=10)\n");
        else if (s == 2) sb_printf(&tb, "  schedule = step(step_size=1, gamma=0.5)\n");
        if (prec) sb_printf(&tb, "  precision = %s\n", prec);
        if (rng_chance(&g.r, 0.25)) sb_printf(&tb, "  clip_grad_norm = 1.0\n");
        if (rng_chance(&g.r, 0.15)) sb_printf(&tb, "  accumulate = 2\n");
        sb_printf(&tb, "}\n");
    } else if (prec) {
        sb_printf(&tb, "train {\n  precision = %s\n}\n", prec);
    }
    sbuf all = {0};
    sb_printf(&all, "module difftest_%llu\n%s%s%s%s%s", (unsigned long long)seed, sb_str(&g.dims), sb_str(&g.decls),
              sb_str(&g.ops), sb_str(&g.outs), sb_str(&tb));
    free(g.dims.s);
    free(g.decls.s);
    free(g.ops.s);
    free(g.outs.s);
    free(tb.s);
    *train_out = g.train;
    return all.s;
}

/* ========================================================================
 * Running a model on one target and collecting every number it produced.
 * ======================================================================== */
typedef struct rtensor {
    char *name;   /* "out:NAME@STEP" or "state:NAME" */
    tf_dtype dt;
    int rank;
    int64_t shape[8];
    int64_t n;
    double *v;
    bool buffer;  /* a buffer the model declares (not an optimizer slot or counter) */
} rtensor;

typedef struct rresult {
    rtensor *t;
    int n, cap;
    bool bias_dropped;   /* the reference's bias_drop dropped a bias before a batchnorm */
} rresult;

static void rr_free(rresult *r)
{
    for (int i = 0; i < r->n; i++) {
        free(r->t[i].name);
        free(r->t[i].v);
    }
    free(r->t);
    memset(r, 0, sizeof *r);
}

static void rr_add(rresult *r, const char *name, const tf_tensor_view *v)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 16;
        r->t = xrealloc(r->t, (size_t)r->cap * sizeof *r->t);
    }
    rtensor *t = &r->t[r->n++];
    t->name = xstrdup(name);
    t->buffer = false;
    t->dt = v->dtype;
    t->rank = v->rank;
    memcpy(t->shape, v->shape, sizeof t->shape);
    t->n = numel(v->rank, v->shape);
    t->v = xrealloc(NULL, (size_t)(t->n ? t->n : 1) * sizeof *t->v);
    for (int64_t i = 0; i < t->n; i++) t->v[i] = load_elem(v->dtype, v->data, i);
}

typedef enum run_status {
    RUN_OK,
    RUN_SKIP,      /* the target cannot run in this build or on this machine */
    RUN_INVALID,   /* parse, verify or compile rejected the model */
    RUN_ERROR,     /* it compiled but a session or a run failed */
} run_status;

/* Fresh data for one input at one step: floats ~ N(0,1), integers uniform
 * below their bound (labels, ids), bools fair coins. malloc'd. */
static void *make_input(const char *name, tf_dtype dt, int rank, const int64_t *shape, int64_t bound, uint64_t seed,
                        int step)
{
    int64_t n = numel(rank, shape);
    rng r = {hash_str(0xcbf29ce484222325ull, name) ^ (seed * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)step << 48)};
    rng_next(&r);
    int sz = tf_dtype_size(dt);
    unsigned char *p = xrealloc(NULL, (size_t)(n ? n : 1) * (size_t)sz);
    if (bound <= 0) bound = 5;
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case TF_DTYPE_F32: ((float *)p)[i] = (float)rng_normal(&r); break;
        case TF_DTYPE_F64: ((double *)p)[i] = rng_normal(&r); break;
        case TF_DTYPE_F16: ((uint16_t *)p)[i] = f32_to_f16((float)rng_normal(&r)); break;
        case TF_DTYPE_BF16: ((uint16_t *)p)[i] = f32_to_bf16((float)rng_normal(&r)); break;
        case TF_DTYPE_I64: ((int64_t *)p)[i] = (int64_t)(rng_next(&r) % (uint64_t)bound); break;
        case TF_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)(rng_next(&r) % (uint64_t)bound); break;
        case TF_DTYPE_BOOL: p[i] = (unsigned char)(rng_next(&r) & 1); break;
        }
    }
    return p;
}

static int g_verbose;

/* Compile `text` for the target, run it (train: two steps), and collect the
 * outputs of every step and, after the last, every param and buffer. */
static run_status run_target(const char *text, bool train, const target_spec *ts, uint64_t seed, rresult *res,
                             char *err, size_t errcap)
{
    tf_context_t *ctx = NULL;
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_session_t *s = NULL;
    run_status rs = RUN_OK;
    err[0] = 0;
    if (tf_context_create(&ctx)) {
        snprintf(err, errcap, "cannot create a context");
        return RUN_ERROR;
    }
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = train ? TF_MODE_TRAIN : TF_MODE_INFER;
    o.target = ts->target;
    o.opt_level = ts->opt_level;
    o.threads = ts->threads;
    o.numerics_exact = ts->exact;
    /* the reference says what bias_drop did (see compare) */
    FILE *explain = ts == &TARGETS[0] && train ? tmpfile() : NULL;
    o.explain = explain;
    tf_status st = tf_model_parse_string(ctx, "model.ir", text, strlen(text), NULL, 0, &m);
    if (st) {
        snprintf(err, errcap, "parse: %s", tf_context_last_error(ctx));
        rs = RUN_INVALID;
        goto done;
    }
    st = tf_program_compile(ctx, m, &o, &p);
    if (explain) {
        char line[1024];
        rewind(explain);
        while (fgets(line, sizeof line, explain))
            if (strstr(line, "[bias_drop]") && strstr(line, "dropped bias")) res->bias_dropped = true;
    }
    if (st == TF_ERR_UNAVAILABLE) { rs = RUN_SKIP; goto done; }
    if (st) {
        snprintf(err, errcap, "compile: %s", tf_context_last_error(ctx));
        rs = RUN_INVALID;
        goto done;
    }
    st = tf_session_create(ctx, p, ts->target, seed, &s);
    if (st == TF_ERR_UNAVAILABLE) { rs = RUN_SKIP; goto done; }
    if (st) {
        snprintf(err, errcap, "session: %s", tf_context_last_error(ctx));
        rs = RUN_ERROR;
        goto done;
    }
    size_t nin = tf_program_io_count(p, TF_IO_INPUT), nout = tf_program_io_count(p, TF_IO_OUTPUT);
    void **bufs = xrealloc(NULL, (nin ? nin : 1) * sizeof *bufs);
    int steps = train ? 2 : 1;
    for (int step = 0; step < steps && rs == RUN_OK; step++) {
        for (size_t i = 0; i < nin; i++) {
            const char *nm;
            tf_dtype dt;
            int rank;
            int64_t shape[8], bound = 0;
            tf_program_io(p, TF_IO_INPUT, i, &nm, &dt, &rank, shape);
            tf_program_input_bound(p, i, &bound);
            bufs[i] = make_input(nm, dt, rank, shape, bound, seed, step);
            if (tf_session_bind(s, nm, dt, shape, rank, bufs[i]) && rs == RUN_OK) {
                snprintf(err, errcap, "bind %s: %s", nm, tf_context_last_error(ctx));
                rs = RUN_ERROR;
            }
        }
        if (rs == RUN_OK && tf_session_run(s)) {
            snprintf(err, errcap, "run (step %d): %s", step + 1, tf_context_last_error(ctx));
            rs = RUN_ERROR;
        }
        for (size_t i = 0; i < nout && rs == RUN_OK; i++) {
            const char *nm;
            tf_program_io(p, TF_IO_OUTPUT, i, &nm, NULL, NULL, NULL);
            tf_tensor_view v;
            if (tf_session_output(s, nm, &v)) {
                snprintf(err, errcap, "output %s: %s", nm, tf_context_last_error(ctx));
                rs = RUN_ERROR;
                break;
            }
            char key[300];
            snprintf(key, sizeof key, "out:%s@%d", nm, step + 1);
            rr_add(res, key, &v);
        }
        for (size_t i = 0; i < nin; i++) free(bufs[i]);
    }
    free(bufs);
    for (int kind = TF_IO_PARAM; kind <= TF_IO_BUFFER && rs == RUN_OK; kind++) {
        size_t n = tf_program_io_count(p, (tf_io_kind)kind);
        for (size_t i = 0; i < n && rs == RUN_OK; i++) {
            const char *nm;
            tf_program_io(p, (tf_io_kind)kind, i, &nm, NULL, NULL, NULL);
            tf_tensor_view v = {0};
            if (tf_session_get_state(s, nm, &v, 0)) {
                snprintf(err, errcap, "get_state %s (shape): %s", nm, tf_context_last_error(ctx));
                rs = RUN_ERROR;
                break;
            }
            size_t bytes = (size_t)numel(v.rank, v.shape) * (size_t)tf_dtype_size(v.dtype);
            v.data = xrealloc(NULL, bytes ? bytes : 1);
            if (tf_session_get_state(s, nm, &v, bytes)) {
                snprintf(err, errcap, "get_state %s: %s", nm, tf_context_last_error(ctx));
                rs = RUN_ERROR;
            } else {
                char key[300];
                snprintf(key, sizeof key, "state:%s", nm);
                rr_add(res, key, &v);
                res->t[res->n - 1].buffer = kind == TF_IO_BUFFER && strncmp(nm, "opt.", 4) && strncmp(nm, "train.", 6);
            }
            free(v.data);
        }
    }
done:
    if (explain) fclose(explain);
    tf_session_free(s);
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
    return rs;
}

/* ========================================================================
 * Comparing a target's results with the reference's.
 * ======================================================================== */
static int tol_class(const char *text)
{
    int cls = TOL_F32;
    for (const char *q = text; *q;) {
        if (isalpha((unsigned char)*q) || *q == '_') {
            const char *b = q;
            while (isalnum((unsigned char)*q) || *q == '_' || *q == '.') q++;
            size_t n = (size_t)(q - b);
            if (n == 4 && !strncmp(b, "bf16", 4)) cls = TOL_BF16;
            else if (((n == 3 && !strncmp(b, "f16", 3)) || (n == 4 && !strncmp(b, "fp16", 4))) && cls < TOL_F16) cls = TOL_F16;
        } else if (*q == '#') {
            while (*q && *q != '\n') q++;
        } else {
            q++;
        }
    }
    return cls;
}

typedef struct diff {
    double err;           /* normalized max error (see Tolerances), INFINITY for a NaN/inf/shape mismatch */
    char tensor[300];
    int64_t at;
    double got, want;
    char what[256];       /* for errors that are not numbers: a missing tensor, a failed run */
} diff;

static const rtensor *find_tensor(const rresult *r, const char *name)
{
    for (int j = 0; j < r->n; j++)
        if (!strcmp(r->t[j].name, name)) return &r->t[j];
    return NULL;
}

/* Adam (and AdamW) move every element of a param by about lr in the
 * direction of its gradient's sign, however small the gradient: an element
 * whose gradient is zero in exact arithmetic (a batchnorm gamma under a
 * mean, a bias before a one-class softmax) moves by +-lr in the direction
 * of rounding noise, which differs between float64 and fp32 legitimately.
 * Such elements are left out of the param's comparison: those whose
 * gradient, by the second moment opt.v.P of both runs, is below the
 * absolute noise of an f32 gradient of O(1) data (2^-16: a few hundred
 * ulps of summed terms), far below any gradient that carries a direction
 * (the moments themselves are still compared, within the bound, and so is
 * every element whose gradient is larger). sqrt(v) underestimates the
 * gradient's size by sqrt(1 - beta2^t), at most 1/sqrt(0.001) after the
 * first step: the threshold is on sqrt(v), 2^-16 * sqrt(1 - 0.999). */
static bool adam_noise(const rtensor *vref, const rtensor *vgot, int64_t k)
{
    if (!vref || !vgot || k >= vref->n || k >= vgot->n) return false;
    double floor = ldexp(1.0, -16) * sqrt(1 - 0.999);
    return sqrt(fmax(vref->v[k], vgot->v[k])) < floor;
}

/* The worst tensor of `got` against `ref`; tensors only one side has
 * (interp-O0 lacks what amp adds, e.g. train.loss_scale) are skipped, and
 * so are the model's buffers with skip_buffers: where bias_drop dropped a
 * bias before a training batchnorm, its running mean tracks the batch mean
 * without that bias by design (passes/bias_drop.c), so a program without the
 * pass (--O0) holds other running statistics (FOUND.md #5). */
/* The second moments opt.v.P of both runs for tensor "state:P" (NULL for
 * anything else, or a param no Adam updates). */
static void second_moments(const rresult *ref, const rresult *got, const rtensor *w, const rtensor **vr,
                           const rtensor **vg)
{
    *vr = *vg = NULL;
    if (strncmp(w->name, "state:", 6)) return;
    char vname[512];
    snprintf(vname, sizeof vname, "state:opt.v.%s", w->name + 6);
    *vr = find_tensor(ref, vname);
    *vg = find_tensor(got, vname);
}

static diff compare(const rresult *ref, const rresult *got, bool skip_buffers, double tol)
{
    diff worst = {0};
    /* A param element Adam moved in the direction of rounding noise
     * (adam_noise) and that ended up elsewhere on the two sides changes what
     * the second step computes from it: the second step's outputs and the
     * running statistics are then not comparable either. */
    bool noisy = false;
    for (int i = 0; i < ref->n && !noisy; i++) {
        const rtensor *w = &ref->t[i], *g = find_tensor(got, w->name);
        if (!g || g->n != w->n) continue;
        const rtensor *vr, *vg;
        second_moments(ref, got, w, &vr, &vg);
        for (int64_t k = 0; k < w->n && !noisy; k++)
            noisy = adam_noise(vr, vg, k) && !(fabs(g->v[k] - w->v[k]) <= tol);
    }
    for (int i = 0; i < ref->n; i++) {
        const rtensor *w = &ref->t[i], *g = find_tensor(got, w->name);
        if (!g || (skip_buffers && w->buffer)) continue;
        if (noisy && (w->buffer || (!strncmp(w->name, "out:", 4) && !strstr(w->name, "@1")))) continue;
        const rtensor *vref, *vgot;
        second_moments(ref, got, w, &vref, &vgot);
        diff d = {0};
        snprintf(d.tensor, sizeof d.tensor, "%s", w->name);
        bool same = g->rank == w->rank;
        for (int k = 0; same && k < w->rank; k++) same = g->shape[k] == w->shape[k];
        if (!same) {
            d.err = INFINITY;
            snprintf(d.what, sizeof d.what, "shapes differ");
        } else {
            double scale = 1;
            for (int64_t k = 0; k < w->n; k++)
                if (isfinite(w->v[k]) && fabs(w->v[k]) > scale) scale = fabs(w->v[k]);
            for (int64_t k = 0; k < w->n; k++) {
                double a = g->v[k], b = w->v[k], e;
                if (adam_noise(vref, vgot, k)) continue;
                if (!isfinite(a) || !isfinite(b)) e = (isnan(a) && isnan(b)) || a == b ? 0 : INFINITY;
                else e = fabs(a - b) / scale;
                if (e > d.err || (e == d.err && e == INFINITY && d.at == 0 && k == 0)) {
                    d.err = e;
                    d.at = k;
                    d.got = a;
                    d.want = b;
                }
            }
        }
        if (d.err > worst.err || !worst.tensor[0]) worst = d;
    }
    return worst;
}

/* What checking one model found. */
typedef struct outcome {
    enum { OK_AGREE, BAD_MISMATCH, BAD_GENERATOR, BAD_REFERENCE } kind;
    int target;          /* the first target that differs */
    diff d;              /* its worst tensor */
    double tol;
    int ntargets;        /* targets that ran */
    char msg[1024];      /* every differing target, one line each */
} outcome;

/* Run the model on the reference and on every other target (or only on
 * `only`, >= 1) and compare. */
static outcome check_model(const char *text, bool train, uint64_t seed, int only)
{
    outcome oc = {0};
    oc.target = -1;
    oc.tol = tol_of_class[tol_class(text)];
    rresult ref = {0};
    char err[1024];
    run_status rs = run_target(text, train, &TARGETS[0], seed, &ref, err, sizeof err);
    if (rs != RUN_OK) {
        oc.kind = rs == RUN_INVALID ? BAD_GENERATOR : BAD_REFERENCE;
        snprintf(oc.msg, sizeof oc.msg, "%s: %.900s", TARGETS[0].name, err);
        rr_free(&ref);
        return oc;
    }
    oc.ntargets = 1;
    size_t at = 0;
    /* the reference with exact numerics, for the rows that are compared with it (a model of 16-bit values only) */
    static const target_spec ref_exact_spec = {"interp --numerics=exact", TF_TARGET_INTERP, 1, 0, true};
    rresult ref_exact = {0};
    bool have_exact = false, sixteen = strstr(text, "f16[") || strstr(text, "bf16[") || strstr(text, "to=f16") || strstr(text, "to=bf16");
    bool half = strstr(text, "precision = fp16") || strstr(text, "precision = bf16");
    for (int t = 1; t < NTARGETS; t++) {
        if (only > 0 && t != only) continue;
        /* --O0 leaves out amp: the model runs in fp32, so with precision
         * fp16/bf16 it computes something else by design (an fp16 step the
         * reference skips on overflow is taken at O0) */
        if (half && TARGETS[t].opt_level == 0) continue;
        const rresult *want = &ref;
        if (TARGETS[t].exact && sixteen) {
            if (!have_exact && run_target(text, train, &ref_exact_spec, seed, &ref_exact, err, sizeof err) != RUN_OK) {
                oc.kind = BAD_REFERENCE;
                snprintf(oc.msg, sizeof oc.msg, "%s: %.900s", ref_exact_spec.name, err);
                break;
            }
            have_exact = true;
            want = &ref_exact;
        }
        rresult got = {0};
        rs = run_target(text, train, &TARGETS[t], seed, &got, err, sizeof err);
        if (rs == RUN_SKIP) {
            rr_free(&got);
            continue;
        }
        oc.ntargets++;
        diff d = {0};
        if (rs != RUN_OK) {
            d.err = INFINITY;
            snprintf(d.what, sizeof d.what, "%.250s", err);
        } else {
            d = compare(want, &got, TARGETS[t].opt_level == 0 && ref.bias_dropped, oc.tol);
        }
        rr_free(&got);
        if (!(d.err <= oc.tol)) {
            if (oc.kind == OK_AGREE) {
                oc.kind = BAD_MISMATCH;
                oc.target = t;
                oc.d = d;
            }
            if (d.what[0])
                at += (size_t)snprintf(oc.msg + at, sizeof oc.msg - at, "  %s vs %s: %s%s%s\n", TARGETS[t].name,
                                       want == &ref ? TARGETS[0].name : ref_exact_spec.name, d.tensor[0] ? d.tensor : "",
                                       d.tensor[0] ? ": " : "", d.what);
            else
                at += (size_t)snprintf(oc.msg + at, sizeof oc.msg - at,
                                       "  %s vs %s: %s differs by %.3g (tolerance %.3g, %s), worst at element %lld: "
                                       "got %.9g, want %.9g\n",
                                       TARGETS[t].name, want == &ref ? TARGETS[0].name : ref_exact_spec.name, d.tensor, d.err, oc.tol,
                                       tol_class_name[tol_class(text)], (long long)d.at, d.got, d.want);
            if (at >= sizeof oc.msg) at = sizeof oc.msg - 1;
        }
    }
    rr_free(&ref);
    rr_free(&ref_exact);
    return oc;
}

/* ========================================================================
 * Shrinking: delta debugging over the model's text.
 *
 * The model is a list of chunks (a statement, or the whole train block).
 * A candidate is the model with one change, then with every statement no
 * one uses removed (dead values, inputs, params, dims); it is kept when it
 * is still valid and the same target still differs from the reference.
 * Changes, tried in order until none is kept: drop an output; bypass an op
 * (its uses read one of its operands instead); make a dim smaller; make
 * every 16-bit dtype f32; drop a train-block line; train -> infer; drop an
 * attribute. Inputs, params and dropout streams are drawn per name, so
 * removing one statement leaves the numbers of the rest unchanged.
 * ======================================================================== */
typedef struct chunks {
    char **c;
    int n;
} chunks;

static chunks split_chunks(const char *text)
{
    chunks k = {0};
    const char *q = text;
    while (*q) {
        const char *e = strchr(q, '\n');
        size_t len = e ? (size_t)(e - q) : strlen(q);
        const char *b = q;
        while (b < q + len && isspace((unsigned char)*b)) b++;
        if (!strncmp(b, "train", 5) && strchr(b, '{') && strchr(b, '{') < q + len) {   /* the block, to its '}' */
            const char *close = strchr(q, '}');
            if (close) {
                e = strchr(close, '\n');
                len = e ? (size_t)(e - q) : strlen(q);
            }
        }
        if (b < q + len && *b != '#') {
            k.c = xrealloc(k.c, (size_t)(k.n + 1) * sizeof *k.c);
            k.c[k.n] = xrealloc(NULL, len + 1);
            memcpy(k.c[k.n], q, len);
            k.c[k.n++][len] = 0;
        }
        q += len;
        if (*q == '\n') q++;
    }
    return k;
}

static void free_chunks(chunks *k)
{
    for (int i = 0; i < k->n; i++) free(k->c[i]);
    free(k->c);
    memset(k, 0, sizeof *k);
}

static char *join_chunks(const chunks *k)
{
    sbuf b = {0};
    for (int i = 0; i < k->n; i++)
        if (k->c[i]) sb_printf(&b, "%s\n", k->c[i]);
    return b.s ? b.s : xstrdup("");
}

/* The identifier tokens of a chunk, with positions; comments excluded. */
static int next_ident(const char *s, int from, int *len)
{
    for (int i = from; s[i]; i++) {
        if (s[i] == '#') return -1;
        if (s[i] == '"') {
            while (s[++i] && s[i] != '"') {}
            if (!s[i]) return -1;
            continue;
        }
        if (isalpha((unsigned char)s[i]) || s[i] == '_') {
            if (i > 0 && (isalnum((unsigned char)s[i - 1]) || s[i - 1] == '.')) continue;   /* inside a number such as 1e-5 */
            int j = i;
            while (isalnum((unsigned char)s[j]) || s[j] == '_' || s[j] == '.') j++;
            *len = j - i;
            return i;
        }
    }
    return -1;
}

/* The name a chunk defines (dim, input, param, buffer, op result), or "". */
static void defined_name(const char *c, char *out, size_t cap)
{
    int len, i = next_ident(c, 0, &len);
    out[0] = 0;
    if (i < 0) return;
    static const char *decl[] = {"dim", "input", "param", "buffer"};
    for (int k = 0; k < 4; k++)
        if ((int)strlen(decl[k]) == len && !strncmp(c + i, decl[k], (size_t)len)) {
            i = next_ident(c, i + len, &len);
            if (i >= 0 && (size_t)len < cap) snprintf(out, cap, "%.*s", len, c + i);
            return;
        }
    if ((len == 6 && !strncmp(c + i, "output", 6)) || (len == 6 && !strncmp(c + i, "update", 6)) ||
        (len == 6 && !strncmp(c + i, "module", 6)) || (len == 5 && !strncmp(c + i, "train", 5)))
        return;
    const char *after = c + i + len;
    while (*after == ' ' || *after == '\t') after++;
    if ((*after == '=' || *after == ':') && (size_t)len < cap) snprintf(out, cap, "%.*s", len, c + i);
}

/* Does chunk c use the name (as a token other than the one it defines)? */
static bool chunk_uses(const char *c, const char *name)
{
    char def[128];
    defined_name(c, def, sizeof def);
    int len, i = 0, nl = (int)strlen(name);
    bool skipped_def = false;
    while ((i = next_ident(c, i, &len)) >= 0) {
        if (len == nl && !strncmp(c + i, name, (size_t)nl)) {
            if (!skipped_def && !strcmp(def, name)) skipped_def = true;
            else return true;
        }
        i += len;
    }
    return false;
}

/* Remove every statement that defines a name no other statement uses. */
static void dce(chunks *k)
{
    for (bool again = true; again;) {
        again = false;
        for (int i = 0; i < k->n; i++) {
            if (!k->c[i]) continue;
            char def[128];
            defined_name(k->c[i], def, sizeof def);
            if (!def[0]) continue;
            bool used = false;
            for (int j = 0; j < k->n && !used; j++)
                if (j != i && k->c[j] && chunk_uses(k->c[j], def)) used = true;
            if (!used) {
                free(k->c[i]);
                k->c[i] = NULL;
                again = true;
            }
        }
    }
}

/* Replace every token `from` in s by `to`; malloc'd. */
static char *replace_ident(const char *s, const char *from, const char *to)
{
    sbuf b = {0};
    int len, i = 0, last = 0, fl = (int)strlen(from);
    while ((i = next_ident(s, i, &len)) >= 0) {
        if (len == fl && !strncmp(s + i, from, (size_t)fl)) {
            sb_printf(&b, "%.*s%s", i - last, s + last, to);
            last = i + len;
        }
        i += len;
    }
    sb_printf(&b, "%s", s + last);
    return b.s;
}

/* The top-level arguments of an op call "NAME = op(a, b, k=v)": offsets of each. */
static int call_args(const char *c, int *start, int *end, int max)
{
    const char *open = strchr(c, '(');
    if (!open) return 0;
    int n = 0, depth = 0, i = (int)(open - c) + 1, b = i;
    for (; c[i]; i++) {
        if (c[i] == '"') { while (c[++i] && c[i] != '"') {} if (!c[i]) break; continue; }
        if (c[i] == '[' || c[i] == '(') depth++;
        else if ((c[i] == ']' || c[i] == ')') && depth > 0) depth--;
        else if ((c[i] == ',' || c[i] == ')') && depth == 0) {
            if (n < max) { start[n] = b; end[n] = i; n++; }
            if (c[i] == ')') break;
            b = i + 1;
        }
    }
    return n;
}

typedef struct shrinker {
    bool train;
    uint64_t seed;
    int target;
    int evals, max_evals;
    double deadline;
    char errkey[64];   /* target -1: shrink a rejected model, keeping this part of the error */
} shrinker;

/* The start of an error message without its place and sizes. */
static void error_key(const char *msg, char *key, size_t cap)
{
    const char *e = strstr(msg, "error: ");
    e = e ? e + 7 : msg;
    size_t n = 0;
    while (e[n] && e[n] != '[' && e[n] != '\n' && e[n] != '\'' && n + 1 < cap && n < 40) n++;
    snprintf(key, cap, "%.*s", (int)n, e);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Keep the candidate (after dce) if it still fails on the same target. */
static bool try_candidate(shrinker *sh, chunks *cand, bool train, char **best, bool *best_train)
{
    if (sh->evals >= sh->max_evals || now_s() > sh->deadline) return false;
    dce(cand);
    char *text = join_chunks(cand);
    if (!strcmp(text, *best) && train == *best_train) {
        free(text);
        return false;
    }
    sh->evals++;
    outcome oc = check_model(text, train, sh->seed, sh->target);
    if ((sh->target > 0 && oc.kind == BAD_MISMATCH && oc.target == sh->target) ||
        (sh->target < 0 && oc.kind == BAD_GENERATOR && strstr(oc.msg, sh->errkey))) {
        free(*best);
        *best = text;
        *best_train = train;
        return true;
    }
    free(text);
    return false;
}

static chunks copy_chunks(const chunks *k)
{
    chunks c = {xrealloc(NULL, (size_t)(k->n ? k->n : 1) * sizeof(char *)), k->n};
    for (int i = 0; i < k->n; i++) c.c[i] = k->c[i] ? xstrdup(k->c[i]) : NULL;
    return c;
}

/* One round: the first change that keeps the failure; false when none does. */
static bool shrink_round(shrinker *sh, char **best, bool *train)
{
    chunks k = split_chunks(*best);
    bool kept = false;
    int nout = 0;
    for (int i = 0; i < k.n; i++) nout += !strncmp(k.c[i], "output", 6);
    /* drop an output */
    for (int i = 0; i < k.n && !kept && nout > 1; i++) {
        if (strncmp(k.c[i], "output", 6)) continue;
        chunks c = copy_chunks(&k);
        free(c.c[i]);
        c.c[i] = NULL;
        kept = try_candidate(sh, &c, *train, best, train);
        free_chunks(&c);
    }
    /* bypass an op: its uses read one of its value operands instead */
    for (int i = k.n - 1; i >= 0 && !kept; i--) {
        char def[128];
        defined_name(k.c[i], def, sizeof def);
        if (!def[0] || !strchr(k.c[i], '(') || !strncmp(k.c[i], "dim", 3)) continue;
        int len, j = (int)(strchr(k.c[i], '(') - k.c[i]);
        while (!kept && (j = next_ident(k.c[i], j, &len)) >= 0) {
            char opnd[128];
            snprintf(opnd, sizeof opnd, "%.*s", len, k.c[i] + j);
            j += len;
            if (k.c[i][j] == '=') continue;   /* an attribute key */
            bool is_value = false;
            for (int q = 0; q < i && !is_value; q++) {
                char d2[128];
                defined_name(k.c[q], d2, sizeof d2);
                is_value = !strcmp(d2, opnd) && strncmp(k.c[q], "dim", 3);
            }
            if (!is_value) continue;
            chunks c = copy_chunks(&k);
            free(c.c[i]);
            c.c[i] = NULL;
            for (int q = i + 1; q < c.n; q++) {
                if (!c.c[q]) continue;
                char *r = replace_ident(c.c[q], def, opnd);
                free(c.c[q]);
                c.c[q] = r;
            }
            /* "output v" of a bypassed v now names its operand: keep the output's name */
            kept = try_candidate(sh, &c, *train, best, train);
            free_chunks(&c);
        }
    }
    /* smaller dims */
    for (int i = 0; i < k.n && !kept; i++) {
        char name[128];
        long long v;
        if (sscanf(k.c[i], " dim %127s = %lld", name, &v) != 2 || v <= 1) continue;
        long long cands[3] = {1, v / 2, v - 1};
        for (int t = 0; t < 3 && !kept; t++) {
            if (cands[t] < 1 || cands[t] >= v || (t > 0 && cands[t] == cands[t - 1])) continue;
            chunks c = copy_chunks(&k);
            free(c.c[i]);
            sbuf b = {0};
            sb_printf(&b, "dim %s = %lld", name, cands[t]);
            c.c[i] = b.s;
            kept = try_candidate(sh, &c, *train, best, train);
            free_chunks(&c);
        }
    }
    /* 16-bit dtypes -> f32, everywhere at once */
    if (!kept && tol_class(*best) != TOL_F32) {
        chunks c = copy_chunks(&k);
        for (int i = 0; i < c.n; i++) {
            if (!strncmp(c.c[i], "train", 5)) continue;
            char *r = replace_ident(c.c[i], "bf16", "f32"), *r2 = replace_ident(r, "f16", "f32");
            free(r);
            free(c.c[i]);
            c.c[i] = r2;
        }
        kept = try_candidate(sh, &c, *train, best, train);
        free_chunks(&c);
    }
    /* train block lines, then the block */
    for (int i = 0; i < k.n && !kept; i++) {
        if (strncmp(k.c[i], "train", 5)) continue;
        chunks lines = split_chunks(k.c[i]);
        for (int l = 1; l + 1 < lines.n && !kept; l++) {
            sbuf b = {0};
            for (int q = 0; q < lines.n; q++)
                if (q != l) sb_printf(&b, "%s%s", q ? "\n" : "", lines.c[q]);
            chunks c = copy_chunks(&k);
            free(c.c[i]);
            c.c[i] = b.s;
            kept = try_candidate(sh, &c, *train, best, train);
            free_chunks(&c);
        }
        if (!kept) {
            chunks c = copy_chunks(&k);
            free(c.c[i]);
            c.c[i] = NULL;
            kept = try_candidate(sh, &c, *train, best, train);
            free_chunks(&c);
        }
        free_chunks(&lines);
    }
    /* train -> infer */
    if (!kept && *train) {
        chunks c = copy_chunks(&k);
        kept = try_candidate(sh, &c, false, best, train);
        free_chunks(&c);
    }
    /* drop one attribute (key=value) */
    for (int i = 0; i < k.n && !kept; i++) {
        int st[16], en[16], n = call_args(k.c[i], st, en, 16);
        for (int a = 0; a < n && !kept; a++) {
            const char *eq = memchr(k.c[i] + st[a], '=', (size_t)(en[a] - st[a]));
            if (!eq) continue;
            int from = a > 0 ? en[a - 1] : st[a], to = a > 0 ? en[a] : (a + 1 < n ? st[a + 1] : en[a]);
            sbuf b = {0};
            sb_printf(&b, "%.*s%s", from, k.c[i], k.c[i] + to);
            chunks c = copy_chunks(&k);
            free(c.c[i]);
            c.c[i] = b.s;
            kept = try_candidate(sh, &c, *train, best, train);
            free_chunks(&c);
        }
    }
    free_chunks(&k);
    return kept;
}

/* The minimal model (malloc'd); *train may become false. */
static char *shrink(const char *text, bool *train, uint64_t seed, int target, int *evals)
{
    shrinker sh = {*train, seed, target, 0, 600, now_s() + 300, ""};
    char *best = xstrdup(text);
    if (target < 0) {
        outcome o0 = check_model(text, *train, seed, -1);
        error_key(o0.msg, sh.errkey, sizeof sh.errkey);
    }
    chunks k = split_chunks(best);   /* normalize: comments and blank lines go */
    dce(&k);
    char *norm = join_chunks(&k);
    free_chunks(&k);
    outcome oc = check_model(norm, *train, seed, target);
    if ((target > 0 && oc.kind == BAD_MISMATCH && oc.target == target) ||
        (target < 0 && oc.kind == BAD_GENERATOR && strstr(oc.msg, sh.errkey))) {
        free(best);
        best = norm;
    } else {
        free(norm);
    }
    while (shrink_round(&sh, &best, train)) {}
    *evals = sh.evals;
    return best;
}

/* ========================================================================
 * The command line.
 * ======================================================================== */
static int usage(void)
{
    fprintf(stderr,
            "usage: tfuse_difftest [--models N] [--seed S] [--mode train|infer|both] [--time-limit SEC]\n"
            "                      [--verbose] [--print SEED] [--file MODEL.ir ...] [--no-shrink]\n");
    return 2;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-') return false;
    char *e;
    errno = 0;
    unsigned long long v = strtoull(s, &e, 10);
    if (*e || errno) return false;
    *out = v;
    return true;
}

typedef struct stats {
    int models, train, infer, agree, mismatches, generator_bugs, reference_errors;
} stats;

/* Check one model, report and shrink a failure. Returns true when it agrees. */
static bool run_one(const char *label, const char *text, bool train, uint64_t seed, bool do_shrink, stats *st)
{
    st->models++;
    if (train) st->train++;
    else st->infer++;
    double t0 = now_s();
    outcome oc = check_model(text, train, seed, -1);
    if (g_verbose)
        printf("%s (%s): %s, %d targets, %.2fs\n", label, train ? "train" : "infer",
               oc.kind == OK_AGREE ? "agree" : oc.kind == BAD_MISMATCH ? "MISMATCH" : oc.kind == BAD_GENERATOR ? "INVALID" : "REFERENCE FAILED",
               oc.ntargets, now_s() - t0);
    if (oc.kind == OK_AGREE) {
        st->agree++;
        return true;
    }
    if (oc.kind == BAD_GENERATOR || oc.kind == BAD_REFERENCE) {
        if (oc.kind == BAD_GENERATOR) st->generator_bugs++;
        else st->reference_errors++;
        printf("%s %s (%s): %s\n%s\n--- model ---\n%s-------------\n",
               oc.kind == BAD_GENERATOR ? "REJECTED:" : "REFERENCE FAILED:", label, train ? "train" : "infer",
               oc.kind == BAD_GENERATOR ? (strstr(oc.msg, ": parse: ") ? "the parser/verifier rejected the model (a generator bug)"
                                                                        : "compiling rejected a model the verifier accepted (a generator or compiler bug)")
                                        : "the interpreter failed to run the model",
               oc.msg, text);
        if (do_shrink && oc.kind == BAD_GENERATOR && strstr(oc.msg, ": compile: ")) {
            bool strain = train;
            int evals = 0;
            char *min = shrink(text, &strain, seed, -1, &evals);
            printf("shrunk in %d tries to this %s-mode model, rejected the same way:\n--- minimal model ---\n%s---------------------\n",
                   evals, strain ? "train" : "infer", min);
            free(min);
        }
        return false;
    }
    st->mismatches++;
    printf("MISMATCH %s (%s mode, seed %llu):\n%s", label, train ? "train" : "infer", (unsigned long long)seed, oc.msg);
    if (!do_shrink) {
        printf("--- model ---\n%s-------------\n", text);
        return false;
    }
    bool strain = train;
    int evals = 0;
    double t1 = now_s();
    char *min = shrink(text, &strain, seed, oc.target, &evals);
    outcome mo = check_model(min, strain, seed, -1);
    printf("shrunk in %d tries (%.1fs) to this %s-mode model (data seed %llu: tfuse_difftest --file F --mode %s --seed %llu):\n"
           "--- minimal model ---\n%s---------------------\n%s",
           evals, now_s() - t1, strain ? "train" : "infer", (unsigned long long)seed, strain ? "train" : "infer",
           (unsigned long long)seed, min, mo.msg);
    free(min);
    fflush(stdout);
    return false;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    sbuf b = {0};
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) sb_printf(&b, "%.*s", (int)n, buf);
    fclose(f);
    return b.s ? b.s : xstrdup("");
}

int main(int argc, char **argv)
{
    uint64_t models = 100, seed = 1, print_seed = 0;
    double time_limit = 0;
    int mode = 2;   /* 0 train, 1 infer, 2 both */
    bool print = false, do_shrink = true;
    const char *files[64];
    int nfiles = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--models")) { if (!parse_u64(v, &models)) return usage(); i++; }
        else if (!strcmp(a, "--seed")) { if (!parse_u64(v, &seed)) return usage(); i++; }
        else if (!strcmp(a, "--print")) { if (!parse_u64(v, &print_seed)) return usage(); print = true; i++; }
        else if (!strcmp(a, "--time-limit")) {
            char *e;
            if (!v) return usage();
            time_limit = strtod(v, &e);
            if (*e || !(time_limit > 0)) return usage();
            i++;
        } else if (!strcmp(a, "--mode")) {
            if (!v) return usage();
            if (!strcmp(v, "train")) mode = 0;
            else if (!strcmp(v, "infer")) mode = 1;
            else if (!strcmp(v, "both")) mode = 2;
            else return usage();
            i++;
        } else if (!strcmp(a, "--file")) {
            if (!v || nfiles == 64) return usage();
            files[nfiles++] = v;
            i++;
        } else if (!strcmp(a, "--verbose")) g_verbose = 1;
        else if (!strcmp(a, "--no-shrink")) do_shrink = false;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        else return usage();
    }
    if (print) {
        bool train;
        char *t = generate(print_seed, mode, &train);
        printf("# seed %llu, %s mode\n%s", (unsigned long long)print_seed, train ? "train" : "infer", t);
        free(t);
        return 0;
    }
    stats st = {0};
    double t0 = now_s();
    bool ok = true;
    if (nfiles) {
        for (int f = 0; f < nfiles; f++) {
            char *t = read_file(files[f]);
            if (!t) {
                fprintf(stderr, "tfuse_difftest: cannot read %s\n", files[f]);
                return 2;
            }
            /* a regression model may carry its data seed: a line "# seed: N" */
            uint64_t fseed = seed;
            const char *sl = strstr(t, "# seed: ");
            if (sl) fseed = strtoull(sl + 8, NULL, 10);
            for (int m = 0; m < 2; m++) {
                if (mode != 2 && mode != m) continue;
                ok &= run_one(files[f], t, m == 0, fseed, do_shrink, &st);
            }
            free(t);
        }
    } else {
        for (uint64_t i = 0; i < models; i++) {
            if (time_limit > 0 && now_s() - t0 > time_limit) break;
            bool train;
            char *t = generate(seed + i, mode, &train);
            char label[64];
            snprintf(label, sizeof label, "seed %llu", (unsigned long long)(seed + i));
            ok &= run_one(label, t, train, seed + i, do_shrink, &st);
            free(t);
            fflush(stdout);
        }
    }
    double el = now_s() - t0;
    printf("difftest: %d models (%d train, %d infer) in %.1fs (%.1f models/s): %d agree, %d mismatches, "
           "%d rejected models, %d reference failures\n",
           st.models, st.train, st.infer, el, el > 0 ? st.models / el : 0.0, st.agree, st.mismatches, st.generator_bugs,
           st.reference_errors);
    return ok ? 0 : 1;
}
