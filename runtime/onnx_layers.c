/* onnx_layers.c — the ONNX ops that become several tfuse ops: the
 * normalizations over several axes (LayerNormalization, RMSNormalization),
 * Attention, and the indexing ops (Expand, Gather on any axis, Slice with
 * negative steps, Pad, Split, Tile). What each becomes is docs/onnx.md's
 * table; runtime/onnx_import.c's table calls them, and onnx_ix.h is what
 * they build with. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "onnx_ix.h"
#include "ops.h"
#include "runtime.h"

/* LayerNormalization over axes [axis, rank): tfuse's layernorm of the last axis on x seen as [P, Q]; Mean and InvStdDev
 * (its optional outputs) as reductions over those axes, kept as dims of 1. */
int ox_layernorm(importer *im, int arg)
{
    (void)arg;
    tf_value *x = ox_in_val(im, 0);
    if (!x) return -1;
    int64_t axis = 0;
    int r = x->type.rank;
    if (ox_norm_axis(im, ox_attr_i(im, "axis", -1), r, &axis)) return -1;
    double eps = ox_attr_f(im, "epsilon", 1e-5);
    int64_t p = 1, q = 1, shape[TF_MAX_RANK], axes[TF_MAX_RANK];
    for (int i = 0; i < r; i++) *(i < axis ? &p : &q) *= x->type.dims[i].n, shape[i] = x->type.dims[i].n;
    tf_value *g = ox_in_val(im, 1), *b = NULL;
    if (!g) return -1;
    if (tf_type_numel(&g->type) != q)
        return ox_fail(im, "Scale has %lld elements, and the normalized axes hold %lld: tfuse takes a Scale of their shape",
                    (long long)tf_type_numel(&g->type), (long long)q);
    if (ox_input(im, 2)) {
        b = ox_in_val(im, 2);
        if (b && tf_type_numel(&b->type) != q)
            return ox_fail(im, "B has %lld elements, and the normalized axes hold %lld: tfuse takes a B of their shape",
                        (long long)tf_type_numel(&b->type), (long long)q);
    } else {   /* no bias: zeros */
        ival z = {.dt = g->type.dtype, .rank = 1, .shape = {q}};
        z.c = ox_own(im, q);
        if (!z.c) return -1;
        b = ox_val(im, &z, "layernorm_zero_bias");
    }
    if (im->failed) return -1;
    bool last = axis == r - 1;
    tf_value *xs = last ? x : ox_reshape(im, x, (int64_t[]){p, q}, 2);
    tf_value *gs = g->type.rank == 1 ? g : ox_reshape(im, g, &q, 1), *bs = b->type.rank == 1 ? b : ox_reshape(im, b, &q, 1);
    tf_value *in[3] = {xs, gs, bs};
    tf_named_attr a = {"eps", tf_attr_float(eps)};
    tf_value *y = ox_op(im, TF_OP_LAYERNORM, in, 3, &a, 1);
    if (ox_set_out(im, 0, last ? y : ox_reshape(im, y, shape, r))) return -1;
    bool mean_out = im->node->nout > 1 && im->node->out[1].n, inv_out = im->node->nout > 2 && im->node->out[2].n;
    if (!mean_out && !inv_out) return 0;
    for (int i = (int)axis; i < r; i++) axes[i - axis] = i;
    tf_named_attr ra[2] = {{"axes", tf_attr_ints(im->m, axes, (int)(r - axis))}, {"keepdims", tf_attr_bool(true)}};
    tf_value *mean = ox_op(im, TF_OP_REDUCE_MEAN, &x, 1, ra, 2), *d = ox_op2(im, TF_OP_SUB, x, mean);
    tf_value *var = ox_op2(im, TF_OP_MUL, d, d);
    var = ox_op(im, TF_OP_REDUCE_MEAN, &var, 1, ra, 2);
    tf_value *inv = ox_op1(im, TF_OP_RSQRT, ox_op2(im, TF_OP_ADD, var, ox_num(im, eps, x->type.dtype)));
    if (mean_out && ox_set_out(im, 1, mean)) return -1;
    return inv_out ? ox_set_out(im, 2, inv) : 0;
}

