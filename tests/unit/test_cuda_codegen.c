/* test_cuda_codegen.c — every generated CUDA kernel compiles with NVRTC.
 *
 * The three examples, train and infer, fp32, bf16 and fp16 (and fp32 at odd
 * sizes: tails, partial blocks), lowered to kernels and emitted
 * (codegen/cuda.c): every elementwise and reduction kernel and every
 * library epilogue is emitted, library calls and views are not (with a
 * reason); each name is the FNV-1a 64 hash of its source, emitting twice
 * gives the same text, equal kernels share one name, different ones never
 * do; launch geometry is sane. Every distinct source is then compiled by
 * NVRTC for sm_80 and sm_90 on a pool of threads: no error, no warning in
 * the log, a non-empty ELF cubin that defines the kernel's name. A dropout
 * kernel takes the {seed, step} parameter and compiles too.
 *
 * Library ops' own kernels (tf_cuda_emit_library): every pooling, gather,
 * scatter_add, concat and slice_grad kernel of the examples, and a set of
 * models of those ops in f32, bf16, f16 and f64 (the copies and scatter_add
 * also in i32, i64 and bool) at odd shapes: padding, strides above 1,
 * non-square windows, windows that skip elements, tensors of 2^30 elements
 * and more (64-bit indices), concat along the first,
 * a middle and the last axis (an operand twice), gather from tables of rank
 * 1 to 3 with i32 and i64 ids, slice_grad with steps and a negative start.
 * Each is emitted (matmul and the convolutions are not, with a reason),
 * named by its hash, deterministic, with sane geometry and parameters, and
 * compiled by NVRTC with the rest (no warning).
 *
 * The loader's failure paths: an empty TFUSE_CUDA_LIBS searched alone names
 * the library it could not find and where it looked; a file that is not a
 * library is reported; no driver says so.
 *
 * NVRTC missing is a failure, unless TFUSE_NO_NVRTC=1 (then the compiles are
 * skipped with a message and everything else still runs). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "cuda.h"
#include "cuda_libs.h"
#include "interp.h"
#include "kernel.h"
#include "parser.h"
#include "passes.h"
#include "target_cases.h"
#include "testutil.h"

/* Every distinct source seen, to compile once per architecture. */
typedef struct unique { char *src; char name[24]; uint64_t hash; } unique;
static unique *g_uniq;
static int g_nuniq, g_capuniq;
static int g_emitted;

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* The name the source should carry: its hash with the name blanked. */
static bool name_is_hash(const tf_cuda_kernel *ck)
{
    const char *at = strstr(ck->src, ck->name);
    /* exactly once, or twice with a second entry point "<name>_b" */
    const char *again = at ? strstr(at + 1, ck->name) : NULL;
    if (!at || (again && (!ck->name2[0] || strncmp(again, ck->name2, strlen(ck->name2)) || strstr(again + 1, ck->name)))) return false;
    if (ck->name2[0] && !again) return false;
    char *copy = strdup(ck->src);
    if (!copy) return false;
    memcpy(copy + (at - ck->src), "tf_XXXXXXXXXXXXXXXX", strlen(ck->name));
    if (again) memcpy(copy + (again - ck->src), "tf_XXXXXXXXXXXXXXXX", strlen(ck->name));
    char want[24];
    snprintf(want, sizeof want, "tf_%016llx", (unsigned long long)fnv1a(copy, strlen(copy)));
    free(copy);
    return strlen(ck->name) == 19 && strcmp(want, ck->name) == 0;
}

static void remember(const char *label, const tf_cuda_kernel *ck)
{
    for (int i = 0; i < g_nuniq; i++) {
        if (strcmp(g_uniq[i].src, ck->src) == 0) {
            CHECK(strcmp(g_uniq[i].name, ck->name) == 0, "%s: equal sources, different names %s %s", label, g_uniq[i].name, ck->name);
            return;
        }
        CHECK(strcmp(g_uniq[i].name, ck->name) != 0, "%s: two different sources named %s", label, ck->name);
    }
    if (g_nuniq == g_capuniq) {
        g_capuniq = g_capuniq ? 2 * g_capuniq : 256;
        g_uniq = realloc(g_uniq, (size_t)g_capuniq * sizeof *g_uniq);
        if (!g_uniq) abort();
    }
    g_uniq[g_nuniq].src = strdup(ck->src);
    snprintf(g_uniq[g_nuniq].name, sizeof g_uniq[g_nuniq].name, "%s", ck->name);
    g_uniq[g_nuniq].hash = ck->hash;
    g_nuniq++;
}

static bool wants_code(const tf_kernel *k)
{
    if (k->kind == TF_K_ELEMENTWISE || k->kind == TF_K_REDUCTION) return true;
    return k->kind == TF_K_LIBRARY && k->nexprs && k->nstores;   /* an epilogue */
}

