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
 * Expressions are `const T eN = ...;` in the kernel IR's order, only those a
 * root needs (NVRTC warns about unused variables, and the tests demand no
 * warnings); in a reduction, those on the outer domain are hoisted out of
 * the loop over r. A value is computed in a math type (float, double, long
 * long or int, by its operands and result) and rounded to its dtype:
 * f16/bf16 through a round trip to __half/__nv_bfloat16, float to integer as
 * tf_dtype_round does (NaN to 0, truncate, saturate).
 *
 * The source names no buffer and no op of the module: b0, b1, ... are the
 * kernel's buffers in order, so equal kernels get equal text and, hashed,
 * equal names. */
#include "cuda.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scalar.h"

/* The name in the source until the hash is known; same length as the name. */
static const char placeholder[] = "tf_XXXXXXXXXXXXXXXX";

/* Grids larger than this loop instead (every kernel is a grid-stride loop). */
enum { MAX_GRID = 65536 };

/* ---- text ------------------------------------------------------------------ */

typedef tf_strbuf sb;

/* A line at indentation depth (4 spaces a level). */
static void line(sb *s, int depth, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void line(sb *s, int depth, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof buf) { s->oom = true; return; }   /* never: lines are short */
    static const char spaces[] = "                                                                ";
    for (int d = depth * 4; d > 0; d -= (int)sizeof spaces - 1) tf_strbuf_append(s, spaces, d < (int)sizeof spaces - 1 ? (size_t)d : sizeof spaces - 1);
    buf[k] = '\n';
    tf_strbuf_append(s, buf, (size_t)k + 1);
}

/* ---- dtypes ---------------------------------------------------------------- */

static const char *storage_type(tf_dt t)
{
    switch (t) {
    case TF_DT_F32: return "float";
    case TF_DT_F16: return "__half";
    case TF_DT_BF16: return "__nv_bfloat16";
    case TF_DT_F64: return "double";
    case TF_DT_I64: return "long long";
    case TF_DT_I32: return "int";
    default: return "unsigned char";   /* bool */
    }
}

/* The C type a value of dtype t lives in: f16/bf16 in a float. */
static const char *value_type(tf_dt t)
{
    switch (t) {
    case TF_DT_F32: case TF_DT_F16: case TF_DT_BF16: return "float";
    case TF_DT_F64: return "double";
    case TF_DT_I64: return "long long";
    case TF_DT_I32: return "int";
    default: return "bool";
    }
}

static bool is_f32ish(tf_dt t) { return t == TF_DT_F32 || t == TF_DT_F16 || t == TF_DT_BF16; }
static bool is_intish(tf_dt t) { return t == TF_DT_I64 || t == TF_DT_I32 || t == TF_DT_BOOL; }

/* The math type of a set of dtypes: double if any is f64, float if any is
 * a float, else the widest integer. */
static tf_dt promote(const tf_dt *ts, int n)
{
    bool f64 = false, fl = false, i64 = false;
    for (int i = 0; i < n; i++) {
        f64 |= ts[i] == TF_DT_F64;
        fl |= is_f32ish(ts[i]);
        i64 |= ts[i] == TF_DT_I64;
    }
    return f64 ? TF_DT_F64 : fl ? TF_DT_F32 : i64 ? TF_DT_I64 : TF_DT_I32;
}

/* code (a value of dtype `from`) as a value of dtype `to`, rounded to it. */
static void conv(tf_dt from, tf_dt to, const char *code, char *out, size_t n)
{
    bool ff = is_f32ish(from) || from == TF_DT_F64;
    if (from == to || (to == TF_DT_F32 && is_f32ish(from))) { snprintf(out, n, "%s", code); return; }
    switch (to) {
    case TF_DT_F32: snprintf(out, n, "(float)(%s)", code); break;
    case TF_DT_F64: snprintf(out, n, "(double)(%s)", code); break;
    case TF_DT_F16:
        if (from == TF_DT_F64) snprintf(out, n, "__half2float(__double2half(%s))", code);
        else snprintf(out, n, is_f32ish(from) ? "tf_rh(%s)" : "tf_rh((float)(%s))", code);
        break;
    case TF_DT_BF16:
        if (from == TF_DT_F64) snprintf(out, n, "__bfloat162float(__double2bfloat16(%s))", code);
        else snprintf(out, n, is_f32ish(from) ? "tf_rb(%s)" : "tf_rb((float)(%s))", code);
        break;
    case TF_DT_I64: snprintf(out, n, ff ? "tf_f2ll(%s)" : "(long long)(%s)", code); break;
    case TF_DT_I32: snprintf(out, n, ff ? "tf_f2i(%s)" : from == TF_DT_I64 ? "tf_ll2i(%s)" : "(int)(%s)", code); break;
    default: snprintf(out, n, "((%s) != 0)", code); break;   /* bool */
    }
}

/* A literal of dtype t's value type (v already rounded to t). */
static void literal(tf_dt t, double v, char *out, size_t n)
{
    if (t == TF_DT_BOOL) { snprintf(out, n, "%s", v != 0 ? "true" : "false"); return; }
    if (t == TF_DT_I32) {
        if (v <= -2147483648.0) snprintf(out, n, "(-2147483647 - 1)");
        else snprintf(out, n, "%d", (int)v);
        return;
    }
    if (t == TF_DT_I64) { snprintf(out, n, "%lldLL", (long long)v); return; }
    bool f = t != TF_DT_F64;
    if (v != v) { snprintf(out, n, "%s", f ? "__int_as_float(0x7fc00000)" : "__longlong_as_double(0x7ff8000000000000LL)"); return; }
    if (isinf(v)) {
        snprintf(out, n, "%s%s", v < 0 ? "-" : "", f ? "__int_as_float(0x7f800000)" : "__longlong_as_double(0x7ff0000000000000LL)");
        return;
    }
    char num[64];
    snprintf(num, sizeof num, f ? "%.9g" : "%.17g", v);   /* enough digits to read back exactly */
    bool dot = strpbrk(num, ".e") != NULL;
    snprintf(out, n, "%s%s%s", num, dot ? "" : ".0", f ? "f" : "");
}

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

/* ---- analysis ------------------------------------------------------------------ */

typedef enum mode { M_FLAT, M_VEC, M_AXES } mode;   /* how a body indexes: flat i, vectors + flat i, axes */

typedef struct em {
    const tf_kernel *k;
    sb s;
    int64_t row[TF_MAX_RANK];   /* row-major strides of the index space */
    int64_t numel;
    bool *written;              /* per buffer: this kernel stores it */
    bool *contig;               /* per expression: a load whose strides are the space's */
    unsigned char *mark;        /* per expression: needed by the current roots */
    bool f16, bf16, vec, rng, wide;
    mode md;
    sb second;                  /* a split reduction's second kernel (its full-space stores), empty when none */
    unsigned grid2, block2;
    const char *bid, *nblocks;  /* pointwise: this block's index and the blocks sharing the work
                                 * (blockIdx.x, gridDim.x; a multi-tensor part's own range) */
    unsigned block;             /* pointwise: threads per block when fixed (a multi-tensor part), 0: chosen */
    const char *count;          /* pointwise: the parameter holding the element count (a multi-tensor part, so that
                                 * parts alike but for their sizes are one function), NULL: the count as a literal */
} em;

static bool contiguous(const tf_kernel *k, const int64_t *row, const tf_kexpr *x)
{
    if (x->offset) return false;   /* a slice starting past 0: indexed (a vector would lose the alignment) */
    for (int a = 0; a < k->rank; a++)
        if (k->dims[a] > 1 && x->strides[a] != row[a]) return false;
    return true;
}

static void mark_from(em *e, int i)
{
    if (e->mark[i]) return;
    e->mark[i] = 1;
    const tf_kexpr *x = &e->k->exprs[i];
    if (x->kind != TF_KX_OP || x->op == TF_OP_DROPOUT_MASK) return;   /* dropout_mask reads only the index */
    for (int q = 0; q < x->nargs; q++) mark_from(e, x->args[q]);
}

static void mark_clear(em *e) { memset(e->mark, 0, (size_t)e->k->nexprs); }

/* Which expressions a set of marks selects. */
typedef enum sel { SEL_ALL, SEL_OUTER, SEL_INNER } sel;

static bool selected(const em *e, int i, sel which)
{
    if (!e->mark[i]) return false;
    if (which == SEL_ALL || e->k->kind != TF_K_REDUCTION) return true;
    return (which == SEL_OUTER) == e->k->exprs[i].reduced_domain;
}

static unsigned all_axes(const tf_kernel *k)
{
    unsigned m = 0;
    for (int a = 0; a < k->rank; a++)
        if (k->dims[a] > 1) m |= 1u << a;
    return m;
}

/* The axes (of extent > 1) that the selected expressions index with in
 * mode md; *flat whether they use the flat index i. */
static unsigned axes_used(const em *e, sel which, mode md, bool *flat)
{
    const tf_kernel *k = e->k;
    unsigned m = 0;
    bool f = false;
    for (int i = 0; i < k->nexprs; i++) {
        if (!selected(e, i, which)) continue;
        const tf_kexpr *x = &k->exprs[i];
        if (x->kind == TF_KX_LOAD) {
            if (md == M_FLAT && e->contig[i]) { f = true; continue; }
            if (md == M_VEC && e->contig[i]) continue;
            for (int a = 0; a < k->rank; a++)
                if (k->dims[a] > 1 && x->strides[a]) m |= 1u << a;
        } else if (x->kind == TF_KX_INDEX) {
            if (k->dims[x->axis] > 1) m |= 1u << x->axis;
        } else if (x->kind == TF_KX_OP && x->op == TF_OP_DROPOUT_MASK) {
            if (md == M_AXES) m |= all_axes(k);
            else f = true;
        }
    }
    if (m && md != M_AXES) f = true;   /* axes come from i */
    if (flat) *flat = f;
    return m;
}

/* const tf_idx iA = ...; for the axes in `axes`, from `var`, the row-major
 * flat index over the axes in `group`. */
static void def_axes(em *e, int depth, unsigned axes, unsigned group, const char *var)
{
    const tf_kernel *k = e->k;
    for (int a = 0; a < k->rank; a++) {
        if (!((axes >> a) & 1)) continue;
        int64_t st = 1;
        bool lead = true;
        for (int b = a + 1; b < k->rank; b++)
            if ((group >> b) & 1) st *= k->dims[b];
        for (int b = 0; b < a; b++)
            if (((group >> b) & 1) && k->dims[b] > 1) lead = false;
        char c[128];
        if (lead) snprintf(c, sizeof c, st == 1 ? "%s" : "%s / %lld", var, (long long)st);
        else if (st == 1) snprintf(c, sizeof c, "%s %% %lld", var, (long long)k->dims[a]);
        else snprintf(c, sizeof c, "(%s / %lld) %% %lld", var, (long long)st, (long long)k->dims[a]);
        line(&e->s, depth, "const tf_idx i%d = %s;", a, c);
    }
}

/* sum of iA * stride over the axes of extent > 1 with a stride */
static void offset_code(const tf_kernel *k, const int64_t *strides, char *out, size_t n)
{
    size_t at = 0;
    out[0] = 0;
    for (int a = 0; a < k->rank; a++) {
        if (k->dims[a] <= 1 || !strides[a]) continue;
        int w = strides[a] == 1 ? snprintf(out + at, n - at, "%si%d", at ? " + " : "", a)
                                : snprintf(out + at, n - at, "%si%d * %lld", at ? " + " : "", a, (long long)strides[a]);
        if (w < 0 || (size_t)w >= n - at) break;
        at += (size_t)w;
    }
    if (!at) snprintf(out, n, "0");
}

/* ---- expressions ------------------------------------------------------------------ */

