/* attention.c — what attention computes, once: the shape rules and the
 * reference kernels (float64) of `attention` and of the fused ops `lower`
 * makes of it, flash_attention and flash_attention_grad. The cpu and cuda
 * kernels are checked against these.
 *
 * attention(q [B, H, Tq, D], k [B, Hk, Tk, D], v [B, Hk, Tk, Dv] [, mask])
 *   s_ij = scale * q_i . k_j (+ mask_ij when the mask is a float), over the
 *   keys j visible to query i: j <= i when causal (top-left aligned, as
 *   PyTorch's is_causal), and mask_ij true when the mask is bool. Query head
 *   h reads key/value head h / (H / Hk) (grouped-query and multi-query
 *   attention). The mask broadcasts to [B, H, Tq, Tk] from the right.
 *   P_i = softmax(s_i) over the visible keys; a row with no visible key
 *   (every score -inf) is 0, not NaN, and so is its gradient. In train mode
 *   with dropout p, P_ij is kept with probability 1 - p and scaled by
 *   1/(1-p) (rounded to f32), drawn as dropout draws over the flat index of
 *   [B, H, Tq, Tk] with the stream of `salt`. O_i = sum_j P_ij v_j, where
 *   for f16/bf16 storage each exp(s_ij - max) is rounded to that dtype
 *   before it multiplies v (the sum that normalizes it is not), as the
 *   decomposed form rounds its probabilities before their matmul and as
 *   tensor-core kernels multiply them.
 * flash_attention: the same (scale given); lse=true makes the result f32
 *   (f64 for f64 operands) [B, H, Tq, Dv + 1], whose last column is the row's log-sum-exp
 *   max_j s_ij + log sum_j exp(s_ij - max) (-inf for an empty row).
 * flash_attention_grad(q, k, v, out, dout [, mask]): out is flash_attention's
 *   lse=true result; dout is O's gradient [B, H, Tq, Dv], or out's [.., Dv+1]
 *   whose last column is the log-sum-exp's. The result, f32 (f64), is dq, dk and
 *   dv flattened one after the other. With P_ij = exp(s_ij - lse_i), Z_ij
 *   the dropout factor and D_i = dO_i . O_i - dlse_i:
 *   dV_j = sum_i P_ij Z_ij dO_i; dP_ij = Z_ij dO_i . v_j;
 *   dS_ij = P_ij (dP_ij - D_i); dQ_i = scale sum_j dS_ij k_j;
 *   dK_j = scale sum_i dS_ij q_i (key/value gradients summed over the query
 *   heads of a group); for f16/bf16 storage P_ij Z_ij and dO are rounded to
 *   that dtype in dV's sum (as in the forward's; dP, dS and D_i are not:
 *   dS_ij = P_ij (dP_ij - D_i) cancels along the row, and rounding its
 *   terms would make dq and dk noise). A float mask gets no gradient here: `lower` keeps an
 *   attention whose mask is learned decomposed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "interp.h"

#define ERR(...) tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc, __VA_ARGS__)
#define OPNAME (tf_op_table[n->op].name)
#define IN(i) (&n->in[i]->type)

/* ---- geometry ---- */

static int mask_operand(const tf_node *n)
{
    int at = n->op == TF_OP_FLASH_ATTENTION_GRAD ? 5 : 3;
    return n->nin > at ? at : -1;
}

void tf_attn_geom_of(const tf_node *n, tf_attn_geom *g)
{
    const tf_type *q = IN(0), *k = IN(1), *v = IN(2);
    memset(g, 0, sizeof *g);
    g->B = q->dims[0].n, g->H = q->dims[1].n, g->Tq = q->dims[2].n, g->D = q->dims[3].n;
    g->Hk = k->dims[1].n, g->Tk = k->dims[2].n, g->Dv = v->dims[3].n;
    int si = tf_op_attr_index(n->op, "scale");
    g->scale = n->attrs[si].set || n->op != TF_OP_ATTENTION ? n->attrs[si].u.f : 1.0 / sqrt((double)g->D);
    g->dropout = tf_node_float(n, "dropout");
    g->salt = (uint64_t)tf_node_int(n, "salt");
    g->causal = tf_node_bool(n, "causal");
    g->lse = n->op == TF_OP_FLASH_ATTENTION && tf_node_bool(n, "lse");
    g->mask = mask_operand(n);
    if (g->mask >= 0) {
        const tf_type *m = IN(g->mask);
        g->mask_bool = m->dtype == TF_DT_BOOL;
        int64_t full[4] = {g->B, g->H, g->Tq, g->Tk}, st = 1;
        for (int a = 3, j = m->rank - 1; a >= 0; a--, j--) {
            int64_t len = j >= 0 ? m->dims[j].n : 1;
            g->mstride[a] = len == 1 && full[a] != 1 ? 0 : st;
            st *= len;
        }
    }
}

