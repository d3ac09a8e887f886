/* cuda_reduce.c — reduction kernels, in two steps: reduce_schedule decides
 * how the kernel runs (threads per outer index, outer indices per block,
 * blocks, row or column, split across blocks or not, shared memory and
 * scratch) from the kernel's shape and the device, printing nothing; the
 * emitters below print the CUDA C that schedule describes, in
 * kernel_eval.c's order within each outer index (cuda.c's opening comment). */
#include "cuda_emit.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- the schedule ------------------------------------------------------------------ */

/* A long reduction over few outer indices is split across blocks, so that
 * it fills the device: SPLIT_MIN reduced elements at least, each block a
 * share of SPLIT_CHUNK or more, up to two blocks per SM in all. */
enum { SPLIT_MIN = 65536, SPLIT_CHUNK = 16384 };
/* Column reductions (a 32-wide tile of outer indices per block) over fewer
 * tiles than SMs that store only their results split their rows as well:
 * COL_SPLIT_MIN rows at least, a share of COL_SPLIT_CHUNK rows or more per
 * block (32 per thread). */
enum { COL_SPLIT_MIN = 2048, COL_SPLIT_CHUNK = 1024 };

/* What the schedule needs to know of the device: the SMs a split fills. */
typedef struct red_target { int64_t sms; } red_target;

/* The device the schedule is for: a 132-SM H100/H200. */
static const red_target target_h100 = {.sms = 132};

/* How a reduction kernel runs: its launch geometry and strategy. */
typedef struct red_sched {
    unsigned rmask, omask;      /* the reduced axes and the outer axes (of the kernel's rank) */
    int64_t M, R;               /* outer indices, and reduced elements per outer index */
    bool row;                   /* the innermost axis is reduced: G threads (whole warps) per outer index;
                                 * else a column of a 32-wide tile of consecutive outer indices */
    int64_t G;                  /* threads per outer index (a group) */
    int64_t RPB;                /* outer indices per block */
    int64_t NB;                 /* blocks of outer indices: M / RPB rounded up */
    int64_t S;                  /* blocks sharing one outer index (a row) or one tile (columns); 1: not split */
    int64_t CH;                 /* each of those blocks' share of r: R / S rounded up */
    bool partials;              /* the group spans warps (rows) or threads (columns): its partials meet in shared memory */
    bool live;                  /* M is not a multiple of RPB: groups past the last outer index idle (tf_live) */
    bool second;                /* split with full-space stores: those are a second kernel over the whole space */
    geom g;                     /* the launch */
    unsigned grid2, block2;     /* the second kernel's launch when second, else 0 */
} red_sched;

/* Whether t is an integer dtype or bool. */
static bool is_intish(tf_dt t) { return t == TF_DT_I64 || t == TF_DT_I32 || t == TF_DT_BOOL; }

/* The accumulator's dtype: double for f64, long long for integer sums, else float. */
static tf_dt acc_dtype(const tf_kernel *k, const tf_kreduce *r)
{
    tf_dt at = k->exprs[r->arg].dtype;
    if (r->dtype == TF_DT_F64 || at == TF_DT_F64) return TF_DT_F64;
    if (is_intish(r->dtype) && is_intish(at)) return TF_DT_I64;
    return TF_DT_F32;
}

/* Whether the kernel stores values of the full space (not only results). */
static bool stores_full(const tf_kernel *k)
{
    bool any = false;
    for (int t = 0; t < k->nstores; t++) any |= !k->stores[t].reduced_domain;
    return any;
}

/* Whether the kernel draws a dropout mask (then it takes the rng parameter). */
static bool draws_rng(const tf_kernel *k)
{
    bool any = false;
    for (int i = 0; i < k->nexprs; i++) any |= k->exprs[i].kind == TF_KX_OP && k->exprs[i].op == TF_OP_DROPOUT_MASK;
    return any;
}