static void load_code(const em *e, int i, char *out, size_t n)
{
    const tf_kernel *k = e->k;
    const tf_kexpr *x = &k->exprs[i];
    char ref[512], off[400];
    if (e->md == M_VEC && e->contig[i]) {
        snprintf(ref, sizeof ref, "tf_v%d.v[j]", i);
    } else {
        if (e->md == M_FLAT && e->contig[i]) snprintf(off, sizeof off, "i");
        else offset_code(k, x->strides, off, sizeof off);
        if (x->offset) snprintf(ref, sizeof ref, "b%d[%lld + %s]", x->buf, (long long)x->offset, off);
        else snprintf(ref, sizeof ref, "b%d[%s]", x->buf, off);
    }
    switch (k->bufs[x->buf].value->type.dtype) {
    case TF_DT_F16: snprintf(out, n, "__half2float(%s)", ref); break;
    case TF_DT_BF16: snprintf(out, n, "__bfloat162float(%s)", ref); break;
    case TF_DT_BOOL: snprintf(out, n, "(%s != 0)", ref); break;
    default: snprintf(out, n, "%s", ref); break;
    }
}

/* The flat index of the full space, or of its outer axes, for dropout's
 * counter. */
static void flat_code(const em *e, bool outer, char *out, size_t n)
{
    if (e->md != M_AXES) { snprintf(out, n, "(unsigned long long)i"); return; }
    char off[400];
    int64_t orow[TF_MAX_RANK], s = 1;
    for (int a = e->k->rank - 1; a >= 0; a--) {
        bool skip = outer && ((e->k->reduce_mask >> a) & 1);
        orow[a] = skip ? 0 : s;
        if (!skip) s *= e->k->dims[a];
    }
    offset_code(e->k, outer ? orow : e->row, off, sizeof off);
    snprintf(out, n, "(unsigned long long)(%s)", off);
}

static void math1(tf_dt ct, const char *base, const char *a, char *out, size_t n)
{
    snprintf(out, n, "%s%s(%s)", base, ct == TF_DT_F32 ? "f" : "", a);
}

/* Node j of the op's scalar expression (scalar.h) as code of type `want`
 * (the math type ct, or TF_DT_BOOL); operand q is expression e<args[q]>. */
typedef struct lw {
    const tf_sexpr *se;
    const char *an[3];
    tf_dt at[3], ct;
    bool overflow;
} lw;

static void lower_cuda(lw *w, int j, tf_dt want, char *out, size_t n)
{
    const tf_snode *nd = &w->se->node[j];
    tf_dt ct = w->ct;
    bool fl = ct == TF_DT_F32 || ct == TF_DT_F64;
    char a[3][640], r[2048];
    if (nd->prim == TF_S_ARG) { conv(w->at[nd->arg], want, w->an[nd->arg], out, n); return; }
    if (nd->prim == TF_S_CONST) { literal(want, tf_dtype_round(want, nd->value), out, n); return; }
    int arity = tf_sprim_arity(nd->prim);
    for (int q = 0; q < arity; q++) {
        lower_cuda(w, nd->kid[q], nd->prim == TF_S_SELECT && q == 0 ? TF_DT_BOOL : ct, a[q], sizeof a[q]);
        if (strlen(a[q]) + 1 >= sizeof a[q]) w->overflow = true;
    }
    const char *fx = ct == TF_DT_F32 ? "f" : "";
    switch (nd->prim) {
    case TF_S_NEG: snprintf(r, sizeof r, "(-%s)", a[0]); break;
    case TF_S_ADD: snprintf(r, sizeof r, "(%s + %s)", a[0], a[1]); break;
    case TF_S_SUB: snprintf(r, sizeof r, "(%s - %s)", a[0], a[1]); break;
    case TF_S_MUL: snprintf(r, sizeof r, "(%s * %s)", a[0], a[1]); break;
    case TF_S_DIV: snprintf(r, sizeof r, fl ? "(%s / %s)" : "tf_idiv(%s, %s)", a[0], a[1]); break;
    case TF_S_ABS:
        if (fl) math1(ct, "fabs", a[0], r, sizeof r);
        else snprintf(r, sizeof r, "(%s < 0 ? -%s : %s)", a[0], a[0], a[0]);
        break;
    case TF_S_EXP: math1(ct, "exp", a[0], r, sizeof r); break;
    case TF_S_LOG: math1(ct, "log", a[0], r, sizeof r); break;
    case TF_S_SQRT: math1(ct, "sqrt", a[0], r, sizeof r); break;
    case TF_S_RSQRT: math1(ct, "rsqrt", a[0], r, sizeof r); break;
    case TF_S_TANH: math1(ct, "tanh", a[0], r, sizeof r); break;
    case TF_S_SIN: math1(ct, "sin", a[0], r, sizeof r); break;
    case TF_S_COS: math1(ct, "cos", a[0], r, sizeof r); break;
    case TF_S_ERF: math1(ct, "erf", a[0], r, sizeof r); break;
    case TF_S_POW: snprintf(r, sizeof r, "pow%s(%s, %s)", fx, a[0], a[1]); break;
    case TF_S_MAX: snprintf(r, sizeof r, "tf_max(%s, %s)", a[0], a[1]); break;
    case TF_S_MIN: snprintf(r, sizeof r, "tf_min(%s, %s)", a[0], a[1]); break;
    case TF_S_EQ: snprintf(r, sizeof r, "(%s == %s)", a[0], a[1]); break;
    case TF_S_NE: snprintf(r, sizeof r, "(%s != %s)", a[0], a[1]); break;
    case TF_S_LT: snprintf(r, sizeof r, "(%s < %s)", a[0], a[1]); break;
    case TF_S_LE: snprintf(r, sizeof r, "(%s <= %s)", a[0], a[1]); break;
    case TF_S_GT: snprintf(r, sizeof r, "(%s > %s)", a[0], a[1]); break;
    case TF_S_GE: snprintf(r, sizeof r, "(%s >= %s)", a[0], a[1]); break;
    case TF_S_ISFINITE: snprintf(r, sizeof r, fl ? "tf_isfinite(%s)" : "true", a[0]); break;   /* integers are finite */
    case TF_S_SELECT: snprintf(r, sizeof r, "(%s ? %s : %s)", a[0], a[1], a[2]); break;
    default: snprintf(r, sizeof r, "0"); w->overflow = true; break;   /* excluded by tf_cuda_supports */
    }
    if (strlen(r) + 1 >= sizeof r) w->overflow = true;
    conv(tf_sprim_boolout(nd->prim) ? TF_DT_BOOL : ct, want, r, out, n);
}

/* The value of an op expression: its scalar expression from the op table,
 * in the math type, rounded to the result's dtype. */
static void op_code(const em *e, int i, char *out, size_t n)
{
    const tf_kernel *k = e->k;
    const tf_kexpr *x = &k->exprs[i];
    const tf_sexpr *se = tf_scalar_lowering(x->op, NULL);
    const tf_snode *root = &se->node[se->n - 1];
    if (root->prim == TF_S_DROPOUT) {
        double p = tf_node_float(x->node, "p");
        char scale[96], zero[96], flat[512];
        literal(x->dtype, tf_dtype_round(x->dtype, 1.0 / (1.0 - p)), scale, sizeof scale);
        literal(x->dtype, 0.0, zero, sizeof zero);
        flat_code(e, x->reduced_domain && e->k->reduce_mask, flat, sizeof flat);
        snprintf(out, n, "(tf_dropout_keep(tf_key%d, %s, %lluULL) ? %s : %s)", i, flat,
                 (unsigned long long)tf_cuda_dropout_threshold(p), scale, zero);
        return;
    }
    lw w = {.se = se};
    char an[3][16];
    tf_dt all[4];
    for (int q = 0; q < x->nargs && q < 3; q++) {
        snprintf(an[q], sizeof an[q], "e%d", x->args[q]);
        w.an[q] = an[q];
        w.at[q] = all[q] = k->exprs[x->args[q]].dtype;
    }
    bool cmp = tf_sprim_boolout(root->prim);
    int na = x->nargs < 3 ? x->nargs : 3;
    if (!cmp) all[na++] = x->dtype;
    w.ct = promote(all, na);
    char r[2048];
    lower_cuda(&w, se->n - 1, cmp ? TF_DT_BOOL : w.ct, r, sizeof r);
    if (w.overflow || strlen(r) + 1 >= sizeof r) {   /* an expression far longer than any in ops.def: NVRTC says so */
        snprintf(out, n, "tf_scalar_expression_too_long");
        return;
    }
    conv(cmp ? TF_DT_BOOL : w.ct, x->dtype, r, out, n);
}

static void emit_expr(em *e, int depth, int i)
{
    const tf_kernel *k = e->k;
    const tf_kexpr *x = &k->exprs[i];
    char code[2600], t[256];
    switch (x->kind) {
    case TF_KX_LOAD: load_code(e, i, code, sizeof code); break;
    case TF_KX_CONST: literal(x->dtype, tf_dtype_round(x->dtype, x->value), code, sizeof code); break;
    case TF_KX_REDUCED: snprintf(code, sizeof code, "tf_r%d", x->red); break;
    case TF_KX_INDEX:
        if (k->dims[x->axis] > 1) snprintf(t, sizeof t, "(long long)i%d", x->axis);
        else snprintf(t, sizeof t, "0LL");
        conv(TF_DT_I64, x->dtype, t, code, sizeof code);
        break;
    case TF_KX_OP: op_code(e, i, code, sizeof code); break;
    }
    line(&e->s, depth, "const %s e%d = %s;", value_type(x->dtype), i, code);
}

static void emit_selected(em *e, int depth, sel which)
{
    for (int i = 0; i < e->k->nexprs; i++)
        if (selected(e, i, which)) emit_expr(e, depth, i);
}

/* The store of expression ex into buffer b at index `at`. */
static void emit_store(em *e, int depth, const tf_kstore *st, const char *at)
{
    tf_dt bt = e->k->bufs[st->buf].value->type.dtype, xt = e->k->exprs[st->expr].dtype;
    char v[32], c[256];
    snprintf(v, sizeof v, "e%d", st->expr);
    conv(xt, bt, v, c, sizeof c);
    const char *f = bt == TF_DT_F16 ? "__float2half_rn" : bt == TF_DT_BF16 ? "__float2bfloat16_rn" : bt == TF_DT_BOOL ? "(unsigned char)" : NULL;
    if (f) line(&e->s, depth, "%s = %s(%s);", at, f, c);
    else line(&e->s, depth, "%s = %s;", at, c);
}

/* Before the loops: one key per dropout mask (seed, step, salt mixed). */
static void emit_dropout_keys(em *e, int depth)
{
    for (int i = 0; i < e->k->nexprs; i++) {
        const tf_kexpr *x = &e->k->exprs[i];
        if (x->kind == TF_KX_OP && x->op == TF_OP_DROPOUT_MASK && e->mark[i])
            line(&e->s, depth, "const unsigned long long tf_key%d = tf_dropout_key(tf_rng, %lluULL);", i,
                 (unsigned long long)tf_node_int(x->node, "salt"));
    }
}

/* ---- pointwise ---------------------------------------------------------------------- */

/* The widest element of the kernel's buffers, in bytes: the alignment
 * scalar accesses need. */
static unsigned widest(const tf_kernel *k)
{
    unsigned w = 1;
    for (int b = 0; b < k->nbufs; b++) {
        unsigned x = (unsigned)tf_dtype_bytes(k->bufs[b].value->type.dtype);
        if (x > w) w = x;
    }
    return w;
}

typedef struct geom { tf_cuda_shape shape; unsigned grid, block, smem, vec, group, align, scratch; } geom;
/* A split reduction's scratch: each outer index's result (8 bytes), then
 * the partials, then a counter per outer index. */

/* A long reduction over few outer indices is split across blocks, so that
 * it fills the device: SPLIT_MIN reduced elements at least, each block a
 * share of SPLIT_CHUNK or more, up to SPLIT_BLOCKS blocks in all (two per SM
 * of a 132-SM H100/H200). */
enum { SPLIT_MIN = 65536, SPLIT_CHUNK = 16384, SPLIT_BLOCKS = 264 };
/* Column reductions (a 32-wide tile of outer indices per block) over fewer
 * tiles than SMs that store only their results split their rows as well:
 * COL_SPLIT_MIN rows at least, a share of COL_SPLIT_CHUNK rows or more per
 * block (32 per thread). */
enum { COL_SPLIT_MIN = 2048, COL_SPLIT_CHUNK = 1024 };

static unsigned blocks_for(int64_t work, unsigned per_block)
{
    int64_t g = (work + per_block - 1) / per_block;
    return g < 1 ? 1 : g > MAX_GRID ? MAX_GRID : (unsigned)g;
}

