/* cuda_lib.c — library ops' own kernels (tf_cuda_emit_library): pooling
 * and its gradients, gather (and embedding), scatter_add, concat and
 * slice_grad, each one grid-stride loop over its result written straight
 * from the op's attributes and shapes (no kernel IR expressions); the
 * attention ops' tiled kernels are cuda_attention.c's. What each computes,
 * against the interpreter, is in cuda.h. */
#include "cuda_emit.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

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

static bool is_float(tf_dt t) { return cu_is_f32ish(t) || t == TF_DT_F64; }

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
    if (tf_op_exec_of(nd->op) == TF_OPX_COMM) {
        snprintf(why, n, "kernel %s: %s averages over the ranks in the runtime (NCCL, or the host's communicator), not in "
                 "generated code", k->name, name);
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
    case TF_OP_FLASH_ATTENTION: case TF_OP_FLASH_ATTENTION_GRAD:
        return cu_attention_supports(k, why, n);
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
    cu_line(&e->s, 1, "for (tf_idx %s = (tf_idx)blockIdx.x * blockDim.x + threadIdx.x; %s < %lld; %s += (tf_idx)gridDim.x * blockDim.x) {",
            var, var, (long long)count, var);
}

/* const tf_idx c = i / div % mod; as few operations as the extents allow */
static void lib_coord(lk *e, int depth, const char *c, const char *i, int64_t div, int64_t mod, bool lead)
{
    char a[96];
    if (div == 1) snprintf(a, sizeof a, "%s", i);
    else snprintf(a, sizeof a, "(%s / %lld)", i, (long long)div);
    if (lead) cu_line(&e->s, depth, "const tf_idx %s = %s;", c, a);
    else cu_line(&e->s, depth, "const tf_idx %s = %s %% %lld;", c, a, (long long)mod);
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
    cu_line(&e->s, 1, "// %s %lldx%lld, stride %lldx%lld, padding %lldx%lld: [%lld, %lld, %lld, %lld] -> [.., %lld, %lld]",
            tf_op_info_of(n->op)->name, (long long)k[0], (long long)k[1], (long long)s[0], (long long)s[1], (long long)p[0],
            (long long)p[1], (long long)dim_of(x, 0), (long long)dim_of(x, 1), (long long)H, (long long)W, (long long)Ho,
            (long long)Wo);
    lib_loop(e, "i", numel_of(y));
    lib_coord(e, 2, "ow", "i", 1, Wo, false);
    lib_coord(e, 2, "oh", "i", Wo, Ho, false);
    lib_coord(e, 2, "pl", "i", Wo * Ho, 0, true);
    cu_line(&e->s, 2, "const %s *x = b1 + pl * %lld;", cu_storage_type(t), (long long)(H * W));
    cu_literal(t == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, is_max ? -INFINITY : 0.0, init, sizeof init);
    cu_line(&e->s, 2, "%s acc = %s;   // %s", mt, init, is_max ? "padding is -inf" : "padding adds 0");
    cu_line(&e->s, 2, "for (int kh = 0; kh < %lld; kh++) {", (long long)k[0]);
    char pos[128];
    win_pos(pos, sizeof pos, "oh", s[0], p[0], "kh");
    cu_line(&e->s, 3, "const tf_idx ih = %s;", pos);
    if (p[0]) cu_line(&e->s, 3, "if (ih < 0 || ih >= %lld) continue;", (long long)H);
    cu_line(&e->s, 3, "for (int kw = 0; kw < %lld; kw++) {", (long long)k[1]);
    win_pos(pos, sizeof pos, "ow", s[1], p[1], "kw");
    cu_line(&e->s, 4, "const tf_idx iw = %s;", pos);
    if (p[1]) cu_line(&e->s, 4, "if (iw < 0 || iw >= %lld) continue;", (long long)W);
    char ref[64];
    snprintf(ref, sizeof ref, "x[ih * %lld + iw]", (long long)W);
    lib_load(t, ref, v, sizeof v);
    cu_line(&e->s, 4, "const %s v = %s;", mt, v);
    if (is_max) cu_line(&e->s, 4, "if (acc == acc && (v != v || v > acc)) acc = v;   // the first maximum; a NaN wins and stays");
    else cu_line(&e->s, 4, "acc += v;");
    cu_line(&e->s, 3, "}");
    cu_line(&e->s, 2, "}");
    char res[96];
    if (is_max) snprintf(res, sizeof res, "acc");
    else {
        char cnt[64];
        cu_literal(t == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, (double)(k[0] * k[1]), cnt, sizeof cnt);
        snprintf(res, sizeof res, "acc / %s", cnt);   /* count_include_pad */
    }
    lib_store(t, res, st, sizeof st);
    cu_line(&e->s, 2, "b0[i] = %s;", st);
    cu_line(&e->s, 1, "}");
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
    cu_literal(t == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, 0.0, zero, sizeof zero);
    cu_line(&e->s, 1, "// %s %lldx%lld, stride %lldx%lld, padding %lldx%lld: dy [.., %lld, %lld] -> dx [%lld, %lld, %lld, %lld]",
            tf_op_info_of(n->op)->name, (long long)k[0], (long long)k[1], (long long)s[0], (long long)s[1], (long long)p[0],
            (long long)p[1], (long long)Ho, (long long)Wo, (long long)dim_of(dx, 0), (long long)dim_of(dx, 1), (long long)H,
            (long long)W);
    cu_line(&e->s, 1, "// a thread per dx element: the windows covering it, in row-major order (deterministic, no atomics)");
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
        if (lo >= 0) cu_line(&e->s, 2, "const tf_idx o%s0 = %s;", ax[a], num);
        else cu_line(&e->s, 2, "const tf_idx o%s0 = i%s < %lld ? 0 : %s;", ax[a], ax[a], (long long)-lo, num);
        char hi[64];
        if (p[a]) snprintf(hi, sizeof hi, "(i%s + %lld)", ax[a], (long long)p[a]);
        else snprintf(hi, sizeof hi, "i%s", ax[a]);
        if (s[a] > 1) cu_line(&e->s, 2, "const tf_idx o%s1 = tf_min(%s / %lld, (tf_idx)%lld);", ax[a], hi, (long long)s[a], (long long)(lim[a] - 1));
        else cu_line(&e->s, 2, "const tf_idx o%s1 = tf_min(%s, (tf_idx)%lld);", ax[a], hi, (long long)(lim[a] - 1));
    }
    cu_line(&e->s, 2, "const %s *dy = %s + pl * %lld;", cu_storage_type(t), dyp, (long long)(Ho * Wo));
    if (is_max) cu_line(&e->s, 2, "const %s *x = b1 + pl * %lld;", cu_storage_type(t), (long long)(H * W));
    cu_line(&e->s, 2, "%s acc = %s;", mt, zero);
    cu_line(&e->s, 2, "for (tf_idx oh = oh0; oh <= oh1; oh++) {");
    cu_line(&e->s, 3, "for (tf_idx ow = ow0; ow <= ow1; ow++) {");
    snprintf(ref, sizeof ref, "dy[oh * %lld + ow]", (long long)Wo);
    lib_load(t, ref, v, sizeof v);
    if (!is_max) {
        char cnt[64];
        cu_literal(t == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32, t == TF_DT_F64 ? 1.0 / (double)(k[0] * k[1]) : (double)(k[0] * k[1]), cnt,
                   sizeof cnt);
        if (t == TF_DT_F64) cu_line(&e->s, 4, "acc += %s * %s;   // the interpreter's dy * (1 / (kh * kw))", v, cnt);
        else cu_line(&e->s, 4, "acc += %s / %s;", v, cnt);
    } else {
        cu_line(&e->s, 4, "tf_idx at = -1;   // the element the forward pass took its value from");
        cu_line(&e->s, 4, "%s best = %s;", mt, zero);
        cu_line(&e->s, 4, "for (int kh = 0; kh < %lld; kh++) {", (long long)k[0]);
        char pos[128];
        win_pos(pos, sizeof pos, "oh", s[0], p[0], "kh");
        cu_line(&e->s, 5, "const tf_idx jh = %s;", pos);
        if (p[0]) cu_line(&e->s, 5, "if (jh < 0 || jh >= %lld) continue;", (long long)H);
        cu_line(&e->s, 5, "for (int kw = 0; kw < %lld; kw++) {", (long long)k[1]);
        win_pos(pos, sizeof pos, "ow", s[1], p[1], "kw");
        cu_line(&e->s, 6, "const tf_idx jw = %s;", pos);
        if (p[1]) cu_line(&e->s, 6, "if (jw < 0 || jw >= %lld) continue;", (long long)W);
        char xv[128], xr[64];
        snprintf(xr, sizeof xr, "x[jh * %lld + jw]", (long long)W);
        lib_load(t, xr, xv, sizeof xv);
        cu_line(&e->s, 6, "const %s v = %s;", mt, xv);
        cu_line(&e->s, 6, "if (at < 0 || (best == best && (v != v || v > best))) {");
        cu_line(&e->s, 7, "best = v;");
        cu_line(&e->s, 7, "at = jh * %lld + jw;", (long long)W);
        cu_line(&e->s, 6, "}");
        cu_line(&e->s, 5, "}");
        cu_line(&e->s, 4, "}");
        cu_line(&e->s, 4, "if (at == ih * %lld + iw) acc += %s;", (long long)W, v);
    }
    cu_line(&e->s, 3, "}");
    cu_line(&e->s, 2, "}");
    lib_store(t, "acc", st, sizeof st);
    cu_line(&e->s, 2, "b0[i] = %s;", st);
    cu_line(&e->s, 1, "}");
}

