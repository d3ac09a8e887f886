/* cuda.c — CUDA C++ for NVRTC from elementwise and reduction kernels (and
 * the epilogues of library kernels). See cuda.h for the model.
 *
 * The generated code follows kernel_eval.c's order within each outer index:
 *
 *   pointwise    for every flat index i (grid-stride): the expressions the
 *                stores need, then the stores; contiguous buffers (stride
 *                vector = the space's row-major strides) move as 16-byte
 *                vectors of `vec` elements, an unrolled loop of vec scalar
 *                bodies in between;
 *   reduction    for every outer index o (a group of threads each): per
 *                reduction in order, each thread folds its strided share of
 *                the reduced index r, the group combines (warp shuffles,
 *                then shared memory), every thread of the group holds the
 *                result; then thread 0 of the group does the outer stores
 *                and the group the full-space stores.
 *
 * The source names no buffer and no op of the module: b0, b1, ... are the
 * kernel's buffers in order, so equal kernels get equal text and, hashed,
 * equal names.
 *
 * This file holds the entry points, what every kind of kernel shares (the
 * per-kernel state, the helpers at the top of every source, naming by the
 * hash) and the pointwise kernels; cuda_emit.h lists the other files:
 * expressions (cuda_expr.c), reductions (cuda_reduce.c), multi-tensor
 * launches (cuda_multi.c) and library ops' kernels (cuda_lib.c). */
#include "cuda_emit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scalar.h"

/* The name in the source until the hash is known; same length as the name. */
const char cu_placeholder[] = "tf_XXXXXXXXXXXXXXXX";

/* Grids larger than this loop instead (every kernel is a grid-stride loop). */
enum { MAX_GRID = 65536 };

/* ---- what is supported ------------------------------------------------------ */

/* The scalar primitives lower_cuda implements (all of scalar.h's). */
static bool cuda_has(tf_sprim p) { return (unsigned)p < TF_S_COUNT; }


/* Whether the op's scalar expression parses, uses only primitives this
 * generator has, and fits the operands the kernel gives it. */
static bool lowered(const tf_kexpr *x, char *why, size_t n) { return tf_sexpr_lowerable(x->op, x->nargs, cuda_has, why, n); }

bool tf_cuda_lowers(int op, char *why, size_t n) { return tf_sexpr_lowerable(op, 3, cuda_has, why, n); }   /* one_hot gets the class index as b */

bool tf_cuda_supports(const tf_kernel *k, char *why, size_t n)
{
    char tmp[8];
    if (!why) { why = tmp; n = sizeof tmp; }
    if (k->kind == TF_K_VIEW) {
        snprintf(why, n, "kernel %s: a view (reshape) has no work to emit", k->name);
        return false;
    }
    if (k->kind == TF_K_LIBRARY && (!k->nexprs || !k->nstores)) {
        snprintf(why, n, "kernel %s: %s is a library op without an epilogue: nothing here (its own kernel is "
                 "tf_cuda_emit_library's, or a library call)", k->name, k->lib ? tf_op_info_of(k->lib->op)->name : "?");
        return false;
    }
    if (k->rank > TF_MAX_RANK) {
        snprintf(why, n, "kernel %s: rank %d exceeds %d", k->name, k->rank, TF_MAX_RANK);
        return false;
    }
    for (int i = 0; i < k->nexprs; i++) {
        const tf_kexpr *x = &k->exprs[i];
        char no[200];
        if (x->kind == TF_KX_OP && !lowered(x, no, sizeof no)) {
            snprintf(why, n, "kernel %s: op %s has no CUDA lowering: %s", k->name, tf_op_info_of(x->op)->name, no);
            return false;
        }
    }
    for (int r = 0; r < k->nreds; r++) {
        int op = k->reds[r].op;
        if (!tf_kernel_reduction_ok(op)) {
            snprintf(why, n, "kernel %s: reduction %d (%s) has no CUDA lowering", k->name, r, tf_op_info_of(op)->name);
            return false;
        }
    }
    return true;
}