static tf_module *compile_model(const char *label, const char *text, tf_ir_mode mode, tf_ir_precision prec, const tf_dim_set *dims,
                                int nd, tf_kernel_plan *plan)
{
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(label, text, strlen(text), dims, nd, &m, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        return NULL;
    }
    tf_options o = {.mode = mode, .diag = &d, .precision_set = true, .precision = prec};
    if (tf_run_pipeline(m, NULL, &o) || tf_kernels_build(m, plan, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        tf_module_free(m);
        return NULL;
    }
    return m;
}

static void check_geometry(const char *label, const tf_kernel *k, const tf_cuda_kernel *ck)
{
    CHECK(ck->block >= 32 && ck->block <= 1024 && ck->block % 32 == 0, "%s: %s: block %u", label, k->name, ck->block);
    CHECK(ck->grid >= 1 && ck->grid <= 65536, "%s: %s: grid %u", label, k->name, ck->grid);
    CHECK(ck->smem <= 48 * 1024, "%s: %s: %u bytes of shared memory", label, k->name, ck->smem);
    CHECK(ck->align >= 1 && ck->align <= 16 && (ck->align & (ck->align - 1)) == 0, "%s: %s: align %u", label, k->name, ck->align);
    CHECK(ck->nparams == k->nbufs + (ck->scratch ? 1 : 0) + (ck->rng ? 1 : 0), "%s: %s: %d parameters for %d buffers", label, k->name,
          ck->nparams, k->nbufs);
    /* the grid is sized to the work: every thread (pointwise) or every group (reductions) has at most one item
     * unless the grid is at its cap, and a long reduction over few outer indices is split over blocks */
    int64_t all = 1, red_n = 1;
    for (int a = 0; a < k->rank; a++) {
        all *= k->dims[a];
        if ((k->reduce_mask >> a) & 1) red_n *= k->dims[a];
    }
    if (k->kind != TF_K_REDUCTION) {
        int64_t items = ck->shape == TF_CUDA_POINTWISE_VEC ? all / ck->vec : all;
        CHECK(ck->grid == 65536 || (int64_t)ck->grid * ck->block >= items, "%s: %s: grid %u x block %u for %lld items", label, k->name,
              ck->grid, ck->block, (long long)items);
        CHECK((int64_t)(ck->grid - 1) * ck->block < (items > 0 ? items : 1), "%s: %s: grid %u x block %u: whole blocks idle for %lld items",
              label, k->name, ck->grid, ck->block, (long long)items);
    } else {
        int64_t outer = all / (red_n ? red_n : 1), per_block = ck->shape == TF_CUDA_ROW_REDUCE ? ck->block / ck->group : 32;
        bool full_store = false;
        for (int t = 0; t < k->nstores; t++) full_store |= !k->stores[t].reduced_domain;
        CHECK(ck->grid == 65536 || (int64_t)ck->grid * per_block >= outer, "%s: %s: grid %u for %lld outer indices", label, k->name,
              ck->grid, (long long)outer);
        if (ck->shape == TF_CUDA_ROW_REDUCE && k->nreds == 1 && !(full_store && ck->rng) && red_n >= 65536 && outer < 132)
            CHECK(ck->grid >= 2 * outer && ck->scratch > 0, "%s: %s: %lld elements reduced per outer index by %u blocks for %lld",
                  label, k->name, (long long)red_n, ck->grid, (long long)outer);
        int64_t tiles = (outer + 31) / 32;
        if (ck->shape == TF_CUDA_COL_REDUCE && k->nreds == 1 && !full_store && red_n >= 2048 && tiles < 132)
            CHECK(ck->grid >= 2 * tiles && ck->scratch > 0, "%s: %s: %lld rows of %lld columns reduced by %u blocks", label, k->name,
                  (long long)red_n, (long long)outer, ck->grid);
        CHECK(!ck->name2[0] == !(ck->scratch && full_store), "%s: %s: a second kernel exactly for a split reduction's full stores",
              label, k->name);
        if (ck->name2[0])
            CHECK(ck->block2 >= 32 && ck->block2 <= 1024 && (ck->grid2 == 65536 || (int64_t)ck->grid2 * ck->block2 >= all) &&
                      (int64_t)(ck->grid2 - 1) * ck->block2 < all,
                  "%s: %s: second kernel grid %u x block %u for %lld elements", label, k->name, ck->grid2, ck->block2, (long long)all);
    }
    bool red = k->kind == TF_K_REDUCTION;
    CHECK(red == (ck->shape == TF_CUDA_ROW_REDUCE || ck->shape == TF_CUDA_COL_REDUCE), "%s: %s: shape %d", label, k->name,
          ck->shape);
    if (ck->shape == TF_CUDA_POINTWISE_VEC) CHECK(ck->vec >= 2 && ck->align == 16, "%s: %s: vec %u", label, k->name, ck->vec);
    if (red) CHECK(ck->group >= 1 && ck->block % ck->group == 0, "%s: %s: group %u", label, k->name, ck->group);
    CHECK(ck->epilogue == (k->kind == TF_K_LIBRARY || k->lib != NULL), "%s: %s: epilogue flag", label, k->name);
}

/* Counts of what the plans held, by kernel shape. */
static int g_shapes[4];

/* The library ops that get their own generated kernel. */
static bool lib_generated(int op)
{
    switch (op) {
    case TF_OP_MAXPOOL2D: case TF_OP_AVGPOOL2D: case TF_OP_MAXPOOL2D_GRAD: case TF_OP_AVGPOOL2D_GRAD:
    case TF_OP_GATHER: case TF_OP_EMBEDDING: case TF_OP_SCATTER_ADD: case TF_OP_CONCAT: case TF_OP_SLICE_GRAD:
    case TF_OP_FLASH_ATTENTION: case TF_OP_FLASH_ATTENTION_GRAD:
        return true;
    default:
        return false;
    }
}

/* Library kernels emitted, per op and per result dtype. */
static int g_lib[TF_OP_COUNT][TF_DT_COUNT];

static void check_library(const char *label, const tf_module *m, const tf_kernel *k, const tf_cuda_kernel *lc, const char *why)
{
    bool want = k->kind == TF_K_LIBRARY && k->lib && lib_generated(k->lib->op);
    CHECK(want == (lc->src != NULL), "%s: %s: library kernel emitted %d, expected %d (%s)", label, k->name, lc->src != NULL, want, why);
    CHECK(want == tf_cuda_library_supports(k, NULL, 0), "%s: %s: tf_cuda_library_supports", label, k->name);
    if (!lc->src) {
        CHECK(why[0] && strstr(why, k->name), "%s: %s: a reason for no library kernel: %s", label, k->name, why);
        if (k->lib && (k->lib->op == TF_OP_MATMUL || k->lib->op == TF_OP_CONV2D))
            CHECK(strstr(why, tf_op_info_of(k->lib->op)->name) != NULL, "%s: %s: %s", label, k->name, why);
        tf_cuda_kernel none;
        tf_diag d = {0};
        CHECK(tf_cuda_emit_library(k, &none, &d) == TF_IR_ERR_RUNTIME && none.src == NULL && strstr(d.msg, "cuda: "),
              "%s: %s: tf_cuda_emit_library refuses it", label, k->name);
        return;
    }
    const tf_node *n = k->lib;
    CHECK(name_is_hash(lc), "%s: %s: library kernel name %s is the hash of its source", label, k->name, lc->name);
    tf_cuda_kernel again;
    tf_diag d = {0};
    if (!tf_cuda_emit_library(k, &again, &d)) {
        CHECK(strcmp(again.src, lc->src) == 0, "%s: %s: emitting the library kernel twice gives the same text", label, k->name);
        tf_cuda_kernel_free(&again);
    } else {
        CHECK(0, "%s: %s: second library emit: %s", label, k->name, d.msg);
    }
    int operands = 0;
    for (int q = 0; q < n->nin; q++) operands += n->in[q]->kind != TF_VAL_CONST;
    bool ids = n->op == TF_OP_GATHER || n->op == TF_OP_EMBEDDING || n->op == TF_OP_SCATTER_ADD;
    tf_dt dt = n->out->type.dtype;
    bool attn = tf_op_exec_of(n->op) == TF_OPX_ATTENTION;   /* tiled: shared memory, dropout's {seed, step}, a second entry */
    CHECK(lc->library && !lc->epilogue && lc->vec == 1 &&
              (attn ? lc->shape == TF_CUDA_ATTENTION && lc->smem > 0 && lc->smem <= 48 * 1024 &&
                          !lc->name2[0] == (n->op == TF_OP_FLASH_ATTENTION) && (!lc->name2[0] || lc->smem2 == lc->smem)
                    : !lc->rng && lc->shape == TF_CUDA_POINTWISE && lc->smem == 0 && !lc->name2[0]),
          "%s: %s: a library kernel's flags", label, k->name);
    CHECK(lc->block >= 32 && lc->block <= 1024 && lc->block % 32 == 0 && lc->grid >= 1 && lc->grid <= 65536,
          "%s: %s: library geometry grid %u block %u", label, k->name, lc->grid, lc->block);
    CHECK(lc->align >= (unsigned)tf_dtype_bytes(dt) && lc->align <= 8, "%s: %s: align %u", label, k->name, lc->align);
    CHECK(lc->nparams == 1 + operands + (ids ? 1 : 0) + (lc->rng ? 1 : 0) && lc->err == ids, "%s: %s: %d parameters", label, k->name,
          lc->nparams);
    CHECK(lc->clear_first == (n->op == TF_OP_SCATTER_ADD && (dt == TF_DT_F32 || dt == TF_DT_F64)), "%s: %s: clear_first", label, k->name);
    CHECK(!ids || strstr(lc->src, "unsigned long long *tf_err"), "%s: %s: the error word parameter", label, k->name);
    CHECK(!lc->clear_first || strstr(lc->src, "atomicAdd(") != NULL, "%s: %s: atomics into the cleared result", label, k->name);
    CHECK(lc->clear_first || !strstr(lc->src, "atomicAdd("), "%s: %s: no atomics elsewhere", label, k->name);
    char *dump = tf_cuda_dump(m, k, lc);
    CHECK(dump && strstr(dump, "the library op") && strstr(dump, lc->src) && strstr(dump, "b0 = "), "%s: %s: tf_cuda_dump of the library kernel",
          label, k->name);
    tf_free(dump);
    g_lib[n->op][dt]++;
    remember(label, lc);
}

/* Multi-tensor launches seen: launches, and the parts they ran. */
static int g_multi, g_multi_parts, g_multi_fns;   /* ... and the distinct part functions they had */

/* A multi-tensor launch of ks[0..ck->parts): one kernel whose blocks are
 * each part's own range, sized to the part's elements as tf_cuda_emit
 * would size the part alone with blocks of 256 threads; every part's
 * buffers as parameters, a value several parts read only once; the later
 * parts not emitted on their own. */
static void check_multi(const char *label, const tf_module *m, const tf_kernel *ks, int avail, const tf_cuda_program *prog, int i)
{
    const tf_cuda_kernel *ck = &prog->kernels[i];
    int n = ck->parts;
    CHECK(n >= 2 && n <= avail && tf_cuda_multi_span(ks, avail) == n, "%s: %s: a multi-tensor launch of %d parts", label, ks[0].name, n);
    if (n < 2 || n > avail) return;
    unsigned grid = 0;
    int params = 0;
    bool vec = false;
    for (int q = 0; q < n; q++) {
        const tf_kernel *k = &ks[q];
        CHECK(k->multi && k->kind == TF_K_ELEMENTWISE && k->region == ks[0].region, "%s: %s: part %d is a multi region's part", label,
              k->name, q);
        for (int r = 0; r < q; r++) CHECK(tf_kernels_independent(&ks[r], k), "%s: %s and %s share memory", label, ks[r].name, k->name);
        tf_cuda_kernel alone;
        tf_diag d = {0};
        if (tf_cuda_emit(k, &alone, &d)) {
            CHECK(0, "%s: %s: the part alone: %s", label, k->name, d.msg);
            continue;
        }
        int64_t all = 1;
        for (int a = 0; a < k->rank; a++) all *= k->dims[a];
        int64_t items = alone.shape == TF_CUDA_POINTWISE_VEC ? all / alone.vec : all, g = (items + 255) / 256;
        grid += (unsigned)(g < 1 ? 1 : g > 65536 ? 65536 : g);
        vec |= alone.shape == TF_CUDA_POINTWISE_VEC;
        CHECK(!alone.rng, "%s: %s: no dropout in a multi-tensor part", label, k->name);
        tf_cuda_kernel_free(&alone);
        /* the values before this part's: each of its buffers is a parameter unless an earlier part has it */
        for (int b = 0; b < k->nbufs; b++) {
            bool seen = false;
            for (int r = 0; r < q && !seen; r++)
                for (int c = 0; c < ks[r].nbufs && !seen; c++) seen = ks[r].bufs[c].value == k->bufs[b].value;
            params += !seen;
        }
        char part[112];
        snprintf(part, sizeof part, "// part %d: %s\n", q, k->name);   /* the dispatch line that runs it */
        CHECK(strstr(ck->src, part) != NULL, "%s: %s: the launch runs part %d", label, ks[0].name, q);
        if (q) {
            const tf_cuda_kernel *later = &prog->kernels[i + q];
            CHECK(!later->src && strstr(prog->why[i + q], "multi-tensor launch") && strstr(prog->why[i + q], ks[0].name),
                  "%s: %s: not emitted alone, it runs in %s's launch (%s)", label, k->name, ks[0].name, prog->why[i + q]);
        }
    }
    /* parts alike but for their sizes share one function, not inlined (ptxas's time on one function
     * grows faster than the function: 36 inlined AdamW parts took 3 s each) */
    int fns = 0;
    for (const char *at = ck->src; (at = strstr(at, "__noinline__ void tf_part")); at++) fns++;
    CHECK(fns >= 1 && fns <= n && (n < 8 || fns < n), "%s: %s: %d functions for %d parts", label, ks[0].name, fns, n);
    CHECK(!strstr(ck->src, "__forceinline__ void tf_part"), "%s: %s: parts are not inlined", label, ks[0].name);
    g_multi_fns += fns;
    CHECK(ck->grid == grid && ck->block == 256, "%s: %s: grid %u x block %u, the parts need %u blocks of 256", label, ks[0].name, ck->grid,
          ck->block, grid);
    CHECK(ck->nparams == params && params * 8 <= 4096, "%s: %s: %d parameters for %d distinct buffers", label, ks[0].name, ck->nparams,
          params);
    /* ... as the kernel declares them: one `*__restrict__ pQbB` or `*pQbB` per parameter */
    const char *sig = strstr(ck->src, "extern \"C\" __global__");
    int declared = 0;
    const char *lp = sig ? strstr(sig, ") ") : NULL;   /* past __launch_bounds__(N): the kernel's own parenthesis */
    for (const char *at = lp ? strchr(lp, '(') : NULL; at && *at && *at != ')'; at++)
        if (*at == '*') declared++;
    CHECK(declared == params, "%s: %s: the kernel declares %d parameters, %d wanted", label, ks[0].name, declared, params);
    CHECK(ck->shape == (vec ? TF_CUDA_POINTWISE_VEC : TF_CUDA_POINTWISE) && !ck->rng && !ck->scratch && !ck->smem && ck->align <= 16,
          "%s: %s: a multi-tensor launch's flags", label, ks[0].name);
    CHECK(name_is_hash(ck), "%s: %s: name %s is the hash of its source", label, ks[0].name, ck->name);
    tf_cuda_kernel again;
    tf_diag d = {0};
    if (!tf_cuda_emit_multi(ks, n, &again, &d)) {
        CHECK(strcmp(again.src, ck->src) == 0, "%s: %s: emitting the launch twice gives the same text", label, ks[0].name);
        tf_cuda_kernel_free(&again);
    } else {
        CHECK(0, "%s: %s: second multi emit: %s", label, ks[0].name, d.msg);
    }
    CHECK(tf_cuda_emit_multi(ks, 1, &again, &d) == TF_IR_ERR_RUNTIME && !again.src, "%s: one part is no multi-tensor launch", label);
    char *dump = tf_cuda_dump(m, ks, ck);
    bool names = dump != NULL;
    for (int q = 0; names && q < n; q++) names = strstr(dump, ks[q].name) != NULL;
    CHECK(names && strstr(dump, ck->src) && strstr(dump, "p1b0 = "), "%s: %s: tf_cuda_dump names every part", label, ks[0].name);
    tf_free(dump);
    g_multi++;
    g_multi_parts += n;
}

static void emit_model(const char *label, const char *text, tf_ir_mode mode, tf_ir_precision prec, const tf_dim_set *dims, int nd)
{
    tf_kernel_plan plan = {0};
    tf_module *m = compile_model(label, text, mode, prec, dims, nd, &plan);
    if (!m) return;
    tf_diag d = {0};
    tf_cuda_program prog;
    if (tf_cuda_emit_plan(&plan, &prog, &d)) {
        CHECK(0, "%s: tf_cuda_emit_plan: %s", label, d.msg);
        tf_kernels_free(&plan);
        tf_module_free(m);
        return;
    }
    int want = 0, before = g_nuniq, multi_parts = 0, multi_bufs = 0, multi_launches = 0;
    for (int i = 0; i < plan.nkernels; i++) {
        multi_parts += plan.kernels[i].multi;
        multi_bufs += plan.kernels[i].multi ? plan.kernels[i].nbufs : 0;
    }
    for (int i = 0; i < plan.nkernels; i++) {
        const tf_kernel *k = &plan.kernels[i];
        const tf_cuda_kernel *ck = &prog.kernels[i];
        want += wants_code(k);
        check_library(label, m, k, &prog.library[i], prog.lib_why[i]);
        if (ck->src && ck->parts > 1) {   /* an optimizer's update chains in one launch */
            check_multi(label, m, k, plan.nkernels - i, &prog, i);
            remember(label, ck);
            multi_launches++;
            for (int q = 1; q < ck->parts && i + 1 < plan.nkernels; q++) {
                i++;
                check_library(label, m, &plan.kernels[i], &prog.library[i], prog.lib_why[i]);
            }
            continue;
        }
        CHECK(wants_code(k) == (ck->src != NULL), "%s: %s: emitted %d, expected %d (%s)", label, k->name, ck->src != NULL,
              wants_code(k), prog.why[i]);
        if (!ck->src) {
            CHECK(!tf_cuda_supports(k, NULL, 0) && prog.why[i][0] && strstr(prog.why[i], k->name),
                  "%s: %s: a reason for not emitting it", label, k->name);
            if (k->kind == TF_K_VIEW) CHECK(strstr(prog.why[i], "view") != NULL, "%s: %s: %s", label, k->name, prog.why[i]);
            if (k->kind == TF_K_LIBRARY) CHECK(strstr(prog.why[i], "library") != NULL, "%s: %s: %s", label, k->name, prog.why[i]);
            tf_cuda_kernel none;
            tf_diag nd2 = {0};
            CHECK(tf_cuda_emit(k, &none, &nd2) == TF_IR_ERR_RUNTIME && none.src == NULL && strstr(nd2.msg, "cuda: "),
                  "%s: %s: tf_cuda_emit refuses it", label, k->name);
            continue;
        }
        CHECK(name_is_hash(ck), "%s: %s: name %s is the hash of its source", label, k->name, ck->name);
        tf_cuda_kernel again;
        tf_diag d2 = {0};
        if (!tf_cuda_emit(k, &again, &d2)) {
            CHECK(strcmp(again.src, ck->src) == 0 && strcmp(again.name, ck->name) == 0, "%s: %s: emitting twice gives the same text",
                  label, k->name);
            tf_cuda_kernel_free(&again);
        } else {
            CHECK(0, "%s: %s: second emit: %s", label, k->name, d2.msg);
        }
        check_geometry(label, k, ck);
        g_shapes[ck->shape]++;
        if (i == 1 || ck->epilogue) {   /* the .cu text names the kernel and holds the source */
            char *dump = tf_cuda_dump(m, k, ck);
            CHECK(dump && strstr(dump, k->name) && strstr(dump, ck->src), "%s: %s: tf_cuda_dump", label, k->name);
            tf_free(dump);   /* tfuse's allocation */
        }
        remember(label, ck);
    }
    /* every update chain of the optimizer in one launch, where their buffers fit one launch's parameters */
    if (multi_parts > 1 && multi_bufs * 8 <= 4096)
        CHECK(multi_launches == 1, "%s: %d multi-tensor parts in %d launches", label, multi_parts, multi_launches);
    CHECK(prog.nemitted == want && (want > 0 || prog.nlibrary > 0), "%s: %d of %d kernels emitted", label, prog.nemitted, want);
    CHECK(prog.nunique >= 1 && prog.nunique <= prog.nemitted + prog.nlibrary, "%s: %d unique", label, prog.nunique);
    printf("%s: %d kernels, %d emitted, %d library (%d distinct, %d new)\n", label, plan.nkernels, prog.nemitted, prog.nlibrary,
           prog.nunique, g_nuniq - before);
    g_emitted += prog.nemitted + prog.nlibrary;
    tf_cuda_program_free(&prog);
    tf_kernels_free(&plan);
    tf_module_free(m);
}

/* A model with a dropout mask: its kernel takes the {seed, step} pointer. */
static void emit_dropout(void)
{
    static const char *t = "input x : f32[3, 7]\nd = dropout(x, p=0.3)\noutput d\n";
    tf_kernel_plan plan = {0};
    tf_module *m = compile_model("dropout", t, TF_IR_TRAIN, TF_PREC_FP32, NULL, 0, &plan);
    if (!m) return;
    int found = 0;
    for (int i = 0; i < plan.nkernels; i++) {
        const tf_kernel *k = &plan.kernels[i];
        bool has = false;
        for (int e = 0; e < k->nexprs; e++) has |= k->exprs[e].kind == TF_KX_OP && k->exprs[e].op == TF_OP_DROPOUT_MASK;
        if (!has) continue;
        tf_cuda_kernel ck;
        tf_diag d = {0};
        if (tf_cuda_emit(k, &ck, &d)) {
            CHECK(0, "dropout: %s", d.msg);
            continue;
        }
        found++;
        CHECK(ck.rng && ck.nparams == k->nbufs + 1 && strstr(ck.src, "const unsigned long long *tf_rng"),
              "dropout: the kernel takes the rng pointer");
        CHECK(strstr(ck.src, "tf_dropout_keep") != NULL, "dropout: the mask is drawn in the kernel");
        remember("dropout", &ck);
        tf_cuda_kernel_free(&ck);
    }
    CHECK(found > 0, "dropout: a kernel draws the mask");
    tf_kernels_free(&plan);
    tf_module_free(m);
    /* the integer threshold decides exactly as tf_rng_uniform(...) >= p */
    const double ps[] = {0.3, 0.1, 0.5, 0.999, 0.0, 1.0 / 3.0, 0.25 + 1.0 / 9007199254740992.0};
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int bad = 0;
    for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++) {
        uint64_t thr = tf_cuda_dropout_threshold(ps[pi]);
        for (int i = 0; i < 20000; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            uint64_t bits = s >> 11;
            if (i < 4) bits = thr + (uint64_t)i - 2;   /* both sides of the edge */
            bits &= (1ull << 53) - 1;
            double u = (double)bits * (1.0 / 9007199254740992.0);
            bad += (u >= ps[pi]) != (bits >= thr);
        }
    }
    CHECK(bad == 0, "dropout threshold agrees with u >= p (%d disagreements)", bad);
}