/* S, the blocks that share an outer index (or a tile of columns): each
 * folds a contiguous share of r, and the last to finish (an atomic count in
 * scratch) folds the S partials in order, so the result does not depend on
 * which block that is. 1 when the reduction is not split. */
static int64_t split_blocks(const tf_kernel *k, const red_sched *c, const red_target *t)
{
    int64_t most = 2 * t->sms, S = 1;
    bool full = stores_full(k);
    /* full-space stores read the result everywhere: they become a second kernel over the space, launched after */
    if (c->row && c->RPB == 1 && k->nreds == 1 && !(full && draws_rng(k)) && c->R >= SPLIT_MIN && c->M < most) {
        S = (c->R + SPLIT_CHUNK - 1) / SPLIT_CHUNK;
        if (S > most / c->M) S = most / c->M;
        if (S < 2) S = 1;
    } else if (!c->row && c->G == 32 && k->nreds == 1 && !full && c->R >= COL_SPLIT_MIN && c->NB < t->sms) {
        /* fewer column tiles than SMs (a bias gradient over many rows): the rows split too; not where the
         * region also stores full-size values, which a second kernel would read all over again */
        S = (c->R + COL_SPLIT_CHUNK - 1) / COL_SPLIT_CHUNK;
        if (S > most / c->NB) S = most / c->NB;
        if (S < 2) S = 1;
    }
    return S;
}

/* How reduction kernel k runs on target t; prints nothing. */
static red_sched reduce_schedule(const tf_kernel *k, const red_target *t)
{
    red_sched c = {.M = 1, .R = 1};
    unsigned all = (1u << k->rank) - 1;
    c.rmask = k->reduce_mask & all;
    c.omask = all & ~c.rmask;
    for (int a = 0; a < k->rank; a++) {
        if ((c.rmask >> a) & 1) c.R *= k->dims[a];
        else c.M *= k->dims[a];
    }
    /* a row (innermost axis reduced): G threads, whole warps, per outer index;
     * else a column of a 32-wide tile of consecutive outer indices */
    c.row = k->rank == 0 || ((c.rmask >> (k->rank - 1)) & 1);
    c.G = c.row ? 32 : 1;
    if (c.row) {
        while (c.G < 1024 && c.G * 8 < c.R) c.G *= 2;
        c.RPB = c.G >= 128 ? 1 : 128 / c.G;
    } else {
        while (c.G < 32 && c.G * 8 < c.R) c.G *= 2;
        c.RPB = 32;
    }
    c.NB = (c.M + c.RPB - 1) / c.RPB;
    c.S = split_blocks(k, &c, t);
    c.CH = (c.R + c.S - 1) / c.S;
    unsigned accb = 4;
    for (int r = 0; r < k->nreds; r++)
        if (acc_dtype(k, &k->reds[r]) != TF_DT_F32) accb = 8;
    c.partials = c.row ? c.G > 32 : c.G > 1;
    c.live = c.M % c.RPB != 0;
    c.second = c.S > 1 && stores_full(k);
    c.g.shape = c.row ? TF_CUDA_ROW_REDUCE : TF_CUDA_COL_REDUCE;
    c.g.block = (unsigned)(c.G * c.RPB);
    c.g.grid = cu_blocks_for(c.NB * c.S, 1);
    c.g.group = (unsigned)c.G;
    c.g.vec = 1;
    c.g.smem = c.partials ? (unsigned)((c.row ? c.RPB * (c.G / 32) : c.G * 32) * accb) : 0;
    c.g.align = cu_widest(k);
    /* a split reduction's scratch: each outer index's result (8 bytes), then
     * the partials, then a counter per outer index */
    if (c.S > 1) c.g.scratch = (unsigned)(c.M * 8 + c.M * c.S * accb + c.M * 4);
    if (c.second) {
        c.block2 = 256;
        c.grid2 = cu_blocks_for(c.M * c.R, 256);
    }
    return c;
}

/* ---- the text ---------------------------------------------------------------------- */

