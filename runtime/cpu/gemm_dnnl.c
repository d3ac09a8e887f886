/* gemm_dnnl.c — see gemm_dnnl.h. */
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "cpu_ops.h"
#include "gemm_dnnl.h"

#ifdef TFUSE_HAVE_ONEDNN

#include <omp.h>
#include <stdatomic.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "dnnl_util.h"

/* One primitive per piece size. */
typedef struct gvariant {
    int64_t rows;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a, c;   /* this piece's A and C, in tfuse's layout */
    size_t scratchpad;
} gvariant;

struct tf_dnnl_gemm {
    int64_t M, N, K;
    bool ta, tb;
    bool bf16_in, bf16_out;   /* A and B bf16 (else f32); C bf16 (else f32) */
    int64_t pieces, rows;     /* rows per piece, the last one fewer */
    gvariant v[2];
    int nv;
    dnnl_memory_desc_t user_b, packed_b;
    dnnl_primitive_t pack;    /* user_b -> packed_b */
    int threads;
    dnnl_stream_t *streams;   /* one per worker */
    size_t per_worker;        /* scratchpad bytes, 64-aligned */
};

static size_t up64(size_t b) { return (b + 63) / 64 * 64; }

/* op(A) rows [0, rows): [rows, K] with A's strides; C [rows, N] */
static bool piece_mds(const tf_dnnl_gemm *g, int64_t rows, dnnl_memory_desc_t *a, dnnl_memory_desc_t *c, char *why, size_t n)
{
    dnnl_dims_t ad = {rows, g->K}, as = {g->ta ? 1 : g->K, g->ta ? g->M : 1}, cd = {rows, g->N}, cs = {g->N, 1};
    return tf_dnnl_ok(dnnl_memory_desc_init_by_strides(a, 2, ad, g->bf16_in ? dnnl_bf16 : dnnl_f32, as), "A", why, n) &&
           tf_dnnl_ok(dnnl_memory_desc_init_by_strides(c, 2, cd, g->bf16_out ? dnnl_bf16 : dnnl_f32, cs), "C", why, n);
}

/* want: the packed layout to use, or NULL to let oneDNN pick it */
static bool variant_make(tf_dnnl_gemm *g, gvariant *v, int64_t rows, const dnnl_memory_desc_t *want, char *why, size_t n)
{
    v->rows = rows;
    dnnl_memory_desc_t any;
    dnnl_dims_t bd = {g->K, g->N};
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t attr = NULL;
    bool good = piece_mds(g, rows, &v->a, &v->c, why, n) &&
                (want || tf_dnnl_ok(dnnl_memory_desc_init_by_tag(&any, 2, bd, g->bf16_in ? dnnl_bf16 : dnnl_f32, dnnl_format_tag_any),
                                    "B", why, n)) &&
                tf_dnnl_ok(dnnl_matmul_desc_init(&d, &v->a, want ? want : &any, NULL, &v->c), "the matmul", why, n) &&
                tf_dnnl_ok(dnnl_primitive_attr_create(&attr), "attributes", why, n) &&
                tf_dnnl_ok(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "the scratchpad mode", why, n) &&
                tf_dnnl_ok(dnnl_primitive_desc_create(&v->pd, &d, attr, tf_dnnl_engine(NULL), NULL), "the primitive descriptor", why, n) &&
                tf_dnnl_ok(dnnl_primitive_create(&v->prim, v->pd), "the primitive", why, n);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!good) return false;
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(v->pd, dnnl_query_scratchpad_md, 0);
    v->scratchpad = sp ? dnnl_memory_desc_get_size(sp) : 0;
    return true;
}

void tf_dnnl_gemm_free(tf_dnnl_gemm *g)
{
    if (!g) return;
    for (int i = 0; i < 2; i++) {
        if (g->v[i].prim) dnnl_primitive_destroy(g->v[i].prim);
        if (g->v[i].pd) dnnl_primitive_desc_destroy(g->v[i].pd);
    }
    if (g->pack) dnnl_primitive_destroy(g->pack);
    for (int t = 0; g->streams && t < g->threads; t++)
        if (g->streams[t]) dnnl_stream_destroy(g->streams[t]);
    tf_free(g->streams);
    tf_free(g);
}