/* ---- pointwise ---------------------------------------------------------------------- */

/* The widest element of the kernel's buffers, in bytes: the alignment
 * scalar accesses need. */
unsigned cu_widest(const tf_kernel *k)
{
    unsigned w = 1;
    for (int b = 0; b < k->nbufs; b++) {
        unsigned x = (unsigned)tf_dtype_bytes(k->bufs[b].value->type.dtype);
        if (x > w) w = x;
    }
    return w;
}

/* Blocks for `work` items, per_block a block: 1 to MAX_GRID (every kernel loops past it). */
unsigned cu_blocks_for(int64_t work, unsigned per_block)
{
    int64_t g = (work + per_block - 1) / per_block;
    return g < 1 ? 1 : g > MAX_GRID ? MAX_GRID : (unsigned)g;
}

/* The scalar body at flat index i (declared by the caller). */
static void pointwise_body(em *e, int depth)
{
    const tf_kernel *k = e->k;
    e->md = M_FLAT;
    unsigned ax = cu_axes_used(e, SEL_ALL, M_FLAT, NULL);
    cu_def_axes(e, depth, ax, (1u << k->rank) - 1, "i");
    cu_emit_selected(e, depth, SEL_ALL);
    for (int s = 0; s < k->nstores; s++) {
        char at[64];
        snprintf(at, sizeof at, "b%d[i]", k->stores[s].buf);
        cu_emit_store(e, depth, &k->stores[s], at);
    }
}

