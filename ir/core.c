/* core.c — diagnostics, dtypes and shape helpers. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

tf_ir_status tf_diag_error(tf_diag *d, tf_ir_status st, const tf_loc *loc, const char *fmt, ...)
{
    if (!d || d->status != TF_IR_OK) return d ? d->status : st;
    d->status = st;
    int k = 0;
    /* a very long path keeps its tail, so the location survives */
    const char *file = loc && loc->file ? loc->file : "<input>";
    size_t flen = strlen(file);
    const char *ell = flen > 4096 ? "..." : "";
    if (flen > 4096) file += flen - 4096;
    if (loc && loc->line > 0)
        k = snprintf(d->msg, sizeof d->msg, "%s%s:%d:%d: error: ", ell, file, loc->line, loc->col);
    else if (loc && loc->file)
        k = snprintf(d->msg, sizeof d->msg, "%s%s: error: ", ell, file);
    else
        k = snprintf(d->msg, sizeof d->msg, "error: ");
    if (k < 0 || (size_t)k >= sizeof d->msg) k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->msg + k, sizeof d->msg - (size_t)k, fmt, ap);
    va_end(ap);
    return st;
}

void tf_diag_clear(tf_diag *d)
{
    d->status = TF_IR_OK;
    d->msg[0] = 0;
}

static const struct { const char *name; int bytes; bool fl; } dt_info[TF_DT_COUNT] = {
#define X(e, n, b, f) [TF_DT_##e] = {n, b, f},
    TF_DTYPES(X)
#undef X
};

const char *tf_dtype_name(tf_dt t) { return (unsigned)t < TF_DT_COUNT ? dt_info[t].name : "?"; }
int tf_dtype_bytes(tf_dt t) { return (unsigned)t < TF_DT_COUNT ? dt_info[t].bytes : 0; }
bool tf_dtype_is_float(tf_dt t) { return (unsigned)t < TF_DT_COUNT && dt_info[t].fl; }

bool tf_dtype_from_name(const char *s, size_t n, tf_dt *out)
{
    for (int i = 0; i < TF_DT_COUNT; i++)
        if (strlen(dt_info[i].name) == n && memcmp(dt_info[i].name, s, n) == 0) {
            *out = (tf_dt)i;
            return true;
        }
    return false;
}

/* Round to a float format with `mbits` explicit mantissa bits and exponent
 * range [emin, emax] (IEEE, round to nearest even, subnormals, overflow to inf). */
static double round_ieee(double v, int mbits, int emin, int emax)
{
    if (v != v || isinf(v) || v == 0) return v;
    int e;
    frexp(v, &e);                     /* v = f * 2^e, 0.5 <= |f| < 1 */
    int exp = e - 1;                  /* v = 1.xxx * 2^exp */
    if (exp < emin) exp = emin;       /* subnormal: fixed quantum */
    double q = ldexp(1.0, exp - mbits);
    double r = nearbyint(v / q) * q;  /* default rounding mode: nearest even */
    double maxv = ldexp(2.0 - ldexp(1.0, -mbits), emax);
    if (fabs(r) > maxv) return v > 0 ? INFINITY : -INFINITY;
    return r;
}

const double tf_exp_coeffs[TF_EXP_DEGREE + 1] = {
    1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320, 1.0 / 362880,
    1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800.0,
};

static double pow2i(int64_t k)   /* 2^k for k in [-1022, 1023] */
{
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* The emitter repeats these steps in this order (codegen/llvm.c emit_exp):
 * change one, change both. */
double tf_exp(double x)
{
    double xc = x > 710.0 ? 710.0 : x;
    xc = xc < -746.0 ? -746.0 : xc;
    double n = nearbyint(xc * TF_EXP_LOG2E);
    double r = (xc - n * TF_EXP_LN2_HI) - n * TF_EXP_LN2_LO;
    double p = tf_exp_coeffs[TF_EXP_DEGREE];
    for (int i = TF_EXP_DEGREE - 1; i >= 0; i--) p = p * r + tf_exp_coeffs[i];
    int64_t k = (int64_t)n, k1 = k / 2, k2 = k - k1;
    double v = p * pow2i(k1) * pow2i(k2);
    if (x > TF_EXP_OVER) v = INFINITY;
    if (x < TF_EXP_UNDER) v = 0.0;
    return x != x ? x : v;
}

double tf_expm1(double x)
{
    double q = tf_exp_coeffs[TF_EXP_DEGREE];
    for (int i = TF_EXP_DEGREE - 1; i >= 1; i--) q = q * x + tf_exp_coeffs[i];
    q = q * x;
    return fabs(x) < TF_EXPM1_SMALL ? q : tf_exp(x) - 1.0;
}

double tf_tanh(double x)
{
    double t = tf_expm1(-2.0 * fabs(x));
    return copysign(-t / (2.0 + t), x);
}

/* Room for n more bytes and a NUL; false (and oom) when out of memory. */
static bool strbuf_reserve(tf_strbuf *s, size_t n)
{
    if (s->oom) return false;
    if (s->n + n + 1 <= s->cap) return true;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->n + n + 1) cap *= 2;
    char *q = tf_realloc(s->p, cap);
    if (!q) {
        s->oom = true;
        return false;
    }
    s->p = q, s->cap = cap;
    return true;
}