/* [B, T, H*D] (3-D, heads from the attribute) as [B, H, T, D]; a 4-D input as it is. */
static tf_value *heads_first(importer *im, tf_value *x, const char *heads_attr)
{
    if (!x || x->type.rank == 4) return x;
    int64_t h = ox_attr_i(im, heads_attr, 0), b = x->type.dims[0].n, t = x->type.dims[1].n, w = x->type.dims[2].n;
    if (x->type.rank != 3 || h < 1 || w % h) {
        ox_fail(im, "3-D inputs need %s dividing their last dim", heads_attr);
        return NULL;
    }
    tf_value *r = ox_reshape(im, x, (int64_t[]){b, t, h, w / h}, 4);
    tf_named_attr a = {"perm", tf_attr_ints(im->m, (int64_t[]){0, 2, 1, 3}, 4)};
    return r ? ox_op(im, TF_OP_TRANSPOSE, &r, 1, &a, 1) : NULL;
}

/* Attention's steps as ONNX defines them, for what tfuse's attention op does not take (softcap; the scores as an output,
 * qk_matmul_output_mode 0: Q K^T scale, 1: plus the mask and the causal bias, 2: softcapped, 3: the softmax): K's and V's
 * heads repeated for grouped queries, S = Q K^T scale + bias (a bool mask and causal: 0 or -inf), softcap tanh(S / softcap),
 * softmax, times V. Output 3 (the scores) is set here. */
static tf_value *attention_steps(importer *im, tf_value *q, tf_value *k, tf_value *v, tf_value *mask, bool causal, double scale,
                                 double softcap, int64_t past)
{
    tf_dt dt = q->type.dtype;
    int64_t b = q->type.dims[0].n, h = q->type.dims[1].n, tq = q->type.dims[2].n, hk = k->type.dims[1].n, tk = k->type.dims[2].n;
    if (hk < 1 || h % hk) {
        ox_fail(im, "%lld query heads over %lld key/value heads", (long long)h, (long long)hk);
        return NULL;
    }
    tf_value *kv[2] = {k, v};
    for (int i = 0; i < 2 && h != hk; i++) {   /* [B, Hk, T, D] -> [B, Hk, G, T, D] -> [B, H, T, D] */
        int64_t d = kv[i]->type.dims[3].n;
        tf_value *e = ox_reshape(im, kv[i], (int64_t[]){b, hk, 1, tk, d}, 5);
        tf_named_attr at = {"shape", tf_attr_ints(im->m, (int64_t[]){b, hk, h / hk, tk, d}, 5)};
        e = e ? ox_op(im, TF_OP_BROADCAST, &e, 1, &at, 1) : NULL;
        kv[i] = e ? ox_reshape(im, e, (int64_t[]){b, h, tk, d}, 4) : NULL;
    }
    tf_named_attr tr = {"perm", tf_attr_ints(im->m, (int64_t[]){0, 1, 3, 2}, 4)};
    tf_value *kt = kv[0] ? ox_op(im, TF_OP_TRANSPOSE, &kv[0], 1, &tr, 1) : NULL;
    tf_value *s = ox_op2(im, TF_OP_MUL, ox_op2(im, TF_OP_MATMUL, q, kt), ox_num(im, scale, dt));
    /* softcap before the mask, so that a masked score stays -inf */
    if (softcap > 0) s = ox_op2(im, TF_OP_MUL, ox_op1(im, TF_OP_TANH, ox_op2(im, TF_OP_DIV, s, ox_num(im, softcap, dt))), ox_num(im, softcap, dt));
    tf_value *s1 = s, *ninf = ox_num(im, -INFINITY, dt), *zero = ox_num(im, 0, dt);
    if (mask && mask->type.dtype == TF_DT_BOOL) mask = ox_op(im, TF_OP_WHERE, (tf_value *[]){mask, zero, ninf}, 3, NULL, 0);
    if (mask) s = ox_op2(im, TF_OP_ADD, s, mask);
    if (causal) {   /* key j after query i + past: -inf (every past key seen) */
        tf_named_attr ri[3] = {{"shape", tf_attr_ints(im->m, (int64_t[]){tq, tk}, 2)}, {"axis", tf_attr_int(0)}, {"dtype", tf_attr_dtype(TF_DT_I64)}};
        tf_named_attr ci[3] = {ri[0], {"axis", tf_attr_int(1)}, ri[2]};
        tf_value *row = ox_op(im, TF_OP_IOTA, NULL, 0, ri, 3), *col = ox_op(im, TF_OP_IOTA, NULL, 0, ci, 3);
        if (past) {
            ival off = {.dt = TF_DT_I64, .rank = 0, .c = ox_own(im, 1)};
            if (!off.c) return NULL;
            off.c[0] = (double)past;
            row = ox_op2(im, TF_OP_ADD, row, ox_val(im, &off, "causal_offset"));
        }
        s = ox_op2(im, TF_OP_ADD, s, ox_op(im, TF_OP_WHERE, (tf_value *[]){ox_op2(im, TF_OP_GT, col, row), ninf, zero}, 3, NULL, 0));
    }
    tf_value *s2 = s;
    tf_named_attr ax = {"axis", tf_attr_int(-1)};
    tf_value *p = s ? ox_op(im, TF_OP_SOFTMAX, &s, 1, &ax, 1) : NULL;
    const tf_onnx_node *n = im->node;
    if (n->nout > 3 && n->out[3].n) {
        int64_t mode = ox_attr_i(im, "qk_matmul_output_mode", 0);   /* 0, 1: Q K^T scale (softcapped); 2: plus the bias; 3: softmax */
        tf_value *scores = mode == 0 || mode == 1 ? s1 : mode == 2 ? s2 : mode == 3 ? p : NULL;
        if (!scores && !im->failed) ox_fail(im, "qk_matmul_output_mode %lld (0 to 3)", (long long)mode);
        if (!scores || ox_set_out(im, 3, scores)) return NULL;
    }
    return p && kv[1] ? ox_op2(im, TF_OP_MATMUL, p, kv[1]) : NULL;
}