void cu_emit_pointwise(em *e, geom *g)
{
    const tf_kernel *k = e->k;
    cu_mark_clear(e);
    for (int s = 0; s < k->nstores; s++) cu_mark_from(e, k->stores[s].expr);
    /* vectors: every store and every contiguous load, as wide as 16 bytes
     * of the widest of them allow */
    int maxb = 1;
    for (int s = 0; s < k->nstores; s++) {
        int b = tf_dtype_bytes(k->bufs[k->stores[s].buf].value->type.dtype);
        if (b > maxb) maxb = b;
    }
    for (int i = 0; i < k->nexprs; i++)
        if (e->mark[i] && e->contig[i]) {
            int b = tf_dtype_bytes(k->bufs[k->exprs[i].buf].value->type.dtype);
            if (b > maxb) maxb = b;
        }
    int vec = 16 / maxb;
    int64_t n = e->numel;
    bool use_vec = k->nstores > 0 && vec >= 2 && n >= vec;
    g->block = e->block ? e->block : 256;
    int64_t work = use_vec ? n / vec : n;
    if (work < 256 && !e->block) g->block = (unsigned)(work < 32 ? 32 : (work + 31) / 32 * 32);
    g->grid = cu_blocks_for(work, g->block);
    g->shape = use_vec ? TF_CUDA_POINTWISE_VEC : TF_CUDA_POINTWISE;
    g->vec = use_vec ? (unsigned)vec : 1;
    g->align = use_vec ? 16 : cu_widest(k);
    e->vec = use_vec;
    sb *s = &e->s;
    /* the count as a literal, or as e->count (long long) read as tf_idx */
    char nv_s[96], n_s[96], start_s[96];
    if (e->count) {
        snprintf(nv_s, sizeof nv_s, "(tf_idx)(%s / %d)", e->count, use_vec ? vec : 1);
        snprintf(n_s, sizeof n_s, "(tf_idx)%s", e->count);
        snprintf(start_s, sizeof start_s, "(tf_idx)(%s / %d * %d)", e->count, use_vec ? vec : 1, use_vec ? vec : 1);
        if (use_vec) cu_line(s, 1, "// pointwise over %s elements, %d at a time (16 bytes of the widest buffer)", e->count, vec);
        else cu_line(s, 1, "// pointwise over %s elements", e->count);
    } else {
        snprintf(nv_s, sizeof nv_s, "%lld", (long long)(use_vec ? n / vec : n));
        snprintf(n_s, sizeof n_s, "%lld", (long long)n);
        snprintf(start_s, sizeof start_s, "%lld", (long long)(use_vec ? n / vec * vec : 0));
        if (use_vec) cu_line(s, 1, "// pointwise over %lld elements, %d at a time (16 bytes of the widest buffer)", (long long)n, vec);
        else cu_line(s, 1, "// pointwise over %lld elements", (long long)n);
    }
    cu_emit_dropout_keys(e, 1);
    if (!k->nstores) return;
    char stride[64];
    const char *bid = e->bid ? e->bid : "blockIdx.x";
    snprintf(stride, sizeof stride, "(tf_idx)%s * blockDim.x", e->nblocks ? e->nblocks : "gridDim.x");
    int64_t start = 0;
    if (use_vec) {
        int64_t nv = n / vec;
        cu_line(s, 1, "for (tf_idx tc = (tf_idx)%s * blockDim.x + threadIdx.x; tc < %s; tc += %s) {", bid, nv_s, stride);
        for (int i = 0; i < k->nexprs; i++) {
            if (!e->mark[i] || !e->contig[i]) continue;
            const tf_kexpr *x = &k->exprs[i];
            const char *t = cu_storage_type(k->bufs[x->buf].value->type.dtype);
            cu_line(s, 2, "const tf_vec<%s, %d> tf_v%d = *(const tf_vec<%s, %d> *)(b%d + tc * %d);", t, vec, i, t, vec, x->buf, vec);
        }
        for (int t = 0; t < k->nstores; t++)
            cu_line(s, 2, "tf_vec<%s, %d> tf_s%d;", cu_storage_type(k->bufs[k->stores[t].buf].value->type.dtype), vec, t);
        cu_line(s, 2, "#pragma unroll");
        cu_line(s, 2, "for (int j = 0; j < %d; j++) {", vec);
        e->md = M_VEC;
        bool flat;
        unsigned ax = cu_axes_used(e, SEL_ALL, M_VEC, &flat);
        if (flat) cu_line(s, 3, "const tf_idx i = tc * %d + j;", vec);
        cu_def_axes(e, 3, ax, (1u << k->rank) - 1, "i");
        cu_emit_selected(e, 3, SEL_ALL);
        for (int t = 0; t < k->nstores; t++) {
            char at[64];
            snprintf(at, sizeof at, "tf_s%d.v[j]", t);
            cu_emit_store(e, 3, &k->stores[t], at);
        }
        cu_line(s, 2, "}");
        for (int t = 0; t < k->nstores; t++) {
            const char *ty = cu_storage_type(k->bufs[k->stores[t].buf].value->type.dtype);
            cu_line(s, 2, "*(tf_vec<%s, %d> *)(b%d + tc * %d) = tf_s%d;", ty, vec, k->stores[t].buf, vec, t);
        }
        cu_line(s, 1, "}");
        start = nv * vec;
        if (start == n) return;
        if (e->count) cu_line(s, 1, "// the last %s %% %d elements", e->count, vec);
        else cu_line(s, 1, "// the last %lld elements", (long long)(n - start));
    }
    if (start) cu_line(s, 1, "for (tf_idx i = %s + (tf_idx)%s * blockDim.x + threadIdx.x; i < %s; i += %s) {", start_s, bid, n_s, stride);
    else cu_line(s, 1, "for (tf_idx i = (tf_idx)%s * blockDim.x + threadIdx.x; i < %s; i += %s) {", bid, n_s, stride);
    pointwise_body(e, 2);
    cu_line(s, 1, "}");
}

/* ---- the whole source ------------------------------------------------------------------ */