/* The emitter's state beside the schedule: which variables the body uses,
 * and the loop over r each thread folds. */
typedef struct rx {
    em *e;
    const red_sched *c;
    bool has_outer;             /* stores on the outer domain (the results) */
    unsigned outer_ax;          /* the outer axes the body indexes with */
    bool o_used, g_used, m_used;   /* the body reads o, tf_g (group in block), tf_m (thread in group) */
    char rloop[64], rbound[32], rstep[32];   /* for (tf_idx r = rloop; r < rbound; rstep) */
} rx;

/* tf_m and tf_g, shared memory, the dropout keys; then the loop over the
 * blocks' outer indices (a split's parts), o and its axes. */
static void emit_head(rx *x)
{
    em *e = x->e;
    const red_sched *c = x->c;
    sb *s = &e->s;
    cu_line(s, 1, "// %s reduction: %lld outer x %lld reduced, %lld threads per outer index, %lld per block",
            c->row ? "row" : "column", (long long)c->M, (long long)c->R, (long long)c->G, (long long)c->RPB);
    if (c->partials) cu_line(s, 1, "extern __shared__ __align__(16) unsigned char tf_smem[];");
    if (c->row) {
        if (x->m_used && c->RPB > 1) cu_line(s, 1, "const int tf_m = threadIdx.x %% %lld;", (long long)c->G);
        else if (x->m_used) cu_line(s, 1, "const int tf_m = threadIdx.x;");
        if (x->g_used) cu_line(s, 1, "const int tf_g = threadIdx.x / %lld;", (long long)c->G);
    } else {
        if (x->g_used) cu_line(s, 1, "const int tf_g = %s;", c->G > 1 ? "threadIdx.x % 32" : "threadIdx.x");
        if (x->m_used) cu_line(s, 1, "const int tf_m = threadIdx.x / 32;");
    }
    cu_emit_dropout_keys(e, 1);
    long long S = c->S, CH = c->CH, R = c->R;
    if (S > 1) cu_line(s, 1, "// split: %lld blocks per outer index, %lld reduced elements each", S, CH);
    cu_line(s, 1, "for (tf_idx tf_ob = blockIdx.x; tf_ob < %lld; tf_ob += gridDim.x) {", (long long)(c->NB * S));
    if (S > 1 && !c->row) {   /* a tile of 32 columns, one share of its rows */
        cu_line(s, 2, "const tf_idx tf_tile = tf_ob / %lld, tf_part = tf_ob %% %lld;", S, S);
        cu_line(s, 2, "const tf_idx o = tf_tile * 32 + tf_g;");
        cu_line(s, 2, "const tf_idx tf_rend = tf_part * %lld + %lld < %lld ? tf_part * %lld + %lld : %lld;", CH, CH, R, CH, CH, R);
    } else if (S > 1) {
        cu_line(s, 2, "const tf_idx o = tf_ob / %lld, tf_part = tf_ob %% %lld;", S, S);
        cu_line(s, 2, "const tf_idx tf_rend = tf_part * %lld + %lld < %lld ? tf_part * %lld + %lld : %lld;", CH, CH, R, CH, CH, R);
    } else if (x->o_used) {
        if (c->RPB > 1) cu_line(s, 2, "const tf_idx o = tf_ob * %lld + tf_g;", (long long)c->RPB);
        else cu_line(s, 2, "const tf_idx o = tf_ob;");
    }
    if (c->live) cu_line(s, 2, "const bool tf_live = o < %lld;", (long long)c->M);
    cu_def_axes(e, 2, x->outer_ax, c->omask, "o");
}

