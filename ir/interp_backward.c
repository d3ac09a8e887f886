/* interp_backward.c — the reference interpreter's kernels for the backward
 * ops of ops.def (conv2d_grad_input, conv2d_grad_weight, maxpool2d_grad,
 * avgpool2d_grad, scatter_add, slice_grad): the exact vector-Jacobian
 * products of conv2d, maxpool2d, avgpool2d, gather/embedding and slice, with
 * PyTorch's semantics. They are the float64 oracle for what autodiff emits.
 *
 * Same conventions as interp_kernels.c: in[i] are the operands; out is
 * allocated and zeroed with the shape of the shape rule (ops.c), which has
 * already checked that the forward op maps out's shape (the `shape`/`size`
 * attribute, or x for maxpool2d_grad) onto dy's. Kernels accumulate into out
 * in double; the driver rounds to the dtype afterwards.
 *
 * Every kernel walks the forward op's loops and scatters each dy element
 * back to the inputs it was computed from, so overlapping windows, dilation
 * and groups add up exactly as the forward op combined them:
 *  - conv2d: y[n,o,oh,ow] = sum_{c,kh,kw} x[n, g*Cg + c, ih, iw] * w[o,c,kh,kw]
 *    with ih = oh*s - p + kh*dil (same for w), g = o / (O/groups).
 *  - maxpool2d: dy goes to the position the forward kernel (pool2d in
 *    interp_kernels.c) takes its value from: padding is -inf, a later element
 *    replaces the running max only if it is strictly greater or NaN, and a
 *    NaN is never replaced. So ties go to the FIRST maximum in row-major
 *    window order, a NaN window to its first NaN, and an all -inf window to
 *    its first in-bounds element (PyTorch's choice too).
 *  - avgpool2d: count_include_pad, each window divides by kh*kw.
 *  - scatter_add: rows of the table accumulate dy for every id (repeated ids
 *    add up); an id out of [0, V) is TF_IR_ERR_RUNTIME, as in ik_embedding.
 *  - slice_grad: zeros, with dy written at the sliced positions (Python
 *    slice start: negative counts from the end, then clamped, as ik_slice). */
#include <string.h>

#include "interp.h"

#define OPNAME (tf_op_table[n->op].name)
#define DIAG   tf_interp_diag(ip)


static tf_ir_status bad_rank(tf_interp_ctx *ip, const tf_node *n)
{
    return tf_diag_error(DIAG, TF_IR_ERR_INTERNAL, &n->loc, "%s: operands and result must have rank 4", OPNAME);
}

/* ---- convolution ------------------------------------------------------------------- */

/* The forward conv's geometry, from the dims of x [N,C,H,W], w [O,C/g,kh,kw]
 * and dy [N,O,Ho,Wo] (one of them being the kernel's result). */
typedef struct conv_geom {
    int64_t N, C, H, W, O, Cg, KH, KW, Ho, Wo, Og;
    int64_t s[2], p[2], dl[2];
} conv_geom;

static bool conv_geom_of(const tf_node *n, const tf_tensor *x, const tf_tensor *w, const tf_tensor *dy,
                         conv_geom *g)
{
    if (x->rank != 4 || w->rank != 4 || dy->rank != 4) return false;
    tf_node_pair(n, "stride", 1, 1, g->s);
    tf_node_pair(n, "padding", 0, 0, g->p);
    tf_node_pair(n, "dilation", 1, 1, g->dl);
    int64_t G = tf_node_int(n, "groups");
    if (G < 1) G = 1;
    g->N = x->dims[0], g->C = x->dims[1], g->H = x->dims[2], g->W = x->dims[3];
    g->O = w->dims[0], g->Cg = w->dims[1], g->KH = w->dims[2], g->KW = w->dims[3];
    g->Ho = dy->dims[2], g->Wo = dy->dims[3], g->Og = g->O / G;
    return g->Og > 0;
}

/* Walk conv2d's loops; for every (output, tap) pair that reads an in-bounds
 * input element: dx[x_i] += dy * w[w_i] (dx given) or dw[w_i] += dy * x[x_i]. */
