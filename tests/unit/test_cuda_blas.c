/* test_cuda_blas.c — GEMM plans (runtime/cuda/blas.c) over cuda-emu's
 * driver and cuBLASLt stand-ins (tf_cuda_libs_load with
 * TF_CUDA_SEARCH_EMU: device memory, streams and events on the host, the
 * matmul computed in double): no GPU, no cuBLASLt.
 *
 *   - results: f32, f16 and bf16 operands, C of the operands' type or f32,
 *     every transpose, strided batches, odd and unit sizes, the bias and
 *     ReLU-bias epilogues, against a double reference written here. Inputs
 *     are multiples of 1/8 in [-2, 2]: every product and sum is exact in
 *     double, so the result rounded once to C's type must match the
 *     reference bit for bit, whichever algorithm the plan chose;
 *   - the choice: every usable candidate of the heuristic is timed (the
 *     matmuls counted, and one candidate made the fastest by slowing the
 *     others down: a spin queued on the stream before each of their
 *     matmuls, inside the events that time it) and the fastest is taken; candidates needing workspace
 *     are left out when the limit or the buffer says so;
 *   - the algorithm cache on disk: a second plan reads it and times
 *     nothing; a flipped byte, a truncated file, garbage or an empty file is
 *     ignored, timed again and rewritten; an algorithm
 *     cublasLtMatmulAlgoCheck refuses, or one the heuristic no longer lists,
 *     is timed again; shapes, transposes, types, epilogues, TF32, batches,
 *     alignments, the workspace limit and the GPU are all in the key (and
 *     TF32 is not, for 16-bit operands, where it changes nothing); no
 *     temporary file is left; the default place is $TFUSE_CACHE_DIR/cuda;
 *     nothing to time on means the heuristic's first, untimed, not written;
 *   - the stand-in itself: its candidates' tags, its workspace, its
 *     argument checks;
 *   - refusals with a reason. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "check.h"
#include "emu.h"
#include "ir.h"
#include "testutil.h"

static tf_cuda_libs g_libs;
static tf_cublaslt_api g_emu;   /* the stand-in's own functions, under the wrappers */
static tf_cublaslt_handle g_h;
static tf_cu_stream g_stream;
static uint64_t g_rng;

/* ---- the wrappers: matmuls counted, candidates slowed, checks refused, the heuristic trimmed ---- */

static int g_matmuls;                 /* Matmul calls */
static unsigned long long g_fast;     /* when set: every other algorithm spins g_slow_ms per call */
static double g_slow_ms = 15;
static bool g_refuse_check;           /* MatmulAlgoCheck refuses everything */
static unsigned long long g_unlisted; /* the heuristic leaves this tag out */

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* A slower algorithm: work on the stream (where the events that time it are), spinning ms milliseconds. */
static int spin(void *ms)
{
    double want;
    memcpy(&want, ms, sizeof want);
    for (double t0 = now_ms(); now_ms() - t0 < want;) {
    }
    return 0;
}

static tf_cublas_status count_matmul(tf_cublaslt_handle h, tf_cublaslt_matmul_desc op, const void *alpha, const void *a,
                                     tf_cublaslt_layout ad, const void *b, tf_cublaslt_layout bd, const void *beta, const void *c,
                                     tf_cublaslt_layout cd, void *d, tf_cublaslt_layout dd, const tf_cublaslt_algo *algo, void *ws,
                                     size_t wsb, tf_cu_stream s)
{
    g_matmuls++;
    if (g_fast && algo && algo->data[0] != g_fast) tf_cuda_emu_submit(s, spin, &g_slow_ms, sizeof g_slow_ms);
    return g_emu.Matmul(h, op, alpha, a, ad, b, bd, beta, c, cd, d, dd, algo, ws, wsb, s);
}

static tf_cublas_status refusing_check(tf_cublaslt_handle h, tf_cublaslt_matmul_desc op, tf_cublaslt_layout a, tf_cublaslt_layout b,
                                       tf_cublaslt_layout c, tf_cublaslt_layout d, const tf_cublaslt_algo *algo, tf_cublaslt_heuristic *r)
{
    if (g_refuse_check) return 15;   /* CUBLAS_STATUS_NOT_SUPPORTED */
    return g_emu.MatmulAlgoCheck(h, op, a, b, c, d, algo, r);
}

static tf_cublas_status trimmed_heuristic(tf_cublaslt_handle h, tf_cublaslt_matmul_desc op, tf_cublaslt_layout a, tf_cublaslt_layout b,
                                          tf_cublaslt_layout c, tf_cublaslt_layout d, tf_cublaslt_pref p, int req,
                                          tf_cublaslt_heuristic *res, int *got)
{
    tf_cublas_status r = g_emu.MatmulAlgoGetHeuristic(h, op, a, b, c, d, p, req, res, got);
    if (r || !g_unlisted) return r;
    int k = 0;
    for (int i = 0; i < *got; i++)
        if (res[i].algo.data[0] != g_unlisted) res[k++] = res[i];
    *got = k;
    return r;
}

/* ---- device buffers ---- */

static tf_cu_deviceptr dev_alloc(size_t bytes)
{
    tf_cu_deviceptr p = 0;
    CHECK(g_libs.cu.MemAlloc(&p, bytes ? bytes : 1) == 0, "cuMemAlloc of %zu bytes", bytes);
    return p;
}
static void dev_free(tf_cu_deviceptr p)
{
    if (p) g_libs.cu.MemFree(p);
}

static tf_gemm_type gt(tf_dt t) { return t == TF_DT_F32 ? TF_GEMM_F32 : t == TF_DT_F16 ? TF_GEMM_F16 : TF_GEMM_BF16; }

/* ---- results against a double reference ---- */

typedef struct gcase {
    tf_dt ab, c;
    bool ta, tb;
    int64_t M, N, K, batch;
    tf_gemm_epilogue epi;
} gcase;

/* Multiples of 1/8 in [-2, 2]: exact in every format here. */
static void fill(double *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) v[i] = (double)((int)(test_rnd(&g_rng) * 33) - 16) / 8;
}

static void *to_storage(tf_dt t, const double *v, int64_t n)
{
    void *b = malloc((size_t)(n ? n : 1) * (size_t)tf_dtype_bytes(t));
    for (int64_t i = 0; i < n; i++) tf_elem_store(t, b, i, v[i]);
    return b;
}