/* ---- shape rules ---- */

static tf_ir_status check_qkv(tf_module *m, tf_node *n, tf_diag *d)
{
    char b1[256], b2[256], b3[256];
    static const char *what[] = {"q [B, H, Tq, D]", "k [B, Hk, Tk, D]", "v [B, Hk, Tk, Dv]"};
    for (int i = 0; i < 3; i++) {
        if (IN(i)->rank != 4)
            return ERR("%s: %s must have rank 4, found %s", OPNAME, what[i], tf_type_str(m, IN(i), b1));
        if (!tf_dtype_is_float(IN(i)->dtype) || IN(i)->dtype != IN(0)->dtype)
            return ERR("%s: %s must be a float of q's dtype, found %s (q %s)", OPNAME, what[i], tf_type_str(m, IN(i), b1),
                       tf_type_str(m, IN(0), b2));
    }
    const tf_type *q = IN(0), *k = IN(1), *v = IN(2);
    if (q->dims[0].n != k->dims[0].n || k->dims[0].n != v->dims[0].n || k->dims[1].n != v->dims[1].n ||
        q->dims[3].n != k->dims[3].n || k->dims[2].n != v->dims[2].n)
        return ERR("%s: shapes do not agree: q %s, k %s, v %s (expected q [B,H,Tq,D], k [B,Hk,Tk,D], v [B,Hk,Tk,Dv])",
                   OPNAME, tf_type_str(m, q, b1), tf_type_str(m, k, b2), tf_type_str(m, v, b3));
    if (q->dims[1].n % k->dims[1].n)
        return ERR("%s: q has %lld heads and k, v %lld: the query heads must be a multiple of the key/value heads "
                   "(grouped-query attention)", OPNAME, (long long)q->dims[1].n, (long long)k->dims[1].n);
    int mi = mask_operand(n);
    if (mi < 0) return TF_IR_OK;
    const tf_type *mk = IN(mi);
    int64_t full[4] = {q->dims[0].n, q->dims[1].n, q->dims[2].n, k->dims[2].n};
    bool ok = mk->rank >= 1 && mk->rank <= 4 && (mk->dtype == TF_DT_BOOL || tf_dtype_is_float(mk->dtype));
    for (int a = 3, j = mk->rank - 1; ok && j >= 0; a--, j--) ok = mk->dims[j].n == 1 || mk->dims[j].n == full[a];
    if (!ok)
        return ERR("%s: the mask %s must be bool (true: attend) or a float added to the scores, broadcasting to "
                   "[B, H, Tq, Tk] = [%lld, %lld, %lld, %lld]", OPNAME, tf_type_str(m, mk, b1), (long long)full[0],
                   (long long)full[1], (long long)full[2], (long long)full[3]);
    return TF_IR_OK;
}

/* The dtype of the saved result and of the gradients: f32, f64 for f64. */
static tf_dt wide(tf_dt t) { return t == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32; }

tf_ir_status sh_attention(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st = check_qkv(m, n, d);
    if (st) return st;
    *out = *IN(0);
    out->dims[3] = IN(2)->dims[3];
    return TF_IR_OK;
}

tf_ir_status sh_flash_attention(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st = sh_attention(m, n, out, d);
    if (st || !tf_node_bool(n, "lse")) return st;
    out->dtype = wide(IN(0)->dtype);
    out->dims[3] = (tf_dim){out->dims[3].n + 1, -1};
    return TF_IR_OK;
}