/* The last block's fold of outer index o's S partials, in order, into tf_a. */
static void fold_partials(sb *s, int depth, const char *vt, int64_t S, bool mx)
{
    cu_line(s, depth, "const volatile %s *tf_v = tf_parts + o * %lld;", vt, (long long)S);
    cu_line(s, depth, "tf_a = tf_v[0];");
    cu_line(s, depth, "for (int q = 1; q < %lld; q++) {", (long long)S);
    if (mx) cu_line(s, depth + 1, "tf_a = tf_max(tf_a, (%s)tf_v[q]);", vt);
    else cu_line(s, depth + 1, "tf_a += tf_v[q];");
    cu_line(s, depth, "}");
}

/* Each thread's fold of its share of r into tf_a (of dtype acc). */
static void emit_fold(rx *x, const tf_kreduce *rd, tf_dt acc, bool mx)
{
    em *e = x->e;
    sb *s = &e->s;
    char v[128], c[256];
    cu_mark_clear(e);
    cu_mark_from(e, rd->arg);
    int depth = 3;
    if (x->c->live) cu_line(s, depth++, "if (tf_live) {");
    cu_emit_selected(e, depth, SEL_OUTER);
    cu_line(s, depth, "for (tf_idx r = %s; r < %s; %s) {", x->rloop, x->rbound, x->rstep);
    unsigned rax = cu_axes_used(e, SEL_INNER, M_AXES, NULL) & x->c->rmask;
    cu_def_axes(e, depth + 1, rax, x->c->rmask, "r");
    cu_emit_selected(e, depth + 1, SEL_INNER);
    snprintf(v, sizeof v, "e%d", rd->arg);
    cu_conv(e->k->exprs[rd->arg].dtype, acc, v, c, sizeof c);
    if (mx) cu_line(s, depth + 1, "tf_a = tf_max(tf_a, %s);", c);
    else cu_line(s, depth + 1, "tf_a += %s;", c);
    cu_line(s, depth, "}");
    if (x->c->live) cu_line(s, --depth, "}");
}

/* The group's total, in every thread of the group: warp shuffles, then the
 * warps' (a row's) or the threads' (a column's) partials in shared memory. */
static void emit_group_total(rx *x, const char *vt, bool mx)
{
    const red_sched *c = x->c;
    sb *s = &x->e->s;
    if (c->row) {
        cu_line(s, 3, mx ? "tf_a = tf_warp_max(tf_a);" : "tf_a = tf_warp_sum(tf_a);");
        if (c->partials) {
            int64_t nw = c->G / 32;
            if (c->RPB > 1) cu_line(s, 3, "%s *tf_p = (%s *)tf_smem + tf_g * %lld;", vt, vt, (long long)nw);
            else cu_line(s, 3, "%s *tf_p = (%s *)tf_smem;", vt, vt);
            cu_line(s, 3, "if ((tf_m & 31) == 0) tf_p[tf_m >> 5] = tf_a;");
            cu_line(s, 3, "__syncthreads();");
            cu_line(s, 3, "tf_a = tf_p[0];");
            cu_line(s, 3, "#pragma unroll");
            cu_line(s, 3, "for (int w = 1; w < %lld; w++) {", (long long)nw);
            if (mx) cu_line(s, 4, "tf_a = tf_max(tf_a, tf_p[w]);");
            else cu_line(s, 4, "tf_a += tf_p[w];");
            cu_line(s, 3, "}");
            cu_line(s, 3, "__syncthreads();");
        }
    } else if (c->partials) {
        cu_line(s, 3, "%s *tf_p = (%s *)tf_smem;", vt, vt);
        cu_line(s, 3, "tf_p[tf_m * 32 + tf_g] = tf_a;");
        cu_line(s, 3, "__syncthreads();");
        cu_line(s, 3, "tf_a = tf_p[tf_g];");
        cu_line(s, 3, "#pragma unroll");
        cu_line(s, 3, "for (int w = 1; w < %lld; w++) {", (long long)c->G);
        if (mx) cu_line(s, 4, "tf_a = tf_max(tf_a, tf_p[w * 32 + tf_g]);");
        else cu_line(s, 4, "tf_a += tf_p[w * 32 + tf_g];");
        cu_line(s, 3, "}");
        cu_line(s, 3, "__syncthreads();");
    }
}

