/* gemm_libs.c — how fast the two CPU GEMM libraries tfuse can reach run the
 * bench models' f32 GEMMs: OpenBLAS's cblas_sgemm (what tf_cpu_gemm calls
 * today) against oneDNN's matmul primitive, with the weights in the row-major
 * layout tfuse stores and prepacked into oneDNN's own blocked layout (what an
 * inference session could do once per session).
 *
 *   cc -O2 -fopenmp bench/gemm_libs.c -o gemm_libs -lopenblas -ldnnl -lpthread && OMP_NUM_THREADS=1 ./gemm_libs
 *
 * Two measurements per shape, the libraries interleaved in every repetition:
 *   1 thread: the thread's CPU clock, best of the repetitions (load on a shared
 *             machine slows a run but does not skew the rate);
 *   2 threads: wall clock, the GEMM's rows cut into 4 pieces shared by two
 *             threads as tf_cpu_gemm cuts them, the caches flushed (64 MiB
 *             touched) before each repetition so that operands come from
 *             memory as in a model's step; median and best.
 * oneDNN is held at one OpenMP thread per call, as runtime/cpu/conv_dnnl.c
 * holds it. GF/s count two operations per multiply-add. */
#define _GNU_SOURCE
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void openblas_set_num_threads(int num_threads);

enum { PIECES = 4, REPS1 = 9, REPS2 = 25, LIBS = 3 };
static const char *lib_name[LIBS] = {"openblas", "onednn", "onednn-packed"};

static double clock_ms(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void check(dnnl_status_t st, const char *what)
{
    if (st == dnnl_success) return;
    fprintf(stderr, "gemm_libs: oneDNN: %s failed (status %d)\n", what, (int)st);
    exit(1);
}

typedef struct shape { const char *what; int M, N, K, ta, tb; } shape;

/* one GEMM of m rows: a primitive for each oneDNN variant, memory objects per piece */
typedef struct gemm {
    shape s;
    int m;   /* rows per piece */
    float *A, *B, *Bp, *C;
    dnnl_primitive_t prim[2];   /* plain weights, prepacked weights */
    dnnl_memory_t a[PIECES], b[2], c[PIECES];
} gemm;

static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream[2];

static void gemm_init(gemm *g, shape s, int m)
{
    memset(g, 0, sizeof *g);
    g->s = s, g->m = m;
    g->A = malloc(sizeof(float) * (size_t)s.M * (size_t)s.K);
    g->B = malloc(sizeof(float) * (size_t)s.K * (size_t)s.N);
    g->C = malloc(sizeof(float) * (size_t)s.M * (size_t)s.N);
    if (!g->A || !g->B || !g->C) exit(1);
    for (size_t i = 0; i < (size_t)s.M * (size_t)s.K; i++) g->A[i] = (float)(rand() % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < (size_t)s.K * (size_t)s.N; i++) g->B[i] = (float)(rand() % 1000) / 1000.0f - 0.5f;
    dnnl_dims_t ad = {m, s.K}, bd = {s.K, s.N}, cd = {m, s.N};
    dnnl_dims_t as = {s.ta ? 1 : s.K, s.ta ? s.M : 1}, bs = {s.tb ? 1 : s.N, s.tb ? s.K : 1};
    dnnl_memory_desc_t am, bm, cm, bany;
    check(dnnl_memory_desc_init_by_strides(&am, 2, ad, dnnl_f32, as), "A desc");
    check(dnnl_memory_desc_init_by_strides(&bm, 2, bd, dnnl_f32, bs), "B desc");
    check(dnnl_memory_desc_init_by_tag(&cm, 2, cd, dnnl_f32, dnnl_ab), "C desc");
    check(dnnl_memory_desc_init_by_tag(&bany, 2, bd, dnnl_f32, dnnl_format_tag_any), "B any");
    for (int v = 0; v < 2; v++) {
        dnnl_matmul_desc_t d;
        dnnl_primitive_desc_t pd;
        check(dnnl_matmul_desc_init(&d, &am, v ? &bany : &bm, NULL, &cm), "matmul desc");
        check(dnnl_primitive_desc_create(&pd, &d, NULL, g_engine, NULL), "matmul pd");
        check(dnnl_primitive_create(&g->prim[v], pd), "matmul");
        const dnnl_memory_desc_t *wm = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        if (!v) {
            check(dnnl_memory_create(&g->b[0], &bm, g_engine, g->B), "B memory");
        } else {   /* reorder the weights once into the primitive's layout */
            size_t bytes = (dnnl_memory_desc_get_size(wm) + 63) / 64 * 64;
            g->Bp = aligned_alloc(64, bytes);
            dnnl_memory_t src;
            dnnl_primitive_desc_t rpd;
            dnnl_primitive_t r;
            check(dnnl_memory_create(&g->b[1], wm, g_engine, g->Bp), "packed memory");
            check(dnnl_memory_create(&src, &bm, g_engine, g->B), "B memory");
            check(dnnl_reorder_primitive_desc_create(&rpd, &bm, g_engine, wm, g_engine, NULL), "reorder pd");
            check(dnnl_primitive_create(&r, rpd), "reorder");
            dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, g->b[1]}};
            check(dnnl_primitive_execute(r, g_stream[0], 2, args), "reorder run");
            check(dnnl_stream_wait(g_stream[0]), "wait");
            dnnl_primitive_destroy(r);
            dnnl_primitive_desc_destroy(rpd);
            dnnl_memory_destroy(src);
        }
        dnnl_primitive_desc_destroy(pd);
    }
    for (int p = 0; p < s.M / m; p++) {
        const float *a = s.ta ? g->A + p * m : g->A + (size_t)p * m * s.K;
        check(dnnl_memory_create(&g->a[p], &am, g_engine, (void *)a), "A memory");
        check(dnnl_memory_create(&g->c[p], &cm, g_engine, g->C + (size_t)p * m * s.N), "C memory");
    }
}