/* Attention (opset 23): tfuse's attention (grouped-query heads, a bool or additive mask broadcast to [B, H, Tq, Tk],
 * causal from the upper left, the scale), with past keys and values concatenated before the new ones (present_key and
 * present_value are those); 3-D inputs as [B, T, H*D]. */
int ox_attention(importer *im, int arg)
{
    (void)arg;
    const tf_onnx_node *n = im->node;
    if (n->nin > 6 && n->in[6].n) return ox_fail(im, "nonpad_kv_seqlen is not read");
    double softcap = ox_attr_f(im, "softcap", 0);
    bool decomposed = softcap != 0 || (n->nout > 3 && n->out[3].n);   /* tfuse's attention has neither: its steps as ops */
    tf_value *q0 = ox_in_val(im, 0), *q = heads_first(im, q0, "q_num_heads"), *k = heads_first(im, ox_in_val(im, 1), "kv_num_heads");
    tf_value *v = heads_first(im, ox_in_val(im, 2), "kv_num_heads"), *mask = ox_input(im, 3) ? ox_in_val(im, 3) : NULL;
    if (!q || !k || !v || im->failed) return -1;
    tf_named_attr seq = {"axis", tf_attr_int(2)};
    int64_t past = 0;
    if (ox_input(im, 4) && ox_input(im, 5)) {   /* past keys and values */
        past = ox_input(im, 4)->shape[2];
        tf_value *pk[2] = {ox_in_val(im, 4), k}, *pv[2] = {ox_in_val(im, 5), v};
        k = ox_op(im, TF_OP_CONCAT, pk, 2, &seq, 1);
        v = ox_op(im, TF_OP_CONCAT, pv, 2, &seq, 1);
    } else if (ox_input(im, 4) || ox_input(im, 5)) {
        return ox_fail(im, "past_key and past_value come together");
    }
    int64_t tk = k ? k->type.dims[2].n : 0;
    if (mask && mask->type.dims[mask->type.rank - 1].n < tk) {   /* a mask shorter than the keys: the rest masked */
        int r = mask->type.rank;
        int64_t shape[TF_MAX_RANK];
        for (int i = 0; i < r; i++) shape[i] = mask->type.dims[i].n;
        shape[r - 1] = tk - shape[r - 1];
        tf_value *f = mask->type.dtype == TF_DT_BOOL ? ox_op2(im, TF_OP_NE, mask, mask) : ox_num(im, -INFINITY, mask->type.dtype);
        if (mask->type.dtype == TF_DT_BOOL) {   /* false, as wide as the rest: the mask's first columns compared with themselves */
            tf_named_attr sl[4] = {{"axis", tf_attr_int(r - 1)}, {"start", tf_attr_int(0)}, {"end", tf_attr_int(1)}, {"step", tf_attr_int(1)}};
            f = ox_op(im, TF_OP_SLICE, &f, 1, sl, 4);
        }
        tf_named_attr at = {"shape", tf_attr_ints(im->m, shape, r)};
        f = f ? ox_op(im, TF_OP_BROADCAST, &f, 1, &at, 1) : NULL;
        tf_named_attr cat = {"axis", tf_attr_int(r - 1)};
        mask = f ? ox_op(im, TF_OP_CONCAT, (tf_value *[]){mask, f}, 2, &cat, 1) : NULL;
    }
    if (mask && mask->type.rank < 4) {   /* broadcast from the right: dims of 1 before */
        int64_t shape[4] = {1, 1, 1, 1};
        for (int i = 0; i < mask->type.rank; i++) shape[4 - mask->type.rank + i] = mask->type.dims[i].n;
        mask = ox_reshape(im, mask, shape, 4);
    }
    if (!k || !v || im->failed) return -1;
    double scale = ox_attr(im, "scale") ? ox_attr_f(im, "scale", 1) : 1.0 / sqrt((double)q->type.dims[3].n);
    bool causal = ox_attr_i(im, "is_causal", 0) != 0;
    tf_value *y;
    if (decomposed || (causal && past)) {   /* tfuse's causal is from the upper left; with past keys it is offset */
        y = attention_steps(im, q, k, v, mask, causal, scale, softcap, past);
    } else {
        tf_named_attr a[2] = {{"causal", tf_attr_bool(causal)}, {"scale", tf_attr_float(scale)}};
        tf_value *in[4] = {q, k, v, mask};
        y = ox_op(im, TF_OP_ATTENTION, in, mask ? 4 : 3, a, 2);
    }
    if (y && q0->type.rank == 3) {   /* back to [B, T, H*Dv] */
        tf_named_attr t = {"perm", tf_attr_ints(im->m, (int64_t[]){0, 2, 1, 3}, 4)};
        y = ox_op(im, TF_OP_TRANSPOSE, &y, 1, &t, 1);
        y = y ? ox_reshape(im, y, (int64_t[]){y->type.dims[0].n, y->type.dims[1].n, y->type.dims[2].n * y->type.dims[3].n}, 3) : NULL;
    }
    if (ox_set_out(im, 0, y)) return -1;
    if (n->nout > 1 && n->out[1].n && ox_set_out(im, 1, k)) return -1;
    return n->nout > 2 && n->out[2].n ? ox_set_out(im, 2, v) : 0;
}