/* A split reduction: this block's partial into scratch; the last block of
 * the outer index (or tile) to count in folds them all, in order, and the
 * others move on. */
static void emit_split_total(rx *x, const char *vt, bool mx)
{
    const red_sched *c = x->c;
    sb *s = &x->e->s;
    long long S = c->S;
    cu_line(s, 3, "%s *tf_parts = (%s *)((unsigned char *)tf_scratch + %lld);", vt, vt, (long long)(c->M * 8));
    cu_line(s, 3, "unsigned *tf_cnt = (unsigned *)(tf_parts + %lld);", (long long)(c->M * S));
    cu_line(s, 3, "__shared__ bool tf_last;");
    if (!c->row) {   /* each column's partial; the last block of the tile folds them all, in order */
        const char *live = c->live ? " && tf_live" : "";
        cu_line(s, 3, "if (tf_m == 0%s) tf_parts[o * %lld + tf_part] = tf_a;", live, S);
        cu_line(s, 3, "__threadfence();");
        cu_line(s, 3, "__syncthreads();");
        cu_line(s, 3, "if (threadIdx.x == 0) tf_last = atomicAdd(&tf_cnt[tf_tile], 1u) == %lldu;", S - 1);
        cu_line(s, 3, "__syncthreads();");
        cu_line(s, 3, "if (!tf_last) continue;");
        cu_line(s, 3, "if (tf_m == 0%s) {", live);
        fold_partials(s, 4, vt, S, mx);
        cu_line(s, 3, "}");
        cu_line(s, 3, "if (threadIdx.x == 0) tf_cnt[tf_tile] = 0u;   // ready for the next launch (and a graph's replay)");
    } else {   /* this block's partial; the last block of the outer index folds them all, in order */
        cu_line(s, 3, "if (tf_m == 0) {");
        cu_line(s, 4, "tf_parts[o * %lld + tf_part] = tf_a;", S);
        cu_line(s, 4, "__threadfence();");
        cu_line(s, 4, "tf_last = atomicAdd(&tf_cnt[o], 1u) == %lldu;", S - 1);
        cu_line(s, 3, "}");
        cu_line(s, 3, "__syncthreads();");
        cu_line(s, 3, "if (!tf_last) continue;");
        cu_line(s, 3, "if (tf_m == 0) {");
        fold_partials(s, 4, vt, S, mx);
        cu_line(s, 4, "tf_cnt[o] = 0u;   // ready for the next launch (and a graph's replay)");
        cu_line(s, 3, "}");
    }
}

/* Reduction r: its result tf_r<r>, in every thread of the group. */
static void emit_one(rx *x, int r)
{
    em *e = x->e;
    sb *s = &e->s;
    const tf_kreduce *rd = &e->k->reds[r];
    tf_dt acc = acc_dtype(e->k, rd);
    bool mx = rd->op == TF_OP_REDUCE_MAX;
    char init[96], c[256], tot[128];
    if (mx && acc == TF_DT_I64) snprintf(init, sizeof init, "(-9223372036854775807LL - 1)");
    else cu_literal(acc, mx ? -INFINITY : 0, init, sizeof init);
    cu_line(s, 2, "%s tf_r%d;   // %s", cu_value_type(rd->dtype), r, tf_op_info_of(rd->op)->name);
    cu_line(s, 2, "{");
    cu_line(s, 3, "%s tf_a = %s;", cu_value_type(acc), init);
    emit_fold(x, rd, acc, mx);
    const char *vt = cu_value_type(acc);
    emit_group_total(x, vt, mx);
    if (x->c->S > 1) emit_split_total(x, vt, mx);
    if (rd->op == TF_OP_REDUCE_MEAN) {
        char cnt[64];
        cu_literal(acc == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, rd->count, cnt, sizeof cnt);
        snprintf(tot, sizeof tot, acc == TF_DT_I64 ? "(double)tf_a / %s" : "tf_a / %s", cnt);
        cu_conv(acc == TF_DT_I64 ? TF_DT_F64 : acc, tf_kreduce_round(rd), tot, c, sizeof c);
    } else {
        cu_conv(acc, tf_kreduce_round(rd), "tf_a", c, sizeof c);
    }
    cu_line(s, 3, "tf_r%d = %s;", r, c);
    if (x->c->second)
        cu_line(s, 3, "if (tf_m == 0%s) ((%s *)tf_scratch)[o] = tf_r%d;   // for the second kernel", x->c->live ? " && tf_live" : "",
                cu_value_type(rd->dtype), r);
    cu_line(s, 2, "}");
}

