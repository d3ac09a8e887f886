/* test_lowp.c — the cpu target's 16-bit float code (runtime/cpu/lowp.c):
 *
 *   - widening every f16 and bf16 pattern, and rounding a spread of f32
 *     patterns (every exponent, ties, the overflow and subnormal edges, NaN
 *     and infinities) give tf_elem_load's and tf_elem_store's bits, in the
 *     vector code this CPU runs and in the plain C one;
 *   - the bf16 GEMM (where this machine has one: tf_cpu_bf16_gemm_kind)
 *     matches a float64 sum of the same products within f32 accumulation
 *     error on odd sizes larger than its blocks, every transpose, with and
 *     without accumulate, and gives the same bits on 1 and 3 threads;
 *   - a bf16 model's matmuls (batched, broadcast, transposed) run as
 *     "gemm_bf16" on the cpu target when there is one, and match the
 *     interpreter. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/cpu_ops.h"
#include "cpu/lowp.h"
#include "ir.h"
#include "tfuse.h"

static uint32_t rng = 2463534242u;
static uint32_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return rng;
}

static bool same_f32(float a, float b)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    uint32_t x, y;
    memcpy(&x, &a, 4), memcpy(&y, &b, 4);
    return x == y;
}

static void test_widen(const char *isa)
{
    static uint16_t h[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    for (int t = 0; t < 2; t++) {
        tf_dt dt = t ? TF_DT_BF16 : TF_DT_F16;
        if (t) tf_cpu_bf16_to_f32(h, f, 65536);
        else tf_cpu_f16_to_f32(h, f, 65536);
        int bad = 0;
        for (int i = 0; i < 65536; i++)
            if (!same_f32(f[i], (float)tf_elem_load(dt, h, i)) && bad++ < 3)
                fprintf(stderr, "%s %s widen 0x%04x: %a\n", isa, tf_dtype_name(dt), i, (double)f[i]);
        CHECK(bad == 0, "%s: %d %s patterns widened wrong", isa, bad, tf_dtype_name(dt));
    }
}

enum { NPAT = 1 << 20 };

static void test_round(const char *isa)
{
    static float f[NPAT];
    static uint16_t h[NPAT], want[NPAT];
    int n = 0;
    for (uint32_t e = 0; e < 256; e++)   /* every exponent: 0, ties, just around ties, the top */
        for (uint32_t s = 0; s < 2; s++) {
            static const uint32_t mant[] = {0, 1, 0x1000, 0xfff, 0x1001, 0x3000, 0x2fff, 0x8000, 0x7fff, 0x8001, 0x18000,
                                            0x17fff, 0x7fffff, 0x7ff000, 0x7fefff, 0x400000, 0x200001};
            for (size_t m = 0; m < sizeof mant / sizeof mant[0]; m++) {
                uint32_t u = s << 31 | e << 23 | mant[m];
                memcpy(&f[n++], &u, 4);
            }
        }
    while (n < NPAT) {
        uint32_t u = next();
        memcpy(&f[n++], &u, 4);
    }
    for (int t = 0; t < 2; t++) {
        tf_dt dt = t ? TF_DT_BF16 : TF_DT_F16;
        if (t) tf_cpu_f32_to_bf16(f, h, NPAT);
        else tf_cpu_f32_to_f16(f, h, NPAT);
        for (int i = 0; i < NPAT; i++) tf_elem_store(dt, want, i, f[i]);
        int bad = 0;
        for (int i = 0; i < NPAT; i++)
            if (h[i] != want[i] && bad++ < 3)
                fprintf(stderr, "%s %s round %a: 0x%04x, want 0x%04x\n", isa, tf_dtype_name(dt), (double)f[i], h[i], want[i]);
        CHECK(bad == 0, "%s: %d f32 patterns rounded to %s wrong", isa, bad, tf_dtype_name(dt));
    }
}

static float bf(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void test_gemm(void)
{
    if (tf_cpu_bf16_gemm_kind() == TF_BF16_GEMM_NONE) {
        printf("bf16 GEMM: none here (%s); its checks skipped\n", tf_cpu_bf16_gemm_name());
        return;
    }
    printf("bf16 GEMM: %s\n", tf_cpu_bf16_gemm_name());
    tf_cpu_blas_init();
    tf_pool *p1 = tf_pool_create(1), *p3 = tf_pool_create(3);
    CHECK(p1 && p3, "pools");
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 33, 5}, {150, 290, 301}, {65, 1030, 129}, {1030, 70, 513}, {9, 31, 2}};
    for (size_t si = 0; p1 && p3 && si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        uint16_t *A = malloc((size_t)(M * K) * 2), *B = malloc((size_t)(K * N) * 2);
        float *C1 = malloc((size_t)(M * N) * 4), *C3 = malloc((size_t)(M * N) * 4), *tmp = malloc((size_t)(M * K + K * N) * 4);
        for (int64_t i = 0; i < M * K + K * N; i++) tmp[i] = (float)(next() % 20001) / 10000.0f - 1.0f;
        tf_cpu_f32_to_bf16(tmp, A, M * K);
        tf_cpu_f32_to_bf16(tmp + M * K, B, K * N);
        for (int v = 0; v < 8; v++) {
            bool ta = v & 1, tb = v & 2, acc = v & 4;
            int64_t lda = ta ? M : K, ldb = tb ? K : N;
            for (int64_t i = 0; i < M * N; i++) C1[i] = C3[i] = acc ? (float)(i % 5) - 2.0f : NAN;
            tf_cpu_gemm_bf16(p1, ta, tb, M, N, K, A, lda, B, ldb, C1, N, acc);
            tf_cpu_gemm_bf16(p3, ta, tb, M, N, K, A, lda, B, ldb, C3, N, acc);
            int bad = 0, diff = 0;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double s = acc ? (double)((i * N + j) % 5) - 2.0 : 0, mag = fabs(s);
                    for (int64_t k = 0; k < K; k++) {
                        double x = (double)bf(ta ? A[k * M + i] : A[i * K + k]) * bf(tb ? B[j * K + k] : B[k * N + j]);
                        s += x, mag += fabs(x);
                    }
                    bad += !(fabs(C1[i * N + j] - s) <= mag * (double)(K + 2) * 0x1p-24);
                    diff += memcmp(&C1[i * N + j], &C3[i * N + j], 4) != 0;
                }
            CHECK(bad == 0, "bf16 GEMM %lldx%lldx%lld ta=%d tb=%d acc=%d: %d elements off", (long long)M, (long long)N,
                  (long long)K, ta, tb, acc, bad);
            CHECK(diff == 0, "bf16 GEMM %lldx%lldx%lld ta=%d tb=%d acc=%d: %d elements differ on 1 and 3 threads",
                  (long long)M, (long long)N, (long long)K, ta, tb, acc, diff);
        }
        free(A), free(B), free(C1), free(C3), free(tmp);
    }
    tf_pool_free(p1);
    tf_pool_free(p3);
}