/* The desc of a case over buffers at a, b, c (0: no timing). */
static tf_gemm_desc desc_of(const gcase *k, const char *cache, tf_cu_deviceptr a, tf_cu_deviceptr b, tf_cu_deviceptr c,
                            tf_cu_deviceptr bias, tf_cu_deviceptr ws, size_t max_ws)
{
    tf_gemm_desc d;
    memset(&d, 0, sizeof d);
    d.ab = gt(k->ab), d.c = gt(k->c);
    d.ta = k->ta, d.tb = k->tb;
    d.M = k->M, d.N = k->N, d.K = k->K, d.batch = k->batch;
    if (k->batch > 1) d.stride_a = k->M * k->K, d.stride_b = k->K * k->N, d.stride_c = k->M * k->N;
    size_t eab = (size_t)tf_dtype_bytes(k->ab), ec = (size_t)tf_dtype_bytes(k->c);
    d.align_a = tf_gemm_alignment(a | (uint64_t)d.stride_a * eab);
    d.align_b = tf_gemm_alignment(b | (uint64_t)d.stride_b * eab);
    d.align_c = tf_gemm_alignment(c | (uint64_t)d.stride_c * ec);
    d.tf32 = true;
    d.max_workspace = max_ws;
    d.epilogue = k->epi;
    d.bias = bias;
    d.gpu = "cuda-emu";
    d.cache_dir = cache;
    d.stream = g_stream;
    d.dev_a = a, d.dev_b = b, d.dev_c = c, d.dev_ws = ws;
    d.warmup = 1, d.runs = 2;
    return d;
}

enum { WS = 1 << 16 };

/* Plan (timing the candidates), run, compare bit for bit; then a second
 * plan from the cache, run again, same bits. */
static void run_case(const gcase *k, const char *cache)
{
    char lab[160];
    snprintf(lab, sizeof lab, "%s%s x %s%s -> %s, %lld x %lld x %lld, batch %lld, epilogue %d", tf_dtype_name(k->ab), k->ta ? "^T" : "",
             tf_dtype_name(k->ab), k->tb ? "^T" : "", tf_dtype_name(k->c), (long long)k->M, (long long)k->N, (long long)k->K,
             (long long)k->batch, (int)k->epi);
    int64_t na = k->batch * k->M * k->K, nb = k->batch * k->K * k->N, nc = k->batch * k->M * k->N;
    double *a = malloc((size_t)na * sizeof *a), *b = malloc((size_t)nb * sizeof *b), *bias = malloc((size_t)k->N * sizeof *bias);
    double *ref = malloc((size_t)nc * sizeof *ref);
    fill(a, na);
    fill(b, nb);
    fill(bias, k->N);
    /* a stored [M, K] (or [K, M] transposed), b [K, N] (or [N, K]), c [M, N], row-major, batch after batch */
    for (int64_t bi = 0; bi < k->batch; bi++)
        for (int64_t i = 0; i < k->M; i++)
            for (int64_t j = 0; j < k->N; j++) {
                double s = 0;
                for (int64_t q = 0; q < k->K; q++) {
                    double av = a[bi * k->M * k->K + (k->ta ? q * k->M + i : i * k->K + q)];
                    double bv = b[bi * k->K * k->N + (k->tb ? j * k->K + q : q * k->N + j)];
                    s += av * bv;
                }
                if (k->epi != TF_GEMM_EPI_NONE) s += tf_dtype_round(k->c, bias[j]);
                if (k->epi == TF_GEMM_EPI_RELU_BIAS && s < 0) s = 0;
                ref[bi * k->M * k->N + i * k->N + j] = s;
            }
    void *ha = to_storage(k->ab, a, na), *hb = to_storage(k->ab, b, nb), *hbias = to_storage(k->c, bias, k->N);
    size_t eab = (size_t)tf_dtype_bytes(k->ab), ec = (size_t)tf_dtype_bytes(k->c);
    tf_cu_deviceptr da = dev_alloc((size_t)na * eab), db = dev_alloc((size_t)nb * eab), dc = dev_alloc((size_t)nc * ec),
                    dbias = dev_alloc((size_t)k->N * ec), dws = dev_alloc(WS);
    g_libs.cu.MemcpyHtoD(da, ha, (size_t)na * eab);
    g_libs.cu.MemcpyHtoD(db, hb, (size_t)nb * eab);
    g_libs.cu.MemcpyHtoD(dbias, hbias, (size_t)k->N * ec);
    void *out = malloc((size_t)nc * ec);
    for (int round = 0; round < 2; round++) {
        tf_gemm_desc d = desc_of(k, cache, da, db, dc, k->epi ? dbias : 0, dws, WS);
        tf_gemm g;
        char err[2048] = "";
        int m0 = g_matmuls;
        tf_cuda_status st = tf_gemm_plan(&g_libs, g_h, &d, &g, err, sizeof err);
        CHECK(!st, "%s: plan: %s", lab, err);
        if (st) break;
        if (round == 0)
            CHECK(!g.from_cache && g.candidates == 4 && g.timed == 4 && g_matmuls - m0 == 4 * 3,
                  "%s: the first plan times all 4 candidates, 1 + 2 runs each (%d timed, %d matmuls)", lab, g.timed, g_matmuls - m0);
        else
            CHECK(g.from_cache && g.timed == 0 && g_matmuls == m0, "%s: the second plan reads the cache (%d matmuls)", lab, g_matmuls - m0);
        g_libs.cu.MemsetD8Async(dc, 0xff, (size_t)nc * ec, g_stream);   /* NaN: beta = 0 must not read it */
        st = tf_gemm_run(&g_libs, g_h, &g, da, db, dc, dws, WS, g_stream, err, sizeof err);
        CHECK(!st, "%s: run: %s", lab, err);
        g_libs.cu.StreamSynchronize(g_stream);
        g_libs.cu.MemcpyDtoH(out, dc, (size_t)nc * ec);
        int bad = 0;
        int64_t first = -1;
        for (int64_t i = 0; i < nc; i++) {
            double got = tf_elem_load(k->c, out, i), want = tf_dtype_round(k->c, ref[i]);
            if (!(got == want) && bad++ == 0) first = i;
        }
        CHECK(!st && bad == 0, "%s%s: %d of %lld elements differ from the reference (first at %lld: %g, want %g)", lab,
              round ? " (cached)" : "", bad, (long long)nc, (long long)first, first >= 0 ? tf_elem_load(k->c, out, first) : 0.0,
              first >= 0 ? tf_dtype_round(k->c, ref[first]) : 0.0);
        tf_gemm_free(&g_libs, &g);
    }
    free(a), free(b), free(bias), free(ref), free(ha), free(hb), free(hbias), free(out);
    dev_free(da), dev_free(db), dev_free(dc), dev_free(dbias), dev_free(dws);
}

