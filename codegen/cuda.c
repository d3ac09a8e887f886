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
    tf_strbuf_printf(s, "%*s%s\n", depth * 4, "", buf);
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
        snprintf(why, n, "kernel %s: %s runs as a library call (the runtime's job), not generated code", k->name,
                 k->lib ? tf_op_info_of(k->lib->op)->name : "?");
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

typedef struct geom { tf_cuda_shape shape; unsigned grid, block, smem, vec, group, align; } geom;

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
    g->block = 256;
    int64_t work = use_vec ? n / vec : n;
    if (work < 256) g->block = (unsigned)(work < 32 ? 32 : (work + 31) / 32 * 32);
    g->grid = blocks_for(work, g->block);
    g->shape = use_vec ? TF_CUDA_POINTWISE_VEC : TF_CUDA_POINTWISE;
    g->vec = use_vec ? (unsigned)vec : 1;
    g->align = use_vec ? 16 : widest(k);
    e->vec = use_vec;
    sb *s = &e->s;
    if (use_vec) line(s, 1, "// pointwise over %lld elements, %d at a time (16 bytes of the widest buffer)", (long long)n, vec);
    else line(s, 1, "// pointwise over %lld elements", (long long)n);
    emit_dropout_keys(e, 1);
    if (!k->nstores) return;
    const char *stride = "(tf_idx)gridDim.x * blockDim.x";
    int64_t start = 0;
    if (use_vec) {
        int64_t nv = n / vec;
        line(s, 1, "for (tf_idx tc = (tf_idx)blockIdx.x * blockDim.x + threadIdx.x; tc < %lld; tc += %s) {", (long long)nv, stride);
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
        line(s, 1, "// the last %lld elements", (long long)(n - start));
    }
    if (start) line(s, 1, "for (tf_idx i = %lld + (tf_idx)blockIdx.x * blockDim.x + threadIdx.x; i < %lld; i += %s) {", (long long)start, (long long)n, stride);
    else line(s, 1, "for (tf_idx i = (tf_idx)blockIdx.x * blockDim.x + threadIdx.x; i < %lld; i += %s) {", (long long)n, stride);
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
    unsigned accb = 4;
    for (int r = 0; r < k->nreds; r++)
        if (acc_dtype(k, &k->reds[r]) != TF_DT_F32) accb = 8;
    bool partials = row ? G > 32 : G > 1;
    g->shape = row ? TF_CUDA_ROW_REDUCE : TF_CUDA_COL_REDUCE;
    g->block = (unsigned)(G * RPB);
    g->grid = blocks_for(M, (unsigned)RPB);
    g->group = (unsigned)G;
    g->vec = 1;
    g->smem = partials ? (unsigned)((row ? RPB * (G / 32) : G * 32) * accb) : 0;
    g->align = widest(k);

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
    line(s, 1, "for (tf_idx tf_ob = blockIdx.x; tf_ob < %lld; tf_ob += gridDim.x) {", (long long)NB);
    if (o_used) {
        if (RPB > 1) line(s, 2, "const tf_idx o = tf_ob * %lld + tf_g;", (long long)RPB);
        else line(s, 2, "const tf_idx o = tf_ob;");
    }
    if (live) line(s, 2, "const bool tf_live = o < %lld;", (long long)M);
    def_axes(e, 2, outer_ax, omask, "o");
    const char *rloop = m_used ? "tf_m" : "0";
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
        line(s, depth, "for (tf_idx r = %s; r < %lld; %s) {", rloop, (long long)R, rstep);
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
        if (rd->op == TF_OP_REDUCE_MEAN) {
            char cnt[64];
            literal(acc == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, rd->count, cnt, sizeof cnt);
            snprintf(tot, sizeof tot, acc == TF_DT_I64 ? "(double)tf_a / %s" : "tf_a / %s", cnt);
            conv(acc == TF_DT_I64 ? TF_DT_F64 : acc, rd->dtype, tot, c, sizeof c);
        } else {
            conv(acc, rd->dtype, "tf_a", c, sizeof c);
        }
        line(s, 3, "tf_r%d = %s;", r, c);
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