/* The stores on the outer domain, by one thread of the group. */
static void emit_outer_stores(rx *x)
{
    em *e = x->e;
    const tf_kernel *k = e->k;
    sb *s = &e->s;
    cu_mark_clear(e);
    for (int t = 0; t < k->nstores; t++)
        if (k->stores[t].reduced_domain) cu_mark_from(e, k->stores[t].expr);
    bool live = x->c->live, m_used = x->m_used;
    char cond[64] = "";
    snprintf(cond, sizeof cond, "%s%s%s", live ? "tf_live" : "", live && m_used ? " && " : "", m_used ? "tf_m == 0" : "");
    int depth = 2;
    if (cond[0]) cu_line(s, depth++, "if (%s) {", cond);
    else cu_line(s, depth++, "{");
    unsigned rax = cu_axes_used(e, SEL_ALL, M_AXES, NULL) & x->c->rmask;
    for (int a = 0; a < k->rank; a++)   /* the reference evaluates them at reduced index 0 */
        if ((rax >> a) & 1) cu_line(s, depth, "const tf_idx i%d = 0;", a);
    cu_emit_selected(e, depth, SEL_ALL);
    for (int t = 0; t < k->nstores; t++) {
        if (!k->stores[t].reduced_domain) continue;
        char at[64];
        snprintf(at, sizeof at, x->o_used ? "b%d[o]" : "b%d[0]", k->stores[t].buf);
        cu_emit_store(e, depth, &k->stores[t], at);
    }
    cu_line(s, 2, "}");
}

/* The full-space stores at (o, r): the axes of r, the expressions on the
 * reduced domain, the stores; at depth. */
static void emit_full_body(em *e, const red_sched *c, int depth)
{
    const tf_kernel *k = e->k;
    unsigned rax = (cu_axes_used(e, SEL_INNER, M_AXES, NULL) | cu_all_axes(k)) & c->rmask;
    cu_def_axes(e, depth, rax, c->rmask, "r");
    cu_emit_selected(e, depth, SEL_INNER);
    char off[400], at[480];
    cu_offset_code(k, e->row, off, sizeof off);
    for (int t = 0; t < k->nstores; t++) {
        if (k->stores[t].reduced_domain) continue;
        snprintf(at, sizeof at, "b%d[%s]", k->stores[t].buf, off);
        cu_emit_store(e, depth, &k->stores[t], at);
    }
}

/* Mark what the full-space stores need. */
static void mark_full_stores(em *e)
{
    cu_mark_clear(e);
    for (int t = 0; t < e->k->nstores; t++)
        if (!e->k->stores[t].reduced_domain) cu_mark_from(e, e->k->stores[t].expr);
}

/* A split reduction's full-space stores: a second kernel (into
 * e->second), over every (o, r), reading the result from scratch. */