static void results(const char *cache)
{
    static const tf_dt types[] = {TF_DT_F32, TF_DT_F16, TF_DT_BF16};
    static const int64_t sizes[][4] = {{5, 7, 9, 1}, {1, 1, 1, 1}, {13, 3, 17, 3}, {4, 16, 8, 2}};
    for (int t = 0; t < 3; t++)
        for (int cf = 0; cf < 2; cf++) {
            if (cf && types[t] == TF_DT_F32) continue;
            for (int tr = 0; tr < 4; tr++)
                for (int s = 0; s < 4; s++) {
                    gcase k = {types[t], cf ? TF_DT_F32 : types[t], tr & 1, (tr >> 1) & 1, sizes[s][0], sizes[s][1], sizes[s][2],
                               sizes[s][3], TF_GEMM_EPI_NONE};
                    run_case(&k, cache);
                }
        }
    /* the epilogues: one GEMM each, a bias of C's type along C's rows, then ReLU */
    for (int t = 0; t < 3; t++)
        for (int e = 1; e <= 2; e++)
            for (int tr = 0; tr < 4; tr += 3) {
                gcase k = {types[t], types[t], tr & 1, (tr >> 1) & 1, 6, 10, 7, 1, (tf_gemm_epilogue)e};
                run_case(&k, cache);
            }
    gcase k = {TF_DT_BF16, TF_DT_F32, false, true, 9, 5, 11, 1, TF_GEMM_EPI_RELU_BIAS};
    run_case(&k, cache);
}

/* ---- the choice and the cache ---- */

typedef struct bufs {
    tf_cu_deviceptr a, b, c, bias, ws;
} bufs;

/* One plan of an f32 64 x 48 x 32 problem (or as changed by tweak) on bufs;
 * *timed: the matmuls it ran. */
typedef void (*tweak_fn)(tf_gemm_desc *d);
static tf_cuda_status plan_once(const char *cache, const bufs *B, tweak_fn tweak, tf_gemm *g, int *matmuls, char *err, size_t n)
{
    gcase k = {TF_DT_F32, TF_DT_F32, false, false, 64, 48, 32, 1, TF_GEMM_EPI_NONE};
    tf_gemm_desc d = desc_of(&k, cache, B->a, B->b, B->c, 0, B->ws, WS);
    if (tweak) tweak(&d);
    int m0 = g_matmuls;
    tf_cuda_status st = tf_gemm_plan(&g_libs, g_h, &d, g, err, n);
    if (matmuls) *matmuls = g_matmuls - m0;
    return st;
}

static void no_tf32(tf_gemm_desc *d) { d->tf32 = false; }
static void other_m(tf_gemm_desc *d) { d->M = 63; }
static void other_n(tf_gemm_desc *d) { d->N = 40; }
static void other_k(tf_gemm_desc *d) { d->K = 24; }
static void trans_a(tf_gemm_desc *d) { d->ta = true; }
static void trans_b(tf_gemm_desc *d) { d->tb = true; }
static void c_f16(tf_gemm_desc *d) { d->ab = d->c = TF_GEMM_F16; }
static void c_f16_no_tf32(tf_gemm_desc *d) { d->ab = d->c = TF_GEMM_F16, d->tf32 = false; }
static void c_bf16(tf_gemm_desc *d) { d->ab = d->c = TF_GEMM_BF16; }
static void bf16_to_f32(tf_gemm_desc *d) { d->ab = TF_GEMM_BF16; }
static tf_cu_deviceptr g_bias;
static void epi_bias(tf_gemm_desc *d) { d->epilogue = TF_GEMM_EPI_BIAS, d->bias = g_bias; }
static void epi_relu(tf_gemm_desc *d) { d->epilogue = TF_GEMM_EPI_RELU_BIAS, d->bias = g_bias; }
static void batched(tf_gemm_desc *d) { d->M = 16, d->batch = 4, d->stride_a = 16 * 32, d->stride_b = 0, d->stride_c = 16 * 48; }
static void batched_b(tf_gemm_desc *d) { batched(d), d->stride_b = 32 * 48; }
static void align4(tf_gemm_desc *d) { d->align_a = 4; }
static void less_ws(tf_gemm_desc *d) { d->max_workspace = WS / 2; }
static void other_gpu(tf_gemm_desc *d) { d->gpu = "another GPU"; }
static void no_buffers(tf_gemm_desc *d) { d->dev_a = 0, d->gpu = "a GPU never timed on"; }
static void other_m_no_buffers(tf_gemm_desc *d) { d->M = 63, d->dev_a = 0; }
static void no_ws_limit(tf_gemm_desc *d) { d->max_workspace = 0, d->dev_ws = 0; }
static void no_ws_buffer(tf_gemm_desc *d) { d->dev_ws = 0, d->gpu = "a GPU without a workspace to time on"; }