const char cu_helpers_common[] =
    "__device__ __forceinline__ float tf_max(float a, float b) { return a != a ? a : b != b ? b : a > b ? a : b; }\n"
    "__device__ __forceinline__ double tf_max(double a, double b) { return a != a ? a : b != b ? b : a > b ? a : b; }\n"
    "__device__ __forceinline__ long long tf_max(long long a, long long b) { return a > b ? a : b; }\n"
    "__device__ __forceinline__ int tf_max(int a, int b) { return a > b ? a : b; }\n"
    "__device__ __forceinline__ float tf_min(float a, float b) { return a != a ? a : b != b ? b : a < b ? a : b; }\n"
    "__device__ __forceinline__ double tf_min(double a, double b) { return a != a ? a : b != b ? b : a < b ? a : b; }\n"
    "__device__ __forceinline__ long long tf_min(long long a, long long b) { return a < b ? a : b; }\n"
    "__device__ __forceinline__ int tf_min(int a, int b) { return a < b ? a : b; }\n"
    "__device__ __forceinline__ float tf_relu(float a) { return a > 0.0f || a != a ? a : 0.0f; }\n"
    "__device__ __forceinline__ double tf_relu(double a) { return a > 0.0 || a != a ? a : 0.0; }\n"
    "__device__ __forceinline__ long long tf_relu(long long a) { return a > 0 ? a : 0; }\n"
    "__device__ __forceinline__ int tf_relu(int a) { return a > 0 ? a : 0; }\n"
    "__device__ __forceinline__ bool tf_isfinite(float a) { return fabsf(a) < __int_as_float(0x7f800000); }\n"
    "__device__ __forceinline__ bool tf_isfinite(double a) { return fabs(a) < __longlong_as_double(0x7ff0000000000000LL); }\n"
    "// integers as tf_dtype_round makes them: NaN to 0, toward zero, saturated\n"
    "__device__ __forceinline__ long long tf_f2ll(double x) {\n"
    "    return x != x ? 0 : x >= 9.2e18 ? 9200000000000000000LL : x <= -9.2e18 ? -9200000000000000000LL : (long long)x;\n"
    "}\n"
    "__device__ __forceinline__ int tf_f2i(double x) {\n"
    "    return x != x ? 0 : x >= 2147483647.0 ? 2147483647 : x <= -2147483648.0 ? (-2147483647 - 1) : (int)x;\n"
    "}\n"
    "__device__ __forceinline__ int tf_ll2i(long long x) {\n"
    "    return x > 2147483647LL ? 2147483647 : x < -2147483648LL ? (-2147483647 - 1) : (int)x;\n"
    "}\n"
    "__device__ __forceinline__ long long tf_idiv(long long a, long long b) {\n"
    "    if (b == 0) return a > 0 ? 9200000000000000000LL : a < 0 ? -9200000000000000000LL : 0;\n"
    "    return b == -1 ? (a < -9200000000000000000LL ? 9200000000000000000LL : -a) : a / b;\n"
    "}\n"
    "__device__ __forceinline__ int tf_idiv(int a, int b) { return tf_ll2i(tf_idiv((long long)a, (long long)b)); }\n";

static const char helpers_warp[] =
    "// every lane ends with the same bits: each step adds the same pairs, and + commutes\n"
    "template <typename T> __device__ __forceinline__ T tf_warp_sum(T v) {\n"
    "#pragma unroll\n"
    "    for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);\n"
    "    return v;\n"
    "}\n"
    "template <typename T> __device__ __forceinline__ T tf_warp_max(T v) {\n"
    "#pragma unroll\n"
    "    for (int s = 16; s > 0; s >>= 1) v = tf_max(v, __shfl_xor_sync(0xffffffffu, v, s));\n"
    "    return v;\n"
    "}\n";

const char cu_helpers_vec[] =
    "template <typename T, int N> struct alignas(sizeof(T) * N) tf_vec { T v[N]; };\n";

const char cu_helpers_f16[] = "__device__ __forceinline__ float tf_rh(float x) { return __half2float(__float2half_rn(x)); }\n";
const char cu_helpers_bf16[] =
    "__device__ __forceinline__ float tf_rb(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }\n";