/* The library ops at odd shapes, in one dtype: floats get every op, the
 * integer and bool dtypes the ones that copy or add (gather, scatter_add,
 * concat, slice_grad). */
static void emit_library_ops(const char *dt)
{
    bool fl = dt[0] == 'f' || !strcmp(dt, "bf16");
    char text[8192], label[64];
    int at = 0;
#define ADD(...) (at += snprintf(text + at, sizeof text - (size_t)at, __VA_ARGS__))
    ADD("input ids : i64[3, 5]\ninput ids2 : i32[7]\n");
    ADD("input tab : %s[11, 6]\ninput tab1 : %s[13]\ninput tab3 : %s[4, 2, 3]\n", dt, dt, dt);
    ADD("input a : %s[2, 3, 5]\ninput b : %s[2, 1, 5]\ninput c : %s[1, 3, 5]\ninput d : %s[2, 3, 2]\n", dt, dt, dt, dt);
    ADD("input dg : %s[3, 5, 6]\ninput dg1 : %s[7]\n", dt, dt);
    ADD("g0 = gather(ids, tab)\ng1 = gather(ids2, tab1)\ng2 = gather(ids2, tab3)\ng3 = gather(ids, tab3)\n");
    ADD("s0 = scatter_add(ids, dg, shape=[11, 6])\ns1 = scatter_add(ids2, dg1, shape=[13])\n");
    ADD("c0 = concat(a, b, a, axis=1)\nc1 = concat(a, c, axis=0)\nc2 = concat(a, d, a, axis=-1)\nc3 = concat(b, b, axis=1)\n");
    ADD("z0 = slice_grad(a, axis=2, start=1, end=10, step=2, size=10)\n");
    ADD("z1 = slice_grad(b, axis=1, start=-2, end=-1, size=4)\n");
    ADD("z2 = slice_grad(c, axis=0, start=2, end=5, step=3, size=4)\n");
    ADD("z3 = slice_grad(d, axis=-1, start=0, end=2, size=2)\n");
    const char *outs[] = {"g0", "g1", "g2", "g3", "s0", "s1", "c0", "c1", "c2", "c3", "z0", "z1", "z2", "z3"};
    for (size_t i = 0; i < sizeof outs / sizeof *outs; i++) ADD("output %s\n", outs[i]);
    if (fl) {
        ADD("input x : %s[2, 3, 7, 9]\ninput y : %s[1, 2, 5, 6]\ninput w : %s[3, 1, 4, 11]\n", dt, dt, dt);
        /* padding, strides 2x1, a 3x2 window; 2x2 windows dropping a row and a
         * column; a 1x3 window with strides 3x2 (rows skipped); 3x3 stride 1;
         * a 4x4 window, stride 3, padding 2 (windows mostly padding) */
        static const char *pools[] = {"kernel=[3, 2], stride=[2, 1], padding=[1, 1]", "kernel=2",
                                      "kernel=[1, 3], stride=[3, 2], padding=[0, 1]", "kernel=3, stride=1, padding=1",
                                      "kernel=4, stride=3, padding=2"};
        static const char *src[] = {"x", "y", "w", "x", "w"};
        static const char *shape[] = {"[2, 3, 7, 9]", "[1, 2, 5, 6]", "[3, 1, 4, 11]", "[2, 3, 7, 9]", "[3, 1, 4, 11]"};
        for (int i = 0; i < 5; i++) {
            ADD("mp%d = maxpool2d(%s, %s)\nap%d = avgpool2d(%s, %s)\n", i, src[i], pools[i], i, src[i], pools[i]);
            ADD("mg%d = maxpool2d_grad(%s, mp%d, %s)\nag%d = avgpool2d_grad(ap%d, %s, shape=%s)\n", i, src[i], i, pools[i], i, i,
                pools[i], shape[i]);
            ADD("output mg%d\noutput ag%d\n", i, i);
        }
    }
#undef ADD
    CHECK(at < (int)sizeof text, "library ops model text fits");
    snprintf(label, sizeof label, "library ops %s", dt);
    emit_model(label, text, TF_IR_INFER, TF_PREC_FP32, NULL, 0);
}