static void cache_tests(const char *root, const bufs *B)
{
    char dir[4200], err[2048], file[4200], how[4600];
    snprintf(dir, sizeof dir, "%s/algos", root);
    tf_gemm g;
    int mm = 0;
    /* the first plan times each candidate; the one the others are slower than wins (it needs workspace) */
    g_fast = 0x7467;
    tf_cuda_status st = plan_once(dir, B, NULL, &g, &mm, err, sizeof err);
    CHECK(!st && !g.from_cache && g.candidates == 4 && g.timed == 4 && mm == 12 && test_count_files(dir, ".cublaslt") == 1,
          "a first plan times 4 candidates (1 + 2 runs each) and writes one file (%s; %d timed, %d matmuls, %d files)", err, g.timed, mm,
          test_count_files(dir, ".cublaslt"));
    CHECK(!st && g.choice == 2 && g.algo.data[0] == 0x7467 && g.workspace == 4096 && g.ms > 0 && g.ms < g_slow_ms,
          "the fastest candidate is chosen: index %d, tag %llx, %zu bytes of workspace, %.3f ms", g.choice,
          (unsigned long long)g.algo.data[0], g.workspace, (double)g.ms);
    tf_gemm_explain(&g, how, sizeof how);
    CHECK(strstr(how, "candidate 2 of 4") && strstr(how, "timed now") && strstr(how, "cached in"), "explained: %s", how);
    snprintf(file, sizeof file, "%s", g.cache_file);
    char *text = test_read_file(file);
    CHECK(text && strstr(text, "tfuse cublaslt algorithm 1\nkey: gemm ab=f32 c=f32 ta=0 tb=0 M=64 N=48 K=32 batch=1 ") &&
              strstr(text, "compute=32F_FAST_TF32 workspace=65536 candidates=8 cublaslt=130000 gpu=cuda-emu\n") &&
              strstr(text, "\nindex: 2\nalgo: 0000000000007467 0000000000000000 ") && strstr(text, "\nsum: "),
          "the file holds the whole key, the index and the algorithm's words: %s", text ? text : "(unreadable)");
    free(text);
    tf_gemm_free(&g_libs, &g);
    /* the second reads it: nothing timed, even with another candidate now the fastest */
    g_fast = 0x7465;
    st = plan_once(dir, B, NULL, &g, &mm, err, sizeof err);
    CHECK(!st && g.from_cache && g.timed == 0 && mm == 0 && g.choice == 2 && g.algo.data[0] == 0x7467 && g.workspace == 4096 &&
              g.ms > 0,
          "a second plan reads the cache (%s; %d matmuls, choice %d)", err, mm, g.choice);
    tf_gemm_explain(&g, how, sizeof how);
    CHECK(strstr(how, "from the algorithm cache") && strstr(how, file), "explained: %s", how);
    tf_gemm_free(&g_libs, &g);
    g_fast = 0x7467;
    /* corrupted: a flipped byte, a truncated file, garbage, an empty file; each ignored, timed again and rewritten */
    const char *damage[] = {"flip", "truncate", "garbage", "empty", "flip in the algorithm's words"};
    for (int i = 0; i < 5; i++) {
        char *t = test_read_file(file);
        FILE *f = fopen(file, "wb");
        if (t && f) {
            size_t len = strlen(t);
            if (i == 0) t[len / 2] ^= 0x04, fwrite(t, 1, len, f);
            else if (i == 1) fwrite(t, 1, len - 10, f);
            else if (i == 2) fputs("index: 2\nsum: 0\n", f);
            else if (i == 4) {
                char *w = strstr(t, "7467");
                if (w) w[3] = '6';
                fwrite(t, 1, len, f);
            }
        }
        if (f) fclose(f);
        free(t);
        st = plan_once(dir, B, NULL, &g, &mm, err, sizeof err);
        CHECK(!st && !g.from_cache && g.timed == 4 && mm == 12 && g.choice == 2, "%s file: timed again (%s; %d matmuls)", damage[i], err, mm);
        tf_gemm_free(&g_libs, &g);
        st = plan_once(dir, B, NULL, &g, &mm, err, sizeof err);
        CHECK(!st && g.from_cache && mm == 0 && g.choice == 2, "%s file: rewritten, then read (%d matmuls)", damage[i], mm);
        tf_gemm_free(&g_libs, &g);
    }
    /* an algorithm cublasLtMatmulAlgoCheck refuses: timed again, rewritten */
    g_refuse_check = true;
    st = plan_once(dir, B, NULL, &g, &mm, err, sizeof err);
    g_refuse_check = false;
    CHECK(!st && !g.from_cache && g.timed == 4 && mm == 12, "an algorithm AlgoCheck refuses: timed again (%s; %d matmuls)", err, mm);
    tf_gemm_free(&g_libs, &g);
    st = plan_once(dir, B, NULL, &g, &mm, err, sizeof err);
    CHECK(!st && g.from_cache && mm == 0, "then read (%d matmuls)", mm);
    tf_gemm_free(&g_libs, &g);
    /* one the heuristic no longer lists: timed again among the others, rewritten */
    g_unlisted = 0x7467;
    g_fast = 0x7468;
    st = plan_once(dir, B, NULL, &g, &mm, err, sizeof err);
    CHECK(!st && !g.from_cache && g.candidates == 3 && g.timed == 3 && mm == 9 && g.choice == 2 && g.algo.data[0] == 0x7468,
          "an algorithm the heuristic no longer lists: the 3 others timed (%s; %d matmuls, choice %d)", err, mm, g.choice);
    tf_gemm_free(&g_libs, &g);
    st = plan_once(dir, B, NULL, &g, &mm, err, sizeof err);
    CHECK(!st && g.from_cache && mm == 0 && g.algo.data[0] == 0x7468, "then read (%d matmuls)", mm);
    tf_gemm_free(&g_libs, &g);
    /* listed again: index 2 is another algorithm now, so the file no longer matches */
    g_unlisted = 0;
    g_fast = 0x7467;
    st = plan_once(dir, B, NULL, &g, &mm, err, sizeof err);
    CHECK(!st && !g.from_cache && g.timed == 4 && g.choice == 2 && g.algo.data[0] == 0x7467,
          "the heuristic's answer changed again: the recorded index holds other words, timed again (%d matmuls)", mm);
    tf_gemm_free(&g_libs, &g);
    /* other keys: each a first plan that times, in a file of its own */
    static const struct { tweak_fn f; const char *what; } keys[] = {
        {no_tf32, "no TF32"}, {other_m, "M"}, {other_n, "N"}, {other_k, "K"}, {trans_a, "A transposed"}, {trans_b, "B transposed"},
        {c_f16, "f16"}, {c_bf16, "bf16"}, {bf16_to_f32, "bf16 -> f32"}, {epi_bias, "a bias epilogue"}, {epi_relu, "a ReLU-bias epilogue"},
        {batched, "a batch, B broadcast"}, {batched_b, "a batch, B strided"}, {align4, "A's alignment"}, {less_ws, "a workspace limit"},
        {other_gpu, "another GPU"},
    };
    int nkeys = (int)(sizeof keys / sizeof *keys);
    for (int i = 0; i < nkeys; i++) {
        int files = test_count_files(dir, ".cublaslt");
        st = plan_once(dir, B, keys[i].f, &g, &mm, err, sizeof err);
        CHECK(!st && !g.from_cache && g.timed == 4 && test_count_files(dir, ".cublaslt") == files + 1, "%s: another key, timed (%s; %d files)",
              keys[i].what, err, test_count_files(dir, ".cublaslt") - files);
        tf_gemm_free(&g_libs, &g);
        st = plan_once(dir, B, keys[i].f, &g, &mm, err, sizeof err);
        CHECK(!st && g.from_cache && mm == 0, "%s: then read", keys[i].what);
        tf_gemm_free(&g_libs, &g);
    }
    /* TF32 means nothing to 16-bit operands: the same key */
    st = plan_once(dir, B, c_f16_no_tf32, &g, &mm, err, sizeof err);
    CHECK(!st && g.from_cache && mm == 0, "f16 without TF32: the f16 key (%s)", err);
    tf_gemm_free(&g_libs, &g);
    /* workspace: none allowed leaves the candidate needing it out; none given leaves it untimed */
    int files = test_count_files(dir, ".cublaslt");
    st = plan_once(dir, B, no_ws_limit, &g, &mm, err, sizeof err);
    CHECK(!st && g.candidates == 3 && g.timed == 3 && g.workspace == 0 && g.algo.data[0] != 0x7467,
          "no workspace allowed: 3 candidates (%s; %d, %d timed)", err, g.candidates, g.timed);
    tf_gemm_free(&g_libs, &g);
    st = plan_once(dir, B, no_ws_buffer, &g, &mm, err, sizeof err);
    CHECK(!st && g.candidates == 4 && g.timed == 3 && g.algo.data[0] != 0x7467 && mm == 9,
          "no workspace buffer to time on: the candidate needing one is not timed (%s; %d timed)", err, g.timed);
    tf_gemm_free(&g_libs, &g);
    CHECK(test_count_files(dir, ".cublaslt") == files + 2, "each written (%d)", test_count_files(dir, ".cublaslt") - files);
    /* nothing to time on and nothing cached: the heuristic's first, untimed, not written */
    files = test_count_files(dir, ".cublaslt");
    st = plan_once(dir, B, no_buffers, &g, &mm, err, sizeof err);
    CHECK(!st && !g.from_cache && g.timed == 0 && mm == 0 && g.choice == 0 && g.algo.data[0] == 0x7465 && g.ms == 0 &&
              test_count_files(dir, ".cublaslt") == files,
          "no buffers: the heuristic's first, untimed, no file (%s)", err);
    tf_gemm_explain(&g, how, sizeof how);
    CHECK(strstr(how, "untimed"), "explained: %s", how);
    tf_gemm_free(&g_libs, &g);
    /* ... but a cached choice is still read without buffers */
    st = plan_once(dir, B, other_m_no_buffers, &g, &mm, err, sizeof err);
    CHECK(!st && g.from_cache && mm == 0, "no buffers, a cached key: read (%s)", err);
    tf_gemm_free(&g_libs, &g);
    CHECK(test_count_files(dir, "") == test_count_files(dir, ".cublaslt"), "no temporary file left (%d files, %d .cublaslt)", test_count_files(dir, ""),
          test_count_files(dir, ".cublaslt"));
    /* the default place: $TFUSE_CACHE_DIR/cuda, made when missing */
    char env[4200], expect[4300];
    snprintf(env, sizeof env, "%s/env", root);
    const char *saved = getenv("TFUSE_CACHE_DIR");
    char *keep = saved ? strdup(saved) : NULL;
    setenv("TFUSE_CACHE_DIR", env, 1);
    st = plan_once(NULL, B, NULL, &g, &mm, err, sizeof err);
    snprintf(expect, sizeof expect, "%s/cuda/", env);
    CHECK(!st && !strncmp(g.cache_file, expect, strlen(expect)) && strstr(g.cache_file, ".cublaslt") && access(g.cache_file, R_OK) == 0,
          "NULL cache_dir: the file is under $TFUSE_CACHE_DIR/cuda (%s)", g.cache_file);
    tf_gemm_free(&g_libs, &g);
    if (keep) setenv("TFUSE_CACHE_DIR", keep, 1);
    else unsetenv("TFUSE_CACHE_DIR");
    free(keep);
    /* no disk cache at all: "" */
    for (int i = 0; i < 2; i++) {
        st = plan_once("", B, NULL, &g, &mm, err, sizeof err);
        CHECK(!st && !g.from_cache && !g.cache_file[0] && g.timed == 4 && mm == 12, "cache_dir \"\": no file, timed every time (%d)", mm);
        tf_gemm_explain(&g, how, sizeof how);
        CHECK(strstr(how, "no disk cache"), "explained: %s", how);
        tf_gemm_free(&g_libs, &g);
    }
    g_fast = 0;
}