/* tf_rng_uniform and tf_dropout_stream (ir/), in 64-bit integers: the same bits */
const char cu_helpers_rng[] =
    "__device__ __forceinline__ unsigned long long tf_mix64(unsigned long long z) {\n"
    "    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;\n"
    "    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;\n"
    "    return z ^ (z >> 31);\n"
    "}\n"
    "// rng[0] the seed, rng[1] the step: the stream of this salt at this step\n"
    "__device__ __forceinline__ unsigned long long tf_dropout_key(const unsigned long long *rng, unsigned long long salt) {\n"
    "    const unsigned long long stream = tf_mix64(tf_mix64(rng[1] ^ 0x64726f706f7574ULL) ^ salt);\n"
    "    return tf_mix64(rng[0] + 0x9e3779b97f4a7c15ULL) ^ tf_mix64(stream + 0x632be59bd9b4e019ULL);\n"
    "}\n"
    "// element i is kept when its uniform draw (top 53 bits) is >= p, i.e. the bits >= thr\n"
    "__device__ __forceinline__ bool tf_dropout_keep(unsigned long long key, unsigned long long i, unsigned long long thr) {\n"
    "    const unsigned long long h = tf_mix64(tf_mix64(key ^ i) + i * 0x9e3779b97f4a7c15ULL);\n"
    "    return (h >> 11) >= thr;\n"
    "}\n";

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

uint64_t tf_cuda_dropout_threshold(double p)
{
    const double two53 = 9007199254740992.0;
    if (p != p) return UINT64_MAX;   /* u >= NaN never holds */
    if (p <= 0) return 0;
    if (p >= 1) return (uint64_t)two53;
    return (uint64_t)ceil(p * two53);   /* p * 2^53 is exact: a power-of-two scaling */
}

/* Whether load x reads the index space's own row-major strides (from 0). */
static bool contiguous(const tf_kernel *k, const int64_t *row, const tf_kexpr *x)
{
    if (x->offset) return false;   /* a slice starting past 0: indexed (a vector would lose the alignment) */
    for (int a = 0; a < k->rank; a++)
        if (k->dims[a] > 1 && x->strides[a] != row[a]) return false;
    return true;
}

/* What emitting kernel k needs to know first; false when out of memory. */
bool cu_em_init(em *e, const tf_kernel *k)
{
    memset(e, 0, sizeof *e);
    e->k = k;
    size_t nx = (size_t)k->nexprs + 1, nb = (size_t)k->nbufs + 1;
    e->written = tf_calloc(nb, sizeof *e->written);
    e->contig = tf_calloc(nx, sizeof *e->contig);
    e->mark = tf_calloc(nx, 1);
    if (!e->written || !e->contig || !e->mark) {
        tf_free(e->written); tf_free(e->contig); tf_free(e->mark);
        return false;
    }
    e->numel = 1;
    for (int a = k->rank - 1; a >= 0; a--) {
        e->row[a] = e->numel;
        e->numel *= k->dims[a];
    }
    int64_t biggest = e->numel;
    for (int b = 0; b < k->nbufs; b++) {
        const tf_type *t = &k->bufs[b].value->type;
        int64_t n = tf_type_numel(t);
        if (n > biggest || n < 0) biggest = n < 0 ? INT64_MAX : n;
        e->f16 |= t->dtype == TF_DT_F16;
        e->bf16 |= t->dtype == TF_DT_BF16;
    }
    for (int t = 0; t < k->nstores; t++) e->written[k->stores[t].buf] = true;
    for (int i = 0; i < k->nexprs; i++) {
        const tf_kexpr *x = &k->exprs[i];
        e->f16 |= x->dtype == TF_DT_F16;
        e->bf16 |= x->dtype == TF_DT_BF16;
        e->rng |= x->kind == TF_KX_OP && x->op == TF_OP_DROPOUT_MASK;
        e->contig[i] = x->kind == TF_KX_LOAD && contiguous(k, e->row, x);
    }
    e->wide = biggest >= ((int64_t)1 << 30);
    return true;
}

/* The parameter list of kernel k: one pointer per buffer, named <prefix>b<i>. */
void cu_buffer_params(sb *params, const tf_kernel *k, const bool *written, const char *prefix)
{
    for (int b = 0; b < k->nbufs; b++)   /* __restrict__ where memplan keeps the buffer apart from every other */
        tf_strbuf_printf(params, "%s%s%s *%s%sb%d", b || params->n ? ", " : "", written[b] ? "" : "const ",
            cu_storage_type(k->bufs[b].value->type.dtype), k->bufs[b].disjoint ? "__restrict__ " : "", prefix, b);
}