/* RMSNormalization: x / sqrt(mean of x^2 over axes [axis, rank) + epsilon) * scale. */
int ox_rmsnorm(importer *im, int arg)
{
    (void)arg;
    tf_value *x = ox_in_val(im, 0), *g = ox_in_val(im, 1);
    if (!x || !g) return -1;
    int64_t axis = 0, axes[TF_MAX_RANK];
    int r = x->type.rank;
    if (ox_norm_axis(im, ox_attr_i(im, "axis", -1), r, &axis)) return -1;
    for (int i = (int)axis; i < r; i++) axes[i - axis] = i;
    tf_named_attr a[2] = {{"axes", tf_attr_ints(im->m, axes, (int)(r - axis))}, {"keepdims", tf_attr_bool(true)}};
    tf_value *sq = ox_op2(im, TF_OP_MUL, x, x), *ms = ox_op(im, TF_OP_REDUCE_MEAN, &sq, 1, a, 2);
    tf_value *inv = ox_op1(im, TF_OP_RSQRT, ox_op2(im, TF_OP_ADD, ms, ox_num(im, ox_attr_f(im, "epsilon", 1e-5), x->type.dtype)));
    return ox_set_out(im, 0, ox_op2(im, TF_OP_MUL, ox_op2(im, TF_OP_MUL, x, inv), g));
}