/* ---- the stand-in where blas.c does not reach ---- */

static void emu_direct(const bufs *B)
{
    const tf_cublaslt_api *a = &g_emu;
    tf_cublaslt_matmul_desc op = NULL;
    tf_cublaslt_layout la = NULL, lb = NULL, lc = NULL;
    tf_cublaslt_pref pref = NULL;
    int r = a->MatmulDescCreate(&op, 68, 0) | a->MatrixLayoutCreate(&la, 0, 4, 3, 4) | a->MatrixLayoutCreate(&lb, 0, 3, 2, 3) |
            a->MatrixLayoutCreate(&lc, 0, 4, 2, 4) | a->MatmulPreferenceCreate(&pref);
    CHECK(r == 0, "the stand-in's descriptors");
    tf_cublaslt_heuristic res[8];
    int got = 0;
    r = a->MatmulAlgoGetHeuristic(g_h, op, la, lb, lc, lc, pref, 8, res, &got);
    CHECK(r == 0 && got == 3 && res[0].algo.data[0] == 0x7465 && res[1].algo.data[0] == 0x7466 && res[2].algo.data[0] == 0x7468,
          "no workspace allowed (the default): 3 candidates, distinct tags (%d, %d)", r, got);
    uint64_t ws = WS;
    r = a->MatmulPreferenceSetAttribute(pref, 1, &ws, sizeof ws) | a->MatmulAlgoGetHeuristic(g_h, op, la, lb, lc, lc, pref, 8, res, &got);
    CHECK(r == 0 && got == 4 && res[2].algo.data[0] == 0x7467 && res[2].workspace_size == 4096, "with workspace: 4, one needing 4096 bytes");
    r = a->MatmulAlgoGetHeuristic(g_h, op, la, lb, lc, lc, pref, 2, res, &got);
    CHECK(r == 0 && got == 2, "as many as asked for (%d)", got);
    CHECK(a->MatmulPreferenceSetAttribute(pref, 1, &ws, 4) == 7, "a workspace limit of the wrong size: INVALID_VALUE");
    /* AlgoCheck: its tags, in place */
    tf_cublaslt_heuristic chk = {0};
    chk.algo.data[0] = 0x7467;
    CHECK(a->MatmulAlgoCheck(g_h, op, la, lb, lc, lc, &chk.algo, &chk) == 0 && chk.workspace_size == 4096 && chk.state == 0 &&
              chk.algo.data[0] == 0x7467,
          "AlgoCheck takes its tags and says the workspace; result->algo is not written");
    tf_cublaslt_algo bad = {{0x7465, 1}};
    CHECK(a->MatmulAlgoCheck(g_h, op, la, lb, lc, lc, &bad, &chk) == 7, "AlgoCheck: an unknown algorithm: INVALID_VALUE");
    bad = (tf_cublaslt_algo){{0x1234}};
    CHECK(a->MatmulAlgoCheck(g_h, op, la, lb, lc, lc, &bad, &chk) == 7, "AlgoCheck: an unknown tag: INVALID_VALUE");
    CHECK(a->MatmulAlgoCheck(g_h, op, la, lc, lc, lc, &res[0].algo, &chk) == 7, "AlgoCheck: shapes that disagree: INVALID_VALUE");
    /* Matmul: every tag, the same numbers; the workspace one writes exactly its workspace */
    float av[12], bv[6], cv[4][8], one = 1, zero = 0;
    for (int i = 0; i < 12; i++) av[i] = (float)(i % 5) * 0.25f - 0.5f;
    for (int i = 0; i < 6; i++) bv[i] = (float)(i % 3) - 1;
    g_libs.cu.MemcpyHtoD(B->a, av, sizeof av);
    g_libs.cu.MemcpyHtoD(B->b, bv, sizeof bv);
    static const unsigned long long tags[4] = {0x7465, 0x7466, 0x7467, 0x7468};
    r = 0;
    for (int t = 0; t < 4; t++) {
        tf_cublaslt_algo al = {{tags[t]}};
        g_libs.cu.MemsetD8Async(B->ws, 0, WS, g_stream);
        r |= a->Matmul(g_h, op, &one, (void *)(uintptr_t)B->a, la, (void *)(uintptr_t)B->b, lb, &zero, NULL, lc, (void *)(uintptr_t)B->c,
                       lc, &al, (void *)(uintptr_t)B->ws, t == 2 ? 4096 : 0, g_stream);
        g_libs.cu.StreamSynchronize(g_stream);
        g_libs.cu.MemcpyDtoH(cv[t], B->c, sizeof cv[t]);
        if (t == 2) {
            unsigned char w[4097];
            g_libs.cu.MemcpyDtoH(w, B->ws, sizeof w);
            CHECK(w[0] == 0xa5 && w[4095] == 0xa5 && w[4096] == 0, "the workspace algorithm uses exactly its 4096 bytes");
        }
    }
    CHECK(r == 0 && !memcmp(cv[0], cv[1], sizeof cv[0]) && !memcmp(cv[0], cv[2], sizeof cv[0]) && !memcmp(cv[0], cv[3], sizeof cv[0]),
          "every candidate computes the same result (%d)", r);
    tf_cublaslt_algo al = {{0x7467}};
    CHECK(a->Matmul(g_h, op, &one, (void *)(uintptr_t)B->a, la, (void *)(uintptr_t)B->b, lb, &zero, NULL, lc, (void *)(uintptr_t)B->c, lc,
                    &al, (void *)(uintptr_t)B->ws, 4095, g_stream) == 7,
          "too little workspace: INVALID_VALUE");
    CHECK(a->Matmul(g_h, op, &one, (void *)(uintptr_t)B->a, la, (void *)(uintptr_t)B->b, lb, &zero, NULL, lc, (void *)(uintptr_t)B->c, lc,
                    &al, NULL, 4096, g_stream) == 7,
          "no workspace: INVALID_VALUE");
    al = (tf_cublaslt_algo){{0x1234}};
    CHECK(a->Matmul(g_h, op, &one, (void *)(uintptr_t)B->a, la, (void *)(uintptr_t)B->b, lb, &zero, NULL, lc, (void *)(uintptr_t)B->c, lc,
                    &al, NULL, 0, g_stream) == 7,
          "an algorithm it never offered: INVALID_VALUE");
    CHECK(a->Matmul(g_h, op, &one, (void *)(uintptr_t)B->a, la, (void *)(uintptr_t)B->b, lb, &zero, NULL, lc, (void *)(uintptr_t)B->c, lc,
                    NULL, NULL, 0, g_stream) == 0,
          "no algorithm: its own choice");
    /* the ReLU mask's leading dimension, in bits: a multiple of 128, at least D's rows (cublasLt.h) */
    uint32_t epi = 134;   /* RELU_AUX_BIAS */
    void *bias_p = (void *)(uintptr_t)B->bias, *aux_p = (void *)(uintptr_t)B->ws;
    int64_t ld = 4;
    r = a->MatmulDescSetAttribute(op, 7, &epi, sizeof epi) | a->MatmulDescSetAttribute(op, 8, &bias_p, sizeof bias_p) |
        a->MatmulDescSetAttribute(op, 11, &aux_p, sizeof aux_p) | a->MatmulDescSetAttribute(op, 12, &ld, sizeof ld);
    CHECK(r == 0, "RELU_AUX_BIAS's attributes, at cublasLt.h's numbers (bias 8, aux 11, aux_ld 12)");
    CHECK(a->Matmul(g_h, op, &one, (void *)(uintptr_t)B->a, la, (void *)(uintptr_t)B->b, lb, &zero, NULL, lc, (void *)(uintptr_t)B->c, lc,
                    NULL, NULL, 0, g_stream) == 7,
          "a ReLU mask 4 bits apart (D has 4 rows, but not a multiple of 128): INVALID_VALUE");
    ld = 128;
    a->MatmulDescSetAttribute(op, 12, &ld, sizeof ld);
    CHECK(a->Matmul(g_h, op, &one, (void *)(uintptr_t)B->a, la, (void *)(uintptr_t)B->b, lb, &zero, NULL, lc, (void *)(uintptr_t)B->c, lc,
                    NULL, NULL, 0, g_stream) == 0,
          "a ReLU mask 128 bits apart: taken");
    aux_p = NULL;
    a->MatmulDescSetAttribute(op, 11, &aux_p, sizeof aux_p);
    CHECK(a->Matmul(g_h, op, &one, (void *)(uintptr_t)B->a, la, (void *)(uintptr_t)B->b, lb, &zero, NULL, lc, (void *)(uintptr_t)B->c, lc,
                    NULL, NULL, 0, g_stream) == 7,
          "RELU_AUX_BIAS without a mask: INVALID_VALUE");
    g_libs.cu.StreamSynchronize(g_stream);
    a->MatmulPreferenceDestroy(pref);
    a->MatrixLayoutDestroy(la);
    a->MatrixLayoutDestroy(lb);
    a->MatrixLayoutDestroy(lc);
    a->MatmulDescDestroy(op);
}