static void gemm_piece(gemm *g, int lib, int p, int t)
{
    shape s = g->s;
    int r0 = p * g->m;
    if (lib == 0) {
        const float *a = s.ta ? g->A + r0 : g->A + (size_t)r0 * s.K;
        cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, g->m, s.N, s.K,
                    1.0f, a, s.ta ? s.M : s.K, g->B, s.tb ? s.K : s.N, 0.0f, g->C + (size_t)r0 * s.N, s.N);
        return;
    }
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, g->a[p]}, {DNNL_ARG_WEIGHTS, g->b[lib - 1]}, {DNNL_ARG_DST, g->c[p]}};
    check(dnnl_primitive_execute(g->prim[lib - 1], g_stream[t], 3, args), "matmul run");
    check(dnnl_stream_wait(g_stream[t]), "wait");
}

typedef struct job { gemm *g; int lib, t; } job;

static void *worker(void *arg)
{
    job *j = arg;
    omp_set_num_threads(1);
    for (int p = j->t; p < j->g->s.M / j->g->m; p += 2) gemm_piece(j->g, j->lib, p, j->t);
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    static const shape shapes[] = {
        {"mlp fc1 (infer/train fwd)", 128, 1024, 784, 0, 0},
        {"mlp fc2", 128, 1024, 1024, 0, 0},
        {"mlp fc2 dW = a1^T g", 1024, 1024, 128, 1, 0},
        {"gpt qkv/out proj", 1024, 256, 256, 0, 0},
        {"gpt mlp up", 1024, 1024, 256, 0, 0},
        {"gpt mlp down", 1024, 256, 1024, 0, 0},
        {"gpt head", 1024, 512, 256, 0, 0},
        {"gpt mlp down dX = g W^T", 1024, 1024, 256, 0, 1},
        {"gpt mlp up dW = x^T g", 256, 1024, 1024, 1, 0},
    };
    static char junk[64 << 20];
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
    check(dnnl_engine_create(&g_engine, dnnl_cpu, 0), "engine");
    for (int t = 0; t < 2; t++) check(dnnl_stream_create(&g_stream[t], g_engine, dnnl_stream_default_flags), "stream");
    printf("%-28s %16s | %-22s %-22s %-22s | %s\n", "GEMM", "M x N x K", "1 thread GF/s (best)", "", "",
           "2 threads, 4 pieces, cold: ms median (best)");
    printf("%-28s %16s | %-22s %-22s %-22s | %s\n", "", "", lib_name[0], lib_name[1], lib_name[2],
           "openblas / onednn / onednn-packed");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        shape s = shapes[i];
        double gf = 2.0 * s.M * s.N * s.K / 1e6, one[LIBS], two[LIBS][REPS2];
        gemm whole, cut;
        gemm_init(&whole, s, s.M);
        gemm_init(&cut, s, s.M / PIECES);
        for (int l = 0; l < LIBS; l++) one[l] = 1e30;
        for (int r = 0; r < REPS1; r++)
            for (int l = 0; l < LIBS; l++) {
                double t0 = clock_ms(CLOCK_THREAD_CPUTIME_ID);
                gemm_piece(&whole, l, 0, 0);
                double t = clock_ms(CLOCK_THREAD_CPUTIME_ID) - t0;
                if (t < one[l]) one[l] = t;
            }
        for (int r = 0; r < REPS2; r++)
            for (int l = 0; l < LIBS; l++) {
                for (size_t q = 0; q < sizeof junk; q += 64) junk[q]++;
                pthread_t th[2];
                job jobs[2] = {{&cut, l, 0}, {&cut, l, 1}};
                double t0 = clock_ms(CLOCK_MONOTONIC);
                for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, worker, &jobs[t]);
                for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
                two[l][r] = clock_ms(CLOCK_MONOTONIC) - t0;
            }
        char dims[32];
        snprintf(dims, sizeof dims, "%dx%dx%d%s%s", s.M, s.N, s.K, s.ta ? " A^T" : "", s.tb ? " B^T" : "");
        printf("%-28s %16s |", s.what, dims);
        for (int l = 0; l < LIBS; l++) printf(" %6.1f (%5.3f ms)     ", gf / one[l], one[l]);
        printf("|");
        for (int l = 0; l < LIBS; l++) {
            qsort(two[l], REPS2, sizeof(double), cmp);
            printf(" %6.3f (%5.3f)", two[l][REPS2 / 2], two[l][0]);
        }
        printf("\n");
        fflush(stdout);
    }
    return 0;
}