/* Tile: each axis repeated, as a broadcast of x with a new axis of the repeats before it, then merged. */
int ox_tile(importer *im, int arg)
{
    (void)arg;
    tf_value *x = ox_in_val(im, 0);
    if (!x) return -1;
    int r = x->type.rank, n;
    int64_t rep[TF_MAX_RANK];
    if (ox_ints_of(im, NULL, 1, rep, &n, TF_MAX_RANK)) return -1;
    if (n != r) return ox_fail(im, "repeats holds %d values for a rank-%d input", n, r);
    for (int i = 0; x && i < r; i++) {
        if (rep[i] < 1 || rep[i] > ((int64_t)1 << 20)) return ox_fail(im, "repeats[%d] = %lld: tfuse takes 1 to 2^20", i, (long long)rep[i]);
        if (rep[i] == 1) continue;
        int64_t s1[TF_MAX_RANK + 1], s2[TF_MAX_RANK + 1], s3[TF_MAX_RANK];
        if (r + 1 > TF_MAX_RANK) return ox_fail(im, "Tile of a rank-%d input (at most %d)", r, TF_MAX_RANK - 1);
        for (int d = 0, k = 0; d < r; d++) {
            if (d == i) s1[k] = 1, s2[k] = rep[i], k++;
            s1[k] = s2[k] = x->type.dims[d].n, s3[d] = d == i ? rep[i] * x->type.dims[d].n : x->type.dims[d].n, k++;
        }
        tf_named_attr b = {"shape", tf_attr_ints(im->m, s2, r + 1)};
        tf_value *e = ox_reshape(im, x, s1, r + 1);
        e = e ? ox_op(im, TF_OP_BROADCAST, &e, 1, &b, 1) : NULL;
        x = e ? ox_reshape(im, e, s3, r) : NULL;
    }
    return ox_set_out(im, 0, x);
}

int ox_expand(importer *im, int arg)
{
    (void)arg;
    tf_value *x = ox_in_val(im, 0);
    int64_t shape[TF_MAX_RANK], out[TF_MAX_RANK];
    int n;
    if (!x || ox_ints_of(im, NULL, 1, shape, &n, TF_MAX_RANK)) return -1;
    if (n < 0) return ox_fail(im, "no shape input");
    int r = n > x->type.rank ? n : x->type.rank;
    for (int i = 0; i < n; i++)
        if (shape[i] < 1) return ox_fail(im, "shape[%d] = %lld: tfuse's sizes are positive", i, (long long)shape[i]);
    for (int i = 0; i < r; i++) {   /* numpy's broadcast of the two shapes */
        int64_t a = i - (r - n) >= 0 ? shape[i - (r - n)] : 1, b = i - (r - x->type.rank) >= 0 ? x->type.dims[i - (r - x->type.rank)].n : 1;
        if (a != b && a != 1 && b != 1) return ox_fail(im, "shape %lld does not broadcast with the input's %lld at axis %d", (long long)a, (long long)b, i);
        out[i] = a == 1 ? b : a;
    }
    tf_named_attr at = {"shape", tf_attr_ints(im->m, out, r)};
    return ox_set_out(im, 0, ox_op(im, TF_OP_BROADCAST, &x, 1, &at, 1));
}

/* Gather: constants folded (shape arithmetic), else rows of a table (axis 0), as tfuse's gather. */
/* x's slices at ids (non-negative) along axis: tfuse's gather takes rows of a 2-D table, so axis goes first, the rest
 * flattened; the result is x.shape[:axis] + ids.shape + x.shape[axis+1:]. */
static tf_value *gather_axis(importer *im, tf_value *x, tf_value *ids, int64_t axis)
{
    if (!x || !ids) return NULL;
    int r = x->type.rank, k = ids->type.rank;
    if (r - 1 + k > TF_MAX_RANK) {
        ox_fail(im, "a result of rank %d (at most %d)", r - 1 + k, TF_MAX_RANK);
        return NULL;
    }
    int64_t perm[TF_MAX_RANK], shape[TF_MAX_RANK], rest = 1;
    perm[0] = axis;
    for (int i = 0, j = 1; i < r; i++)
        if (i != axis) perm[j++] = i, rest *= x->type.dims[i].n;
    tf_value *t = x;
    if (axis) {
        tf_named_attr a = {"perm", tf_attr_ints(im->m, perm, r)};
        t = ox_op(im, TF_OP_TRANSPOSE, &t, 1, &a, 1);
    }
    t = ox_reshape(im, t, (int64_t[]){x->type.dims[axis].n, rest}, 2);
    tf_value *id1 = k ? ids : ox_reshape(im, ids, (int64_t[]){1}, 1);
    tf_value *in[2] = {id1, t};
    tf_value *g = ox_op(im, TF_OP_GATHER, in, 2, NULL, 0);   /* ids.shape + [rest] */
    int n = 0;
    for (int i = 0; i < k; i++) shape[n++] = ids->type.dims[i].n;
    for (int i = 1; i < r; i++) shape[n++] = x->type.dims[perm[i]].n;
    g = ox_reshape(im, g, shape, n);   /* ids dims, then x's other dims in order */
    if (!axis || !k) return g;
    int64_t back[TF_MAX_RANK];
    n = 0;
    for (int i = 0; i < axis; i++) back[n++] = k + i;   /* x's dims before axis */
    for (int i = 0; i < k; i++) back[n++] = i;          /* then the ids' */
    for (int i = (int)axis; i < r - 1; i++) back[n++] = k + i;
    tf_named_attr a = {"perm", tf_attr_ints(im->m, back, n)};
    return ox_op(im, TF_OP_TRANSPOSE, &g, 1, &a, 1);
}