static const char *model =
    "input a : bf16[3, 37, 70]\n"
    "input b : bf16[70, 45]\n"
    "input c : bf16[3, 45, 70]\n"
    "input d : bf16[1, 37, 45]\n"
    "y = matmul(a, b)\n"
    "z = matmul(a, c, transpose_b=true)\n"
    "w = matmul(a, d, transpose_a=true)\n"
    "output y\noutput z\noutput w\n";

static void test_model(void)
{
    tf_context_t *ctx = NULL;
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_session_t *s[2] = {0};
    if (tf_context_create(&ctx) || tf_model_parse_string(ctx, "lowp", model, strlen(model), NULL, 0, &m)) {
        CHECK(0, "parse: %s", ctx ? tf_context_last_error(ctx) : "no context");
        return;
    }
    const char *how = NULL;
    tf_target_op_support(ctx, TF_TARGET_CPU, "matmul", &how, NULL, 0);
    if (!how) {   /* a build without LLVM has no cpu target: the conversions and the GEMM above are all there is */
        printf("lowp: no cpu target in this build (no LLVM); the model is not run\n");
        tf_model_free(m);
        tf_context_free(ctx);
        return;
    }
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    CHECK(!tf_program_compile(ctx, m, &o, &p), "compile: %s", tf_context_last_error(ctx));
    const tf_target tg[2] = {TF_TARGET_INTERP, TF_TARGET_CPU};
    for (int t = 0; p && t < 2; t++) CHECK(!tf_session_create(ctx, p, tg[t], 1, &s[t]), "session: %s", tf_context_last_error(ctx));
    static const char *in[] = {"a", "b", "c", "d"};
    static const int64_t shp[4][3] = {{3, 37, 70}, {70, 45, 0}, {3, 45, 70}, {1, 37, 45}};
    static uint16_t data[4][3 * 70 * 45];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3 * 70 * 45; j++) {
            float x = (float)(next() % 2001) / 1000.0f - 1.0f;
            tf_cpu_f32_to_bf16(&x, &data[i][j], 1);
        }
    for (int t = 0; s[1] && t < 2; t++) {
        tf_session_set_profiling(s[t], 1);
        for (int i = 0; i < 4; i++) tf_session_bind(s[t], in[i], TF_DTYPE_BF16, shp[i], shp[i][2] ? 3 : 2, data[i]);
        CHECK(!tf_session_run(s[t]), "run: %s", tf_context_last_error(ctx));
    }
    static const char *out[] = {"y", "z", "w"};
    for (int i = 0; s[1] && i < 3; i++) {
        tf_tensor_view g, w;
        CHECK(!tf_session_output(s[1], out[i], &g) && !tf_session_output(s[0], out[i], &w), "outputs");
        int bad = 0;
        int64_t numel = 1;
        for (int k = 0; k < w.rank; k++) numel *= w.shape[k];
        for (int64_t j = 0; j < numel; j++) {
            double a = tf_view_element(&g, j), b = tf_view_element(&w, j);
            bad += !(fabs(a - b) <= 0x1p-7 * (fabs(b) + 0.5));   /* one bf16 rounding of a sum of |x| <= 70 */
        }
        CHECK(bad == 0, "output %s: %d elements off the interpreter's", out[i], bad);
    }
    int bf16 = 0, gemm = 0;
    for (size_t i = 0; s[1] && i < tf_session_profile_count(s[1]); i++) {
        tf_kernel_profile kp;
        if (tf_session_profile(s[1], i, &kp)) continue;
        bf16 += !strcmp(kp.how, "gemm_bf16");
        gemm += !strcmp(kp.how, "gemm");
    }
    if (tf_cpu_bf16_gemm_kind() != TF_BF16_GEMM_NONE) CHECK(bf16 == 3 && gemm == 0, "%d gemm_bf16, %d gemm kernels", bf16, gemm);
    else CHECK(bf16 == 0 && gemm == 3, "%d gemm_bf16, %d gemm kernels", bf16, gemm);
    for (int t = 0; t < 2; t++) tf_session_free(s[t]);
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
}

int main(void)
{
    printf("conversions: %s\n", tf_cpu_lowp_isa());
    test_widen(tf_cpu_lowp_isa());
    test_round(tf_cpu_lowp_isa());
    tf_cpu_lowp_force_scalar(true);
    test_widen("scalar");
    test_round("scalar");
    tf_cpu_lowp_force_scalar(false);
    test_gemm();
    test_model();
    return check_report();
}