/* Tensors of 2^30 elements and more: the library kernels index in 64 bits. */
static void emit_library_wide(void)
{
    static const char *t =
        "input ids : i64[8]\ninput tab : f32[65536, 16384]\ninput a : bf16[32768, 32768]\ninput x : f16[1, 1, 32768, 32768]\n"
        "input dy : f32[8, 16384]\n"
        "g = gather(ids, tab)\ns = scatter_add(ids, dy, shape=[65536, 16384])\nc = concat(a, a, axis=1)\n"
        "z = slice_grad(a, axis=0, start=1, end=65536, step=2, size=65536)\np = maxpool2d(x, kernel=3, stride=2, padding=1)\n"
        "q = maxpool2d_grad(x, p, kernel=3, stride=2, padding=1)\noutput g\noutput s\noutput c\noutput z\noutput q\n";
    tf_kernel_plan plan = {0};
    tf_module *m = compile_model("library ops, 64-bit indices", t, TF_IR_INFER, TF_PREC_FP32, NULL, 0, &plan);
    if (!m) return;
    int wide = 0;
    for (int i = 0; i < plan.nkernels; i++) {
        const tf_kernel *k = &plan.kernels[i];
        if (!tf_cuda_library_supports(k, NULL, 0)) continue;
        tf_cuda_kernel ck;
        tf_diag d = {0};
        if (tf_cuda_emit_library(k, &ck, &d)) {
            CHECK(0, "wide: %s: %s", k->name, d.msg);
            continue;
        }
        CHECK(ck.wide_index && strstr(ck.src, "typedef long long tf_idx;"), "wide: %s indexes in 64 bits", k->name);
        wide += ck.wide_index;
        remember("library ops, 64-bit indices", &ck);
        tf_cuda_kernel_free(&ck);
    }
    CHECK(wide == 6, "wide: six library kernels (%d)", wide);
    tf_kernels_free(&plan);
    tf_module_free(m);
}

