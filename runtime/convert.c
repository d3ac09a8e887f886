/* convert.c — element conversion between doubles and storage dtypes. */
#include <math.h>
#include <string.h>

#include "runtime.h"

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

double tf_view_element(const tf_tensor_view *v, int64_t i)
{
    if (!v || !v->data || v->rank < 0 || v->rank > 8 || i < 0 || (unsigned)v->dtype > TF_DTYPE_BOOL) return NAN;
    int64_t n = 1;
    for (int k = 0; k < v->rank; k++) n *= v->shape[k];
    return i < n ? tf_elem_load((tf_dt)v->dtype, v->data, i) : NAN;
}