tf_dnnl_gemm *tf_dnnl_gemm_create(int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool bf16_in, bool bf16_out, int threads,
                                  bool *oom, char *why, size_t n)
{
    *oom = false;
    const char *no = NULL;
    if (!tf_dnnl_engine(&no)) {
        snprintf(why, n, "oneDNN has no CPU engine: %s", no ? no : "?");
        return NULL;
    }
    if (M < 1 || N < 1 || K < 1) {
        snprintf(why, n, "an empty GEMM (%lld x %lld x %lld)", (long long)M, (long long)N, (long long)K);
        return NULL;
    }
    tf_dnnl_gemm *g = tf_calloc(1, sizeof *g);
    if (!g) {
        *oom = true;
        snprintf(why, n, "out of memory");
        return NULL;
    }
    g->M = M, g->N = N, g->K = K, g->ta = ta, g->tb = tb, g->bf16_in = bf16_in, g->bf16_out = bf16_out;
    g->threads = threads < 1 ? 1 : threads;
    int64_t np = tf_cpu_gemm_pieces(), rows = (M + np - 1) / np;
    if (rows < TF_DNNL_GEMM_MIN_ROWS) rows = TF_DNNL_GEMM_MIN_ROWS;
    if (rows > M) rows = M;
    g->rows = rows;
    g->pieces = (M + rows - 1) / rows;
    dnnl_dims_t bd = {K, N}, bs = {tb ? 1 : N, tb ? K : 1};
    /* primitives are made for one thread: oneDNN sizes its blocking by the
     * OpenMP threads of the thread that creates them */
    int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    bool good = tf_dnnl_ok(dnnl_memory_desc_init_by_strides(&g->user_b, 2, bd, bf16_in ? dnnl_bf16 : dnnl_f32, bs), "B", why, n) &&
                variant_make(g, &g->v[0], rows, NULL, why, n);
    g->nv = 1;
    const char *impl = NULL;   /* a reference implementation (bf16 on a CPU without its instructions) is far slower than OpenBLAS */
    if (good && dnnl_primitive_desc_query(g->v[0].pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
        !strncmp(impl, "ref", 3))
        good = false, snprintf(why, n, "oneDNN has only its reference matmul (%s) for %s operands on this CPU", impl,
                               bf16_in ? "bf16" : "f32");
    if (good) g->packed_b = *dnnl_primitive_desc_query_md(g->v[0].pd, dnnl_query_weights_md, 0);
    int64_t last = M - (g->pieces - 1) * rows;
    if (good && last != rows) good = variant_make(g, &g->v[1], last, &g->packed_b, why, n), g->nv = 2;
    dnnl_primitive_desc_t rpd = NULL;
    if (good)
        good = tf_dnnl_ok(dnnl_reorder_primitive_desc_create(&rpd, &g->user_b, tf_dnnl_engine(NULL), &g->packed_b,
                                                             tf_dnnl_engine(NULL), NULL), "the packing reorder", why, n) &&
               tf_dnnl_ok(dnnl_primitive_create(&g->pack, rpd), "the packing reorder", why, n);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    omp_set_num_threads(prev);
    if (good && !(g->streams = tf_calloc((size_t)g->threads, sizeof *g->streams)))
        good = false, *oom = true, snprintf(why, n, "out of memory");
    for (int t = 0; good && t < g->threads; t++)
        good = tf_dnnl_ok(dnnl_stream_create(&g->streams[t], tf_dnnl_engine(NULL), dnnl_stream_default_flags), "a stream", why, n);
    if (!good) {
        tf_dnnl_gemm_free(g);
        return NULL;
    }
    for (int i = 0; i < g->nv; i++)
        if (up64(g->v[i].scratchpad) > g->per_worker) g->per_worker = up64(g->v[i].scratchpad);
    return g;
}

size_t tf_dnnl_gemm_packed_bytes(const tf_dnnl_gemm *g) { return dnnl_memory_desc_get_size(&g->packed_b); }
size_t tf_dnnl_gemm_scratch_bytes(const tf_dnnl_gemm *g) { return (size_t)g->threads * g->per_worker; }

static bool run_on(dnnl_primitive_t p, dnnl_stream_t s, const dnnl_memory_desc_t *const *md, void *const *ptr, const int *arg,
                   int nargs)
{
    dnnl_memory_t mem[4] = {0};
    dnnl_exec_arg_t args[4];
    bool good = true;
    for (int i = 0; good && i < nargs; i++) {
        good = dnnl_memory_create(&mem[i], md[i], tf_dnnl_engine(NULL), ptr[i]) == dnnl_success;
        args[i] = (dnnl_exec_arg_t){arg[i], mem[i]};
    }
    good = good && tf_dnnl_exec(p, s, nargs, args);
    for (int i = 0; i < nargs; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    return good;
}

bool tf_dnnl_gemm_pack(tf_dnnl_gemm *g, const void *B, void *packed)
{
    int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    const dnnl_memory_desc_t *md[2] = {&g->user_b, &g->packed_b};
    void *ptr[2] = {(void *)B, packed};
    int arg[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    bool good = run_on(g->pack, g->streams[0], md, ptr, arg, 2);
    omp_set_num_threads(prev);
    return good;
}

typedef struct gjob {
    tf_dnnl_gemm *g;
    const char *A;
    const void *packed;
    char *C;
    unsigned char *scratch;
    int workers;
    atomic_bool failed;
} gjob;

static bool run_piece(gjob *j, int t, int64_t q)
{
    tf_dnnl_gemm *g = j->g;
    int64_t r0 = q * g->rows;
    gvariant *v = &g->v[q == g->pieces - 1 && g->nv == 2 ? 1 : 0];
    size_t ea = g->bf16_in ? 2 : 4, ec = g->bf16_out ? 2 : 4;
    const char *a = j->A + (size_t)(g->ta ? r0 : r0 * g->K) * ea;
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(v->pd, dnnl_query_scratchpad_md, 0);
    const dnnl_memory_desc_t *md[4] = {&v->a, &g->packed_b, &v->c, sp};
    void *ptr[4] = {(void *)a, (void *)j->packed, j->C + (size_t)(r0 * g->N) * ec, j->scratch + (size_t)t * g->per_worker};
    int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
    return run_on(v->prim, g->streams[t], md, ptr, arg, v->scratchpad ? 4 : 3);
}

static void run_worker(void *arg, int64_t lo, int64_t hi)
{
    gjob *j = arg;
    int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int64_t t = lo; t < hi; t++)
        for (int64_t q = j->g->pieces * t / j->workers; q < j->g->pieces * (t + 1) / j->workers; q++)
            if (!run_piece(j, (int)t, q)) atomic_store(&j->failed, true);
    omp_set_num_threads(prev);
}

bool tf_dnnl_gemm_run(tf_dnnl_gemm *g, tf_pool *pool, const void *A, const void *packed, void *C, void *scratch)
{
    gjob j = {.g = g, .A = A, .packed = packed, .C = C, .scratch = scratch};
    atomic_init(&j.failed, false);
    j.workers = tf_pool_threads(pool);
    if (j.workers > g->threads) j.workers = g->threads;
    if (j.workers > g->pieces) j.workers = (int)g->pieces;
    if ((double)g->M * (double)g->N * (double)g->K < TF_CPU_GEMM_POOL_MIN_MACS) j.workers = 1;   /* small: on this thread */
    if (j.workers <= 1) {
        j.workers = 1;
        run_worker(&j, 0, 1);
    } else {
        tf_pool_run(pool, j.workers, run_worker, &j);
    }
    return !atomic_load(&j.failed);
}

void tf_dnnl_gemm_explain(const tf_dnnl_gemm *g, char *out, size_t n)
{
    const char *impl = "?";
    dnnl_primitive_desc_query(g->v[0].pd, dnnl_query_impl_info_str, 0, &impl);
    char lay[64];
    tf_dnnl_layout_str(&g->packed_b, lay, sizeof lay);
    snprintf(out, n, "oneDNN matmul %s, %s operands, %s result, weights packed once into %s (%zu bytes); %lld pieces of %lld%s rows",
             impl, g->bf16_in ? "bf16" : "f32", g->bf16_out ? "bf16" : "f32", lay, tf_dnnl_gemm_packed_bytes(g), (long long)g->pieces,
             (long long)g->rows, g->nv > 1 ? " or fewer" : "");
}

#else /* !TFUSE_HAVE_ONEDNN */

tf_dnnl_gemm *tf_dnnl_gemm_create(int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool bf16_in, bool bf16_out, int threads,
                                  bool *oom, char *why, size_t n)
{
    (void)M, (void)N, (void)K, (void)ta, (void)tb, (void)bf16_in, (void)bf16_out, (void)threads;
    *oom = false;
    snprintf(why, n, "this build has no oneDNN");
    return NULL;
}
void tf_dnnl_gemm_free(tf_dnnl_gemm *g) { (void)g; }
size_t tf_dnnl_gemm_packed_bytes(const tf_dnnl_gemm *g) { (void)g; return 0; }
size_t tf_dnnl_gemm_scratch_bytes(const tf_dnnl_gemm *g) { (void)g; return 0; }
bool tf_dnnl_gemm_pack(tf_dnnl_gemm *g, const void *B, void *packed) { (void)g, (void)B, (void)packed; return false; }
bool tf_dnnl_gemm_run(tf_dnnl_gemm *g, tf_pool *pool, const void *A, const void *packed, void *C, void *scratch)
{
    (void)g, (void)pool, (void)A, (void)packed, (void)C, (void)scratch;
    return false;
}
void tf_dnnl_gemm_explain(const tf_dnnl_gemm *g, char *out, size_t n) { (void)g, snprintf(out, n, "no oneDNN"); }

#endif