/* ---- the loader ---- */

static void loader_failures(const char *tmpdir)
{
    char err[4096], *saved_dirs = getenv("TFUSE_CUDA_LIBS"), *saved_only = getenv("TFUSE_CUDA_LIBS_ONLY");
    saved_dirs = saved_dirs ? strdup(saved_dirs) : NULL;
    saved_only = saved_only ? strdup(saved_only) : NULL;
    tf_cuda_libs l;
    /* an empty directory, searched alone through the environment */
    setenv("TFUSE_CUDA_LIBS", tmpdir, 1);
    setenv("TFUSE_CUDA_LIBS_ONLY", "1", 1);
    tf_cuda_status st = tf_cuda_libs_load(&l, TF_CUDA_LIB_NVRTC | TF_CUDA_LIB_DRIVER, NULL, err, sizeof err);
    CHECK(st == TF_CUDA_ERR_NOT_FOUND && l.loaded == 0, "empty TFUSE_CUDA_LIBS alone: nothing loads (status %d)", st);
    CHECK(strstr(err, "NVRTC not found") && strstr(err, "libnvrtc.so.13") && strstr(err, tmpdir) &&
              strstr(err, "TFUSE_CUDA_LIBS_ONLY=1"),
          "the NVRTC message names the library and the only place searched: %s", err);
    CHECK(strstr(err, "no CUDA driver (libcuda.so.1 not found)") != NULL, "the driver message names libcuda.so.1: %s", err);
    CHECK(strstr(l.nvrtc_error, "libnvrtc") && strstr(l.driver_error, "libcuda.so.1"), "each library keeps its reason");
    char desc[8192];
    tf_cuda_libs_describe(&l, desc, sizeof desc);
    CHECK(strstr(desc, "nvrtc: not loaded") && strstr(desc, "driver: not loaded"), "describe says what did not load: %s", desc);
    tf_cuda_libs_free(&l);
    if (saved_dirs) setenv("TFUSE_CUDA_LIBS", saved_dirs, 1);
    else unsetenv("TFUSE_CUDA_LIBS");
    if (saved_only) setenv("TFUSE_CUDA_LIBS_ONLY", saved_only, 1);
    else unsetenv("TFUSE_CUDA_LIBS_ONLY");
    free(saved_dirs);
    free(saved_only);

    /* the same through the API; a file that is not a library is named */
    char fake[4096];
    snprintf(fake, sizeof fake, "%s/libnvrtc.so.12", tmpdir);
    FILE *f = fopen(fake, "w");
    CHECK(f != NULL, "cannot write %s", fake);
    if (f) {
        fputs("not a shared object\n", f);
        fclose(f);
    }
    tf_cuda_search only = {TF_CUDA_SEARCH_DIRS_ONLY, tmpdir}, all_places = {TF_CUDA_SEARCH_EVERYWHERE, NULL};
    st = tf_cuda_libs_load(&l, TF_CUDA_LIB_NVRTC, &only, err, sizeof err);
    CHECK(st == TF_CUDA_ERR_NOT_FOUND && strstr(err, fake) && strstr(err, "directories-only"),
          "a file that does not load is reported: %s", err);
    tf_cuda_libs_free(&l);
    remove(fake);

    /* cuDNN: missing from a directories-only search, the message says what
     * and where; searched everywhere, found with its version and functions
     * (this machine's toolkit has it) or missing with the places searched */
    st = tf_cuda_libs_load(&l, TF_CUDA_LIB_CUDNN, &only, err, sizeof err);
    CHECK(st == TF_CUDA_ERR_NOT_FOUND && !(l.loaded & TF_CUDA_LIB_CUDNN) && strstr(err, "cuDNN not found") &&
              strstr(err, "libcudnn.so.9") && strstr(err, tmpdir) && strstr(err, "nvidia-cudnn"),
          "cuDNN missing: %s", err);
    tf_cuda_libs_describe(&l, desc, sizeof desc);
    CHECK(strstr(desc, "cudnn: not loaded: cuDNN not found") != NULL, "describe says cuDNN did not load: %s", desc);
    tf_cuda_libs_free(&l);
    st = tf_cuda_libs_load(&l, TF_CUDA_LIB_CUDNN, &all_places, err, sizeof err);
    tf_cuda_libs_describe(&l, desc, sizeof desc);
    if (st) {
        CHECK(strstr(err, "cuDNN not found") && strstr(err, "/usr/local/cuda/lib64") && strstr(err, "site-packages"),
              "cuDNN not on this machine, and the message says where it looked: %s", err);
        printf("cudnn: %s\n", l.cudnn_error);
    } else {
        CHECK(l.cudnn_version >= 80000 && l.dnn.Create && l.dnn.SetStream && strstr(desc, "cudnn: ") &&
                  strstr(desc, l.cudnn_path),
              "cuDNN loaded with its version, functions and path: %s", desc);
        CHECK(strcmp(l.dnn.GetErrorString(0), "") != 0, "cudnnGetErrorString answers");
        printf("cudnn: %zu from %s\n", l.cudnn_version, l.cudnn_path);
    }
    tf_cuda_libs_free(&l);

    /* NCCL likewise: missing from a directories-only search, said; searched everywhere, found with a
     * version (CUDA 13's toolkit ships it) or missing with the places searched */
    st = tf_cuda_libs_load(&l, TF_CUDA_LIB_NCCL, &only, err, sizeof err);
    tf_cuda_libs_describe(&l, desc, sizeof desc);
    CHECK(st == TF_CUDA_ERR_NOT_FOUND && strstr(err, "NCCL not found") && strstr(err, "libnccl.so.2") && strstr(err, tmpdir) &&
              strstr(desc, "nccl: not loaded: NCCL not found"),
          "NCCL missing: %s / %s", err, desc);
    tf_cuda_libs_free(&l);
    st = tf_cuda_libs_load(&l, TF_CUDA_LIB_NCCL, &all_places, err, sizeof err);
    tf_cuda_libs_describe(&l, desc, sizeof desc);
    if (st) {
        CHECK(strstr(err, "NCCL not found") && strstr(err, "site-packages"), "NCCL not on this machine, and where it looked: %s", err);
        printf("nccl: %s\n", l.nccl_error);
    } else {
        CHECK(l.nccl_version >= 20000 && strstr(desc, "nccl: ") && strstr(desc, l.nccl_path), "NCCL loaded with its version: %s", desc);
        printf("nccl: %d from %s\n", l.nccl_version, l.nccl_path);
    }
    tf_cuda_libs_free(&l);

    /* the driver, searched everywhere: on a machine without one, say so */
    tf_cuda_search all = all_places;
    st = tf_cuda_libs_load(&l, TF_CUDA_LIB_DRIVER, &all, err, sizeof err);
    if (st) {
        CHECK(strstr(err, "libcuda.so.1") && strstr(err, "no NVIDIA GPU driver"), "no driver: %s", err);
        int nd = -1;
        CHECK(tf_cuda_driver_init(&l, &nd, err, sizeof err) == TF_CUDA_ERR_NOT_FOUND && nd == 0 && strstr(err, "libcuda.so.1"),
              "driver_init without a driver: %s", err);
        printf("driver: %s\n", l.driver_error);
    } else {
        CHECK(l.driver_path[0] && l.cu.LaunchKernel, "the driver loaded with its functions");
        printf("driver: %d loaded from %s\n", l.driver_version, l.driver_path);
    }
    tf_cuda_libs_free(&l);
}