/* The scalar body at flat index i (declared by the caller). */
static void pointwise_body(em *e, int depth)
{
    const tf_kernel *k = e->k;
    e->md = M_FLAT;
    unsigned ax = axes_used(e, SEL_ALL, M_FLAT, NULL);
    def_axes(e, depth, ax, (1u << k->rank) - 1, "i");
    emit_selected(e, depth, SEL_ALL);
    for (int s = 0; s < k->nstores; s++) {
        char at[64];
        snprintf(at, sizeof at, "b%d[i]", k->stores[s].buf);
        emit_store(e, depth, &k->stores[s], at);
    }
}

static void emit_pointwise(em *e, geom *g)
{
    const tf_kernel *k = e->k;
    mark_clear(e);
    for (int s = 0; s < k->nstores; s++) mark_from(e, k->stores[s].expr);
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
    g->grid = blocks_for(work, g->block);
    g->shape = use_vec ? TF_CUDA_POINTWISE_VEC : TF_CUDA_POINTWISE;
    g->vec = use_vec ? (unsigned)vec : 1;
    g->align = use_vec ? 16 : widest(k);
    e->vec = use_vec;
    sb *s = &e->s;
    /* the count as a literal, or as e->count (long long) read as tf_idx */
    char nv_s[96], n_s[96], start_s[96];
    if (e->count) {
        snprintf(nv_s, sizeof nv_s, "(tf_idx)(%s / %d)", e->count, use_vec ? vec : 1);
        snprintf(n_s, sizeof n_s, "(tf_idx)%s", e->count);
        snprintf(start_s, sizeof start_s, "(tf_idx)(%s / %d * %d)", e->count, use_vec ? vec : 1, use_vec ? vec : 1);
        if (use_vec) line(s, 1, "// pointwise over %s elements, %d at a time (16 bytes of the widest buffer)", e->count, vec);
        else line(s, 1, "// pointwise over %s elements", e->count);
    } else {
        snprintf(nv_s, sizeof nv_s, "%lld", (long long)(use_vec ? n / vec : n));
        snprintf(n_s, sizeof n_s, "%lld", (long long)n);
        snprintf(start_s, sizeof start_s, "%lld", (long long)(use_vec ? n / vec * vec : 0));
        if (use_vec) line(s, 1, "// pointwise over %lld elements, %d at a time (16 bytes of the widest buffer)", (long long)n, vec);
        else line(s, 1, "// pointwise over %lld elements", (long long)n);
    }
    emit_dropout_keys(e, 1);
    if (!k->nstores) return;
    char stride[64];
    const char *bid = e->bid ? e->bid : "blockIdx.x";
    snprintf(stride, sizeof stride, "(tf_idx)%s * blockDim.x", e->nblocks ? e->nblocks : "gridDim.x");
    int64_t start = 0;
    if (use_vec) {
        int64_t nv = n / vec;
        line(s, 1, "for (tf_idx tc = (tf_idx)%s * blockDim.x + threadIdx.x; tc < %s; tc += %s) {", bid, nv_s, stride);
        for (int i = 0; i < k->nexprs; i++) {
            if (!e->mark[i] || !e->contig[i]) continue;
            const tf_kexpr *x = &k->exprs[i];
            const char *t = storage_type(k->bufs[x->buf].value->type.dtype);
            line(s, 2, "const tf_vec<%s, %d> tf_v%d = *(const tf_vec<%s, %d> *)(b%d + tc * %d);", t, vec, i, t, vec, x->buf, vec);
        }
        for (int t = 0; t < k->nstores; t++)
            line(s, 2, "tf_vec<%s, %d> tf_s%d;", storage_type(k->bufs[k->stores[t].buf].value->type.dtype), vec, t);
        line(s, 2, "#pragma unroll");
        line(s, 2, "for (int j = 0; j < %d; j++) {", vec);
        e->md = M_VEC;
        bool flat;
        unsigned ax = axes_used(e, SEL_ALL, M_VEC, &flat);
        if (flat) line(s, 3, "const tf_idx i = tc * %d + j;", vec);
        def_axes(e, 3, ax, (1u << k->rank) - 1, "i");
        emit_selected(e, 3, SEL_ALL);
        for (int t = 0; t < k->nstores; t++) {
            char at[64];
            snprintf(at, sizeof at, "tf_s%d.v[j]", t);
            emit_store(e, 3, &k->stores[t], at);
        }
        line(s, 2, "}");
        for (int t = 0; t < k->nstores; t++) {
            const char *ty = storage_type(k->bufs[k->stores[t].buf].value->type.dtype);
            line(s, 2, "*(tf_vec<%s, %d> *)(b%d + tc * %d) = tf_s%d;", ty, vec, k->stores[t].buf, vec, t);
        }
        line(s, 1, "}");
        start = nv * vec;
        if (start == n) return;
        if (e->count) line(s, 1, "// the last %s %% %d elements", e->count, vec);
        else line(s, 1, "// the last %lld elements", (long long)(n - start));
    }
    if (start) line(s, 1, "for (tf_idx i = %s + (tf_idx)%s * blockDim.x + threadIdx.x; i < %s; i += %s) {", start_s, bid, n_s, stride);
    else line(s, 1, "for (tf_idx i = (tf_idx)%s * blockDim.x + threadIdx.x; i < %s; i += %s) {", bid, n_s, stride);
    pointwise_body(e, 2);
    line(s, 1, "}");
}

/* ---- reductions ------------------------------------------------------------------- */

/* The accumulator's dtype: double for f64, long long for integer sums, else float. */
static tf_dt acc_dtype(const tf_kernel *k, const tf_kreduce *r)
{
    tf_dt at = k->exprs[r->arg].dtype;
    if (r->dtype == TF_DT_F64 || at == TF_DT_F64) return TF_DT_F64;
    if (is_intish(r->dtype) && is_intish(at)) return TF_DT_I64;
    return TF_DT_F32;
}

/* The last block's fold of outer index o's S partials, in order, into tf_a. */
static void fold_partials(sb *s, int depth, const char *vt, int64_t S, bool mx)
{
    line(s, depth, "const volatile %s *tf_v = tf_parts + o * %lld;", vt, (long long)S);
    line(s, depth, "tf_a = tf_v[0];");
    line(s, depth, "for (int q = 1; q < %lld; q++) {", (long long)S);
    if (mx) line(s, depth + 1, "tf_a = tf_max(tf_a, (%s)tf_v[q]);", vt);
    else line(s, depth + 1, "tf_a += tf_v[q];");
    line(s, depth, "}");
}