/* ---- the backward epilogues: bias gradients, the ReLU mask ---- */

/* BGRAD_B (cuBLASLt's BGRADA): C = op(A) op(B) and the bias gradient, op(B)
 * summed over K (N values); BGRAD_A (BGRADB): op(A) summed over K (M
 * values). Every transpose, f32 and bf16; exact inputs, so bit for bit. */
static void bgrad_case(tf_dt t, bool ta, bool tb, tf_gemm_epilogue epi)
{
    enum { M = 7, N = 5, K = 9 };
    double a[M * K], b[K * N], ref[M * N], gref[M > N ? M : N];
    fill(a, M * K);
    fill(b, K * N);
    int64_t len = epi == TF_GEMM_EPI_BGRAD_B ? N : M;
    for (int64_t r = 0; r < len; r++) gref[r] = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int q = 0; q < K; q++) s += a[ta ? q * M + i : i * K + q] * b[tb ? j * K + q : q * N + j];
            ref[i * N + j] = s;
        }
    for (int q = 0; q < K; q++) {
        if (epi == TF_GEMM_EPI_BGRAD_B)
            for (int j = 0; j < N; j++) gref[j] += b[tb ? j * K + q : q * N + j];
        else
            for (int i = 0; i < M; i++) gref[i] += a[ta ? q * M + i : i * K + q];
    }
    size_t e = (size_t)tf_dtype_bytes(t);
    void *ha = to_storage(t, a, M * K), *hb = to_storage(t, b, K * N);
    tf_cu_deviceptr da = dev_alloc(M * K * e), db = dev_alloc(K * N * e), dc = dev_alloc(M * N * e), dg = dev_alloc(len * e), dws = dev_alloc(WS);
    g_libs.cu.MemcpyHtoD(da, ha, M * K * e);
    g_libs.cu.MemcpyHtoD(db, hb, K * N * e);
    g_libs.cu.MemsetD8Async(dg, 0xff, len * e, g_stream);
    gcase k = {t, t, ta, tb, M, N, K, 1, epi};
    tf_gemm_desc d = desc_of(&k, "", da, db, dc, dg, dws, WS);
    tf_gemm g;
    char err[2048] = "", lab[120];
    snprintf(lab, sizeof lab, "%s %s%s x %s%s", tf_gemm_epilogue_name(epi), tf_dtype_name(t), ta ? "^T" : "", tf_dtype_name(t), tb ? "^T" : "");
    tf_cuda_status st = tf_gemm_plan(&g_libs, g_h, &d, &g, err, sizeof err);
    CHECK(!st, "%s: plan: %s", lab, err);
    if (!st) st = tf_gemm_run(&g_libs, g_h, &g, da, db, dc, dws, WS, g_stream, err, sizeof err);
    CHECK(!st, "%s: run: %s", lab, err);
    g_libs.cu.StreamSynchronize(g_stream);
    unsigned char out[M * N * 4], grad[(M > N ? M : N) * 4];
    g_libs.cu.MemcpyDtoH(out, dc, M * N * e);
    g_libs.cu.MemcpyDtoH(grad, dg, len * e);
    int bad = 0, gbad = 0;
    for (int i = 0; i < M * N; i++) bad += tf_elem_load(t, out, i) != tf_dtype_round(t, ref[i]);
    for (int64_t r = 0; r < len; r++) gbad += tf_elem_load(t, grad, r) != tf_dtype_round(t, gref[r]);
    CHECK(!st && !bad && !gbad, "%s: %d products and %d of %lld bias-gradient values differ from the reference", lab, bad, gbad, (long long)len);
    tf_gemm_free(&g_libs, &g);
    free(ha), free(hb);
    dev_free(da), dev_free(db), dev_free(dc), dev_free(dg), dev_free(dws);
}

