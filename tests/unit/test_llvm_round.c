/* test_llvm_round.c — the emitter's inline f16/bf16 rounding (codegen/llvm.c
 * round_ieee, f_to_half) against tf_dtype_round, bit for bit, on doubles
 * chosen to hit every case: ties at the format's last bit (both parities),
 * a double ulp either side of them, the subnormal range and its ties, the
 * smallest normal, the overflow threshold and its neighbours, zeros,
 * infinities, NaNs (signs and payloads), double subnormals and extremes,
 * plus random bit patterns. A kernel cast(x: f64 -> f16/bf16 -> f64) is
 * JIT-compiled; its f64 output must equal tf_dtype_round's bits and its
 * 16-bit output tf_elem_store's. One differing bit fails the test. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "interp.h"
#include "kernel.h"
#include "llvm.h"
#include "parser.h"
#include "passes.h"

static double from_bits(uint64_t u) { double v; memcpy(&v, &u, 8); return v; }
static uint64_t to_bits(double v) { uint64_t u; memcpy(&u, &v, 8); return u; }

static uint64_t rng = 0x9E3779B97F4A7C15u;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* The interesting doubles for a format with mbits mantissa bits and
 * exponents [emin, emax]; both signs. */
static int64_t fill(double *x, int64_t cap, int mbits, int emin, int emax)
{
    int64_t n = 0;
#define PUT(v) do { if (n + 2 <= cap) { double v_ = (v); x[n++] = v_; x[n++] = -v_; } } while (0)
    int drop = 52 - mbits;
    double maxv = ldexp(2.0 - ldexp(1.0, -mbits), emax), thr = ldexp(2.0 - ldexp(1.0, -(mbits + 1)), emax);
    double specials[] = {0.0, INFINITY, NAN, DBL_MAX, DBL_MIN, from_bits(1), from_bits(0x000FFFFFFFFFFFFFu), maxv, thr,
                         ldexp(1.0, emax + 1), ldexp(1.0, emin), ldexp(1.0, emin - mbits), ldexp(1.0, emin - mbits - 1),
                         ldexp(3.0, emin - mbits - 1), 1.0, 1.0 / 3, 65504, 65519, 65520, 1e300, 1e-300};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) {
        double s = specials[i];
        PUT(s);
        if (isfinite(s) && s != 0) {
            PUT(nextafter(s, 0));
            PUT(nextafter(s, INFINITY));
        }
    }
    /* NaNs with payloads (quiet and signalling patterns) */
    uint64_t nans[] = {0x7FF8000000000000u, 0x7FF0000000000001u, 0x7FFFFFFFFFFFFFFFu, 0x7FF4000000000000u, 0x7FFC00000000BEEFu};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) PUT(from_bits(nans[i]));
    /* ties and near-ties at the last mantissa bit, every exponent of the
     * format's normal range and a few outside it */
    for (int e = emin - mbits - 3; e <= emax + 2; e++) {
        for (int k = 0; k < 6; k++) {
            uint64_t mant = next() & ((1ull << 52) - 1);
            uint64_t tie = (mant & ~((1ull << drop) - 1)) | (1ull << (drop - 1));   /* exactly half an ulp */
            if (k == 1) tie |= 1ull << drop;                                        /* the other parity */
            if (k == 2) tie = (1ull << 52) - (1ull << (drop - 1));                  /* rounds up into the next binade */
            if (k == 3) tie = mant;
            if (k == 4) tie = 1ull << (drop - 1);
            if (k == 5) tie = (1ull << drop) | (1ull << (drop - 1));
            if (e + 1023 < 1 || e + 1023 > 2046) continue;
            double v = from_bits(((uint64_t)(e + 1023) << 52) | tie);
            PUT(v);
            PUT(nextafter(v, 0));
            PUT(nextafter(v, INFINITY));
        }
    }
    /* subnormal ties: odd multiples of half the quantum */
    double q = ldexp(1.0, emin - mbits);
    for (int k = 0; k < (1 << mbits) * 2 + 4; k += (k < 64 ? 1 : 7)) {
        double v = (k + 0.5) * q;
        PUT(v);
        PUT(nextafter(v, 0));
        PUT(nextafter(v, INFINITY));
        PUT(k * q);
    }
    /* random doubles: raw bit patterns, and values spread over the format's range */
    while (n + 4 <= cap) {
        PUT(from_bits(next()));
        int e = emin - mbits - 4 + (int)(next() % (uint64_t)(emax - emin + mbits + 8));
        PUT(ldexp(1.0 + (double)(next() >> 11) * 0x1p-53, e));
    }