static void conv_backward(const conv_geom *g, const double *dy, const double *x, const double *w, double *dx,
                          double *dw)
{
    for (int64_t nb = 0; nb < g->N; nb++)
        for (int64_t o = 0; o < g->O; o++) {
            int64_t c0 = (o / g->Og) * g->Cg;
            const double *pdy = dy + (nb * g->O + o) * g->Ho * g->Wo;
            for (int64_t oh = 0; oh < g->Ho; oh++)
                for (int64_t ow = 0; ow < g->Wo; ow++) {
                    double gy = pdy[oh * g->Wo + ow];
                    for (int64_t c = 0; c < g->Cg; c++) {
                        int64_t xb = (nb * g->C + c0 + c) * g->H * g->W, wb = (o * g->Cg + c) * g->KH * g->KW;
                        for (int64_t kh = 0; kh < g->KH; kh++) {
                            int64_t ih = oh * g->s[0] - g->p[0] + kh * g->dl[0];
                            if (ih < 0 || ih >= g->H) continue;
                            for (int64_t kw = 0; kw < g->KW; kw++) {
                                int64_t iw = ow * g->s[1] - g->p[1] + kw * g->dl[1];
                                if (iw < 0 || iw >= g->W) continue;
                                int64_t xi = xb + ih * g->W + iw, wi = wb + kh * g->KW + kw;
                                if (dx) dx[xi] += gy * w[wi];
                                else dw[wi] += gy * x[xi];
                            }
                        }
                    }
                }
        }
}

/* conv2d_grad_input(dy, w; shape=[N,C,H,W]) = dL/dx. */
tf_ir_status ik_conv2d_grad_input(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    const tf_tensor *dy = in[0], *w = in[1];
    conv_geom g;
    if (!conv_geom_of(n, out, w, dy, &g)) return bad_rank(ip, n);
    conv_backward(&g, dy->data, NULL, w->data, out->data, NULL);
    return TF_IR_OK;
}

/* conv2d_grad_weight(x, dy; shape=[O,C/g,kh,kw]) = dL/dw. */
tf_ir_status ik_conv2d_grad_weight(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    const tf_tensor *x = in[0], *dy = in[1];
    conv_geom g;
    if (!conv_geom_of(n, x, out, dy, &g)) return bad_rank(ip, n);
    conv_backward(&g, dy->data, x->data, NULL, NULL, out->data);
    return TF_IR_OK;
}

/* ---- pooling ----------------------------------------------------------------------- */

/* Scatter dy [planes, Ho, Wo] back onto dx [planes, H, W] (same planes).
 * x NULL: avgpool, every in-bounds element of a window gets dy / (kh*kw).
 * x given: maxpool, the window's selected element (see the header) gets dy. */
static void pool_backward(const tf_node *n, const tf_tensor *x, const tf_tensor *dy, tf_tensor *dx)
{
    int64_t k[2], s[2], p[2];
    tf_node_pair(n, "kernel", 1, 1, k);
    tf_node_pair(n, "stride", k[0], k[1], s);
    tf_node_pair(n, "padding", 0, 0, p);
    int64_t planes = dx->dims[0] * dx->dims[1], H = dx->dims[2], W = dx->dims[3];
    int64_t Ho = dy->dims[2], Wo = dy->dims[3];
    double inv = 1.0 / (double)(k[0] * k[1]);
    for (int64_t pl = 0; pl < planes; pl++) {
        const double *px = x ? x->data + pl * H * W : NULL, *pdy = dy->data + pl * Ho * Wo;
        double *pdx = dx->data + pl * H * W;
        for (int64_t oh = 0; oh < Ho; oh++)
            for (int64_t ow = 0; ow < Wo; ow++) {
                double gy = pdy[oh * Wo + ow], best = 0.0;
                int64_t at = -1;   /* maxpool: flat position of the selected element */
                for (int64_t kh = 0; kh < k[0]; kh++) {
                    int64_t ih = oh * s[0] - p[0] + kh;
                    if (ih < 0 || ih >= H) continue;
                    for (int64_t kw = 0; kw < k[1]; kw++) {
                        int64_t iw = ow * s[1] - p[1] + kw;
                        if (iw < 0 || iw >= W) continue;
                        int64_t i = ih * W + iw;
                        if (!px) {
                            pdx[i] += gy * inv;
                            continue;
                        }
                        /* The first in-bounds element is what pool2d's running
                         * max holds after it (from -inf); then its update rule. */
                        double v = px[i];
                        if (at < 0 || (best == best && (v != v || v > best))) {
                            best = v;
                            at = i;
                        }
                    }
                }
                if (at >= 0) pdx[at] += gy;   /* a window wholly in padding reads nothing */
            }
    }
}