/* The ReLU mask as blas.h lays it out (and cublasLt.h describes it): bit
 * j + i * ld of our C[M, N] (i, j), ld = N rounded up to 128 bits, bit b in
 * bit b % 8 of byte b / 8; RELU_AUX_BIAS writes it, DRELU_BGRAD reads it and
 * writes the bias gradient of what it keeps; the probe agrees. */
static void relu_mask(void)
{
    enum { M = 5, N = 131, K = 3 };
    CHECK(tf_gemm_relu_mask_ld(N) == 256 && tf_gemm_relu_mask_ld(128) == 128 && tf_gemm_relu_mask_ld(1) == 128 &&
              tf_gemm_relu_mask_bytes(M, N) == M * 32,
          "the mask's leading dimension: N rounded up to 128 bits");
    double a[M * K], b[K * N], bias[N], pre[M * N];
    fill(a, M * K);
    fill(b, K * N);
    fill(bias, N);
    bias[0] = 0;   /* an exact zero at (0, 0): bias[0] cancels the product (multiples of 1/64, exact) */
    for (int q = 0; q < K; q++) bias[0] -= a[q] * b[q * N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = bias[j];
            for (int q = 0; q < K; q++) s += a[i * K + q] * b[q * N + j];
            pre[i * N + j] = s;
        }
    void *ha = to_storage(TF_DT_F32, a, M * K), *hb = to_storage(TF_DT_F32, b, K * N), *hbias = to_storage(TF_DT_F32, bias, N);
    size_t mb = tf_gemm_relu_mask_bytes(M, N);
    tf_cu_deviceptr da = dev_alloc(M * K * 4), db = dev_alloc(K * N * 4), dc = dev_alloc(M * N * 4), dbias = dev_alloc(N * 4),
                    dmask = dev_alloc(mb), dws = dev_alloc(WS);
    g_libs.cu.MemcpyHtoD(da, ha, M * K * 4);
    g_libs.cu.MemcpyHtoD(db, hb, K * N * 4);
    g_libs.cu.MemcpyHtoD(dbias, hbias, N * 4);
    g_libs.cu.MemsetD8Async(dmask, 0, mb, g_stream);
    gcase k = {TF_DT_F32, TF_DT_F32, false, false, M, N, K, 1, TF_GEMM_EPI_RELU_AUX_BIAS};
    tf_gemm_desc d = desc_of(&k, "", da, db, dc, dbias, dws, WS);
    d.aux = dmask;
    tf_gemm g;
    char err[2048] = "";
    tf_cuda_status st = tf_gemm_plan(&g_libs, g_h, &d, &g, err, sizeof err);
    if (!st) st = tf_gemm_run(&g_libs, g_h, &g, da, db, dc, dws, WS, g_stream, err, sizeof err);
    tf_gemm_free(&g_libs, &g);
    CHECK(!st, "RELU_AUX_BIAS: %s", err);
    g_libs.cu.StreamSynchronize(g_stream);
    unsigned char mask[M * 32];
    float c[M * N];
    g_libs.cu.MemcpyDtoH(mask, dmask, mb);
    g_libs.cu.MemcpyDtoH(c, dc, sizeof c);
    int bad = 0, cbad = 0, pad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < 256; j++) {
            int bit = j + i * 256;
            bool got = (mask[bit / 8] >> (bit % 8)) & 1;
            if (j >= N) pad += got;
            else bad += got != (pre[i * N + j] > 0), cbad += c[i * N + j] != (float)(pre[i * N + j] > 0 ? pre[i * N + j] : 0);
        }
    CHECK(pre[0] == 0 && !bad && !cbad && !pad, "RELU_AUX_BIAS: %d mask bits differ from x > 0 (bit j + 256 i, lowest bit first), "
          "%d results from relu, %d padding bits set", bad, cbad, pad);
    /* DRELU_BGRAD on that mask: C = A2 B2 where the mask is set, bias = its column sums */
    double a2[M * K], b2[K * N], want[M * N], gwant[N];
    fill(a2, M * K);
    fill(b2, K * N);
    for (int j = 0; j < N; j++) gwant[j] = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int q = 0; q < K; q++) s += a2[i * K + q] * b2[q * N + j];
            want[i * N + j] = pre[i * N + j] > 0 ? s : 0;
            gwant[j] += want[i * N + j];
        }
    free(ha), free(hb);
    ha = to_storage(TF_DT_F32, a2, M * K), hb = to_storage(TF_DT_F32, b2, K * N);
    g_libs.cu.MemcpyHtoD(da, ha, M * K * 4);
    g_libs.cu.MemcpyHtoD(db, hb, K * N * 4);
    k.epi = TF_GEMM_EPI_DRELU_BGRAD;
    d = desc_of(&k, "", da, db, dc, dbias, dws, WS);
    d.aux = dmask;
    st = tf_gemm_plan(&g_libs, g_h, &d, &g, err, sizeof err);
    if (!st) st = tf_gemm_run(&g_libs, g_h, &g, da, db, dc, dws, WS, g_stream, err, sizeof err);
    tf_gemm_free(&g_libs, &g);
    CHECK(!st, "DRELU_BGRAD: %s", err);
    g_libs.cu.StreamSynchronize(g_stream);
    float gb[N];
    g_libs.cu.MemcpyDtoH(c, dc, sizeof c);
    g_libs.cu.MemcpyDtoH(gb, dbias, sizeof gb);
    bad = 0;
    int gbad = 0;
    for (int i = 0; i < M * N; i++) bad += c[i] != (float)want[i];
    for (int j = 0; j < N; j++) gbad += gb[j] != (float)gwant[j];
    CHECK(!bad && !gbad, "DRELU_BGRAD: %d results and %d bias-gradient values differ (the mask read back at bit j + 256 i)", bad, gbad);
    free(ha), free(hb), free(hbias);
    dev_free(da), dev_free(db), dev_free(dc), dev_free(dbias), dev_free(dmask);
    bool same = false;
    char why[600] = "";
    st = tf_gemm_relu_mask_probe(&g_libs, g_h, g_stream, dws, WS, &same, why, sizeof why);
    CHECK(!st && same, "the mask probe finds cuda-emu's cuBLASLt is x > 0 in blas.h's layout: %s", why);
    dev_free(dws);
}