static void emit_reduction(em *e, geom *g)
{
    const tf_kernel *k = e->k;
    sb *s = &e->s;
    unsigned all = (1u << k->rank) - 1, rmask = k->reduce_mask & all, omask = all & ~rmask;
    int64_t M = 1, R = 1;
    for (int a = 0; a < k->rank; a++) {
        if ((rmask >> a) & 1) R *= k->dims[a];
        else M *= k->dims[a];
    }
    /* a row (innermost axis reduced): G threads, whole warps, per outer index;
     * else a column of a 32-wide tile of consecutive outer indices */
    bool row = k->rank == 0 || ((rmask >> (k->rank - 1)) & 1);
    int64_t G = row ? 32 : 1, RPB;
    if (row) {
        while (G < 1024 && G * 8 < R) G *= 2;
        RPB = G >= 128 ? 1 : 128 / G;
    } else {
        while (G < 32 && G * 8 < R) G *= 2;
        RPB = 32;
    }
    int64_t NB = (M + RPB - 1) / RPB;
    /* split: S blocks per outer index each fold a contiguous share of r; the
     * last to finish (an atomic count in scratch) folds the S partials in
     * order, so the result does not depend on which block that is */
    bool any_full = false;
    for (int t = 0; t < k->nstores; t++) any_full |= !k->stores[t].reduced_domain;
    int64_t S = 1;
    /* full-space stores read the result everywhere: they become a second kernel over the space, launched after */
    if (row && RPB == 1 && k->nreds == 1 && !(any_full && e->rng) && R >= SPLIT_MIN && M < SPLIT_BLOCKS) {
        S = (R + SPLIT_CHUNK - 1) / SPLIT_CHUNK;
        if (S > SPLIT_BLOCKS / M) S = SPLIT_BLOCKS / M;
        if (S < 2) S = 1;
    } else if (!row && G == 32 && k->nreds == 1 && !any_full && R >= COL_SPLIT_MIN && NB < SPLIT_BLOCKS / 2) {
        /* fewer column tiles than SMs (a bias gradient over many rows): the rows split too; not where the
         * region also stores full-size values, which a second kernel would read all over again */
        S = (R + COL_SPLIT_CHUNK - 1) / COL_SPLIT_CHUNK;
        if (S > SPLIT_BLOCKS / NB) S = SPLIT_BLOCKS / NB;
        if (S < 2) S = 1;
    }
    int64_t CH = (R + S - 1) / S;   /* each block's share of r */
    unsigned accb = 4;
    for (int r = 0; r < k->nreds; r++)
        if (acc_dtype(k, &k->reds[r]) != TF_DT_F32) accb = 8;
    bool partials = row ? G > 32 : G > 1;
    g->shape = row ? TF_CUDA_ROW_REDUCE : TF_CUDA_COL_REDUCE;
    g->block = (unsigned)(G * RPB);
    g->grid = blocks_for(NB * S, 1);
    g->group = (unsigned)G;
    g->vec = 1;
    g->smem = partials ? (unsigned)((row ? RPB * (G / 32) : G * 32) * accb) : 0;
    g->align = widest(k);
    if (S > 1) g->scratch = (unsigned)(M * 8 + M * S * accb + M * 4);   /* results, partials, counters */
    bool second = S > 1 && any_full;

    /* which stores, and what indexes what */
    bool has_outer = false, has_full = false;
    for (int t = 0; t < k->nstores; t++) {
        if (k->stores[t].reduced_domain) has_outer = true;
        else has_full = true;
    }
    mark_clear(e);   /* everything any pass or store needs */
    for (int r = 0; r < k->nreds; r++) mark_from(e, k->reds[r].arg);
    for (int t = 0; t < k->nstores; t++) mark_from(e, k->stores[t].expr);
    unsigned outer_ax = axes_used(e, SEL_ALL, M_AXES, NULL) & omask;
    if (has_full) outer_ax |= all_axes(k) & omask;   /* the full-space store index */
    bool live = M % RPB != 0;
    bool o_used = live || outer_ax || has_outer;
    bool g_used = (o_used && RPB > 1) || (partials && (!row || RPB > 1));
    bool m_used = G > 1;

    line(s, 1, "// %s reduction: %lld outer x %lld reduced, %lld threads per outer index, %lld per block",
         row ? "row" : "column", (long long)M, (long long)R, (long long)G, (long long)RPB);
    if (partials) line(s, 1, "extern __shared__ __align__(16) unsigned char tf_smem[];");
    if (row) {
        if (m_used && RPB > 1) line(s, 1, "const int tf_m = threadIdx.x %% %lld;", (long long)G);
        else if (m_used) line(s, 1, "const int tf_m = threadIdx.x;");
        if (g_used) line(s, 1, "const int tf_g = threadIdx.x / %lld;", (long long)G);
    } else {
        if (g_used) line(s, 1, "const int tf_g = %s;", G > 1 ? "threadIdx.x % 32" : "threadIdx.x");
        if (m_used) line(s, 1, "const int tf_m = threadIdx.x / 32;");
    }
    emit_dropout_keys(e, 1);
    if (S > 1) line(s, 1, "// split: %lld blocks per outer index, %lld reduced elements each", (long long)S, (long long)CH);
    line(s, 1, "for (tf_idx tf_ob = blockIdx.x; tf_ob < %lld; tf_ob += gridDim.x) {", (long long)(NB * S));
    if (S > 1 && !row) {   /* a tile of 32 columns, one share of its rows */
        line(s, 2, "const tf_idx tf_tile = tf_ob / %lld, tf_part = tf_ob %% %lld;", (long long)S, (long long)S);
        line(s, 2, "const tf_idx o = tf_tile * 32 + tf_g;");
        line(s, 2, "const tf_idx tf_rend = tf_part * %lld + %lld < %lld ? tf_part * %lld + %lld : %lld;", (long long)CH, (long long)CH,
             (long long)R, (long long)CH, (long long)CH, (long long)R);
    } else if (S > 1) {
        line(s, 2, "const tf_idx o = tf_ob / %lld, tf_part = tf_ob %% %lld;", (long long)S, (long long)S);
        line(s, 2, "const tf_idx tf_rend = tf_part * %lld + %lld < %lld ? tf_part * %lld + %lld : %lld;", (long long)CH, (long long)CH,
             (long long)R, (long long)CH, (long long)CH, (long long)R);
    } else if (o_used) {
        if (RPB > 1) line(s, 2, "const tf_idx o = tf_ob * %lld + tf_g;", (long long)RPB);
        else line(s, 2, "const tf_idx o = tf_ob;");
    }
    if (live) line(s, 2, "const bool tf_live = o < %lld;", (long long)M);
    def_axes(e, 2, outer_ax, omask, "o");
    char rloop[64], rbound[32];
    if (S > 1) snprintf(rloop, sizeof rloop, "tf_part * %lld + tf_m", (long long)CH);
    else snprintf(rloop, sizeof rloop, "%s", m_used ? "tf_m" : "0");
    if (S > 1) snprintf(rbound, sizeof rbound, "tf_rend");
    else snprintf(rbound, sizeof rbound, "%lld", (long long)R);
    char rstep[32];
    snprintf(rstep, sizeof rstep, m_used ? "r += %lld" : "r++", (long long)G);
    e->md = M_AXES;

    for (int r = 0; r < k->nreds; r++) {
        const tf_kreduce *rd = &k->reds[r];
        tf_dt acc = acc_dtype(k, rd);
        bool mx = rd->op == TF_OP_REDUCE_MAX;
        char init[96], x[128], c[256], tot[128];
        if (mx && acc == TF_DT_I64) snprintf(init, sizeof init, "(-9223372036854775807LL - 1)");
        else literal(acc, mx ? -INFINITY : 0, init, sizeof init);
        line(s, 2, "%s tf_r%d;   // %s", value_type(rd->dtype), r, tf_op_info_of(rd->op)->name);
        line(s, 2, "{");
        line(s, 3, "%s tf_a = %s;", value_type(acc), init);
        mark_clear(e);
        mark_from(e, rd->arg);
        int depth = 3;
        if (live) line(s, depth++, "if (tf_live) {");
        emit_selected(e, depth, SEL_OUTER);
        line(s, depth, "for (tf_idx r = %s; r < %s; %s) {", rloop, rbound, rstep);
        unsigned rax = axes_used(e, SEL_INNER, M_AXES, NULL) & rmask;
        def_axes(e, depth + 1, rax, rmask, "r");
        emit_selected(e, depth + 1, SEL_INNER);
        snprintf(x, sizeof x, "e%d", rd->arg);
        conv(k->exprs[rd->arg].dtype, acc, x, c, sizeof c);
        if (mx) line(s, depth + 1, "tf_a = tf_max(tf_a, %s);", c);
        else line(s, depth + 1, "tf_a += %s;", c);
        line(s, depth, "}");
        if (live) line(s, --depth, "}");
        /* the group's total, in every thread of the group */
        const char *vt = value_type(acc);
        if (row) {
            line(s, 3, mx ? "tf_a = tf_warp_max(tf_a);" : "tf_a = tf_warp_sum(tf_a);");
            if (partials) {
                int64_t nw = G / 32;
                if (RPB > 1) line(s, 3, "%s *tf_p = (%s *)tf_smem + tf_g * %lld;", vt, vt, (long long)nw);
                else line(s, 3, "%s *tf_p = (%s *)tf_smem;", vt, vt);
                line(s, 3, "if ((tf_m & 31) == 0) tf_p[tf_m >> 5] = tf_a;");
                line(s, 3, "__syncthreads();");
                line(s, 3, "tf_a = tf_p[0];");
                line(s, 3, "#pragma unroll");
                line(s, 3, "for (int w = 1; w < %lld; w++) {", (long long)nw);
                if (mx) line(s, 4, "tf_a = tf_max(tf_a, tf_p[w]);");
                else line(s, 4, "tf_a += tf_p[w];");
                line(s, 3, "}");
                line(s, 3, "__syncthreads();");
            }
        } else if (partials) {
            line(s, 3, "%s *tf_p = (%s *)tf_smem;", vt, vt);
            line(s, 3, "tf_p[tf_m * 32 + tf_g] = tf_a;");
            line(s, 3, "__syncthreads();");
            line(s, 3, "tf_a = tf_p[tf_g];");
            line(s, 3, "#pragma unroll");
            line(s, 3, "for (int w = 1; w < %lld; w++) {", (long long)G);
            if (mx) line(s, 4, "tf_a = tf_max(tf_a, tf_p[w * 32 + tf_g]);");
            else line(s, 4, "tf_a += tf_p[w * 32 + tf_g];");
            line(s, 3, "}");
            line(s, 3, "__syncthreads();");
        }
        if (S > 1 && !row) {   /* each column's partial; the last block of the tile folds them all, in order */
            line(s, 3, "%s *tf_parts = (%s *)((unsigned char *)tf_scratch + %lld);", vt, vt, (long long)(M * 8));
            line(s, 3, "unsigned *tf_cnt = (unsigned *)(tf_parts + %lld);", (long long)(M * S));
            line(s, 3, "__shared__ bool tf_last;");
            line(s, 3, "if (tf_m == 0%s) tf_parts[o * %lld + tf_part] = tf_a;", live ? " && tf_live" : "", (long long)S);
            line(s, 3, "__threadfence();");
            line(s, 3, "__syncthreads();");
            line(s, 3, "if (threadIdx.x == 0) tf_last = atomicAdd(&tf_cnt[tf_tile], 1u) == %lldu;", (long long)(S - 1));
            line(s, 3, "__syncthreads();");
            line(s, 3, "if (!tf_last) continue;");
            line(s, 3, "if (tf_m == 0%s) {", live ? " && tf_live" : "");
            fold_partials(s, 4, vt, S, mx);
            line(s, 3, "}");
            line(s, 3, "if (threadIdx.x == 0) tf_cnt[tf_tile] = 0u;   // ready for the next launch (and a graph's replay)");
        } else if (S > 1) {   /* this block's partial; the last block of the outer index folds them all, in order */
            line(s, 3, "%s *tf_parts = (%s *)((unsigned char *)tf_scratch + %lld);", vt, vt, (long long)(M * 8));
            line(s, 3, "unsigned *tf_cnt = (unsigned *)(tf_parts + %lld);", (long long)(M * S));
            line(s, 3, "__shared__ bool tf_last;");
            line(s, 3, "if (tf_m == 0) {");
            line(s, 4, "tf_parts[o * %lld + tf_part] = tf_a;", (long long)S);
            line(s, 4, "__threadfence();");
            line(s, 4, "tf_last = atomicAdd(&tf_cnt[o], 1u) == %lldu;", (long long)(S - 1));
            line(s, 3, "}");
            line(s, 3, "__syncthreads();");
            line(s, 3, "if (!tf_last) continue;");
            line(s, 3, "if (tf_m == 0) {");
            fold_partials(s, 4, vt, S, mx);
            line(s, 4, "tf_cnt[o] = 0u;   // ready for the next launch (and a graph's replay)");
            line(s, 3, "}");
        }
        if (rd->op == TF_OP_REDUCE_MEAN) {
            char cnt[64];
            literal(acc == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, rd->count, cnt, sizeof cnt);
            snprintf(tot, sizeof tot, acc == TF_DT_I64 ? "(double)tf_a / %s" : "tf_a / %s", cnt);
            conv(acc == TF_DT_I64 ? TF_DT_F64 : acc, rd->dtype, tot, c, sizeof c);
        } else {
            conv(acc, rd->dtype, "tf_a", c, sizeof c);
        }
        line(s, 3, "tf_r%d = %s;", r, c);
        if (second) line(s, 3, "if (tf_m == 0%s) ((%s *)tf_scratch)[o] = tf_r%d;   // for the second kernel", live ? " && tf_live" : "",
                         value_type(rd->dtype), r);
        line(s, 2, "}");
    }

    if (has_outer) {
        mark_clear(e);
        for (int t = 0; t < k->nstores; t++)
            if (k->stores[t].reduced_domain) mark_from(e, k->stores[t].expr);
        char cond[64] = "";
        snprintf(cond, sizeof cond, "%s%s%s", live ? "tf_live" : "", live && m_used ? " && " : "", m_used ? "tf_m == 0" : "");
        int depth = 2;
        if (cond[0]) line(s, depth++, "if (%s) {", cond);
        else line(s, depth++, "{");
        unsigned rax = axes_used(e, SEL_ALL, M_AXES, NULL) & rmask;
        for (int a = 0; a < k->rank; a++)   /* the reference evaluates them at reduced index 0 */
            if ((rax >> a) & 1) line(s, depth, "const tf_idx i%d = 0;", a);
        emit_selected(e, depth, SEL_ALL);
        for (int t = 0; t < k->nstores; t++) {
            if (!k->stores[t].reduced_domain) continue;
            char at[64];
            snprintf(at, sizeof at, o_used ? "b%d[o]" : "b%d[0]", k->stores[t].buf);
            emit_store(e, depth, &k->stores[t], at);
        }
        line(s, 2, "}");
    }

    if (second) {   /* the full-space stores: a second kernel, over every (o, r), reading the result */
        line(s, 1, "}");
        const tf_kreduce *rd = &k->reds[0];
        sb main_body = e->s;
        e->s = (sb){0};
        int64_t n2 = M * R;
        e->block2 = 256;
        e->grid2 = blocks_for(n2, 256);
        line(&e->s, 1, "// the full-space stores of the split reduction above: %lld elements", (long long)n2);
        line(&e->s, 1, "for (tf_idx tf_f = (tf_idx)blockIdx.x * blockDim.x + threadIdx.x; tf_f < %lld; tf_f += (tf_idx)gridDim.x * blockDim.x) {",
             (long long)n2);
        line(&e->s, 2, "const tf_idx o = tf_f / %lld, r = tf_f %% %lld;", (long long)R, (long long)R);
        line(&e->s, 2, "const %s tf_r0 = ((const %s *)tf_scratch)[o];", value_type(rd->dtype), value_type(rd->dtype));
        mark_clear(e);
        for (int t = 0; t < k->nstores; t++)
            if (!k->stores[t].reduced_domain) mark_from(e, k->stores[t].expr);
        e->md = M_AXES;
        unsigned oax = (axes_used(e, SEL_ALL, M_AXES, NULL) | all_axes(k)) & omask;
        def_axes(e, 2, oax, omask, "o");
        emit_selected(e, 2, SEL_OUTER);
        unsigned rax = (axes_used(e, SEL_INNER, M_AXES, NULL) | all_axes(k)) & rmask;
        def_axes(e, 2, rax, rmask, "r");
        emit_selected(e, 2, SEL_INNER);
        char off[400], at[480];
        offset_code(k, e->row, off, sizeof off);
        for (int t = 0; t < k->nstores; t++) {
            if (k->stores[t].reduced_domain) continue;
            snprintf(at, sizeof at, "b%d[%s]", k->stores[t].buf, off);
            emit_store(e, 2, &k->stores[t], at);
        }
        line(&e->s, 1, "}");
        e->second = e->s;
        e->s = main_body;
        return;
    }

    if (has_full) {
        mark_clear(e);
        for (int t = 0; t < k->nstores; t++)
            if (!k->stores[t].reduced_domain) mark_from(e, k->stores[t].expr);
        int depth = 2;
        if (live) line(s, depth++, "if (tf_live) {");
        emit_selected(e, depth, SEL_OUTER);
        line(s, depth, "for (tf_idx r = %s; r < %lld; %s) {", rloop, (long long)R, rstep);
        unsigned rax = (axes_used(e, SEL_INNER, M_AXES, NULL) | all_axes(k)) & rmask;
        def_axes(e, depth + 1, rax, rmask, "r");
        emit_selected(e, depth + 1, SEL_INNER);
        char off[400], at[480];
        offset_code(k, e->row, off, sizeof off);
        for (int t = 0; t < k->nstores; t++) {
            if (k->stores[t].reduced_domain) continue;
            snprintf(at, sizeof at, "b%d[%s]", k->stores[t].buf, off);
            emit_store(e, depth + 1, &k->stores[t], at);
        }
        line(s, depth, "}");
        if (live) line(s, --depth, "}");
    }
    line(s, 1, "}");
}