int ox_gather(importer *im, int arg)
{
    (void)arg;
    ival *data = ox_need(im, 0), *idx = ox_need(im, 1);
    if (!data || !idx) return -1;
    int64_t axis = 0;
    if (ox_norm_axis(im, ox_attr_i(im, "axis", 0), data->rank, &axis)) return -1;
    if ((axis != 0 || data->rank != 2) && !idx->v && ox_const_of(im, idx) && ox_numel(idx) <= 64 && data->rank - 1 + idx->rank <= TF_MAX_RANK) {
        /* known indices on any axis: a slice per index, concatenated, reshaped to data[:axis] + indices + data[axis+1:] */
        tf_value *x = ox_in_val(im, 0), *parts[64];
        int64_t n = ox_numel(idx), dim = data->shape[axis], shape[TF_MAX_RANK];
        for (int64_t i = 0; x && i < n; i++) {
            if (!(fabs(idx->c[i]) <= 4611686018427387904.0)) return ox_fail(im, "index %g is not an integer tfuse takes", idx->c[i]);
            int64_t k = (int64_t)idx->c[i];
            if (k < -dim || k >= dim) return ox_fail(im, "index %lld is out of range [%lld, %lld)", (long long)k, (long long)-dim, (long long)dim);
            if (k < 0) k += dim;
            tf_named_attr a[4] = {{"axis", tf_attr_int(axis)}, {"start", tf_attr_int(k)}, {"end", tf_attr_int(k + 1)}, {"step", tf_attr_int(1)}};
            parts[i] = dim == 1 ? x : ox_op(im, TF_OP_SLICE, &x, 1, a, 4);
        }
        tf_named_attr ca = {"axis", tf_attr_int(axis)};
        tf_value *v = n == 1 ? parts[0] : ox_op(im, TF_OP_CONCAT, parts, (int)n, &ca, 1);
        int r = 0;
        for (int a = 0; a < axis; a++) shape[r++] = data->shape[a];
        for (int a = 0; a < idx->rank; a++) shape[r++] = idx->shape[a];
        for (int a = (int)axis + 1; a < data->rank; a++) shape[r++] = data->shape[a];
        return ox_set_out(im, 0, v ? ox_reshape(im, v, shape, r) : NULL);
    }
    tf_value *x = ox_in_val(im, 0), *ids = ox_in_val(im, 1);
    if (!x || !ids) return -1;
    if (ids->type.dtype != TF_DT_I64 && ids->type.dtype != TF_DT_I32) return ox_fail(im, "indices must be i64 or i32");
    /* a negative index counts from the end */
    tf_value *dim = ox_num(im, (double)data->shape[axis], ids->type.dtype);
    tf_value *w[3] = {ox_op2(im, TF_OP_LT, ids, ox_num(im, 0, ids->type.dtype)), ox_op2(im, TF_OP_ADD, ids, dim), ids};
    return ox_set_out(im, 0, gather_axis(im, x, ox_op(im, TF_OP_WHERE, w, 3, NULL, 0), axis));
}