#undef PUT
    return n;
}

static void check_format(tf_dt dt, const char *name, int mbits, int emin, int emax)
{
    enum { N = 200000 };
    char text[256];
    snprintf(text, sizeof text, "input x : f64[%d]\nh = cast(x, to=%s)\ny = cast(h, to=f64)\noutput y\noutput h\n", N, name);
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(name, text, strlen(text), NULL, 0, &m, &d)) {
        CHECK(0, "%s: %s", name, d.msg);
        return;
    }
    tf_options o = {.mode = TF_IR_INFER, .diag = &d};
    tf_kernel_plan plan = {0};
    tf_jit *jit = NULL;
    if (tf_run_pipeline(m, NULL, &o) || tf_kernels_build(m, &plan, &d) || tf_jit_create(&jit, &d)) {
        CHECK(0, "%s: %s", name, d.msg);
        tf_kernels_free(&plan);
        tf_module_free(m);
        return;
    }
    double *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint16_t *h = malloc(N * sizeof *h);
    int64_t n = fill(x, N, mbits, emin, emax);
    for (int64_t i = n; i < N; i++) x[i] = x[i % n];
    int compiled = 0;
    for (int i = 0; i < plan.nkernels; i++) {
        const tf_kernel *k = &plan.kernels[i];
        if (k->kind != TF_K_ELEMENTWISE) continue;
        tf_kernel_fn fn = NULL;
        tf_jit_code *code = NULL;
        tf_diag cd = {0};
        if (tf_jit_compile(jit, k, &fn, &code, &cd)) {
            CHECK(0, "%s: %s: %s", name, k->name, cd.msg);
            continue;
        }
        compiled++;
        void *bufs[8] = {0};
        bool ok = k->nbufs <= 8;
        for (int b = 0; ok && b < k->nbufs; b++) {
            const tf_value *v = k->bufs[b].value;
            if (v->type.dtype == TF_DT_F64 && !k->bufs[b].written) bufs[b] = x;
            else if (v->type.dtype == TF_DT_F64) bufs[b] = y;
            else if (v->type.dtype == dt) bufs[b] = h;
            else ok = false;
        }
        CHECK(ok, "%s: kernel %s has unexpected buffers", name, k->name);
        memset(y, 0x5A, N * sizeof *y);
        memset(h, 0x5A, N * sizeof *h);
        if (ok) fn(bufs, 0, k->dims[0] > 0 && tf_kernel_split_axis(k) >= 0 ? k->dims[tf_kernel_split_axis(k)] : 1, NULL);
        int bad = 0;
        for (int b = 0; ok && b < k->nbufs; b++) {
            if (!k->bufs[b].written) continue;
            for (int64_t j = 0; j < N; j++) {
                double want = tf_dtype_round(dt, x[j]);
                if (bufs[b] == y) {
                    if (to_bits(y[j]) != to_bits(want) && bad++ < 10)
                        fprintf(stderr, "%s: round(%a [%016llx]) = %a [%016llx], want %a [%016llx]\n", name, x[j],
                                (unsigned long long)to_bits(x[j]), y[j], (unsigned long long)to_bits(y[j]), want,
                                (unsigned long long)to_bits(want));
                } else {
                    uint16_t w;
                    tf_elem_store(dt, &w, 0, x[j]);
                    if (h[j] != w && bad++ < 10)
                        fprintf(stderr, "%s: store(%a) = %04x, want %04x\n", name, x[j], h[j], w);
                }
            }
        }
        CHECK(bad == 0, "%s: %s: %d values differ from tf_dtype_round", name, k->name, bad);
        tf_diag rd = {0};
        CHECK(!tf_jit_release(jit, code, &rd), "%s: release: %s", name, rd.msg);
    }
    CHECK(compiled > 0, "%s: a kernel compiled", name);
    printf("%s: %lld distinct test doubles (of %d), %d kernel(s)\n", name, (long long)n, N, compiled);
    free(x), free(y), free(h);
    tf_jit_free(jit);
    tf_kernels_free(&plan);
    tf_module_free(m);
}

int main(void)
{
    check_format(TF_DT_BF16, "bf16", 7, -126, 127);
    check_format(TF_DT_F16, "f16", 10, -14, 15);
    return check_report();
}