/* ---- the whole source ------------------------------------------------------------------ */

static const char helpers_common[] =
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

static const char helpers_vec[] =
    "template <typename T, int N> struct alignas(sizeof(T) * N) tf_vec { T v[N]; };\n";

static const char helpers_f16[] = "__device__ __forceinline__ float tf_rh(float x) { return __half2float(__float2half_rn(x)); }\n";
static const char helpers_bf16[] =
    "__device__ __forceinline__ float tf_rb(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }\n";

/* tf_rng_uniform and tf_dropout_stream (ir/), in 64-bit integers: the same bits */
static const char helpers_rng[] =
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

/* What emitting kernel k needs to know first; false when out of memory. */
static bool em_init(em *e, const tf_kernel *k)
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
static void buffer_params(sb *params, const tf_kernel *k, const bool *written, const char *prefix)
{
    for (int b = 0; b < k->nbufs; b++)   /* __restrict__ where memplan keeps the buffer apart from every other */
        tf_strbuf_printf(params, "%s%s%s *%s%sb%d", b || params->n ? ", " : "", written[b] ? "" : "const ",
            storage_type(k->bufs[b].value->type.dtype), k->bufs[b].disjoint ? "__restrict__ " : "", prefix, b);
}

static void name_source(tf_cuda_kernel *out, char *src, size_t n)
{
    out->hash = fnv1a(src, n);
    snprintf(out->name, sizeof out->name, "tf_%016llx", (unsigned long long)out->hash);
    for (char *at = strstr(src, placeholder); at; at = strstr(at, placeholder)) memcpy(at, out->name, strlen(placeholder));
    out->src = src;
}