static void emit_second(rx *x)
{
    em *e = x->e;
    const red_sched *c = x->c;
    const tf_kreduce *rd = &e->k->reds[0];
    sb main_body = e->s;
    e->s = (sb){0};
    int64_t n2 = c->M * c->R;
    e->block2 = c->block2;
    e->grid2 = c->grid2;
    cu_line(&e->s, 1, "// the full-space stores of the split reduction above: %lld elements", (long long)n2);
    cu_line(&e->s, 1, "for (tf_idx tf_f = (tf_idx)blockIdx.x * blockDim.x + threadIdx.x; tf_f < %lld; tf_f += (tf_idx)gridDim.x * blockDim.x) {",
            (long long)n2);
    cu_line(&e->s, 2, "const tf_idx o = tf_f / %lld, r = tf_f %% %lld;", (long long)c->R, (long long)c->R);
    cu_line(&e->s, 2, "const %s tf_r0 = ((const %s *)tf_scratch)[o];", cu_value_type(rd->dtype), cu_value_type(rd->dtype));
    mark_full_stores(e);
    e->md = M_AXES;
    unsigned oax = (cu_axes_used(e, SEL_ALL, M_AXES, NULL) | cu_all_axes(e->k)) & c->omask;
    cu_def_axes(e, 2, oax, c->omask, "o");
    cu_emit_selected(e, 2, SEL_OUTER);
    emit_full_body(e, c, 2);
    cu_line(&e->s, 1, "}");
    e->second = e->s;
    e->s = main_body;
}

/* The full-space stores in the kernel itself: the group strides over r. */
static void emit_full_stores(rx *x)
{
    em *e = x->e;
    sb *s = &e->s;
    mark_full_stores(e);
    int depth = 2;
    if (x->c->live) cu_line(s, depth++, "if (tf_live) {");
    cu_emit_selected(e, depth, SEL_OUTER);
    cu_line(s, depth, "for (tf_idx r = %s; r < %lld; %s) {", x->rloop, (long long)x->c->R, x->rstep);
    emit_full_body(e, x->c, depth + 1);
    cu_line(s, depth, "}");
    if (x->c->live) cu_line(s, --depth, "}");
}

void cu_emit_reduction(em *e, geom *g)
{
    const tf_kernel *k = e->k;
    red_sched c = reduce_schedule(k, &target_h100);
    *g = c.g;
    rx x = {.e = e, .c = &c};
    for (int t = 0; t < k->nstores; t++) x.has_outer |= k->stores[t].reduced_domain;
    bool has_full = stores_full(k);
    cu_mark_clear(e);   /* everything any pass or store needs */
    for (int r = 0; r < k->nreds; r++) cu_mark_from(e, k->reds[r].arg);
    for (int t = 0; t < k->nstores; t++) cu_mark_from(e, k->stores[t].expr);
    x.outer_ax = cu_axes_used(e, SEL_ALL, M_AXES, NULL) & c.omask;
    if (has_full) x.outer_ax |= cu_all_axes(k) & c.omask;   /* the full-space store index */
    x.o_used = c.live || x.outer_ax || x.has_outer;
    x.g_used = (x.o_used && c.RPB > 1) || (c.partials && (!c.row || c.RPB > 1));
    x.m_used = c.G > 1;
    emit_head(&x);
    if (c.S > 1) snprintf(x.rloop, sizeof x.rloop, "tf_part * %lld + tf_m", (long long)c.CH);
    else snprintf(x.rloop, sizeof x.rloop, "%s", x.m_used ? "tf_m" : "0");
    if (c.S > 1) snprintf(x.rbound, sizeof x.rbound, "tf_rend");
    else snprintf(x.rbound, sizeof x.rbound, "%lld", (long long)c.R);
    snprintf(x.rstep, sizeof x.rstep, x.m_used ? "r += %lld" : "r++", (long long)c.G);
    e->md = M_AXES;

    for (int r = 0; r < k->nreds; r++) emit_one(&x, r);
    if (x.has_outer) emit_outer_stores(&x);
    if (c.second) {   /* the full-space stores: a second kernel, over every (o, r), reading the result */
        cu_line(&e->s, 1, "}");
        emit_second(&x);
        return;
    }
    if (has_full) emit_full_stores(&x);
    cu_line(&e->s, 1, "}");
}