/* maxpool2d_grad(x, dy; kernel, stride, padding) = dL/dx. */
tf_ir_status ik_maxpool2d_grad(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    if (in[0]->rank != 4 || in[1]->rank != 4 || out->rank != 4) return bad_rank(ip, n);
    pool_backward(n, in[0], in[1], out);
    return TF_IR_OK;
}

/* avgpool2d_grad(dy; kernel, stride, padding, shape=[N,C,H,W]) = dL/dx. */
tf_ir_status ik_avgpool2d_grad(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    if (in[0]->rank != 4 || out->rank != 4) return bad_rank(ip, n);
    pool_backward(n, NULL, in[0], out);
    return TF_IR_OK;
}

/* ---- gather and slice -------------------------------------------------------------- */

/* scatter_add(ids, dy; shape=[V, ...]): out[id, j...] += dy[i..., j...] for
 * every i with ids[i...] = id. */
tf_ir_status ik_scatter_add(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    const tf_tensor *ids = in[0], *dy = in[1];
    int64_t V = out->rank ? out->dims[0] : 1, row = out->numel / (V > 0 ? V : 1);
    if (dy->numel != ids->numel * row)
        return tf_diag_error(DIAG, TF_IR_ERR_INTERNAL, &n->loc, "%s: dy has %lld elements, expected %lld", OPNAME,
                             (long long)dy->numel, (long long)(ids->numel * row));
    for (int64_t i = 0; i < ids->numel; i++) {
        double v = ids->data[i];
        if (!(v >= 0 && v < (double)V))
            return tf_diag_error(DIAG, TF_IR_ERR_RUNTIME, &n->loc,
                                 "%s: id %lld at position %lld is out of range [0, %lld)", OPNAME, (long long)v,
                                 (long long)i, (long long)V);
        double *dst = out->data + (int64_t)v * row;
        const double *src = dy->data + i * row;
        for (int64_t j = 0; j < row; j++) dst[j] += src[j];
    }
    return TF_IR_OK;
}

/* slice_grad(dy; axis, start, end, step, size): out viewed as [outer, size,
 * inner] and dy as [outer, m, inner]; out[o, start + j*step, i] = dy[o, j, i]. */
tf_ir_status ik_slice_grad(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    const tf_tensor *dy = in[0];
    int ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), out->rank, &ax) || dy->rank != out->rank)
        return tf_diag_error(DIAG, TF_IR_ERR_INTERNAL, &n->loc, "%s: axis %lld is out of range for rank %d", OPNAME,
                             (long long)tf_node_int(n, "axis"), out->rank);
    int64_t len = out->dims[ax], m = dy->dims[ax], start = tf_node_int(n, "start"), step = tf_node_int(n, "step");
    tf_slice_bounds(len, start, len, &start, NULL);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < ax; i++) outer *= out->dims[i];
    for (int i = ax + 1; i < out->rank; i++) inner *= out->dims[i];
    if (m > 0 && start + (m - 1) * step >= len)
        return tf_diag_error(DIAG, TF_IR_ERR_INTERNAL, &n->loc, "%s: dy's axis %d (%lld) does not fit the slice",
                             OPNAME, ax, (long long)m);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < m; j++)
            memcpy(out->data + (o * len + start + j * step) * inner, dy->data + (o * m + j) * inner,
                   (size_t)inner * sizeof *out->data);
    return TF_IR_OK;
}