/* The id of row r (ids are operand 0: a parameter or a constant). */
static void lib_id(lk *e, int depth, const char *r)
{
    const tf_value *ids = e->n->in[0];
    if (ids->kind == TF_VAL_CONST) cu_line(&e->s, depth, "const long long id = %lldLL;", (long long)ids->cval);
    else cu_line(&e->s, depth, "const long long id = (long long)b%d[%s];", e->par[0], r);
}

/* gather / embedding: out[r, j] = table[ids[r], j]; an id out of range
 * reads nothing, leaves zeros and reports its position in *tf_err. */
static void lib_gather(lk *e)
{
    const tf_node *n = e->n;
    const tf_value *tab = n->in[1], *out = n->out;
    int64_t V = dim_of(tab, 0), row = numel_of(tab) / V;
    tf_dt t = dt_of(out);
    cu_line(&e->s, 1, "// %s: %lld rows of %lld elements from a table of %lld rows", tf_op_info_of(n->op)->name,
            (long long)numel_of(n->in[0]), (long long)row, (long long)V);
    lib_loop(e, "i", numel_of(out));
    if (row > 1) {
        lib_coord(e, 2, "r", "i", row, 0, true);
        lib_coord(e, 2, "j", "i", 1, row, false);
    }
    lib_id(e, 2, row > 1 ? "r" : "i");
    cu_line(&e->s, 2, "if (id >= 0 && id < %lldLL) {", (long long)V);
    if (row > 1) cu_line(&e->s, 3, "b0[i] = b%d[id * %lldLL + j];", e->par[1], (long long)row);
    else cu_line(&e->s, 3, "b0[i] = b%d[id];", e->par[1]);
    cu_line(&e->s, 2, "} else {");
    cu_line(&e->s, 3, "b0[i] = %s;", lib_zero(t));
    cu_line(&e->s, 3, "tf_err[0] = (unsigned long long)%s + 1ULL;", row > 1 ? "r" : "i");
    cu_line(&e->s, 2, "}");
    cu_line(&e->s, 1, "}");
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
    cu_line(&e->s, 1, "// scatter_add: %lld rows of %lld elements into a table of %lld rows", (long long)N, (long long)row, (long long)V);
    if (scatter_atomic(t)) {
        cu_line(&e->s, 1, "// atomicAdd into b0, zeroed before the launch: the order of the additions is the GPU's (not bit-deterministic)");
        lib_loop(e, "i", numel_of(dy));
        if (row > 1) {
            lib_coord(e, 2, "r", "i", row, 0, true);
            lib_coord(e, 2, "j", "i", 1, row, false);
        }
        lib_id(e, 2, row > 1 ? "r" : "i");
        cu_line(&e->s, 2, "if (id >= 0 && id < %lldLL) atomicAdd(&b0[id * %lldLL%s], b%d[i]);", (long long)V, (long long)row,
                row > 1 ? " + j" : "", e->par[1]);
        cu_line(&e->s, 2, "else tf_err[0] = (unsigned long long)%s + 1ULL;", row > 1 ? "r" : "i");
        cu_line(&e->s, 1, "}");
        return;
    }
    bool fl = cu_is_f32ish(t);
    cu_line(&e->s, 1, "// a thread per result element adds its rows in order (deterministic); ids out of range are reported");
    lib_loop(e, "i", N);
    lib_id(e, 2, "i");
    cu_line(&e->s, 2, "if (id < 0 || id >= %lldLL) tf_err[0] = (unsigned long long)i + 1ULL;", (long long)V);
    cu_line(&e->s, 1, "}");
    lib_loop(e, "i", numel_of(out));
    if (row > 1) {
        lib_coord(e, 2, "v", "i", row, 0, true);
        lib_coord(e, 2, "j", "i", 1, row, false);
    }
    cu_line(&e->s, 2, "%s acc = %s;", fl ? "float" : "double", fl ? "0.0f" : "0.0");
    cu_line(&e->s, 2, "for (tf_idx r = 0; r < %lld; r++) {", (long long)N);
    lib_id(e, 3, "r");
    if (row > 1) snprintf(ref, sizeof ref, "b%d[r * %lld + j]", e->par[1], (long long)row);
    else snprintf(ref, sizeof ref, "b%d[r]", e->par[1]);
    if (fl) lib_load(t, ref, v, sizeof v);
    else snprintf(v, sizeof v, "(double)%s", ref);
    cu_line(&e->s, 3, "if (id == %s) acc += %s;", row > 1 ? "v" : "i", v);
    cu_line(&e->s, 2, "}");
    lib_store(t, "acc", st, sizeof st);
    cu_line(&e->s, 2, "b0[i] = %s;", st);
    cu_line(&e->s, 1, "}");
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
    cu_line(&e->s, 1, "// concat of %d operands along axis %d: [%lld, %lld, %lld] as [outer, axis, inner]", n->nin, ax, (long long)outer,
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
        if (q == n->nin - 1) cu_line(&e->s, 2, "%sb0[i] = b%d[%s];", q ? "else " : "", e->par[q], idx);
        else cu_line(&e->s, 2, "%s (a < %lld) b0[i] = b%d[%s];", kw, (long long)(pos + m), e->par[q], idx);
        pos += m;
    }
    cu_line(&e->s, 1, "}");
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
    cu_line(&e->s, 1, "// slice_grad along axis %d: [%lld, %lld, %lld] as [outer, axis, inner], dy's %lld at %lld + %lld j", ax,
            (long long)outer, (long long)len, (long long)inner, (long long)m, (long long)start, (long long)step);
    lib_loop(e, "i", numel_of(out));
    if (inner > 1) lib_coord(e, 2, "r", "i", 1, inner, false);
    lib_coord(e, 2, "a", "i", inner, len, outer == 1);
    if (outer > 1) lib_coord(e, 2, "o", "i", inner * len, 0, true);
    cu_line(&e->s, 2, "const tf_idx t = a - %lld;", (long long)start);
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
    if (inner > 1) cu_line(&e->s, 2, "b0[i] = %s ? b1[%s * %lld + r] : %s;", cond, idx, (long long)inner, lib_zero(dt_of(out)));
    else cu_line(&e->s, 2, "b0[i] = %s ? b1[%s] : %s;", cond, idx, lib_zero(dt_of(out)));
    cu_line(&e->s, 1, "}");
}

