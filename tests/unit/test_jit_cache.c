/* test_jit_cache.c — a process that compiles model after model stays
 * bounded: the cpu target's JIT cache gives back the code of kernels no
 * session holds beyond its limit (TF_JIT_CACHE_KERNELS, set small here).
 *
 * Every JIT-compiled module costs the process memory mappings, and a process
 * has at most vm.max_map_count of them (65530 by default): before the limit,
 * a long tfuse_difftest run failed after about 10000 models with "JIT
 * session error: Cannot allocate memory". Here 300 programs of distinct
 * kernels are compiled and run one after another; the mappings the process
 * gains must stay far below one set per kernel, each program must still
 * compute the right numbers, and a kernel still held by a live session must
 * keep working while others are evicted. Linux only (/proc/self/maps); the
 * test says so and passes elsewhere or without LLVM. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime.h"
#include "tfuse.h"

static long count_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    long n = 0;
    int ch;
    while ((ch = fgetc(f)) != EOF) n += ch == '\n';
    fclose(f);
    return n;
}

/* y = exp(x * a + 1) over f32[n]: one kernel whose key differs by n. */
static tf_session_t *make(tf_context_t *ctx, int n, double a, tf_program_t **p, tf_model_t **m)
{
    char text[256];
    snprintf(text, sizeof text, "input x : f32[%d]\nh = mul(x, %.17g)\ng = add(h, 1.0)\ny = exp(g)\noutput y\n", n, a);
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = TF_TARGET_CPU;
    o.threads = 1;
    tf_session_t *s = NULL;
    if (tf_model_parse_string(ctx, "cache.ir", text, strlen(text), NULL, 0, m) || tf_program_compile(ctx, *m, &o, p) ||
        tf_session_create(ctx, *p, TF_TARGET_CPU, 1, &s)) {
        CHECK(0, "program %d: %s", n, tf_context_last_error(ctx));
        return NULL;
    }
    return s;
}

static bool run_check(tf_context_t *ctx, tf_session_t *s, int n, double a)
{
    float x[512];
    for (int i = 0; i < n; i++) x[i] = (float)i / (float)n - 0.5f;
    int64_t shape[1] = {n};
    tf_tensor_view y;
    if (tf_session_bind(s, "x", TF_DTYPE_F32, shape, 1, x) || tf_session_run(s) || tf_session_output(s, "y", &y)) {
        CHECK(0, "program %d: run: %s", n, tf_context_last_error(ctx));
        return false;
    }
    for (int i = 0; i < n; i++) {
        double want = exp((double)(float)((double)x[i] * (float)a) + 1.0);
        if (fabs(((float *)y.data)[i] - want) > 1e-5 * want) {
            CHECK(0, "program %d: y[%d] = %g, want %g", n, i, ((float *)y.data)[i], want);
            return false;
        }
    }
    return true;
}

int main(void)
{
    if (tf_backend_cpu.unavailable()) {
        printf("jit_cache: no cpu target in this build (no LLVM); nothing to check\n");
        return check_report();
    }
    if (count_maps() < 0) {
        printf("jit_cache: no /proc/self/maps here; nothing to check\n");
        return check_report();
    }
    setenv("TFUSE_JIT_CACHE_KERNELS", "8", 1);
    tf_context_t *ctx;
    tf_context_create(&ctx);
    /* a session that stays alive through the whole churn */
    tf_program_t *kp = NULL;
    tf_model_t *km = NULL;
    tf_session_t *keep = make(ctx, 7, 0.75, &kp, &km);
    CHECK(keep && run_check(ctx, keep, 7, 0.75), "the long-lived session runs");
    /* warm up what every JIT compile allocates once */
    for (int n = 8; n < 40; n++) {
        tf_program_t *p = NULL;
        tf_model_t *m = NULL;
        tf_session_t *s = make(ctx, n, 0.5, &p, &m);
        if (s) run_check(ctx, s, n, 0.5);
        tf_session_free(s);
        tf_program_free(p);
        tf_model_free(m);
    }
    long before = count_maps();
    int ran = 0;
    for (int n = 40; n < 340; n++) {
        tf_program_t *p = NULL;
        tf_model_t *m = NULL;
        tf_session_t *s = make(ctx, n, 0.5, &p, &m);
        ran += s && run_check(ctx, s, n, 0.5);
        tf_session_free(s);
        tf_program_free(p);
        tf_model_free(m);
    }
    long after = count_maps();
    printf("jit_cache: %d programs of distinct kernels compiled and run; the process's mappings went %ld -> %ld\n", ran,
           before, after);
    CHECK(ran == 300, "every program ran right (%d of 300)", ran);
    /* one kernel each: without eviction the process gains a few mappings
     * per kernel (300 kernels: several hundred); with 8 kept, a handful */
    CHECK(after - before < 150, "the mappings stay bounded: %ld gained over 300 kernels", after - before);
    CHECK(keep && run_check(ctx, keep, 7, 0.75), "the long-lived session's kernel survived the evictions");
    tf_session_free(keep);
    tf_program_free(kp);
    tf_model_free(km);
    tf_context_free(ctx);
    return check_report();
}