tf_ir_status tf_cuda_emit(const tf_kernel *k, tf_cuda_kernel *out, tf_diag *d)
{
    memset(out, 0, sizeof *out);
    char why[256];
    if (!tf_cuda_supports(k, why, sizeof why)) return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "cuda: %s", why);
    em e = {.k = k};
    size_t nx = (size_t)k->nexprs + 1, nb = (size_t)k->nbufs + 1;
    e.written = tf_calloc(nb, sizeof *e.written);
    e.contig = tf_calloc(nx, sizeof *e.contig);
    e.mark = tf_calloc(nx, 1);
    if (!e.written || !e.contig || !e.mark) {
        tf_free(e.written); tf_free(e.contig); tf_free(e.mark);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");
    }
    e.numel = 1;
    for (int a = k->rank - 1; a >= 0; a--) {
        e.row[a] = e.numel;
        e.numel *= k->dims[a];
    }
    int64_t biggest = e.numel;
    for (int b = 0; b < k->nbufs; b++) {
        const tf_type *t = &k->bufs[b].value->type;
        int64_t n = tf_type_numel(t);
        if (n > biggest || n < 0) biggest = n < 0 ? INT64_MAX : n;
        e.f16 |= t->dtype == TF_DT_F16;
        e.bf16 |= t->dtype == TF_DT_BF16;
    }
    for (int t = 0; t < k->nstores; t++) e.written[k->stores[t].buf] = true;
    for (int i = 0; i < k->nexprs; i++) {
        const tf_kexpr *x = &k->exprs[i];
        e.f16 |= x->dtype == TF_DT_F16;
        e.bf16 |= x->dtype == TF_DT_BF16;
        e.rng |= x->kind == TF_KX_OP && x->op == TF_OP_DROPOUT_MASK;
        e.contig[i] = x->kind == TF_KX_LOAD && contiguous(k, e.row, x);
    }
    e.wide = biggest >= ((int64_t)1 << 30);

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
    tf_strbuf_printf(&src, "\nextern \"C\" __global__ void __launch_bounds__(%u) %s(", g.block, placeholder);
    for (int b = 0; b < k->nbufs; b++)   /* __restrict__ where memplan keeps the buffer apart from every other */
        tf_strbuf_printf(&src, "%s%s%s *%sb%d", b ? ", " : "", e.written[b] ? "" : "const ", storage_type(k->bufs[b].value->type.dtype),
            k->bufs[b].disjoint ? "__restrict__ " : "", b);
    if (e.rng) tf_strbuf_printf(&src, "%sconst unsigned long long *tf_rng", k->nbufs ? ", " : "");
    tf_strbuf_printf(&src, ")\n{\n    typedef %s tf_idx;\n", e.wide ? "long long" : "int");
    tf_strbuf_printf(&src, "%s}\n", body.p ? body.p : "");
    bool oom = body.oom || src.oom;
    tf_free(body.p);
    tf_free(e.written);
    tf_free(e.contig);
    tf_free(e.mark);
    if (oom) {
        tf_free(src.p);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");
    }
    out->hash = fnv1a(src.p, src.n);
    snprintf(out->name, sizeof out->name, "tf_%016llx", (unsigned long long)out->hash);
    char *at = strstr(src.p, placeholder);
    if (at) memcpy(at, out->name, strlen(placeholder));
    out->src = src.p;
    out->shape = g.shape;
    out->grid = g.grid;
    out->block = g.block;
    out->smem = g.smem;
    out->align = g.align;
    out->vec = g.vec;
    out->group = g.group;
    out->nparams = k->nbufs + (e.rng ? 1 : 0);
    out->rng = e.rng;
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
    if (!out->kernels || !out->why) {
        tf_cuda_program_free(out);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");
    }
    out->nkernels = n;
    for (int i = 0; i < n; i++) {
        const tf_kernel *k = &p->kernels[i];
        if (!tf_cuda_supports(k, out->why[i], sizeof out->why[i])) continue;
        tf_ir_status st = tf_cuda_emit(k, &out->kernels[i], d);
        if (st) {
            tf_cuda_program_free(out);
            return st;
        }
        out->nemitted++;
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = out->kernels[j].src && out->kernels[j].hash == out->kernels[i].hash &&
                   strcmp(out->kernels[j].src, out->kernels[i].src) == 0;
        out->nunique += !seen;
    }
    return TF_IR_OK;
}

void tf_cuda_program_free(tf_cuda_program *prog)
{
    if (!prog) return;
    for (int i = 0; prog->kernels && i < prog->nkernels; i++) tf_cuda_kernel_free(&prog->kernels[i]);
    tf_free(prog->kernels);
    tf_free(prog->why);
    memset(prog, 0, sizeof *prog);
}

char *tf_cuda_dump(const tf_module *m, const tf_kernel *k, const tf_cuda_kernel *ck)
{
    static const char *shapes[] = {"pointwise", "pointwise, 16-byte vectors", "row reduction", "column reduction"};
    sb s = {0};
    tf_strbuf_printf(&s, "// tfuse kernel %s", k->name);
    if (m && k->region > 0 && k->region <= m->nregions) tf_strbuf_printf(&s, " (region %s)", m->regions[k->region - 1].name);
    if (ck->epilogue && k->lib) tf_strbuf_printf(&s, ": the epilogue of %s -> %s", tf_op_info_of(k->lib->op)->name, k->lib->out->name ? k->lib->out->name : "?");
    tf_strbuf_printf(&s, "\n// %s; entry %s; grid %u x block %u, %u bytes of dynamic shared memory; buffers %u-byte aligned\n",
        shapes[ck->shape], ck->name, ck->grid, ck->block, ck->smem, ck->align);
    char dims[256];
    for (int b = 0; b < k->nbufs; b++) {
        const tf_type *t = &k->bufs[b].value->type;
        size_t at = 0;
        dims[0] = 0;
        for (int a = 0; a < t->rank && at < sizeof dims - 24; a++)
            at += (size_t)snprintf(dims + at, sizeof dims - at, "%s%lld", a ? ", " : "", (long long)t->dims[a].n);
        bool stored = false;
        for (int j = 0; j < k->nstores; j++) stored |= k->stores[j].buf == b;
        tf_strbuf_printf(&s, "//   b%d = %s : %s[%s]%s\n", b, k->bufs[b].value->name ? k->bufs[b].value->name : "?", tf_dtype_name(t->dtype), dims,
            stored ? " (written)" : "");
    }
    if (ck->rng) tf_strbuf_printf(&s, "//   tf_rng = {seed, step} (device memory)\n");
    tf_strbuf_printf(&s, "%s", ck->src);
    if (s.oom) {
        tf_free(s.p);
        return NULL;
    }
    return s.p;
}