static void backward_epilogues(void)
{
    static const tf_dt types[] = {TF_DT_F32, TF_DT_BF16};
    for (int t = 0; t < 2; t++)
        for (int tr = 0; tr < 4; tr++) {
            bgrad_case(types[t], tr & 1, (tr >> 1) & 1, TF_GEMM_EPI_BGRAD_B);
            bgrad_case(types[t], tr & 1, (tr >> 1) & 1, TF_GEMM_EPI_BGRAD_A);
        }
    relu_mask();
}

/* ---- refusals ---- */

static void refusals(const char *root, const bufs *B)
{
    char err[2048];
    tf_gemm g;
    tf_cuda_libs none;
    memset(&none, 0, sizeof none);
    gcase k = {TF_DT_F32, TF_DT_F32, false, false, 8, 8, 8, 1, TF_GEMM_EPI_NONE};
    tf_gemm_desc d = desc_of(&k, root, B->a, B->b, B->c, 0, B->ws, WS);
    CHECK(tf_gemm_plan(&none, NULL, &d, &g, err, sizeof err) == TF_CUDA_ERR_NOT_FOUND && strstr(err, "cuBLASLt is not loaded"),
          "cuBLASLt not loaded: %s", err);
    d.K = 0;
    CHECK(tf_gemm_plan(&g_libs, g_h, &d, &g, err, sizeof err) == TF_CUDA_ERR_ARG && strstr(err, "outside what cuBLASLt takes"), "K = 0: %s",
          err);
    d = desc_of(&k, root, B->a, B->b, B->c, 0, B->ws, WS);
    d.ab = TF_GEMM_F16, d.c = TF_GEMM_BF16;
    CHECK(tf_gemm_plan(&g_libs, g_h, &d, &g, err, sizeof err) == TF_CUDA_ERR_ARG && strstr(err, "writes the same type or f32"),
          "f16 -> bf16: %s", err);
    d = desc_of(&k, root, B->a, B->b, B->c, 0, B->ws, WS);
    d.epilogue = TF_GEMM_EPI_BIAS, d.bias = B->bias, d.batch = 2, d.stride_a = 64, d.stride_c = 64;
    CHECK(tf_gemm_plan(&g_libs, g_h, &d, &g, err, sizeof err) == TF_CUDA_ERR_ARG && strstr(err, "the BIAS epilogue takes one GEMM"),
          "a batched bias epilogue: %s", err);
    d = desc_of(&k, root, B->a, B->b, B->c, 0, B->ws, WS);
    d.epilogue = TF_GEMM_EPI_DRELU;   /* no mask */
    CHECK(tf_gemm_plan(&g_libs, g_h, &d, &g, err, sizeof err) == TF_CUDA_ERR_ARG && strstr(err, "the DRELU epilogue takes one GEMM and a ReLU mask"),
          "DRELU without a mask: %s", err);
    /* a workspace smaller than the plan's algorithm needs, at run time */
    g_fast = 0x7467;
    d = desc_of(&k, "", B->a, B->b, B->c, 0, B->ws, WS);
    tf_cuda_status st = tf_gemm_plan(&g_libs, g_h, &d, &g, err, sizeof err);
    g_fast = 0;
    CHECK(!st && g.workspace == 4096, "planned with workspace (%s)", err);
    if (!st) {
        CHECK(tf_gemm_run(&g_libs, g_h, &g, B->a, B->b, B->c, B->ws, 4095, g_stream, err, sizeof err) == TF_CUDA_ERR_ARG &&
                  strstr(err, "bytes of workspace"),
              "too little workspace: %s", err);
        tf_gemm_free(&g_libs, &g);
    }
}

int main(void)
{
    g_rng = test_seed() | 1;
    char err[4096];
    tf_cuda_search emu = {TF_CUDA_SEARCH_EMU, NULL};
    int ndev = 0;
    if (tf_cuda_libs_load(&g_libs, TF_CUDA_LIB_DRIVER | TF_CUDA_LIB_CUBLASLT, &emu, err, sizeof err) ||
        tf_cuda_driver_init(&g_libs, &ndev, err, sizeof err)) {
        fprintf(stderr, "cuda-emu's driver and cuBLASLt: %s\n", err);
        return 1;
    }
    g_emu = g_libs.lt;
    g_libs.lt.Matmul = count_matmul;
    g_libs.lt.MatmulAlgoCheck = refusing_check;
    g_libs.lt.MatmulAlgoGetHeuristic = trimmed_heuristic;
    CHECK(g_libs.lt.Create(&g_h) == 0 && g_libs.cu.StreamCreate(&g_stream, 0) == 0, "the stand-in's handle and a stream");
    char root[] = "/tmp/tfuse_test_cuda_blas.XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    results(root);
    backward_epilogues();
    bufs B = {dev_alloc(1 << 16), dev_alloc(1 << 16), dev_alloc(1 << 16), dev_alloc(64 * 4), dev_alloc(WS)};
    g_bias = B.bias;
    cache_tests(root, &B);
    emu_direct(&B);
    refusals(root, &B);
    dev_free(B.a), dev_free(B.b), dev_free(B.c), dev_free(B.bias), dev_free(B.ws);
    g_libs.cu.StreamDestroy(g_stream);
    g_libs.lt.Destroy(g_h);
    CHECK(tf_cuda_emu_live() == 0, "every allocation, stream and event of the stand-ins freed (%d live)", tf_cuda_emu_live());
    tf_cuda_libs_free(&g_libs);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return check_report();
}
