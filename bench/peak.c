/* peak.c — this machine's fp32 FMA peak, the ceiling bench/run.sh holds each
 * GEMM- and conv-bound step's GFLOP/s against.
 *
 *   cc -O3 -pthread bench/peak.c -o peak && ./peak [THREADS]
 *
 * Each thread runs a loop of fused multiply-adds on independent vector
 * accumulators (enough to cover the FMA units' latency), with the widest
 * vectors the CPU has (AVX-512, else AVX2 + FMA, else scalar C), for a
 * fixed count, timed by the thread's own CPU clock (so that other work on a
 * shared machine slows the run but not the rate), and the best of five runs
 * is kept; the threads' rates add up. Prints `key: value` lines:
 * peak_gflops (all threads), peak_gflops_per_thread, isa, threads. Two
 * floating-point operations per multiply-add, as tfuse's step_flops counts. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { ITERS = 20000000, ACC = 12 };

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static volatile float g_sink;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static double run_avx512(long n)
{
    __m512 a[ACC], x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < n; k++)
#pragma GCC unroll 16   /* the accumulators in registers, not on the stack */
        for (int i = 0; i < ACC; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
    float s = 0;
    for (int i = 0; i < ACC; i++) s += _mm512_reduce_add_ps(a[i]);
    g_sink = s;
    return 2.0 * 16 * ACC * (double)n;
}

__attribute__((target("avx2,fma"))) static double run_avx2(long n)
{
    __m256 a[ACC], x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < ACC; i++) a[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < n; k++)
#pragma GCC unroll 16
        for (int i = 0; i < ACC; i++) a[i] = _mm256_fmadd_ps(a[i], x, y);
    float s = 0, v[8];
    for (int i = 0; i < ACC; i++) {
        _mm256_storeu_ps(v, a[i]);
        for (int j = 0; j < 8; j++) s += v[j];
    }
    g_sink = s;
    return 2.0 * 8 * ACC * (double)n;
}
#endif

static double run_scalar(long n)
{
    float a[ACC], x = 0.999999f, y = 1e-7f, s = 0;
    for (int i = 0; i < ACC; i++) a[i] = (float)i;
    for (long k = 0; k < n; k++)
#pragma GCC unroll 16
        for (int i = 0; i < ACC; i++) a[i] = a[i] * x + y;
    for (int i = 0; i < ACC; i++) s += a[i];
    g_sink = s;
    return 2.0 * ACC * (double)n;
}

typedef struct job { int isa; double flops, secs; } job;

static void *worker(void *arg)
{
    job *j = arg;
    double t0 = now_s();
#if defined(__x86_64__)
    if (j->isa == 2) j->flops = run_avx512(ITERS / 4);
    else if (j->isa == 1) j->flops = run_avx2(ITERS / 4);
    else
#endif
        j->flops = run_scalar(ITERS / 4);
    j->secs = now_s() - t0;
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > 1024) {
        fprintf(stderr, "usage: peak [THREADS]  (1 to 1024)\n");
        return 2;
    }
    int isa = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) isa = 2;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isa = 1;
#endif
    static const char *names[] = {"scalar", "avx2+fma", "avx512f"};
    job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    if (!jobs || !tid) return 1;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        for (int t = 0; t < threads; t++) {
            jobs[t].isa = isa;
            if (pthread_create(&tid[t], NULL, worker, &jobs[t])) return 1;
        }
        double rate = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            rate += jobs[t].flops / jobs[t].secs;
        }
        if (rate > best) best = rate;
    }
    printf("isa: %s\nthreads: %d\npeak_gflops: %.1f\npeak_gflops_per_thread: %.1f\n", names[isa], threads, best * 1e-9,
           best * 1e-9 / threads);
    free(jobs);
    free(tid);
    return 0;
}