tf_ir_status tf_cuda_emit_library(const tf_kernel *k, tf_cuda_kernel *out, tf_diag *d)
{
    return tf_cuda_emit_library_mode(k, TF_IR_TRAIN, out, d);
}

tf_ir_status tf_cuda_emit_library_mode(const tf_kernel *k, tf_ir_mode mode, tf_cuda_kernel *out, tf_diag *d)
{
    memset(out, 0, sizeof *out);
    char why[256];
    if (!tf_cuda_library_supports(k, why, sizeof why)) return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "cuda: %s", why);
    const tf_node *n = k->lib;
    if (tf_op_exec_of(n->op) == TF_OPX_ATTENTION) return cu_emit_attention(k, mode == TF_IR_TRAIN, out, d);
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
    tf_strbuf_printf(&src, "\n%s", cu_helpers_common);
    tf_strbuf_printf(&src, "\nextern \"C\" __global__ void __launch_bounds__(%u) %s(", block, cu_placeholder);
    for (int p = 0; p < e.np; p++) {
        const tf_value *v = n->out;
        for (int q = 0; p && q < n->nin; q++)
            if (e.par[q] == p) v = n->in[q];
        bool disjoint = false;
        for (int b = 0; b < k->nbufs; b++)
            if (k->bufs[b].value == v) disjoint = k->bufs[b].disjoint;
        tf_strbuf_printf(&src, "%s%s%s *%sb%d", p ? ", " : "", p ? "const " : "", cu_storage_type(dt_of(v)), disjoint ? "__restrict__ " : "", p);
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
    cu_name_source(out, src.p, src.n);
    out->shape = TF_CUDA_POINTWISE;
    out->block = block;
    out->grid = cu_blocks_for(work, block);
    out->align = align;
    out->vec = 1;
    out->nparams = e.np + (e.err ? 1 : 0);
    out->library = true;
    out->clear_first = e.clear;
    out->err = e.err;
    out->wide_index = e.wide;
    return TF_IR_OK;
}