tf_ir_status sh_flash_attention_grad(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st = check_qkv(m, n, d);
    if (st) return st;
    const tf_type *q = IN(0), *o = IN(3), *dy = IN(4);
    int64_t Dv = IN(2)->dims[3].n;
    char b1[256], b2[256];
    bool ok = o->rank == 4 && o->dtype == wide(q->dtype) && o->dims[3].n == Dv + 1;
    for (int a = 0; ok && a < 3; a++) ok = o->dims[a].n == q->dims[a].n;
    if (!ok)
        return ERR("%s: out %s must be flash_attention's result with lse=true: %s [B, H, Tq, Dv + 1] (q %s)", OPNAME,
                   tf_type_str(m, o, b1), tf_dtype_name(wide(q->dtype)), tf_type_str(m, q, b2));
    ok = dy->rank == 4 && tf_dtype_is_float(dy->dtype) && (dy->dims[3].n == Dv || dy->dims[3].n == Dv + 1);
    for (int a = 0; ok && a < 3; a++) ok = dy->dims[a].n == q->dims[a].n;
    if (!ok)
        return ERR("%s: dout %s must be the gradient of out %s, or of its first Dv columns", OPNAME, tf_type_str(m, dy, b1),
                   tf_type_str(m, o, b2));
    out->dtype = wide(q->dtype);
    out->rank = 1;
    out->dims[0] = (tf_dim){tf_type_numel(q) + tf_type_numel(IN(1)) + tf_type_numel(IN(2)), -1};
    return TF_IR_OK;
}

/* ---- reference kernels ---- */

static tf_ir_status oom(tf_interp_ctx *ip, const tf_node *n)
{
    return tf_diag_error(tf_interp_diag(ip), TF_IR_ERR_OOM, &n->loc, "%s: out of memory for the interpreter's scratch space",
                         OPNAME);
}

/* Row i of (b, h)'s scores into s[0..Tk): -inf where not visible. */
static void scores(const tf_attn_geom *g, const tf_tensor *const *in, int64_t b, int64_t h, int64_t i, double *s)
{
    int64_t hk = h / (g->H / g->Hk);
    const double *qi = in[0]->data + ((b * g->H + h) * g->Tq + i) * g->D;
    const double *kb = in[1]->data + (b * g->Hk + hk) * g->Tk * g->D;
    const double *mk = g->mask >= 0 ? in[g->mask]->data + b * g->mstride[0] + h * g->mstride[1] + i * g->mstride[2] : NULL;
    for (int64_t j = 0; j < g->Tk; j++) {
        double mv = mk ? mk[j * g->mstride[3]] : 0;
        if ((g->causal && j > i) || (mk && g->mask_bool && mv == 0)) {
            s[j] = -INFINITY;
            continue;
        }
        double acc = 0;
        for (int64_t e = 0; e < g->D; e++) acc += qi[e] * kb[j * g->D + e];
        s[j] = acc * g->scale + (mk && !g->mask_bool ? mv : 0);
    }
}

/* The dropout factor of P_ij at flat index idx (1 without dropout). */
static double keep(const tf_attn_geom *g, tf_interp_ctx *ip, uint64_t stream, int64_t idx)
{
    if (g->dropout <= 0 || tf_interp_mode(ip) != TF_IR_TRAIN) return 1;
    return tf_rng_uniform(tf_interp_seed(ip), stream, (uint64_t)idx) >= g->dropout ? (double)(float)(1.0 / (1.0 - g->dropout))
                                                                                    : 0.0;
}