void cu_name_source(tf_cuda_kernel *out, char *src, size_t n)
{
    out->hash = fnv1a(src, n);
    snprintf(out->name, sizeof out->name, "tf_%016llx", (unsigned long long)out->hash);
    for (char *at = strstr(src, cu_placeholder); at; at = strstr(at, cu_placeholder)) memcpy(at, out->name, strlen(cu_placeholder));
    out->src = src;
}

tf_ir_status tf_cuda_emit(const tf_kernel *k, tf_cuda_kernel *out, tf_diag *d)
{
    memset(out, 0, sizeof *out);
    char why[256];
    if (!tf_cuda_supports(k, why, sizeof why)) return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "cuda: %s", why);
    em e;
    if (!cu_em_init(&e, k)) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");

    /* the body first: it decides the geometry and whether vectors are used */
    geom g = {0};
    sb body = {0};
    e.s = body;
    if (k->kind == TF_K_REDUCTION) cu_emit_reduction(&e, &g);
    else cu_emit_pointwise(&e, &g);
    body = e.s;

    sb src = {0};
    tf_strbuf_printf(&src, "// generated by tfuse (codegen/cuda.c) for NVRTC\n");
    if (e.f16) tf_strbuf_printf(&src, "#include <cuda_fp16.h>\n");
    if (e.bf16) tf_strbuf_printf(&src, "#include <cuda_bf16.h>\n");
    tf_strbuf_printf(&src, "\n%s", cu_helpers_common);
    if (k->kind == TF_K_REDUCTION) tf_strbuf_printf(&src, "%s", helpers_warp);
    if (e.vec) tf_strbuf_printf(&src, "%s", cu_helpers_vec);
    if (e.f16) tf_strbuf_printf(&src, "%s", cu_helpers_f16);
    if (e.bf16) tf_strbuf_printf(&src, "%s", cu_helpers_bf16);
    if (e.rng) tf_strbuf_printf(&src, "%s", cu_helpers_rng);
    sb params = {0};
    cu_buffer_params(&params, k, e.written, "");
    if (g.scratch) tf_strbuf_printf(&params, "%svoid *__restrict__ tf_scratch", k->nbufs ? ", " : "");
    if (e.rng) tf_strbuf_printf(&params, "%sconst unsigned long long *tf_rng", k->nbufs || g.scratch ? ", " : "");
    tf_strbuf_printf(&src, "\nextern \"C\" __global__ void __launch_bounds__(%u) %s(%s)\n", g.block, cu_placeholder, params.p ? params.p : "");
    tf_strbuf_printf(&src, "{\n    typedef %s tf_idx;\n", e.wide ? "long long" : "int");
    tf_strbuf_printf(&src, "%s}\n", body.p ? body.p : "");
    if (e.second.p) {   /* the second kernel: launched after the first, the same parameters */
        tf_strbuf_printf(&src, "\nextern \"C\" __global__ void __launch_bounds__(%u) %s_b(%s)\n", e.block2, cu_placeholder,
                         params.p ? params.p : "");
        tf_strbuf_printf(&src, "{\n    typedef %s tf_idx;\n%s}\n", e.wide ? "long long" : "int", e.second.p);
    }
    bool params_oom = params.oom || e.second.oom;
    tf_free(params.p);
    tf_free(e.second.p);
    bool oom = body.oom || src.oom || params_oom;
    tf_free(body.p);
    tf_free(e.written);
    tf_free(e.contig);
    tf_free(e.mark);
    if (oom) {
        tf_free(src.p);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");
    }
    cu_name_source(out, src.p, src.n);
    if (e.grid2) {
        snprintf(out->name2, sizeof out->name2, "%.19s_b", out->name);
        out->grid2 = e.grid2;
        out->block2 = e.block2;
    }
    out->shape = g.shape;
    out->grid = g.grid;
    out->block = g.block;
    out->smem = g.smem;
    out->align = g.align;
    out->vec = g.vec;
    out->group = g.group;
    out->nparams = k->nbufs + (g.scratch ? 1 : 0) + (e.rng ? 1 : 0);
    out->rng = e.rng;
    out->scratch = g.scratch;
    out->epilogue = k->kind == TF_K_LIBRARY || k->lib != NULL;
    out->wide_index = e.wide;
    return TF_IR_OK;
}