tf_ir_status tf_cuda_emit(const tf_kernel *k, tf_cuda_kernel *out, tf_diag *d)
{
    memset(out, 0, sizeof *out);
    char why[256];
    if (!tf_cuda_supports(k, why, sizeof why)) return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "cuda: %s", why);
    em e;
    if (!em_init(&e, k)) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");

    /* the body first: it decides the geometry and whether vectors are used */
    geom g = {0};
    sb body = {0};
    e.s = body;
    if (k->kind == TF_K_REDUCTION) emit_reduction(&e, &g);
    else emit_pointwise(&e, &g);
    body = e.s;

    sb src = {0};
    tf_strbuf_printf(&src, "// generated by tfuse (codegen/cuda.c) for NVRTC\n");
    if (e.f16) tf_strbuf_printf(&src, "#include <cuda_fp16.h>\n");
    if (e.bf16) tf_strbuf_printf(&src, "#include <cuda_bf16.h>\n");
    tf_strbuf_printf(&src, "\n%s", helpers_common);
    if (k->kind == TF_K_REDUCTION) tf_strbuf_printf(&src, "%s", helpers_warp);
    if (e.vec) tf_strbuf_printf(&src, "%s", helpers_vec);
    if (e.f16) tf_strbuf_printf(&src, "%s", helpers_f16);
    if (e.bf16) tf_strbuf_printf(&src, "%s", helpers_bf16);
    if (e.rng) tf_strbuf_printf(&src, "%s", helpers_rng);
    sb params = {0};
    buffer_params(&params, k, e.written, "");
    if (g.scratch) tf_strbuf_printf(&params, "%svoid *__restrict__ tf_scratch", k->nbufs ? ", " : "");
    if (e.rng) tf_strbuf_printf(&params, "%sconst unsigned long long *tf_rng", k->nbufs || g.scratch ? ", " : "");
    tf_strbuf_printf(&src, "\nextern \"C\" __global__ void __launch_bounds__(%u) %s(%s)\n", g.block, placeholder, params.p ? params.p : "");
    tf_strbuf_printf(&src, "{\n    typedef %s tf_idx;\n", e.wide ? "long long" : "int");
    tf_strbuf_printf(&src, "%s}\n", body.p ? body.p : "");
    if (e.second.p) {   /* the second kernel: launched after the first, the same parameters */
        tf_strbuf_printf(&src, "\nextern \"C\" __global__ void __launch_bounds__(%u) %s_b(%s)\n", e.block2, placeholder,
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
    name_source(out, src.p, src.n);
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

/* ---- multi-tensor launches ------------------------------------------------------------- */

/* A multi-tensor launch's parameters stay within the 4 KiB every CUDA
 * driver and architecture accepts (newer ones take 32 KiB; PyTorch's
 * multi_tensor_apply keeps to 4 KiB as well); a region with more buffers
 * is several launches. Every part's blocks have MULTI_BLOCK threads. */
enum { MULTI_PARAM_BYTES = 4096, MULTI_BLOCK = 256 };

static bool multi_part_ok(const tf_kernel *k)
{
    if (!k->multi || k->kind != TF_K_ELEMENTWISE || !k->nstores || !tf_cuda_supports(k, NULL, 0)) return false;
    for (int i = 0; i < k->nexprs; i++)
        if (k->exprs[i].kind == TF_KX_OP && k->exprs[i].op == TF_OP_DROPOUT_MASK) return false;
    return true;
}

int tf_cuda_multi_span(const tf_kernel *ks, int n)
{
    if (n < 1 || !multi_part_ok(&ks[0])) return n < 1 ? 0 : 1;
    int span = 1, params = ks[0].nbufs;
    while (span < n && ks[span].region == ks[0].region && multi_part_ok(&ks[span]) &&
           (params + ks[span].nbufs) * (int)sizeof(void *) <= MULTI_PARAM_BYTES) {
        bool apart = true;
        for (int q = 0; q < span && apart; q++) apart = tf_kernels_independent(&ks[q], &ks[span]);
        if (!apart) break;
        params += ks[span].nbufs;
        span++;
    }
    return span;
}

int tf_cuda_multi_params(const tf_kernel *ks, int n, int *first)
{
    int total = 0, distinct = 0;
    for (int q = 0; q < n; q++)
        for (int b = 0; b < ks[q].nbufs; b++, total++) {
            first[total] = total;
            for (int r = 0, o = 0; r <= q && first[total] == total; r++)   /* at most 512 buffers: a plain search */
                for (int c = 0; c < ks[r].nbufs && o < total; c++, o++)
                    if (first[o] == o && ks[r].bufs[c].value == ks[q].bufs[b].value) {
                        first[total] = o;
                        break;
                    }
            distinct += first[total] == total;
        }
    return distinct;
}

tf_ir_status tf_cuda_emit_multi(const tf_kernel *ks, int n, tf_cuda_kernel *out, tf_diag *d)
{
    memset(out, 0, sizeof *out);
    if (n < 2 || tf_cuda_multi_span(ks, n) != n)
        return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "cuda: kernels %s.. (%d) are not one multi-tensor launch", n > 0 ? ks[0].name : "?", n);
    sb parts = {0}, params = {0}, body = {0};
    bool f16 = false, bf16 = false, vec = false;
    unsigned base = 0, align = 1;
    char **fns = tf_calloc((size_t)n, sizeof *fns);   /* the distinct parts' functions (from their parameters on) */
    int *fn_part = tf_calloc((size_t)n, sizeof *fn_part), nfns = 0;   /* the part each was first emitted for */
    int total = 0;
    for (int q = 0; q < n; q++) total += ks[q].nbufs;
    /* per buffer of the parts in turn: its parameter (the buffer it first comes as), and what the parameter's
     * type needs: written by any part, apart from every other buffer in all of them */
    int *first = tf_calloc((size_t)(total ? total : 1), sizeof *first);
    struct { int q, b; } *where = tf_calloc((size_t)(total ? total : 1), sizeof *where);   /* each buffer's part and place */
    bool *written = tf_calloc((size_t)(total ? total : 1), sizeof *written), *apart = tf_calloc((size_t)(total ? total : 1), sizeof *apart);
    bool oom = !fns || !fn_part || !first || !where || !written || !apart;
    int nparams = oom ? 0 : tf_cuda_multi_params(ks, n, first);
    for (int o = 0; !oom && o < total; o++) apart[o] = true;
    for (int q = 0; q < n && !oom; q++) {
        const tf_kernel *k = &ks[q];
        em e;
        if (!em_init(&e, k)) {
            oom = true;
            break;
        }
        e.bid = "tf_bid";
        e.nblocks = "tf_nblocks";
        e.block = MULTI_BLOCK;
        e.count = "tf_n";
        geom g = {0};
        emit_pointwise(&e, &g);
        sb own = {0}, fn = {0};
        buffer_params(&own, k, e.written, "");
        tf_strbuf_printf(&fn, "(%s, int tf_bid, int tf_nblocks, long long tf_n)\n{\n    typedef %s tf_idx;\n%s}\n", own.p ? own.p : "",
                         e.wide ? "long long" : "int", e.s.p ? e.s.p : "");
        /* parts alike but for their sizes are one function (ptxas's time grows faster than the code it is
         * given, and an optimizer's update of 36 params is 3 or 4 distinct parts); not inlined, so that
         * ptxas compiles each once */
        int same = 0;
        while (same < nfns && !(fn.p && fns[same] && strcmp(fns[same], fn.p) == 0)) same++;
        if (same == nfns) {
            tf_strbuf_printf(&parts, "\n// part %d: %s\nstatic __device__ __noinline__ void tf_part%d%s", q, k->name, q, fn.p ? fn.p : "");
            fns[nfns] = fn.p;
            fn_part[nfns++] = q;
            fn.p = NULL;
        }
        int off = 0;
        for (int r = 0; r < q; r++) off += ks[r].nbufs;
        for (int b = 0; b < k->nbufs; b++) {   /* a parameter is named for where it first comes: p<part>b<buffer> */
            int f = first[off + b];
            where[off + b].q = q, where[off + b].b = b;
            written[f] |= e.written[b];
            apart[f] &= k->bufs[b].disjoint;
        }
        tf_strbuf_printf(&body, "    if (blockIdx.x < %uu) { tf_part%d(", base + g.grid, fn_part[same]);
        for (int b = 0; b < k->nbufs; b++) {
            int f = first[off + b];
            tf_strbuf_printf(&body, "p%db%d, ", where[f].q, where[f].b);
        }
        tf_strbuf_printf(&body, "(int)blockIdx.x - %u, %u, %lldLL); return; }   // part %d: %s\n", base, g.grid, (long long)e.numel, q,
                         k->name);
        oom |= fn.oom;
        tf_free(fn.p);
        base += g.grid;
        if (g.align > align) align = g.align;
        f16 |= e.f16;
        bf16 |= e.bf16;
        vec |= e.vec;
        oom |= own.oom || e.s.oom;
        tf_free(own.p);
        tf_free(e.s.p);
        tf_free(e.written);
        tf_free(e.contig);
        tf_free(e.mark);
    }
    for (int q = 0, o = 0; !oom && q < n; q++)   /* the parameters, each value once */
        for (int b = 0; b < ks[q].nbufs; b++, o++)
            if (first[o] == o)
                tf_strbuf_printf(&params, "%s%s%s *%sp%db%d", params.n ? ", " : "", written[o] ? "" : "const ",
                                 storage_type(ks[q].bufs[b].value->type.dtype), apart[o] ? "__restrict__ " : "", q, b);
    tf_free(first);
    tf_free(where);
    tf_free(written);
    tf_free(apart);
    sb src = {0};
    if (!oom) {
        tf_strbuf_printf(&src, "// generated by tfuse (codegen/cuda.c) for NVRTC: a multi-tensor launch of %d kernels\n", n);
        if (f16) tf_strbuf_printf(&src, "#include <cuda_fp16.h>\n");
        if (bf16) tf_strbuf_printf(&src, "#include <cuda_bf16.h>\n");
        tf_strbuf_printf(&src, "\n%s", helpers_common);
        if (vec) tf_strbuf_printf(&src, "%s", helpers_vec);
        if (f16) tf_strbuf_printf(&src, "%s", helpers_f16);
        if (bf16) tf_strbuf_printf(&src, "%s", helpers_bf16);
        tf_strbuf_printf(&src, "%s", parts.p ? parts.p : "");
        tf_strbuf_printf(&src, "\n// each part's blocks are a range of the grid\nextern \"C\" __global__ void __launch_bounds__(%u) %s(%s)\n{\n%s}\n",
                         MULTI_BLOCK, placeholder, params.p ? params.p : "", body.p ? body.p : "");
    }
    oom |= parts.oom || params.oom || body.oom || src.oom;
    for (int i = 0; i < nfns; i++) tf_free(fns[i]);
    tf_free(fns);
    tf_free(fn_part);
    tf_free(parts.p);
    tf_free(params.p);
    tf_free(body.p);
    if (oom) {
        tf_free(src.p);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");
    }
    name_source(out, src.p, src.n);
    out->shape = vec ? TF_CUDA_POINTWISE_VEC : TF_CUDA_POINTWISE;
    out->grid = base;
    out->block = MULTI_BLOCK;
    out->align = align;
    out->vec = 1;
    out->parts = n;
    out->nparams = nparams;
    return TF_IR_OK;
}

/* ---- library ops' own kernels ----------------------------------------------------------- */

/* Parameters: b0 the op's result, then b1, b2, ... one per operand that is
 * not a constant, in operand order (an operand given twice is passed twice),
 * then tf_err for ids. */
typedef struct lk {
    const tf_kernel *k;
    const tf_node *n;
    sb s;
    int par[65];                /* per operand: its parameter, -1 for a constant */
    int np;                     /* parameters b0..b<np-1> */
    bool f16, bf16, wide, err, clear;
} lk;

static bool is_float(tf_dt t) { return is_f32ish(t) || t == TF_DT_F64; }

/* The math type of a float dtype: double for f64, else float. */
static const char *math_type(tf_dt t) { return t == TF_DT_F64 ? "double" : "float"; }

/* A stored element as a value of its math type. */
static void lib_load(tf_dt t, const char *ref, char *out, size_t n)
{
    if (t == TF_DT_F16) snprintf(out, n, "__half2float(%s)", ref);
    else if (t == TF_DT_BF16) snprintf(out, n, "__bfloat162float(%s)", ref);
    else snprintf(out, n, "%s", ref);
}

/* A value of the math type (float, or double for f64 and the integer
 * dtypes' sums) as the storage type t, rounded once. */
static void lib_store(tf_dt t, const char *v, char *out, size_t n)
{
    switch (t) {
    case TF_DT_F16: snprintf(out, n, "__float2half_rn(%s)", v); break;
    case TF_DT_BF16: snprintf(out, n, "__float2bfloat16_rn(%s)", v); break;
    case TF_DT_I64: snprintf(out, n, "tf_f2ll(%s)", v); break;
    case TF_DT_I32: snprintf(out, n, "tf_f2i(%s)", v); break;
    case TF_DT_BOOL: snprintf(out, n, "(unsigned char)((%s) != 0)", v); break;
    default: snprintf(out, n, "%s", v); break;
    }
}

/* A zero of storage type t. */
static const char *lib_zero(tf_dt t)
{
    switch (t) {
    case TF_DT_F32: return "0.0f";
    case TF_DT_F16: return "__float2half_rn(0.0f)";
    case TF_DT_BF16: return "__float2bfloat16_rn(0.0f)";
    case TF_DT_F64: return "0.0";
    case TF_DT_I64: return "0LL";
    case TF_DT_I32: return "0";
    default: return "(unsigned char)0";
    }
}

static int64_t numel_of(const tf_value *v) { return tf_type_numel(&v->type); }
static tf_dt dt_of(const tf_value *v) { return v->type.dtype; }
static int64_t dim_of(const tf_value *v, int a) { return v->type.dims[a].n; }

/* The op's window attributes as the interpreter reads them. */
static void pool_attrs(const tf_node *n, int64_t k[2], int64_t s[2], int64_t p[2])
{
    tf_node_pair(n, "kernel", 1, 1, k);
    tf_node_pair(n, "stride", k[0], k[1], s);
    tf_node_pair(n, "padding", 0, 0, p);
}

/* [outer, len, inner] around axis ax of v. */
static void split_axis(const tf_value *v, int ax, int64_t *outer, int64_t *len, int64_t *inner)
{
    *outer = *inner = 1;
    for (int a = 0; a < ax; a++) *outer *= dim_of(v, a);
    for (int a = ax + 1; a < v->type.rank; a++) *inner *= dim_of(v, a);
    *len = dim_of(v, ax);
}

/* A library op whose CUDA C kernel this file writes (ops.def's EXEC: a
 * kernel of its own), and one of them that reads row ids. */
static bool lib_op(int op) { return tf_exec_own_kernel(tf_op_exec_of(op)); }
static bool ids_op(int op) { return tf_exec_indexed(tf_op_exec_of(op)); }

/* scatter_add accumulates with atomicAdd where the dtype has one. */
static bool scatter_atomic(tf_dt t) { return t == TF_DT_F32 || t == TF_DT_F64; }

bool tf_cuda_library_supports(const tf_kernel *k, char *why, size_t n)
{
    char tmp[8];
    if (!why) { why = tmp; n = sizeof tmp; }
    if (k->kind != TF_K_LIBRARY || !k->lib) {
        snprintf(why, n, "kernel %s: not a library op", k->name);
        return false;
    }
    const tf_node *nd = k->lib;
    const char *name = tf_op_info_of(nd->op)->name;
    if (tf_op_exec_of(nd->op) == TF_OPX_GEMM) {
        snprintf(why, n, "kernel %s: %s is a library call (cuBLASLt), not generated code", k->name, name);
        return false;
    }
    if (!lib_op(nd->op)) {
        snprintf(why, n, "kernel %s: %s has no generated CUDA kernel (a library call or the host's)", k->name, name);
        return false;
    }
    const tf_value *out = nd->out;
    if (nd->nin > 64 || out->type.rank > TF_MAX_RANK || numel_of(out) <= 0) {
        snprintf(why, n, "kernel %s: %s of %d operands and %lld elements", k->name, name, nd->nin, (long long)numel_of(out));
        return false;
    }
    for (int q = 0; q < nd->nin; q++) {
        const tf_value *v = nd->in[q];
        if (v->kind == TF_VAL_CONST && !(ids_op(nd->op) && q == 0)) {
            snprintf(why, n, "kernel %s: %s with a constant as operand %d", k->name, name, q);
            return false;
        }
        if (numel_of(v) <= 0) {
            snprintf(why, n, "kernel %s: %s: operand %d has no elements", k->name, name, q);
            return false;
        }
    }
    switch (nd->op) {
    case TF_OP_MAXPOOL2D: case TF_OP_AVGPOOL2D: case TF_OP_MAXPOOL2D_GRAD: case TF_OP_AVGPOOL2D_GRAD: {
        bool ok = out->type.rank == 4 && is_float(dt_of(out));
        for (int q = 0; q < nd->nin; q++) ok &= nd->in[q]->type.rank == 4 && dt_of(nd->in[q]) == dt_of(out);
        int64_t k2[2], s[2], p[2];
        pool_attrs(nd, k2, s, p);
        ok &= k2[0] >= 1 && k2[1] >= 1 && s[0] >= 1 && s[1] >= 1 && p[0] >= 0 && p[1] >= 0;
        if (!ok) {
            snprintf(why, n, "kernel %s: %s takes rank-4 f32, f16, bf16 or f64 images of one dtype and positive windows", k->name, name);
            return false;
        }
        return true;
    }
    case TF_OP_GATHER: case TF_OP_EMBEDDING: case TF_OP_SCATTER_ADD: {
        const tf_value *ids = nd->in[0], *tab = nd->op == TF_OP_SCATTER_ADD ? out : nd->in[1];
        const tf_value *rows = nd->op == TF_OP_SCATTER_ADD ? nd->in[1] : out;
        bool ok = (dt_of(ids) == TF_DT_I64 || dt_of(ids) == TF_DT_I32) && tab->type.rank >= 1 && dim_of(tab, 0) > 0 &&
                  dt_of(rows) == dt_of(tab) && numel_of(rows) == numel_of(ids) * (numel_of(tab) / dim_of(tab, 0));
        if (!ok) {
            snprintf(why, n, "kernel %s: %s takes i64 or i32 ids and rows of the table's shape and dtype", k->name, name);
            return false;
        }
        return true;
    }
    case TF_OP_CONCAT: {
        int ax;
        bool ok = tf_axis_norm(tf_node_int(nd, "axis"), out->type.rank, &ax);
        int64_t total = 0;
        for (int q = 0; ok && q < nd->nin; q++) {
            const tf_value *v = nd->in[q];
            ok = v->type.rank == out->type.rank && dt_of(v) == dt_of(out);
            for (int a = 0; ok && a < out->type.rank; a++) ok = a == ax || dim_of(v, a) == dim_of(out, a);
            if (ok) total += dim_of(v, ax);
        }
        if (!ok || total != dim_of(out, ax)) {
            snprintf(why, n, "kernel %s: concat's operands do not tile its result", k->name);
            return false;
        }
        return true;
    }
    default: {   /* slice_grad */
        const tf_value *dy = nd->in[0];
        int ax;
        bool ok = tf_axis_norm(tf_node_int(nd, "axis"), out->type.rank, &ax) && dy->type.rank == out->type.rank && dt_of(dy) == dt_of(out);
        int64_t step = tf_node_int(nd, "step"), start = 0;
        for (int a = 0; ok && a < out->type.rank; a++) ok = a == ax || dim_of(dy, a) == dim_of(out, a);
        if (ok) {
            int64_t len = dim_of(out, ax), m = dim_of(dy, ax);
            tf_slice_bounds(len, tf_node_int(nd, "start"), len, &start, NULL);
            ok = step >= 1 && start >= 0 && m >= 1 && start + (m - 1) * step < len;
        }
        if (!ok) {
            snprintf(why, n, "kernel %s: slice_grad's dy does not fit the slice", k->name);
            return false;
        }
        return true;
    }
    }
}

/* for (tf_idx i ...) over `count` items, grid-stride */
static void lib_loop(lk *e, const char *var, int64_t count)
{
    line(&e->s, 1, "for (tf_idx %s = (tf_idx)blockIdx.x * blockDim.x + threadIdx.x; %s < %lld; %s += (tf_idx)gridDim.x * blockDim.x) {",
         var, var, (long long)count, var);
}

/* const tf_idx c = i / div % mod; as few operations as the extents allow */
static void lib_coord(lk *e, int depth, const char *c, const char *i, int64_t div, int64_t mod, bool lead)
{
    char a[96];
    if (div == 1) snprintf(a, sizeof a, "%s", i);
    else snprintf(a, sizeof a, "(%s / %lld)", i, (long long)div);
    if (lead) line(&e->s, depth, "const tf_idx %s = %s;", c, a);
    else line(&e->s, depth, "const tf_idx %s = %s %% %lld;", c, a, (long long)mod);
}

/* "o * s - p + kk" without the no-op parts */
static void win_pos(char *out, size_t n, const char *o, int64_t s, int64_t p, const char *kk)
{
    char m[48], q[48];
    if (s == 1) snprintf(m, sizeof m, "%s", o);
    else snprintf(m, sizeof m, "%s * %lld", o, (long long)s);
    if (p) snprintf(q, sizeof q, " - %lld", (long long)p);
    else q[0] = 0;
    snprintf(out, n, "%s%s + %s", m, q, kk);
}

/* maxpool2d, avgpool2d: a thread per output element, its window in
 * row-major order, padding skipped (pool2d in interp_kernels.c). */
static void lib_pool(lk *e, bool is_max)
{
    const tf_node *n = e->n;
    const tf_value *x = n->in[0], *y = n->out;
    tf_dt t = dt_of(y);
    const char *mt = math_type(t);
    int64_t k[2], s[2], p[2], H = dim_of(x, 2), W = dim_of(x, 3), Ho = dim_of(y, 2), Wo = dim_of(y, 3);
    pool_attrs(n, k, s, p);
    char v[128], st[160], init[96];
    line(&e->s, 1, "// %s %lldx%lld, stride %lldx%lld, padding %lldx%lld: [%lld, %lld, %lld, %lld] -> [.., %lld, %lld]",
         tf_op_info_of(n->op)->name, (long long)k[0], (long long)k[1], (long long)s[0], (long long)s[1], (long long)p[0],
         (long long)p[1], (long long)dim_of(x, 0), (long long)dim_of(x, 1), (long long)H, (long long)W, (long long)Ho,
         (long long)Wo);
    lib_loop(e, "i", numel_of(y));
    lib_coord(e, 2, "ow", "i", 1, Wo, false);
    lib_coord(e, 2, "oh", "i", Wo, Ho, false);
    lib_coord(e, 2, "pl", "i", Wo * Ho, 0, true);
    line(&e->s, 2, "const %s *x = b1 + pl * %lld;", storage_type(t), (long long)(H * W));
    literal(t == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, is_max ? -INFINITY : 0.0, init, sizeof init);
    line(&e->s, 2, "%s acc = %s;   // %s", mt, init, is_max ? "padding is -inf" : "padding adds 0");
    line(&e->s, 2, "for (int kh = 0; kh < %lld; kh++) {", (long long)k[0]);
    char pos[128];
    win_pos(pos, sizeof pos, "oh", s[0], p[0], "kh");
    line(&e->s, 3, "const tf_idx ih = %s;", pos);
    if (p[0]) line(&e->s, 3, "if (ih < 0 || ih >= %lld) continue;", (long long)H);
    line(&e->s, 3, "for (int kw = 0; kw < %lld; kw++) {", (long long)k[1]);
    win_pos(pos, sizeof pos, "ow", s[1], p[1], "kw");
    line(&e->s, 4, "const tf_idx iw = %s;", pos);
    if (p[1]) line(&e->s, 4, "if (iw < 0 || iw >= %lld) continue;", (long long)W);
    char ref[64];
    snprintf(ref, sizeof ref, "x[ih * %lld + iw]", (long long)W);
    lib_load(t, ref, v, sizeof v);
    line(&e->s, 4, "const %s v = %s;", mt, v);
    if (is_max) line(&e->s, 4, "if (acc == acc && (v != v || v > acc)) acc = v;   // the first maximum; a NaN wins and stays");
    else line(&e->s, 4, "acc += v;");
    line(&e->s, 3, "}");
    line(&e->s, 2, "}");
    char res[96];
    if (is_max) snprintf(res, sizeof res, "acc");
    else {
        char cnt[64];
        literal(t == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, (double)(k[0] * k[1]), cnt, sizeof cnt);
        snprintf(res, sizeof res, "acc / %s", cnt);   /* count_include_pad */
    }
    lib_store(t, res, st, sizeof st);
    line(&e->s, 2, "b0[i] = %s;", st);
    line(&e->s, 1, "}");
}

/* maxpool2d_grad, avgpool2d_grad: a thread per input element gathers the
 * windows that cover it, in the row-major window order in which
 * pool_backward (interp_backward.c) adds them; maxpool's window gives its
 * dy to the element pool_backward selects (the first maximum, the first
 * NaN, the first in-bounds element of an all -inf window). */
static void lib_pool_grad(lk *e, bool is_max)
{
    const tf_node *n = e->n;
    const tf_value *dx = n->out, *dy = n->in[is_max ? 1 : 0];
    tf_dt t = dt_of(dx);
    const char *mt = math_type(t), *dyp = is_max ? "b2" : "b1";
    int64_t k[2], s[2], p[2], H = dim_of(dx, 2), W = dim_of(dx, 3), Ho = dim_of(dy, 2), Wo = dim_of(dy, 3);
    pool_attrs(n, k, s, p);
    char v[160], st[160], zero[64], ref[96];
    literal(t == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, 0.0, zero, sizeof zero);
    line(&e->s, 1, "// %s %lldx%lld, stride %lldx%lld, padding %lldx%lld: dy [.., %lld, %lld] -> dx [%lld, %lld, %lld, %lld]",
         tf_op_info_of(n->op)->name, (long long)k[0], (long long)k[1], (long long)s[0], (long long)s[1], (long long)p[0],
         (long long)p[1], (long long)Ho, (long long)Wo, (long long)dim_of(dx, 0), (long long)dim_of(dx, 1), (long long)H,
         (long long)W);
    line(&e->s, 1, "// a thread per dx element: the windows covering it, in row-major order (deterministic, no atomics)");
    lib_loop(e, "i", numel_of(dx));
    lib_coord(e, 2, "iw", "i", 1, W, false);
    lib_coord(e, 2, "ih", "i", W, H, false);
    lib_coord(e, 2, "pl", "i", W * H, 0, true);
    const char *ax[2] = {"h", "w"};
    int64_t lim[2] = {Ho, Wo};
    for (int a = 0; a < 2; a++) {   /* windows o with o*s - p <= i <= o*s - p + k - 1, 0 <= o < lim */
        int64_t lo = p[a] - k[a] + 1, c = lo + s[a] - 1;   /* o >= ceil((i + lo) / s) = (i + c) / s where i + lo >= 0 */
        char num[128];
        if (c) snprintf(num, sizeof num, "(i%s %c %lld)", ax[a], c < 0 ? '-' : '+', (long long)(c < 0 ? -c : c));
        else snprintf(num, sizeof num, "i%s", ax[a]);
        if (s[a] > 1) {
            char t2[64];
            snprintf(t2, sizeof t2, "%.40s / %lld", num, (long long)s[a]);
            snprintf(num, sizeof num, "%s", t2);
        }
        if (lo >= 0) line(&e->s, 2, "const tf_idx o%s0 = %s;", ax[a], num);
        else line(&e->s, 2, "const tf_idx o%s0 = i%s < %lld ? 0 : %s;", ax[a], ax[a], (long long)-lo, num);
        char hi[64];
        if (p[a]) snprintf(hi, sizeof hi, "(i%s + %lld)", ax[a], (long long)p[a]);
        else snprintf(hi, sizeof hi, "i%s", ax[a]);
        if (s[a] > 1) line(&e->s, 2, "const tf_idx o%s1 = tf_min(%s / %lld, (tf_idx)%lld);", ax[a], hi, (long long)s[a], (long long)(lim[a] - 1));
        else line(&e->s, 2, "const tf_idx o%s1 = tf_min(%s, (tf_idx)%lld);", ax[a], hi, (long long)(lim[a] - 1));
    }
    line(&e->s, 2, "const %s *dy = %s + pl * %lld;", storage_type(t), dyp, (long long)(Ho * Wo));
    if (is_max) line(&e->s, 2, "const %s *x = b1 + pl * %lld;", storage_type(t), (long long)(H * W));
    line(&e->s, 2, "%s acc = %s;", mt, zero);
    line(&e->s, 2, "for (tf_idx oh = oh0; oh <= oh1; oh++) {");
    line(&e->s, 3, "for (tf_idx ow = ow0; ow <= ow1; ow++) {");
    snprintf(ref, sizeof ref, "dy[oh * %lld + ow]", (long long)Wo);
    lib_load(t, ref, v, sizeof v);
    if (!is_max) {
        char cnt[64];
        literal(t == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, t == TF_DT_F64 ? 1.0 / (double)(k[0] * k[1]) : (double)(k[0] * k[1]), cnt,
                sizeof cnt);
        if (t == TF_DT_F64) line(&e->s, 4, "acc += %s * %s;   // the interpreter's dy * (1 / (kh * kw))", v, cnt);
        else line(&e->s, 4, "acc += %s / %s;", v, cnt);
    } else {
        line(&e->s, 4, "tf_idx at = -1;   // the element the forward pass took its value from");
        line(&e->s, 4, "%s best = %s;", mt, zero);
        line(&e->s, 4, "for (int kh = 0; kh < %lld; kh++) {", (long long)k[0]);
        char pos[128];
        win_pos(pos, sizeof pos, "oh", s[0], p[0], "kh");
        line(&e->s, 5, "const tf_idx jh = %s;", pos);
        if (p[0]) line(&e->s, 5, "if (jh < 0 || jh >= %lld) continue;", (long long)H);
        line(&e->s, 5, "for (int kw = 0; kw < %lld; kw++) {", (long long)k[1]);
        win_pos(pos, sizeof pos, "ow", s[1], p[1], "kw");
        line(&e->s, 6, "const tf_idx jw = %s;", pos);
        if (p[1]) line(&e->s, 6, "if (jw < 0 || jw >= %lld) continue;", (long long)W);
        char xv[128], xr[64];
        snprintf(xr, sizeof xr, "x[jh * %lld + jw]", (long long)W);
        lib_load(t, xr, xv, sizeof xv);
        line(&e->s, 6, "const %s v = %s;", mt, xv);
        line(&e->s, 6, "if (at < 0 || (best == best && (v != v || v > best))) {");
        line(&e->s, 7, "best = v;");
        line(&e->s, 7, "at = jh * %lld + jw;", (long long)W);
        line(&e->s, 6, "}");
        line(&e->s, 5, "}");
        line(&e->s, 4, "}");
        line(&e->s, 4, "if (at == ih * %lld + iw) acc += %s;", (long long)W, v);
    }
    line(&e->s, 3, "}");
    line(&e->s, 2, "}");
    lib_store(t, "acc", st, sizeof st);
    line(&e->s, 2, "b0[i] = %s;", st);
    line(&e->s, 1, "}");
}

/* The id of row r (ids are operand 0: a parameter or a constant). */
static void lib_id(lk *e, int depth, const char *r)
{
    const tf_value *ids = e->n->in[0];
    if (ids->kind == TF_VAL_CONST) line(&e->s, depth, "const long long id = %lldLL;", (long long)ids->cval);
    else line(&e->s, depth, "const long long id = (long long)b%d[%s];", e->par[0], r);
}

/* gather / embedding: out[r, j] = table[ids[r], j]; an id out of range
 * reads nothing, leaves zeros and reports its position in *tf_err. */
static void lib_gather(lk *e)
{
    const tf_node *n = e->n;
    const tf_value *tab = n->in[1], *out = n->out;
    int64_t V = dim_of(tab, 0), row = numel_of(tab) / V;
    tf_dt t = dt_of(out);
    line(&e->s, 1, "// %s: %lld rows of %lld elements from a table of %lld rows", tf_op_info_of(n->op)->name,
         (long long)numel_of(n->in[0]), (long long)row, (long long)V);
    lib_loop(e, "i", numel_of(out));
    if (row > 1) {
        lib_coord(e, 2, "r", "i", row, 0, true);
        lib_coord(e, 2, "j", "i", 1, row, false);
    }
    lib_id(e, 2, row > 1 ? "r" : "i");
    line(&e->s, 2, "if (id >= 0 && id < %lldLL) {", (long long)V);
    if (row > 1) line(&e->s, 3, "b0[i] = b%d[id * %lldLL + j];", e->par[1], (long long)row);
    else line(&e->s, 3, "b0[i] = b%d[id];", e->par[1]);
    line(&e->s, 2, "} else {");
    line(&e->s, 3, "b0[i] = %s;", lib_zero(t));
    line(&e->s, 3, "tf_err[0] = (unsigned long long)%s + 1ULL;", row > 1 ? "r" : "i");
    line(&e->s, 2, "}");
    line(&e->s, 1, "}");
}

/* scatter_add: out[ids[r], j] += dy[r, j]. f32 and f64: atomicAdd into a
 * result the runtime has zeroed (clear_first); other dtypes: a thread per
 * result element adds its rows in order r = 0, 1, ... (the interpreter's). */
static void lib_scatter(lk *e)
{
    const tf_node *n = e->n;
    const tf_value *out = n->out, *dy = n->in[1];
    int64_t V = dim_of(out, 0), row = numel_of(out) / V, N = numel_of(n->in[0]);
    tf_dt t = dt_of(out);
    char v[128], ref[64], st[160];
    line(&e->s, 1, "// scatter_add: %lld rows of %lld elements into a table of %lld rows", (long long)N, (long long)row, (long long)V);
    if (scatter_atomic(t)) {
        line(&e->s, 1, "// atomicAdd into b0, zeroed before the launch: the order of the additions is the GPU's (not bit-deterministic)");
        lib_loop(e, "i", numel_of(dy));
        if (row > 1) {
            lib_coord(e, 2, "r", "i", row, 0, true);
            lib_coord(e, 2, "j", "i", 1, row, false);
        }
        lib_id(e, 2, row > 1 ? "r" : "i");
        line(&e->s, 2, "if (id >= 0 && id < %lldLL) atomicAdd(&b0[id * %lldLL%s], b%d[i]);", (long long)V, (long long)row,
             row > 1 ? " + j" : "", e->par[1]);
        line(&e->s, 2, "else tf_err[0] = (unsigned long long)%s + 1ULL;", row > 1 ? "r" : "i");
        line(&e->s, 1, "}");
        return;
    }
    bool fl = is_f32ish(t);
    line(&e->s, 1, "// a thread per result element adds its rows in order (deterministic); ids out of range are reported");
    lib_loop(e, "i", N);
    lib_id(e, 2, "i");
    line(&e->s, 2, "if (id < 0 || id >= %lldLL) tf_err[0] = (unsigned long long)i + 1ULL;", (long long)V);
    line(&e->s, 1, "}");
    lib_loop(e, "i", numel_of(out));
    if (row > 1) {
        lib_coord(e, 2, "v", "i", row, 0, true);
        lib_coord(e, 2, "j", "i", 1, row, false);
    }
    line(&e->s, 2, "%s acc = %s;", fl ? "float" : "double", fl ? "0.0f" : "0.0");
    line(&e->s, 2, "for (tf_idx r = 0; r < %lld; r++) {", (long long)N);
    lib_id(e, 3, "r");
    if (row > 1) snprintf(ref, sizeof ref, "b%d[r * %lld + j]", e->par[1], (long long)row);
    else snprintf(ref, sizeof ref, "b%d[r]", e->par[1]);
    if (fl) lib_load(t, ref, v, sizeof v);
    else snprintf(v, sizeof v, "(double)%s", ref);
    line(&e->s, 3, "if (id == %s) acc += %s;", row > 1 ? "v" : "i", v);
    line(&e->s, 2, "}");
    lib_store(t, "acc", st, sizeof st);
    line(&e->s, 2, "b0[i] = %s;", st);
    line(&e->s, 1, "}");
}

/* concat: a thread per result element copies it from the operand whose
 * part of the axis holds it (bits, any dtype). */
static void lib_concat(lk *e)
{
    const tf_node *n = e->n;
    const tf_value *out = n->out;
    int ax;
    tf_axis_norm(tf_node_int(n, "axis"), out->type.rank, &ax);
    int64_t outer, len, inner;
    split_axis(out, ax, &outer, &len, &inner);
    line(&e->s, 1, "// concat of %d operands along axis %d: [%lld, %lld, %lld] as [outer, axis, inner]", n->nin, ax, (long long)outer,
         (long long)len, (long long)inner);
    lib_loop(e, "i", numel_of(out));
    if (inner > 1) lib_coord(e, 2, "r", "i", 1, inner, false);
    lib_coord(e, 2, "a", "i", inner, len, outer == 1);
    if (outer > 1) lib_coord(e, 2, "o", "i", inner * len, 0, true);
    int64_t pos = 0;
    for (int q = 0; q < n->nin; q++) {
        int64_t m = dim_of(n->in[q], ax);
        char idx[256], at[64];
        if (pos) snprintf(at, sizeof at, "(a - %lld)", (long long)pos);
        else snprintf(at, sizeof at, "a");
        if (outer > 1 && m > 1) snprintf(idx, sizeof idx, "(o * %lld + %s)", (long long)m, at);
        else if (outer > 1) snprintf(idx, sizeof idx, "(o + %s)", at);
        else snprintf(idx, sizeof idx, "%s", at);
        if (inner > 1) {
            char t2[256];
            snprintf(t2, sizeof t2, "%.200s * %lld + r", idx, (long long)inner);
            snprintf(idx, sizeof idx, "%s", t2);
        }
        const char *kw = q == 0 ? "if" : "else if";
        if (q == n->nin - 1) line(&e->s, 2, "%sb0[i] = b%d[%s];", q ? "else " : "", e->par[q], idx);
        else line(&e->s, 2, "%s (a < %lld) b0[i] = b%d[%s];", kw, (long long)(pos + m), e->par[q], idx);
        pos += m;
    }
    line(&e->s, 1, "}");
}

/* slice_grad: zeros, dy at start + j * step along the axis. */
static void lib_slice_grad(lk *e)
{
    const tf_node *n = e->n;
    const tf_value *out = n->out, *dy = n->in[0];
    int ax;
    tf_axis_norm(tf_node_int(n, "axis"), out->type.rank, &ax);
    int64_t outer, len, inner, m = dim_of(dy, ax), step = tf_node_int(n, "step"), start = 0;
    split_axis(out, ax, &outer, &len, &inner);
    tf_slice_bounds(len, tf_node_int(n, "start"), len, &start, NULL);
    line(&e->s, 1, "// slice_grad along axis %d: [%lld, %lld, %lld] as [outer, axis, inner], dy's %lld at %lld + %lld j", ax,
         (long long)outer, (long long)len, (long long)inner, (long long)m, (long long)start, (long long)step);
    lib_loop(e, "i", numel_of(out));
    if (inner > 1) lib_coord(e, 2, "r", "i", 1, inner, false);
    lib_coord(e, 2, "a", "i", inner, len, outer == 1);
    if (outer > 1) lib_coord(e, 2, "o", "i", inner * len, 0, true);
    line(&e->s, 2, "const tf_idx t = a - %lld;", (long long)start);
    char cond[128], idx[200], j[32];
    if (step == 1) {
        snprintf(cond, sizeof cond, "t >= 0 && t < %lld", (long long)m);
        snprintf(j, sizeof j, "t");
    } else {
        snprintf(cond, sizeof cond, "t >= 0 && t %% %lld == 0 && t < %lld", (long long)step, (long long)(m * step));
        snprintf(j, sizeof j, "(t / %lld)", (long long)step);
    }
    if (outer > 1 && m > 1) snprintf(idx, sizeof idx, "(o * %lld + %s)", (long long)m, j);
    else if (outer > 1) snprintf(idx, sizeof idx, "(o + %s)", j);
    else snprintf(idx, sizeof idx, "%s", j);
    if (inner > 1) line(&e->s, 2, "b0[i] = %s ? b1[%s * %lld + r] : %s;", cond, idx, (long long)inner, lib_zero(dt_of(out)));
    else line(&e->s, 2, "b0[i] = %s ? b1[%s] : %s;", cond, idx, lib_zero(dt_of(out)));
    line(&e->s, 1, "}");
}

tf_ir_status tf_cuda_emit_library(const tf_kernel *k, tf_cuda_kernel *out, tf_diag *d)
{
    memset(out, 0, sizeof *out);
    char why[256];
    if (!tf_cuda_library_supports(k, why, sizeof why)) return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "cuda: %s", why);
    const tf_node *n = k->lib;
    lk e = {.k = k, .n = n};
    /* parameters, and what the source needs */
    int64_t biggest = numel_of(n->out), work = numel_of(n->out);
    unsigned align = (unsigned)tf_dtype_bytes(dt_of(n->out));
    e.np = 1;
    for (int q = 0; q < n->nin; q++) {
        const tf_value *v = n->in[q];
        e.par[q] = v->kind == TF_VAL_CONST ? -1 : e.np++;
        if (v->kind == TF_VAL_CONST) continue;
        if (numel_of(v) > biggest) biggest = numel_of(v);
        if ((unsigned)tf_dtype_bytes(dt_of(v)) > align) align = (unsigned)tf_dtype_bytes(dt_of(v));
    }
    for (int p = 0; p < e.np; p++) {
        tf_dt t = p == 0 ? dt_of(n->out) : TF_DT_BOOL;
        for (int q = 0; p && q < n->nin; q++)
            if (e.par[q] == p) t = dt_of(n->in[q]);
        e.f16 |= t == TF_DT_F16;
        e.bf16 |= t == TF_DT_BF16;
    }
    e.err = ids_op(n->op);
    e.clear = n->op == TF_OP_SCATTER_ADD && scatter_atomic(dt_of(n->out));
    if (e.clear) work = numel_of(n->in[1]);
    e.wide = biggest >= ((int64_t)1 << 30);

    switch (n->op) {
    case TF_OP_MAXPOOL2D: lib_pool(&e, true); break;
    case TF_OP_AVGPOOL2D: lib_pool(&e, false); break;
    case TF_OP_MAXPOOL2D_GRAD: lib_pool_grad(&e, true); break;
    case TF_OP_AVGPOOL2D_GRAD: lib_pool_grad(&e, false); break;
    case TF_OP_GATHER: case TF_OP_EMBEDDING: lib_gather(&e); break;
    case TF_OP_SCATTER_ADD: lib_scatter(&e); break;
    case TF_OP_CONCAT: lib_concat(&e); break;
    default: lib_slice_grad(&e); break;
    }
    unsigned block = 256;
    if (work < 256) block = (unsigned)(work < 32 ? 32 : (work + 31) / 32 * 32);

    sb src = {0};
    tf_strbuf_printf(&src, "// generated by tfuse (codegen/cuda.c) for NVRTC: a library op's own kernel\n");
    if (e.f16) tf_strbuf_printf(&src, "#include <cuda_fp16.h>\n");
    if (e.bf16) tf_strbuf_printf(&src, "#include <cuda_bf16.h>\n");
    tf_strbuf_printf(&src, "\n%s", helpers_common);
    tf_strbuf_printf(&src, "\nextern \"C\" __global__ void __launch_bounds__(%u) %s(", block, placeholder);
    for (int p = 0; p < e.np; p++) {
        const tf_value *v = n->out;
        for (int q = 0; p && q < n->nin; q++)
            if (e.par[q] == p) v = n->in[q];
        bool disjoint = false;
        for (int b = 0; b < k->nbufs; b++)
            if (k->bufs[b].value == v) disjoint = k->bufs[b].disjoint;
        tf_strbuf_printf(&src, "%s%s%s *%sb%d", p ? ", " : "", p ? "const " : "", storage_type(dt_of(v)), disjoint ? "__restrict__ " : "", p);
    }
    if (e.err) tf_strbuf_printf(&src, ", unsigned long long *tf_err");
    tf_strbuf_printf(&src, ")\n{\n    typedef %s tf_idx;\n", e.wide ? "long long" : "int");
    tf_strbuf_printf(&src, "%s}\n", e.s.p ? e.s.p : "");
    bool oom = e.s.oom || src.oom;
    tf_free(e.s.p);
    if (oom) {
        tf_free(src.p);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");
    }
    out->hash = fnv1a(src.p, src.n);
    snprintf(out->name, sizeof out->name, "tf_%016llx", (unsigned long long)out->hash);
    char *at = strstr(src.p, placeholder);
    if (at) memcpy(at, out->name, strlen(placeholder));
    out->src = src.p;
    out->shape = TF_CUDA_POINTWISE;
    out->block = block;
    out->grid = blocks_for(work, block);
    out->align = align;
    out->vec = 1;
    out->nparams = e.np + (e.err ? 1 : 0);
    out->library = true;
    out->clear_first = e.clear;
    out->err = e.err;
    out->wide_index = e.wide;
    return TF_IR_OK;
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
    static const char *shapes[] = {"pointwise", "pointwise, 16-byte vectors", "row reduction", "column reduction"};
    sb s = {0};
    tf_strbuf_printf(&s, "// tfuse kernel %s", k->name);
    if (m && k->region > 0 && k->region <= m->nregions) tf_strbuf_printf(&s, " (region %s)", m->regions[k->region - 1].name);
    if (ck->library && k->lib) tf_strbuf_printf(&s, ": the library op %s -> %s", tf_op_info_of(k->lib->op)->name, k->lib->out->name ? k->lib->out->name : "?");
    else if (ck->epilogue && k->lib) tf_strbuf_printf(&s, ": the epilogue of %s -> %s", tf_op_info_of(k->lib->op)->name, k->lib->out->name ? k->lib->out->name : "?");
    for (int q = 1; q < ck->parts; q++) tf_strbuf_printf(&s, "%s%s", q == 1 ? ", in one multi-tensor launch with " : ", ", k[q].name);
    tf_strbuf_printf(&s, "\n// %s; entry %s; grid %u x block %u, %u bytes of dynamic shared memory; buffers %u-byte aligned\n",
        shapes[ck->shape], ck->name, ck->grid, ck->block, ck->smem, ck->align);
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