static tf_ir_status forward(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    tf_attn_geom g;
    tf_attn_geom_of(n, &g);
    double *s = tf_malloc((size_t)(g.Tk > 0 ? g.Tk : 1) * sizeof *s);
    if (!s) return oom(ip, n);
    uint64_t stream = tf_dropout_stream(tf_interp_step(ip), g.salt);
    int64_t W = g.Dv + g.lse;
    tf_dt half = in[0]->dtype == TF_DT_F16 || in[0]->dtype == TF_DT_BF16 ? in[0]->dtype : TF_DT_F64;
    for (int64_t b = 0; b < g.B; b++)
        for (int64_t h = 0; h < g.H; h++) {
            const double *vb = in[2]->data + (b * g.Hk + h / (g.H / g.Hk)) * g.Tk * g.Dv;
            for (int64_t i = 0; i < g.Tq; i++) {
                double *o = out->data + ((b * g.H + h) * g.Tq + i) * W;
                int64_t row = ((b * g.H + h) * g.Tq + i) * g.Tk;
                scores(&g, in, b, h, i, s);
                double mx = -INFINITY, l = 0;
                for (int64_t j = 0; j < g.Tk; j++) mx = s[j] > mx ? s[j] : mx;
                for (int64_t e = 0; e < W; e++) o[e] = 0;
                if (mx == -INFINITY) {
                    if (g.lse) o[g.Dv] = -INFINITY;
                    continue;
                }
                for (int64_t j = 0; j < g.Tk; j++) l += s[j] = exp(s[j] - mx);
                for (int64_t j = 0; j < g.Tk; j++) {
                    double p = tf_dtype_round(half, s[j]) / l * keep(&g, ip, stream, row + j);
                    if (p != 0)
                        for (int64_t e = 0; e < g.Dv; e++) o[e] += p * vb[j * g.Dv + e];
                }
                if (g.lse) o[g.Dv] = mx + log(l);
            }
        }
    tf_free(s);
    return TF_IR_OK;
}

tf_ir_status ik_attention(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    return forward(ip, n, in, out);
}

tf_ir_status ik_flash_attention(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    return forward(ip, n, in, out);
}

tf_ir_status ik_flash_attention_grad(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    tf_attn_geom g;
    tf_attn_geom_of(n, &g);
    double *s = tf_malloc((size_t)(g.Tk > 0 ? g.Tk : 1) * sizeof *s);
    if (!s) return oom(ip, n);
    uint64_t stream = tf_dropout_stream(tf_interp_step(ip), g.salt);
    int64_t nq = g.B * g.H * g.Tq * g.D, nk = g.B * g.Hk * g.Tk * g.D, Wo = g.Dv + 1, Wd = in[4]->dims[3];
    double *dq = out->data, *dk = dq + nq, *dv = dk + nk;
    tf_dt half = in[0]->dtype == TF_DT_F16 || in[0]->dtype == TF_DT_BF16 ? in[0]->dtype : TF_DT_F64;
    memset(out->data, 0, (size_t)out->numel * sizeof *out->data);
    for (int64_t b = 0; b < g.B; b++)
        for (int64_t h = 0; h < g.H; h++) {
            int64_t kv = (b * g.Hk + h / (g.H / g.Hk)) * g.Tk;
            const double *kb = in[1]->data + kv * g.D, *vb = in[2]->data + kv * g.Dv;
            for (int64_t i = 0; i < g.Tq; i++) {
                int64_t qi = (b * g.H + h) * g.Tq + i;
                const double *o = in[3]->data + qi * Wo, *dy = in[4]->data + qi * Wd, *q = in[0]->data + qi * g.D;
                double lse = o[g.Dv];
                if (lse == -INFINITY) continue;
                double Di = 0;
                for (int64_t e = 0; e < g.Dv; e++) Di += dy[e] * o[e];
                if (Wd > g.Dv) Di -= dy[g.Dv];
                scores(&g, in, b, h, i, s);
                for (int64_t j = 0; j < g.Tk; j++) {
                    if (s[j] == -INFINITY) continue;
                    double p = exp(s[j] - lse), z = keep(&g, ip, stream, qi * g.Tk + j), dp = 0;
                    double pz = tf_dtype_round(half, p * z);
                    for (int64_t e = 0; e < g.Dv; e++) {
                        double dye = tf_dtype_round(half, dy[e]);
                        dv[(kv + j) * g.Dv + e] += pz * dye;
                        dp += dy[e] * vb[j * g.Dv + e];
                    }
                    double ds = p * (z * dp - Di) * g.scale;
                    for (int64_t e = 0; e < g.D; e++) {
                        dq[qi * g.D + e] += ds * kb[j * g.D + e];
                        dk[(kv + j) * g.D + e] += ds * q[e];
                    }
                }
            }
        }
    tf_free(s);
    return TF_IR_OK;
}