void tf_cuda_kernel_free(tf_cuda_kernel *ck)
{
    if (!ck) return;
    tf_free(ck->src);
    ck->src = NULL;
}

/* ---- a whole plan ------------------------------------------------------------------------ */

tf_ir_status tf_cuda_emit_plan(const tf_kernel_plan *p, tf_cuda_program *out, tf_diag *d)
{
    memset(out, 0, sizeof *out);
    int n = p->nkernels;
    out->kernels = tf_calloc((size_t)n + 1, sizeof *out->kernels);
    out->why = tf_calloc((size_t)n + 1, sizeof *out->why);
    out->library = tf_calloc((size_t)n + 1, sizeof *out->library);
    out->lib_why = tf_calloc((size_t)n + 1, sizeof *out->lib_why);
    if (!out->kernels || !out->why || !out->library || !out->lib_why) {
        tf_cuda_program_free(out);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");
    }
    out->nkernels = n;
    for (int i = 0, span = 1, in_span = 0; i < n; i++) {
        const tf_kernel *k = &p->kernels[i];
        if (in_span > 0) {   /* a later part of a multi-tensor launch */
            snprintf(out->why[i], sizeof out->why[i], "kernel %.50s: part %d of %.50s's multi-tensor launch", k->name, span - in_span,
                     p->kernels[i - (span - in_span)].name);
            snprintf(out->lib_why[i], sizeof out->lib_why[i], "kernel %s: not a library op", k->name);
            in_span--;
            continue;
        }
        span = tf_cuda_multi_span(k, n - i);
        in_span = span - 1;
        for (int part = 0; part < 2; part++) {   /* the library op's own kernel, then the kernel (or epilogue) */
            tf_cuda_kernel *ck = part ? &out->kernels[i] : &out->library[i];
            if (part ? !tf_cuda_supports(k, out->why[i], sizeof out->why[i])
                     : !tf_cuda_library_supports(k, out->lib_why[i], sizeof out->lib_why[i]))
                continue;
            tf_ir_status st = part ? span > 1 ? tf_cuda_emit_multi(k, span, ck, d) : tf_cuda_emit(k, ck, d) : tf_cuda_emit_library(k, ck, d);
            if (st) {
                tf_cuda_program_free(out);
                return st;
            }
            if (part) out->nemitted++;
            else out->nlibrary++;
            bool seen = false;
            for (int j = 0; j <= i && !seen; j++)
                for (int q = 0; q < 2 && !seen; q++) {
                    const tf_cuda_kernel *o = q ? &out->kernels[j] : &out->library[j];
                    if (o == ck) break;
                    seen = o->src && o->hash == ck->hash && strcmp(o->src, ck->src) == 0;
                }
            out->nunique += !seen;
        }
    }
    return TF_IR_OK;
}

void tf_cuda_program_free(tf_cuda_program *prog)
{
    if (!prog) return;
    for (int i = 0; prog->kernels && i < prog->nkernels; i++) tf_cuda_kernel_free(&prog->kernels[i]);
    for (int i = 0; prog->library && i < prog->nkernels; i++) tf_cuda_kernel_free(&prog->library[i]);
    tf_free(prog->kernels);
    tf_free(prog->why);
    tf_free(prog->library);
    tf_free(prog->lib_why);
    memset(prog, 0, sizeof *prog);
}

static int64_t numel_space(const tf_kernel *k)
{
    int64_t n = 1;
    for (int a = 0; a < k->rank; a++) n *= k->dims[a];
    return n;
}