/* Slice: starts/ends/axes/steps (attributes before opset 10, constant inputs after); one tfuse slice per axis. */
int ox_slice(importer *im, int arg)
{
    (void)arg;
    ival *x = ox_need(im, 0);
    if (!x) return -1;
    int64_t st[TF_MAX_RANK], en[TF_MAX_RANK], ax[TF_MAX_RANK], sp[TF_MAX_RANK];
    int ns, ne, na, np;
    if (ox_ints_of(im, im->opset < 10 ? "starts" : NULL, 1, st, &ns, TF_MAX_RANK) ||
        ox_ints_of(im, im->opset < 10 ? "ends" : NULL, 2, en, &ne, TF_MAX_RANK) ||
        ox_ints_of(im, im->opset < 10 ? "axes" : NULL, 3, ax, &na, TF_MAX_RANK) || ox_ints_of(im, NULL, 4, sp, &np, TF_MAX_RANK))
        return -1;
    if (ns < 0 || ne != ns) return ox_fail(im, "starts and ends must be given, as many of each");
    if ((na >= 0 && na != ns) || (np >= 0 && np != ns)) return ox_fail(im, "axes and steps, where given, must be as many as starts");
    tf_value *v = ox_in_val(im, 0);
    for (int i = 0; v && i < ns; i++) {
        int64_t axis = 0;
        if (ox_norm_axis(im, na >= 0 ? ax[i] : i, x->rank, &axis)) return -1;
        int64_t step = np >= 0 ? sp[i] : 1, dim = v->type.dims[axis].n;
        if (step == 0) return ox_fail(im, "a step of 0");
        int64_t s = st[i] < 0 ? st[i] + dim : st[i], e = en[i] < 0 ? en[i] + dim : en[i];
        if (step < 0) {   /* backwards: start clamped to [0, dim-1], end to [-1, dim-1]; the elements gathered */
            s = s < 0 ? -1 : s > dim - 1 ? dim - 1 : s;
            e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
            if (s <= e) return ox_fail(im, "an empty slice [%lld:%lld:%lld] of axis %lld", (long long)s, (long long)e, (long long)step,
                                    (long long)axis);
            ival ids = {.dt = TF_DT_I64, .rank = 1, .shape = {(s - e + (-step) - 1) / (-step)}};
            if (!(ids.c = ox_own(im, ids.shape[0]))) return -1;
            for (int64_t k = 0; k < ids.shape[0]; k++) ids.c[k] = (double)(s + k * step);
            v = gather_axis(im, v, ox_val(im, &ids, "slice_indices"), axis);
            continue;
        }
        s = s < 0 ? 0 : s > dim ? dim : s;
        e = e < 0 ? 0 : e > dim ? dim : e;
        if (s == 0 && e == dim && step == 1) continue;
        if (e <= s) return ox_fail(im, "an empty slice [%lld:%lld] of axis %lld", (long long)s, (long long)e, (long long)axis);
        tf_named_attr a[4] = {{"axis", tf_attr_int(axis)}, {"start", tf_attr_int(s)}, {"end", tf_attr_int(e)}, {"step", tf_attr_int(step)}};
        v = ox_op(im, TF_OP_SLICE, &v, 1, a, 4);
    }
    return ox_set_out(im, 0, v);
}

/* Pad: per axis, a crop (negative pads) then constant blocks concatenated (mode constant) or the elements that reflect,
 * edge or wrap name, gathered. Pads, value and axes: attributes before opset 11, constant inputs after. */