/* Formatted once into the room left, and again only when it did not fit:
 * printf is slow in a process where a library registered printf hooks
 * (libquadmath, which OpenBLAS brings, makes glibc take its positional
 * path for every call), and the emitters write megabytes through here. */
void tf_strbuf_vprintf(tf_strbuf *s, const char *fmt, va_list ap)
{
    if (s->oom) return;
    va_list again;
    va_copy(again, ap);
    size_t room = s->cap - s->n;
    int k = vsnprintf(room ? s->p + s->n : NULL, room, fmt, ap);
    if (k < 0) s->oom = true;
    else if ((size_t)k >= room && strbuf_reserve(s, (size_t)k)) vsnprintf(s->p + s->n, s->cap - s->n, fmt, again);
    if (!s->oom) s->n += (size_t)k;
    va_end(again);
}

void tf_strbuf_append(tf_strbuf *s, const char *p, size_t n)
{
    if (!strbuf_reserve(s, n)) return;
    memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = 0;
}

void tf_strbuf_printf(tf_strbuf *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tf_strbuf_vprintf(s, fmt, ap);
    va_end(ap);
}

double tf_lanes_sum(const double *l)
{
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

double tf_lanes_max(const double *l)
{
    double a = tf_max_step(tf_max_step(l[0], l[1]), tf_max_step(l[2], l[3]));
    double b = tf_max_step(tf_max_step(l[4], l[5]), tf_max_step(l[6], l[7]));
    return tf_max_step(a, b);
}

double tf_dtype_round(tf_dt t, double v)
{
    switch (t) {
    case TF_DT_F32: return (double)(float)v;
    case TF_DT_F64: return v;
    case TF_DT_F16: return round_ieee(v, 10, -14, 15);
    case TF_DT_BF16: return round_ieee(v, 7, -126, 127);
    case TF_DT_BOOL: return v != 0 ? 1.0 : 0.0;
    case TF_DT_I32:
        if (v != v) return 0;
        v = trunc(v);
        return v > 2147483647.0 ? 2147483647.0 : v < -2147483648.0 ? -2147483648.0 : v;
    case TF_DT_I64:
        if (v != v) return 0;
        v = trunc(v);
        return v > 9.2e18 ? 9.2e18 : v < -9.2e18 ? -9.2e18 : v;
    default: return v;
    }
}

int64_t tf_type_numel(const tf_type *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->dims[i].n <= 0) return 0;
        if (n > TF_MAX_NUMEL / t->dims[i].n) return -1;   /* overflow: callers report it */
        n *= t->dims[i].n;
    }
    return n;
}

bool tf_type_same_shape(const tf_type *a, const tf_type *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i].n != b->dims[i].n) return false;
    return true;
}

bool tf_type_equal(const tf_type *a, const tf_type *b) { return a->dtype == b->dtype && tf_type_same_shape(a, b); }

bool tf_place_result(int rank, const int64_t *dims, unsigned reduce_mask, const tf_type *t, int8_t *axis)
{
    if (t->rank == rank) {
        for (int j = 0; j < rank; j++) {
            if (t->dims[j].n != 1 && t->dims[j].n != dims[j]) return false;
            axis[j] = t->dims[j].n == 1 ? -1 : (int8_t)j;
        }
        return true;
    }
    if (!reduce_mask) return false;
    int j = 0;
    for (int i = 0; i < rank; i++) {
        if ((reduce_mask >> i) & 1) continue;
        if (j >= t->rank || t->dims[j].n != dims[i]) return false;
        axis[j] = dims[i] == 1 ? -1 : (int8_t)i;
        j++;
    }
    return j == t->rank;
}