/* The parameters of a kernel's buffers (a library kernel's: its result and
 * operands) with their values, names prefixed (a multi-tensor part's). */
static void dump_params(sb *s, const tf_kernel *k, const tf_cuda_kernel *ck, const char *prefix)
{
    char dims[256];
    int np = ck->library ? 1 + (k->lib ? k->lib->nin : 0) : k->nbufs;
    for (int b = 0, p = 0; b < np; b++) {
        const tf_value *v = !ck->library ? k->bufs[b].value : b ? k->lib->in[b - 1] : k->lib->out;
        if (v->kind == TF_VAL_CONST) continue;   /* a constant operand is in the source */
        const tf_type *t = &v->type;
        size_t at = 0;
        dims[0] = 0;
        for (int a = 0; a < t->rank && at < sizeof dims - 24; a++)
            at += (size_t)snprintf(dims + at, sizeof dims - at, "%s%lld", a ? ", " : "", (long long)t->dims[a].n);
        bool stored = ck->library && b == 0;
        for (int j = 0; !ck->library && j < k->nstores; j++) stored |= k->stores[j].buf == b;
        tf_strbuf_printf(s, "//   %sb%d = %s : %s[%s]%s\n", prefix, p++, v->name ? v->name : "?", tf_dtype_name(t->dtype), dims,
            stored ? " (written)" : "");
    }
}

char *tf_cuda_dump(const tf_module *m, const tf_kernel *k, const tf_cuda_kernel *ck)
{
    static const char *shapes[] = {"pointwise", "pointwise, 16-byte vectors", "row reduction", "column reduction",
                                   "flash attention, a block per tile of rows"};
    sb s = {0};
    tf_strbuf_printf(&s, "// tfuse kernel %s", k->name);
    if (m && k->region > 0 && k->region <= m->nregions) tf_strbuf_printf(&s, " (region %s)", m->regions[k->region - 1].name);
    if (ck->library && k->lib) tf_strbuf_printf(&s, ": the library op %s -> %s", tf_op_info_of(k->lib->op)->name, k->lib->out->name ? k->lib->out->name : "?");
    else if (ck->epilogue && k->lib) tf_strbuf_printf(&s, ": the epilogue of %s -> %s", tf_op_info_of(k->lib->op)->name, k->lib->out->name ? k->lib->out->name : "?");
    for (int q = 1; q < ck->parts; q++) tf_strbuf_printf(&s, "%s%s", q == 1 ? ", in one multi-tensor launch with " : ", ", k[q].name);
    tf_strbuf_printf(&s, "\n// %s; entry %s; grid %u x block %u, %u bytes of dynamic shared memory; buffers %u-byte aligned\n",
        shapes[ck->shape], ck->name, ck->grid, ck->block, ck->smem, ck->align);
    if (ck->name2[0])
        tf_strbuf_printf(&s, "// then entry %s (same parameters); grid %u x block %u, %u bytes of dynamic shared memory\n", ck->name2,
                         ck->grid2, ck->block2, ck->smem2);
    if (ck->parts > 1) {
        for (int q = 0; q < ck->parts; q++) {
            char prefix[16];
            snprintf(prefix, sizeof prefix, "p%d", q);
            tf_strbuf_printf(&s, "// part %d: kernel %s over %lld elements\n", q, k[q].name, (long long)numel_space(&k[q]));
            dump_params(&s, &k[q], ck, prefix);
        }
    } else {
        dump_params(&s, k, ck, "");
    }
    if (ck->rng) tf_strbuf_printf(&s, "//   tf_rng = {seed, step} (device memory)\n");
    if (ck->err) tf_strbuf_printf(&s, "//   tf_err = 1 + the position of an id out of range, else 0 (device memory)\n");
    if (ck->clear_first) tf_strbuf_printf(&s, "//   b0 is zeroed before the launch\n");
    tf_strbuf_printf(&s, "%s", ck->src);
    if (s.oom) {
        tf_free(s.p);
        return NULL;
    }
    return s.p;
}