/* ---- compiling ---- */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool cubin_defines(const tf_nvrtc_job *j)
{
    const unsigned char *p = j->cubin;
    if (j->cubin_size < 64 || memcmp(p, "\177ELF", 4) != 0) return false;
    size_t n = strlen(j->name);
    for (size_t i = 0; i + n <= j->cubin_size; i++)
        if (memcmp(p + i, j->name, n) == 0) return true;
    return false;
}

/* TFUSE_CUDA_COMPILE_EVERY=N compiles one distinct source in N: the
 * sanitizer builds set it, since NVRTC runs several times slower under
 * ASan's allocator and is not what they check (the emitter still runs on
 * every kernel there). */
static int compile_every(void)
{
    const char *v = getenv("TFUSE_CUDA_COMPILE_EVERY");
    int n = v ? atoi(v) : 1;
    return n >= 1 ? n : 1;
}

static void compile_all(const tf_cuda_libs *libs)
{
    static const char *archs[] = {"sm_80", "sm_90"};
    int every = compile_every(), nsrc = (g_nuniq + every - 1) / every;
    int na = (int)(sizeof archs / sizeof *archs), nj = nsrc * na;
    if (every > 1) printf("compiling 1 distinct kernel in %d (TFUSE_CUDA_COMPILE_EVERY=%d)\n", every, every);
    tf_nvrtc_job *jobs = calloc((size_t)nj + 1, sizeof *jobs);
    if (!jobs) abort();
    for (int i = 0; i < nsrc; i++)
        for (int a = 0; a < na; a++) {
            jobs[i * na + a].src = g_uniq[i * every].src;
            jobs[i * na + a].name = g_uniq[i * every].name;
            jobs[i * na + a].arch = archs[a];
        }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cpus > 0 ? (int)cpus : 2;
    double t0 = now();
    tf_cuda_status st = tf_nvrtc_compile_jobs(libs, jobs, nj, threads);
    double dt = now() - t0;
    CHECK(st == TF_CUDA_OK, "every kernel compiles (status %d)", st);
    int ok[2] = {0, 0}, warned = 0;
    for (int j = 0; j < nj; j++) {
        tf_nvrtc_job *jb = &jobs[j];
        CHECK(jb->status == TF_CUDA_OK, "%s for %s: %s\n%s", jb->name, jb->arch, jb->err, jb->log ? jb->log : "");
        if (jb->status) {
            static int shown;
            if (shown++ < 3) fprintf(stderr, "--- source of %s ---\n%s\n", jb->name, jb->src);
            continue;
        }
        bool warns = jb->log && (strstr(jb->log, "warning") || strstr(jb->log, "Warning"));
        warned += warns;
        CHECK(!warns, "%s for %s: NVRTC warns:\n%s", jb->name, jb->arch, jb->log);
        CHECK(cubin_defines(jb), "%s for %s: an ELF cubin (%zu bytes) defining the kernel", jb->name, jb->arch, jb->cubin_size);
        ok[j % na]++;
    }
    printf("nvrtc: %d distinct kernels (of %d emitted); compiled for %s: %d, %s: %d; %d warned; %.1f s on %d threads\n",
           g_nuniq, g_emitted, archs[0], ok[0], archs[1], ok[1], warned, dt, threads);
    CHECK(ok[0] == nsrc && ok[1] == nsrc, "every distinct kernel compiled for both architectures");
    for (int j = 0; j < nj; j++) tf_nvrtc_job_free(&jobs[j]);
    free(jobs);
}