int ox_pad(importer *im, int arg)
{
    (void)arg;
    tf_value *v = ox_in_val(im, 0);
    if (!v) return -1;
    int r = v->type.rank;
    int64_t pads[2 * TF_MAX_RANK], axes[TF_MAX_RANK];
    int np, na = -1;
    if (ox_ints_of(im, im->opset < 11 ? "pads" : NULL, 1, pads, &np, 2 * TF_MAX_RANK)) return -1;
    if (im->opset >= 18 && ox_ints_of(im, NULL, 3, axes, &na, TF_MAX_RANK)) return -1;
    if (na < 0) {
        na = r;
        for (int i = 0; i < r; i++) axes[i] = i;
    }
    if (np != 2 * na) return ox_fail(im, "pads holds %d values for %d axes (it needs two per axis)", np, na);
    const tf_onnx_attr *ma = ox_attr(im, "mode");
    int mode = !ma || tf_onnx_is(ma->s, "constant") ? 0 : tf_onnx_is(ma->s, "reflect") ? 1 : tf_onnx_is(ma->s, "edge") ? 2
             : tf_onnx_is(ma->s, "wrap") ? 3 : -1;
    if (mode < 0) return ox_fail(im, "mode '%.*s': tfuse pads constant, reflect, edge and wrap", (int)ma->s.n, ma->s.p);
    double value = ox_attr_f(im, "value", 0);
    if (im->opset >= 11 && ox_input(im, 2)) {
        ival *c = ox_input(im, 2);
        if (c->v || !ox_const_of(im, c)) return ox_fail(im, "constant_value must be known when the model is imported");
        value = c->c[0];
    }
    if (im->failed) return -1;
    for (int i = 0; v && i < na; i++) {
        int64_t axis = 0;
        if (ox_norm_axis(im, axes[i], r, &axis)) return -1;
        int64_t b = pads[i], e = pads[i + na], dim = v->type.dims[axis].n;
        if (b < 0 || e < 0) {   /* a crop */
            int64_t s0 = b < 0 ? -b : 0, e0 = dim + (e < 0 ? e : 0);
            if (e0 <= s0) return ox_fail(im, "pads crop axis %lld to nothing", (long long)axis);
            tf_named_attr a[4] = {{"axis", tf_attr_int(axis)}, {"start", tf_attr_int(s0)}, {"end", tf_attr_int(e0)}, {"step", tf_attr_int(1)}};
            v = ox_op(im, TF_OP_SLICE, &v, 1, a, 4);
            b = b < 0 ? 0 : b, e = e < 0 ? 0 : e, dim = e0 - s0;
        }
        if (!b && !e) continue;
        if (b > ((int64_t)1 << 40) || e > ((int64_t)1 << 40)) return ox_fail(im, "pads of more than 2^40");
        if (mode == 0) {
            tf_value *parts[3];
            int n = 0;
            for (int k = 0; k < 2; k++) {
                int64_t len = k ? e : b, shape[TF_MAX_RANK];
                if (!len) continue;
                for (int d = 0; d < r; d++) shape[d] = d == axis ? len : v->type.dims[d].n;
                tf_named_attr at = {"shape", tf_attr_ints(im->m, shape, r)};
                tf_value *c = ox_num(im, value, v->type.dtype);
                tf_value *blk = c ? ox_op(im, TF_OP_BROADCAST, &c, 1, &at, 1) : NULL;
                if (!k) parts[n++] = blk, parts[n++] = v;
                else {
                    if (!n) parts[n++] = v;
                    parts[n++] = blk;
                }
            }
            if (n == 1) parts[n++] = v;
            tf_named_attr ca = {"axis", tf_attr_int(axis)};
            v = ox_op(im, TF_OP_CONCAT, parts, n, &ca, 1);
            continue;
        }
        if (mode == 1 && dim < 2) return ox_fail(im, "reflect padding of an axis of %lld element", (long long)dim);
        ival ids = {.dt = TF_DT_I64, .rank = 1, .shape = {b + dim + e}};
        if (!(ids.c = ox_own(im, ids.shape[0]))) return -1;
        for (int64_t j = -b; j < dim + e; j++) {
            int64_t k = j;
            if (mode == 2) k = j < 0 ? 0 : j >= dim ? dim - 1 : j;
            else if (mode == 3) k = ((j % dim) + dim) % dim;
            else {   /* reflect: mirror at the ends without repeating them, period 2 (dim - 1) */
                int64_t per = 2 * (dim - 1);
                k = ((j % per) + per) % per;
                if (k >= dim) k = per - k;
            }
            ids.c[j + b] = (double)k;
        }
        v = gather_axis(im, v, ox_val(im, &ids, "pad_indices"), axis);
    }
    return ox_set_out(im, 0, v);
}

int ox_split(importer *im, int arg)
{
    (void)arg;
    tf_value *x = ox_in_val(im, 0);
    if (!x) return -1;
    int64_t axis = 0;
    if (ox_norm_axis(im, ox_attr_i(im, "axis", 0), x->type.rank, &axis)) return -1;
    int64_t sizes[64];
    int n, nout = im->node->nout;
    if (nout > 64) return ox_fail(im, "Split into %d parts (at most 64)", nout);
    if (ox_ints_of(im, im->opset < 13 ? "split" : NULL, 1, sizes, &n, 64)) return -1;
    int64_t dim = x->type.dims[axis].n;
    if (n < 0) {   /* equal parts (the last smaller, from opset 18) */
        int64_t part = (dim + nout - 1) / nout;
        for (int i = 0; i < nout; i++) sizes[i] = i < nout - 1 ? part : dim - part * (nout - 1);
        n = nout;
    }
    if (n != nout) return ox_fail(im, "%d sizes for %d outputs", n, nout);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (sizes[i] <= 0 || at + sizes[i] > dim) return ox_fail(im, "part %d of size %lld does not fit axis %lld of size %lld", i, (long long)sizes[i], (long long)axis, (long long)dim);
        tf_named_attr a[3] = {{"axis", tf_attr_int(axis)}, {"start", tf_attr_int(at)}, {"end", tf_attr_int(at + sizes[i])}};
        if (ox_set_out(im, i, ox_op(im, TF_OP_SLICE, &x, 1, a, 3))) return -1;
        at += sizes[i];
    }
    return 0;
}