bool tf_place_operand(const int64_t *dims, const int8_t *res, int rrank, const tf_type *v, bool leading, int8_t *axis)
{
    if (v->rank > rrank) return false;
    for (int j = 0; j < v->rank; j++) {
        int o = leading ? j : rrank - v->rank + j;
        if (v->dims[j].n == 1) {
            axis[j] = -1;
            continue;
        }
        int a = res[o];
        if (a < 0 || dims[a] != v->dims[j].n) return false;
        axis[j] = (int8_t)a;
    }
    return true;
}

/* ---- elements in storage dtype ---- */

static double half_to_double(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, f = h & 1023;
    double v;
    if (e == 0) v = ldexp(f, -24);
    else if (e == 31) v = f ? NAN : INFINITY;
    else v = ldexp(f + 1024, e - 25);
    return s ? -v : v;
}

static uint16_t double_to_half(double v)
{
    /* v is first rounded to an f16 value by tf_dtype_round, so this is exact */
    v = tf_dtype_round(TF_DT_F16, v);
    uint16_t s = signbit(v) ? 0x8000 : 0;
    v = fabs(v);
    if (isnan(v)) return 0x7e00;
    if (isinf(v)) return s | 0x7c00;
    if (v == 0) return s;
    int e;
    double f = frexp(v, &e);          /* v = f * 2^e, f in [0.5, 1) */
    if (e - 1 < -14) return s | (uint16_t)llround(ldexp(v, 24));   /* subnormal */
    return s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(llround(ldexp(f, 11)) - 1024);
}

static double bf16_to_double(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t double_to_bf16(double v)
{
    float f = (float)tf_dtype_round(TF_DT_BF16, v);   /* exact in f32 */
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f)) return 0x7fc0;
    return (uint16_t)(u >> 16);
}

double tf_elem_load(tf_dt t, const void *base, int64_t i)
{
    switch (t) {
    case TF_DT_F32: { float x; memcpy(&x, (const char *)base + 4 * i, 4); return x; }
    case TF_DT_F64: { double x; memcpy(&x, (const char *)base + 8 * i, 8); return x; }
    case TF_DT_F16: { uint16_t x; memcpy(&x, (const char *)base + 2 * i, 2); return half_to_double(x); }
    case TF_DT_BF16: { uint16_t x; memcpy(&x, (const char *)base + 2 * i, 2); return bf16_to_double(x); }
    case TF_DT_I64: { int64_t x; memcpy(&x, (const char *)base + 8 * i, 8); return (double)x; }
    case TF_DT_I32: { int32_t x; memcpy(&x, (const char *)base + 4 * i, 4); return x; }
    case TF_DT_BOOL: return ((const unsigned char *)base)[i] != 0;
    default: return 0;
    }
}

void tf_elem_store(tf_dt t, void *base, int64_t i, double v)
{
    switch (t) {
    case TF_DT_F32: { float x = (float)v; memcpy((char *)base + 4 * i, &x, 4); break; }
    case TF_DT_F64: memcpy((char *)base + 8 * i, &v, 8); break;
    case TF_DT_F16: { uint16_t x = double_to_half(v); memcpy((char *)base + 2 * i, &x, 2); break; }
    case TF_DT_BF16: { uint16_t x = double_to_bf16(v); memcpy((char *)base + 2 * i, &x, 2); break; }
    case TF_DT_I64: { int64_t x = (int64_t)tf_dtype_round(TF_DT_I64, v); memcpy((char *)base + 8 * i, &x, 8); break; }
    case TF_DT_I32: { int32_t x = (int32_t)tf_dtype_round(TF_DT_I32, v); memcpy((char *)base + 4 * i, &x, 4); break; }
    case TF_DT_BOOL: ((unsigned char *)base)[i] = v != 0; break;
    default: break;
    }
}

bool tf_parse_bytes(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return false;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : *end == 'T' ? 40 : 0;
    if (shift) end++;
    if (errno || *end || v == 0 || v > (1ull << (62 - shift))) return false;
    *out = (int64_t)(v << shift);
    return true;
}