static void compile_errors(const tf_cuda_libs *libs)
{
    void *cubin;
    size_t size;
    char *log = NULL, err[2048];
    tf_cuda_status st = tf_nvrtc_compile(libs, "extern \"C\" __global__ void k(float *x) { x[0] = undeclared; }\n", "broken", "sm_90",
                                         &cubin, &size, &log, err, sizeof err);
    CHECK(st == TF_CUDA_ERR_COMPILE && !cubin && log && strstr(log, "undeclared") && strstr(err, "broken.cu") &&
              strstr(err, "undeclared"),
          "a compile error comes back with the log: %s", err);
    tf_free(log);
    st = tf_nvrtc_compile(libs, "extern \"C\" __global__ void k() {}\n", "k", "sm_10", &cubin, &size, &log, err, sizeof err);
    CHECK(st == TF_CUDA_ERR_ARCH && strstr(err, "sm_10"), "an unknown architecture is refused: %s", err);
    tf_free(log);
}

int main(void)
{
    double t0 = now();
    char tmpdir[] = "/tmp/tfuse_cuda_test_XXXXXX";
    CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp: %s", strerror(errno));
    loader_failures(tmpdir);
    rmdir(tmpdir);

    static const struct { tf_ir_precision p; const char *name; } precs[] = {
        {TF_PREC_FP32, "fp32"}, {TF_PREC_BF16, "bf16"}, {TF_PREC_FP16, "fp16"}};
    for (size_t i = 0; i < TEST_NEXAMPLES; i++) {
        const test_example *ex = &test_examples[i];
        tf_dim_set dims[3];
        for (int j = 0; j < ex->nd; j++) dims[j] = (tf_dim_set){ex->dims[j].name, ex->dims[j].value};
        char path[4096], label[4200];
        char *text = test_read_example(ex->file, path, sizeof path);
        CHECK(text != NULL, "cannot read %s", path);
        if (!text) continue;
        for (int mode = 0; mode < 2; mode++)
            for (size_t p = 0; p < sizeof precs / sizeof *precs; p++) {
                snprintf(label, sizeof label, "%s %s %s", ex->file, mode == TF_IR_TRAIN ? "train" : "infer", precs[p].name);
                emit_model(label, text, (tf_ir_mode)mode, precs[p].p, NULL, 0);
            }
        /* odd sizes: vector tails, partial blocks, rows shorter than a warp */
        snprintf(label, sizeof label, "%s train fp32 (odd sizes)", ex->file);
        emit_model(label, text, TF_IR_TRAIN, TF_PREC_FP32, dims, ex->nd);
        free(text);
    }
    emit_dropout();
    /* long reductions: split over blocks, with scratch (check_geometry demands it) */
    emit_model("long reductions", tc_text("long reductions"), TF_IR_INFER, TF_PREC_FP32, NULL, 0);
    emit_model("long reductions bf16", tc_text("long reductions"), TF_IR_INFER, TF_PREC_BF16, NULL, 0);
    static const char *lib_dts[] = {"f32", "bf16", "f16", "f64", "i32", "i64", "bool"};
    for (size_t i = 0; i < sizeof lib_dts / sizeof *lib_dts; i++) emit_library_ops(lib_dts[i]);
    emit_library_wide();
    static const int lib_ops[] = {TF_OP_MAXPOOL2D, TF_OP_AVGPOOL2D, TF_OP_MAXPOOL2D_GRAD, TF_OP_AVGPOOL2D_GRAD,
                                  TF_OP_GATHER, TF_OP_SCATTER_ADD, TF_OP_CONCAT, TF_OP_SLICE_GRAD};
    static const tf_dt lib_fl[] = {TF_DT_F32, TF_DT_BF16, TF_DT_F16, TF_DT_F64};
    for (size_t i = 0; i < sizeof lib_ops / sizeof *lib_ops; i++)
        for (size_t j = 0; j < sizeof lib_fl / sizeof *lib_fl; j++)
            CHECK(g_lib[lib_ops[i]][lib_fl[j]] > 0, "a generated %s kernel in %s", tf_op_info_of(lib_ops[i])->name,
                  tf_dtype_name(lib_fl[j]));
    CHECK(g_lib[TF_OP_GATHER][TF_DT_I32] && g_lib[TF_OP_GATHER][TF_DT_I64] && g_lib[TF_OP_GATHER][TF_DT_BOOL],
          "gather in the integer dtypes and bool");
    CHECK(g_lib[TF_OP_SCATTER_ADD][TF_DT_I32] && g_lib[TF_OP_CONCAT][TF_DT_BOOL] && g_lib[TF_OP_SLICE_GRAD][TF_DT_I64],
          "scatter_add, concat and slice_grad in the integer dtypes and bool");
    printf("shapes: %d pointwise, %d vectorized, %d row reductions, %d column reductions\n", g_shapes[TF_CUDA_POINTWISE],
           g_shapes[TF_CUDA_POINTWISE_VEC], g_shapes[TF_CUDA_ROW_REDUCE], g_shapes[TF_CUDA_COL_REDUCE]);
    for (int s = 0; s < 4; s++) CHECK(g_shapes[s] > 0, "the examples use kernel shape %d", s);
    CHECK(g_nuniq < g_emitted, "equal kernels share a source (%d distinct of %d)", g_nuniq, g_emitted);
    CHECK(g_multi > 0 && g_multi_parts > g_multi, "the examples' optimizers run as multi-tensor launches (%d, of %d parts)", g_multi,
          g_multi_parts);
    printf("multi-tensor launches: %d, of %d parts in %d distinct functions\n", g_multi, g_multi_parts, g_multi_fns);
    CHECK(g_multi_fns < g_multi_parts, "parts alike share a function (%d for %d parts)", g_multi_fns, g_multi_parts);

    tf_cuda_libs libs;
    char err[4096];
    if (tf_cuda_libs_load(&libs, TF_CUDA_LIB_NVRTC, NULL, err, sizeof err)) {
        const char *skip = getenv("TFUSE_NO_NVRTC");
        if (skip && strcmp(skip, "1") == 0) {
            printf("SKIPPED: the NVRTC compiles (TFUSE_NO_NVRTC=1): %s\n", err);
        } else {
            CHECK(0, "NVRTC is needed to check the generated CUDA (set TFUSE_NO_NVRTC=1 to skip): %s", err);
        }
    } else {
        char desc[8192];
        tf_cuda_libs_describe(&libs, desc, sizeof desc);
        printf("%s", desc);
        CHECK(strstr(desc, libs.nvrtc_path) != NULL && libs.nvrtc_major >= 11, "describe names the NVRTC loaded");
        CHECK(libs.include_dir[0] != 0, "an include directory with cuda_fp16.h and cuda_bf16.h was found");
        compile_errors(&libs);
        compile_all(&libs);
        tf_cuda_libs_free(&libs);
    }
    for (int i = 0; i < g_nuniq; i++) free(g_uniq[i].src);
    free(g_uniq);
    printf("%.1f s in all\n", now() - t0);
    return check_report();
}
