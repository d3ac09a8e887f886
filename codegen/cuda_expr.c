/* cuda_expr.c — the CUDA emitter's text: lines, dtypes, literals and
 * conversions; which expressions a body needs and how it indexes them; and
 * the lowering of the kernel IR's expressions (each op's scalar expression
 * from ops.def, through lower_cuda), loads and stores.
 *
 * Expressions are `const T eN = ...;` in the kernel IR's order, only those a
 * root needs (NVRTC warns about unused variables, and the tests demand no
 * warnings); in a reduction, those on the outer domain are hoisted out of
 * the loop over r. A value is computed in a math type (float, double, long
 * long or int, by its operands and result) and rounded to its dtype:
 * f16/bf16 through a round trip to __half/__nv_bfloat16, float to integer as
 * tf_dtype_round does (NaN to 0, truncate, saturate). */
#include "cuda_emit.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "scalar.h"

/* ---- text ------------------------------------------------------------------ */

/* A line at indentation depth (4 spaces a level). */
void cu_line(sb *s, int depth, const char *fmt, ...)
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

/* The C type a buffer of dtype t stores (unsigned char for bool). */
const char *cu_storage_type(tf_dt t)
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
const char *cu_value_type(tf_dt t)
{
    switch (t) {
    case TF_DT_F32: case TF_DT_F16: case TF_DT_BF16: return "float";
    case TF_DT_F64: return "double";
    case TF_DT_I64: return "long long";
    case TF_DT_I32: return "int";
    default: return "bool";
    }
}

bool cu_is_f32ish(tf_dt t) { return t == TF_DT_F32 || t == TF_DT_F16 || t == TF_DT_BF16; }

/* The math type of a set of dtypes: double if any is f64, float if any is
 * a float, else the widest integer. */
static tf_dt promote(const tf_dt *ts, int n)
{
    bool f64 = false, fl = false, i64 = false;
    for (int i = 0; i < n; i++) {
        f64 |= ts[i] == TF_DT_F64;
        fl |= cu_is_f32ish(ts[i]);
        i64 |= ts[i] == TF_DT_I64;
    }
    return f64 ? TF_DT_F64 : fl ? TF_DT_F32 : i64 ? TF_DT_I64 : TF_DT_I32;
}

/* code (a value of dtype `from`) as a value of dtype `to`, rounded to it. */
void cu_conv(tf_dt from, tf_dt to, const char *code, char *out, size_t n)
{
    bool ff = cu_is_f32ish(from) || from == TF_DT_F64;
    if (from == to || (to == TF_DT_F32 && cu_is_f32ish(from))) { snprintf(out, n, "%s", code); return; }
    switch (to) {
    case TF_DT_F32: snprintf(out, n, "(float)(%s)", code); break;
    case TF_DT_F64: snprintf(out, n, "(double)(%s)", code); break;
    case TF_DT_F16:
        if (from == TF_DT_F64) snprintf(out, n, "__half2float(__double2half(%s))", code);
        else snprintf(out, n, cu_is_f32ish(from) ? "tf_rh(%s)" : "tf_rh((float)(%s))", code);
        break;
    case TF_DT_BF16:
        if (from == TF_DT_F64) snprintf(out, n, "__bfloat162float(__double2bfloat16(%s))", code);
        else snprintf(out, n, cu_is_f32ish(from) ? "tf_rb(%s)" : "tf_rb((float)(%s))", code);
        break;
    case TF_DT_I64: snprintf(out, n, ff ? "tf_f2ll(%s)" : "(long long)(%s)", code); break;
    case TF_DT_I32: snprintf(out, n, ff ? "tf_f2i(%s)" : from == TF_DT_I64 ? "tf_ll2i(%s)" : "(int)(%s)", code); break;
    default: snprintf(out, n, "((%s) != 0)", code); break;   /* bool */
    }
}

/* A literal of dtype t's value type (v already rounded to t). */
void cu_literal(tf_dt t, double v, char *out, size_t n)
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

/* ---- analysis ------------------------------------------------------------------ */

void cu_mark_from(em *e, int i)
{
    if (e->mark[i]) return;
    e->mark[i] = 1;
    const tf_kexpr *x = &e->k->exprs[i];
    if (x->kind != TF_KX_OP || x->op == TF_OP_DROPOUT_MASK) return;   /* dropout_mask reads only the index */
    for (int q = 0; q < x->nargs; q++) cu_mark_from(e, x->args[q]);
}

void cu_mark_clear(em *e) { memset(e->mark, 0, (size_t)e->k->nexprs); }

static bool selected(const em *e, int i, sel which)
{
    if (!e->mark[i]) return false;
    if (which == SEL_ALL || e->k->kind != TF_K_REDUCTION) return true;
    return (which == SEL_OUTER) == e->k->exprs[i].reduced_domain;
}

unsigned cu_all_axes(const tf_kernel *k)
{
    unsigned m = 0;
    for (int a = 0; a < k->rank; a++)
        if (k->dims[a] > 1) m |= 1u << a;
    return m;
}

/* The axes (of extent > 1) that the selected expressions index with in
 * mode md; *flat whether they use the flat index i. */
unsigned cu_axes_used(const em *e, sel which, mode md, bool *flat)
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
            if (md == M_AXES) m |= cu_all_axes(k);
            else f = true;
        }
    }
    if (m && md != M_AXES) f = true;   /* axes come from i */
    if (flat) *flat = f;
    return m;
}

/* const tf_idx iA = ...; for the axes in `axes`, from `var`, the row-major
 * flat index over the axes in `group`. */
void cu_def_axes(em *e, int depth, unsigned axes, unsigned group, const char *var)
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
        cu_line(&e->s, depth, "const tf_idx i%d = %s;", a, c);
    }
}

/* sum of iA * stride over the axes of extent > 1 with a stride */
void cu_offset_code(const tf_kernel *k, const int64_t *strides, char *out, size_t n)
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
        else cu_offset_code(k, x->strides, off, sizeof off);
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
    cu_offset_code(e->k, outer ? orow : e->row, off, sizeof off);
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
    if (nd->prim == TF_S_ARG) { cu_conv(w->at[nd->arg], want, w->an[nd->arg], out, n); return; }
    if (nd->prim == TF_S_CONST) { cu_literal(want, tf_dtype_round(want, nd->value), out, n); return; }
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
    cu_conv(tf_sprim_boolout(nd->prim) ? TF_DT_BOOL : ct, want, r, out, n);
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
        cu_literal(x->dtype, tf_dtype_round(x->dtype, 1.0 / (1.0 - p)), scale, sizeof scale);
        cu_literal(x->dtype, 0.0, zero, sizeof zero);
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
    cu_conv(cmp ? TF_DT_BOOL : w.ct, tf_kexpr_round(x), r, out, n);
}

static void emit_expr(em *e, int depth, int i)
{
    const tf_kernel *k = e->k;
    const tf_kexpr *x = &k->exprs[i];
    char code[2600], t[256];
    switch (x->kind) {
    case TF_KX_LOAD: load_code(e, i, code, sizeof code); break;
    case TF_KX_CONST: cu_literal(x->dtype, tf_dtype_round(x->dtype, x->value), code, sizeof code); break;
    case TF_KX_REDUCED: snprintf(code, sizeof code, "tf_r%d", x->red); break;
    case TF_KX_INDEX:
        if (k->dims[x->axis] > 1) snprintf(t, sizeof t, "(long long)i%d", x->axis);
        else snprintf(t, sizeof t, "0LL");
        cu_conv(TF_DT_I64, tf_kexpr_round(x), t, code, sizeof code);
        break;
    case TF_KX_OP: op_code(e, i, code, sizeof code); break;
    }
    cu_line(&e->s, depth, "const %s e%d = %s;", cu_value_type(x->dtype), i, code);
}

void cu_emit_selected(em *e, int depth, sel which)
{
    for (int i = 0; i < e->k->nexprs; i++)
        if (selected(e, i, which)) emit_expr(e, depth, i);
}

/* The store of expression ex into buffer b at index `at`. */
void cu_emit_store(em *e, int depth, const tf_kstore *st, const char *at)
{
    tf_dt bt = e->k->bufs[st->buf].value->type.dtype, xt = tf_kexpr_round(&e->k->exprs[st->expr]);
    char v[32], c[256];
    snprintf(v, sizeof v, "e%d", st->expr);
    cu_conv(xt, bt, v, c, sizeof c);
    const char *f = bt == TF_DT_F16 ? "__float2half_rn" : bt == TF_DT_BF16 ? "__float2bfloat16_rn" : bt == TF_DT_BOOL ? "(unsigned char)" : NULL;
    if (f) cu_line(&e->s, depth, "%s = %s(%s);", at, f, c);
    else cu_line(&e->s, depth, "%s = %s;", at, c);
}

/* Before the loops: one key per dropout mask (seed, step, salt mixed). */
void cu_emit_dropout_keys(em *e, int depth)
{
    for (int i = 0; i < e->k->nexprs; i++) {
        const tf_kexpr *x = &e->k->exprs[i];
        if (x->kind == TF_KX_OP && x->op == TF_OP_DROPOUT_MASK && e->mark[i])
            cu_line(&e->s, depth, "const unsigned long long tf_key%d = tf_dropout_key(tf_rng, %lluULL);", i,
                    (unsigned long long)tf_node_int(x->node, "salt"));
    }
}
