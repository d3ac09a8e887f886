/* interp_kernels.c — the reference interpreter's kernels: one ik_<NAME> per
 * INTERP entry of ops.def, the float64 oracle every backend is checked against.
 *
 * Conventions (see interp.h and ops.h):
 *  - in[i] are the operands, out is allocated (dims/rank/numel/dtype from the
 *    shape rules in ops.c, data zeroed). Tensors are row-major doubles; a
 *    number written as an operand is a rank-0 tensor. Every kernel writes
 *    every element of out. The driver rounds out to its dtype afterwards, so
 *    kernels compute and accumulate in double.
 *  - Semantics are PyTorch's with tfuse's layouts: linear weights are
 *    [in, out], conv2d is NCHW with weights [O, C/groups, kh, kw], class and
 *    normalized axes are the last axis (cross_entropy, layernorm), batchnorm's
 *    channel axis is 1, embedding/gather take (ids, table).
 *  - Attributes come from tf_node_* getters. stride/padding/dilation/kernel
 *    are one value for both spatial axes or [h, w]; pool stride [] = kernel.
 *  - Bad data (ids, labels out of range) is TF_IR_ERR_RUNTIME naming the op,
 *    the value, its flat position and the valid range. Scratch memory is
 *    malloc'd, checked (TF_IR_ERR_OOM) and freed on every path.
 *  - Dropout draws u_i = tf_rng_uniform(seed, stream, i) for flat index i,
 *    stream = mix64(mix64(step ^ "dropout" as 0x64726f706f7574) ^ salt) with
 *    mix64 splitmix64's finalizer, and keeps element i when u_i >= p; the
 *    kept value is x_i * s with s = 1/(1-p) rounded to the result dtype, so
 *    mul(x, dropout_mask(x)) equals dropout(x) bit for bit.
 *
 * Shared machinery: `iter` walks a shape in row-major order carrying one
 * offset per operand (strides may be 0 for broadcast axes, scaled for slices,
 * permuted for transposes); bcast_strides right-aligns an operand against a
 * result shape; split3 views a tensor as [outer, len, inner] around an axis. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "interp.h"

#define OPNAME (tf_op_table[n->op].name)
#define DIAG   tf_interp_diag(ip)

static tf_ir_status oom(tf_interp_ctx *ip, const tf_node *n)
{
    return tf_diag_error(DIAG, TF_IR_ERR_OOM, &n->loc, "%s: out of memory for the interpreter's scratch space", OPNAME);
}

static tf_ir_status bad_axis(tf_interp_ctx *ip, const tf_node *n, int64_t axis, int rank)
{
    return tf_diag_error(DIAG, TF_IR_ERR_RUNTIME, &n->loc, "%s: axis %lld is out of range for rank %d", OPNAME,
                         (long long)axis, rank);
}

static tf_ir_status out_of_range(tf_interp_ctx *ip, const tf_node *n, const char *what, double v, int64_t pos,
                                 int64_t hi)
{
    return tf_diag_error(DIAG, TF_IR_ERR_RUNTIME, &n->loc, "%s: %s %lld at position %lld is out of range [0, %lld)",
                         OPNAME, what, (long long)v, (long long)pos, (long long)hi);
}

/* An integer-valued element (ids, labels) as an index in [0, hi), or -1. */
static int64_t as_index(double v, int64_t hi)
{
    return v >= 0 && v < (double)hi ? (int64_t)v : -1;
}

/* ---- shapes and strided iteration ------------------------------------------ */

static int64_t prod(const int64_t *d, int lo, int hi)
{
    int64_t p = 1;
    for (int i = lo; i < hi; i++) p *= d[i];
    return p;
}

/* Row-major strides of dims[0..rank), in units of `unit` elements. */
static void contig_strides(const int64_t *dims, int rank, int64_t unit, int64_t *st)
{
    int64_t s = unit;
    for (int i = rank - 1; i >= 0; i--) {
        st[i] = s;
        s *= dims[i];
    }
}

/* Strides of a source with dims sdims[0..srank) (row-major, times unit) seen
 * through a result of rank orank: right-aligned, 0 on missing and size-1 axes. */
static void bcast_strides(const int64_t *sdims, int srank, int64_t unit, int orank, int64_t *st)
{
    int64_t cs[TF_MAX_RANK];
    contig_strides(sdims, srank, unit, cs);
    for (int ax = 0; ax < orank; ax++) {
        int j = ax - (orank - srank);
        st[ax] = (j < 0 || sdims[j] == 1) ? 0 : cs[j];
    }
}

enum { IT_OPS = 3 };

/* Row-major walk over dims, one running offset per operand. */
typedef struct iter {
    int rank, nops;
    int64_t dims[TF_MAX_RANK], idx[TF_MAX_RANK];
    int64_t st[IT_OPS][TF_MAX_RANK];
    int64_t off[IT_OPS];
} iter;

static void it_init(iter *it, int rank, const int64_t *dims, int nops)
{
    memset(it, 0, sizeof *it);
    it->rank = rank;
    it->nops = nops;
    for (int i = 0; i < rank; i++) it->dims[i] = dims[i];
}

static void it_next(iter *it)
{
    for (int ax = it->rank - 1; ax >= 0; ax--) {
        for (int k = 0; k < it->nops; k++) it->off[k] += it->st[k][ax];
        if (++it->idx[ax] < it->dims[ax]) return;
        for (int k = 0; k < it->nops; k++) it->off[k] -= it->st[k][ax] * it->dims[ax];
        it->idx[ax] = 0;
    }
}

/* Iterate out's shape with operands ops[0..k) broadcast into it. */
static void bcast_setup(iter *it, const tf_tensor *out, const tf_tensor *const *ops, int k)
{
    it_init(it, out->rank, out->dims, k);
    for (int i = 0; i < k; i++) bcast_strides(ops[i]->dims, ops[i]->rank, 1, out->rank, it->st[i]);
}

/* dst[dbase + dst_st . idx] = src[sbase + src_st . idx] for every idx of dims. */
static void copy_strided(double *dst, int64_t dbase, const int64_t *dst_st, const double *src, int64_t sbase,
                         const int64_t *src_st, int rank, const int64_t *dims)
{
    iter it;
    it_init(&it, rank, dims, 2);
    for (int i = 0; i < rank; i++) {
        it.st[0][i] = dst_st[i];
        it.st[1][i] = src_st[i];
    }
    int64_t total = prod(dims, 0, rank);
    for (int64_t i = 0; i < total; i++, it_next(&it)) dst[dbase + it.off[0]] = src[sbase + it.off[1]];
}

/* View t as [outer, len, inner] around axis ax (rank 0: one element). */
static void split3(const tf_tensor *t, int ax, int64_t *outer, int64_t *len, int64_t *inner)
{
    if (t->rank == 0) {
        *outer = *len = *inner = 1;
        return;
    }
    *outer = prod(t->dims, 0, ax);
    *len = t->dims[ax];
    *inner = prod(t->dims, ax + 1, t->rank);
}


/* ---- pointwise ---------------------------------------------------------------- */

tf_ir_status ik_pointwise(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    tf_scalar_fn f = tf_op_table[n->op].scalar;
    if (!f || n->nin < 1 || n->nin > 2)
        return tf_diag_error(DIAG, TF_IR_ERR_INTERNAL, &n->loc, "%s: no scalar function for a pointwise kernel",
                             OPNAME);
    iter it;
    bcast_setup(&it, out, in, n->nin);
    for (int64_t i = 0; i < out->numel; i++, it_next(&it)) {
        double a = in[0]->data[it.off[0]];
        double b = n->nin == 2 ? in[1]->data[it.off[1]] : 0.0;
        out->data[i] = f(a, b);
    }
    return TF_IR_OK;
}

tf_ir_status ik_where(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip; (void)n;
    iter it;
    bcast_setup(&it, out, in, 3);
    for (int64_t i = 0; i < out->numel; i++, it_next(&it))
        out->data[i] = in[0]->data[it.off[0]] != 0 ? in[1]->data[it.off[1]] : in[2]->data[it.off[2]];
    return TF_IR_OK;
}

tf_ir_status ik_copy(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    if (in[0]->numel != out->numel)
        return tf_diag_error(DIAG, TF_IR_ERR_INTERNAL, &n->loc, "%s: %lld elements in, %lld out", OPNAME,
                             (long long)in[0]->numel, (long long)out->numel);
    memcpy(out->data, in[0]->data, (size_t)out->numel * sizeof *out->data);
    return TF_IR_OK;
}

/* The mean over the ranks (the session's communicator); the driver rounds
 * it to the dtype once. */
tf_ir_status ik_allreduce(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    tf_ir_status st = ik_copy(ip, n, in, out);
    const tf_interp_comm *c = tf_interp_comm_of(ip);
    char err[512];
    if (!st && c && c->mean(c->self, out->dtype, out->data, out->numel, err, sizeof err))
        return tf_diag_error(DIAG, TF_IR_ERR_RUNTIME, &n->loc, "%s: %s", OPNAME, err);
    return st;
}

/* shard and allgather need as many ranks as they were compiled for. */
static tf_ir_status ranks_match(tf_interp_ctx *ip, const tf_node *n, int *rank)
{
    const tf_interp_comm *c = tf_interp_comm_of(ip);
    int64_t want = tf_node_int(n, "ranks"), size = c ? c->size : 1;
    *rank = c ? c->rank : 0;
    if (size != want)
        return tf_diag_error(DIAG, TF_IR_ERR_RUNTIME, &n->loc, "%s: compiled for %lld ranks (shard_optimizer), and the session's "
                             "job has %lld (tf_session_set_comm)", OPNAME, (long long)want, (long long)size);
    return TF_IR_OK;
}

tf_ir_status ik_shard(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    int rank;
    tf_ir_status st = ranks_match(ip, n, &rank);
    for (int64_t i = 0; !st && i < out->numel; i++) {
        int64_t at = (int64_t)rank * out->numel + i;
        out->data[i] = at < in[0]->numel ? in[0]->data[at] : 0.0;
    }
    return st;
}

tf_ir_status ik_allgather(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    int rank;
    tf_ir_status st = ranks_match(ip, n, &rank);
    if (st) return st;
    const tf_interp_comm *c = tf_interp_comm_of(ip);
    if (!c) {   /* one rank: its chunk is the whole */
        memcpy(out->data, in[0]->data, (size_t)out->numel * sizeof *out->data);
        return TF_IR_OK;
    }
    double *all = tf_malloc((size_t)(in[0]->numel * c->size) * sizeof *all);
    char err[512];
    if (!all) return tf_diag_error(DIAG, TF_IR_ERR_OOM, &n->loc, "%s: out of memory", OPNAME);
    if (c->gather(c->self, out->dtype, in[0]->data, in[0]->numel, all, err, sizeof err)) {
        tf_free(all);
        return tf_diag_error(DIAG, TF_IR_ERR_RUNTIME, &n->loc, "%s: %s", OPNAME, err);
    }
    memcpy(out->data, all, (size_t)out->numel * sizeof *out->data);
    tf_free(all);
    return TF_IR_OK;
}

tf_ir_status ik_cast(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    return ik_copy(ip, n, in, out);   /* the driver rounds to the target dtype */
}

tf_ir_status ik_gelu(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip;
    bool tanh_approx = strcmp(tf_node_str(n, "approx"), "tanh") == 0;
    const double k = 0.79788456080286535588;   /* sqrt(2/pi) */
    for (int64_t i = 0; i < out->numel; i++) {
        double x = in[0]->data[i];
        out->data[i] = tanh_approx ? 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)))
                                   : 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
    }
    return TF_IR_OK;
}

/* ---- dropout ------------------------------------------------------------------- */

static uint64_t mix64(uint64_t z)   /* splitmix64's finalizer */
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The random stream of a dropout (or dropout_mask) with this salt at this
 * step: distinct per salt and per step, equal for the two ops; exported so
 * that every backend draws the oracle's masks. */
uint64_t tf_dropout_stream(uint64_t step, uint64_t salt)
{
    return mix64(mix64(step ^ 0x64726f706f7574ull /* "dropout" */) ^ salt);
}

/* out = mask (apply false) or x * mask (apply true). */
static void dropout_fill(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *x, tf_tensor *out, bool apply)
{
    double p = tf_node_float(n, "p");
    double scale = tf_dtype_round(out->dtype, 1.0 / (1.0 - p));
    uint64_t seed = tf_interp_seed(ip);
    uint64_t stream = tf_dropout_stream(tf_interp_step(ip), (uint64_t)tf_node_int(n, "salt"));
    for (int64_t i = 0; i < out->numel; i++) {
        double m = tf_rng_uniform(seed, stream, (uint64_t)i) >= p ? scale : 0.0;
        out->data[i] = apply ? x->data[i] * m : m;
    }
}

tf_ir_status ik_dropout(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    if (tf_interp_mode(ip) != TF_IR_TRAIN) return ik_copy(ip, n, in, out);
    dropout_fill(ip, n, in[0], out, true);
    return TF_IR_OK;
}

tf_ir_status ik_dropout_mask(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    dropout_fill(ip, n, in[0], out, false);
    return TF_IR_OK;
}

/* ---- reductions ------------------------------------------------------------------- */

enum { RED_SUM, RED_MEAN, RED_MAX };

static tf_ir_status reduce(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *x, tf_tensor *out, int kind)
{
    const tf_attr *axes = tf_node_attr_named(n, "axes");
    bool red[TF_MAX_RANK] = {0};
    int nax = axes && axes->kind == TF_ATTR_INTS ? axes->u.ints.n : 0;
    for (int i = 0; i < x->rank; i++) red[i] = nax == 0;
    for (int i = 0; i < nax; i++) {
        int ax;
        if (!tf_axis_norm(axes->u.ints.v[i].v, x->rank, &ax)) return bad_axis(ip, n, axes->u.ints.v[i].v, x->rank);
        red[ax] = true;
    }
    /* x's shape with reduced axes at size 1 is out's shape (keepdims or not,
     * the flat order is the same); map each element of x there, and to its
     * lane: its row-major position among the reduced axes, mod 8 (ir.h). */
    int64_t vd[TF_MAX_RANK], rd[TF_MAX_RANK];
    for (int i = 0; i < x->rank; i++) vd[i] = red[i] ? 1 : x->dims[i], rd[i] = red[i] ? x->dims[i] : 1;
    iter it;
    it_init(&it, x->rank, x->dims, 2);
    contig_strides(vd, x->rank, 1, it.st[0]);
    contig_strides(rd, x->rank, 1, it.st[1]);
    for (int i = 0; i < x->rank; i++) {
        if (red[i]) it.st[0][i] = 0;
        else it.st[1][i] = 0;
    }
    double *lanes = tf_malloc((size_t)(out->numel ? out->numel : 1) * TF_RED_LANES * sizeof *lanes);
    if (!lanes) return oom(ip, n);
    for (int64_t i = 0; i < out->numel * TF_RED_LANES; i++) lanes[i] = kind == RED_MAX ? -INFINITY : 0.0;
    for (int64_t i = 0; i < x->numel; i++, it_next(&it)) {
        double v = x->data[i], *o = &lanes[it.off[0] * TF_RED_LANES + it.off[1] % TF_RED_LANES];
        if (kind != RED_MAX) *o += v;
        else *o = tf_max_step(*o, v);   /* a NaN wins and stays */
    }
    double cnt = (double)x->numel / (double)(out->numel ? out->numel : 1);
    for (int64_t i = 0; i < out->numel; i++) {
        const double *l = &lanes[i * TF_RED_LANES];
        out->data[i] = kind == RED_MAX ? tf_lanes_max(l) : tf_lanes_sum(l);
        if (kind == RED_MEAN) out->data[i] /= cnt;
    }
    tf_free(lanes);
    return TF_IR_OK;
}

tf_ir_status ik_reduce_sum(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    return reduce(ip, n, in[0], out, RED_SUM);
}

tf_ir_status ik_reduce_mean(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    return reduce(ip, n, in[0], out, RED_MEAN);
}

tf_ir_status ik_reduce_max(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    return reduce(ip, n, in[0], out, RED_MAX);
}

tf_ir_status ik_global_avgpool(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip; (void)n;
    const tf_tensor *x = in[0];
    int64_t rows = x->dims[0] * x->dims[1], cnt = prod(x->dims, 2, x->rank);
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t j = 0; j < cnt; j++) s += x->data[r * cnt + j];
        out->data[r] = s / (double)cnt;
    }
    return TF_IR_OK;
}

/* ---- matmul family ------------------------------------------------------------------ */

tf_ir_status ik_linear(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip;
    const tf_tensor *x = in[0], *w = in[1], *b = n->nin > 2 ? in[2] : NULL;
    int64_t K = w->dims[0], N = w->dims[1], rows = x->numel / K;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += x->data[r * K + k] * w->data[k * N + j];
            out->data[r * N + j] = s + (b ? b->data[j] : 0.0);
        }
    return TF_IR_OK;
}

tf_ir_status ik_matmul(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip;
    const tf_tensor *a = in[0], *b = in[1];
    bool ta = tf_node_bool(n, "transpose_a"), tb = tf_node_bool(n, "transpose_b");
    int ra = a->rank - 2, rb = b->rank - 2, r = out->rank - 2;
    int64_t M = out->dims[r], N = out->dims[r + 1], K = a->dims[ta ? ra : ra + 1];
    iter it;   /* over the batch axes; offsets of a's and b's matrices */
    it_init(&it, r, out->dims, 2);
    bcast_strides(a->dims, ra, M * K, r, it.st[0]);
    bcast_strides(b->dims, rb, K * N, r, it.st[1]);
    int64_t nb = prod(out->dims, 0, r);
    for (int64_t bi = 0; bi < nb; bi++, it_next(&it)) {
        const double *pa = a->data + it.off[0], *pb = b->data + it.off[1];
        double *po = out->data + bi * M * N;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += pa[ta ? k * M + i : i * K + k] * pb[tb ? j * K + k : k * N + j];
                po[i * N + j] = s;
            }
    }
    return TF_IR_OK;
}

/* ---- convolution and pooling ----------------------------------------------------------- */

tf_ir_status ik_conv2d(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip;
    const tf_tensor *x = in[0], *w = in[1], *b = n->nin > 2 ? in[2] : NULL;
    int64_t s[2], p[2], dl[2];
    tf_node_pair(n, "stride", 1, 1, s);
    tf_node_pair(n, "padding", 0, 0, p);
    tf_node_pair(n, "dilation", 1, 1, dl);
    int64_t G = tf_node_int(n, "groups");
    if (G < 1) G = 1;
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
    int64_t O = w->dims[0], Cg = w->dims[1], KH = w->dims[2], KW = w->dims[3];
    int64_t Ho = out->dims[2], Wo = out->dims[3], Og = O / G;
    for (int64_t nb = 0; nb < N; nb++)
        for (int64_t o = 0; o < O; o++) {
            int64_t c0 = (o / Og) * Cg;
            double *po = out->data + (nb * O + o) * Ho * Wo;
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    double acc = 0;
                    for (int64_t c = 0; c < Cg; c++) {
                        const double *px = x->data + (nb * C + c0 + c) * H * W;
                        const double *pw = w->data + (o * Cg + c) * KH * KW;
                        for (int64_t kh = 0; kh < KH; kh++) {
                            int64_t ih = oh * s[0] - p[0] + kh * dl[0];
                            if (ih < 0 || ih >= H) continue;
                            for (int64_t kw = 0; kw < KW; kw++) {
                                int64_t iw = ow * s[1] - p[1] + kw * dl[1];
                                if (iw >= 0 && iw < W) acc += px[ih * W + iw] * pw[kh * KW + kw];
                            }
                        }
                    }
                    po[oh * Wo + ow] = acc + (b ? b->data[o] : 0.0);
                }
        }
    return TF_IR_OK;
}

static void pool2d(const tf_node *n, const tf_tensor *x, tf_tensor *out, bool is_max)
{
    int64_t k[2], s[2], p[2];
    tf_node_pair(n, "kernel", 1, 1, k);
    tf_node_pair(n, "stride", k[0], k[1], s);
    tf_node_pair(n, "padding", 0, 0, p);
    int64_t planes = x->dims[0] * x->dims[1], H = x->dims[2], W = x->dims[3], Ho = out->dims[2], Wo = out->dims[3];
    for (int64_t pl = 0; pl < planes; pl++) {
        const double *px = x->data + pl * H * W;
        double *po = out->data + pl * Ho * Wo;
        for (int64_t oh = 0; oh < Ho; oh++)
            for (int64_t ow = 0; ow < Wo; ow++) {
                double acc = is_max ? -INFINITY : 0.0;   /* padding: -inf for max, 0 for avg */
                for (int64_t kh = 0; kh < k[0]; kh++) {
                    int64_t ih = oh * s[0] - p[0] + kh;
                    if (ih < 0 || ih >= H) continue;
                    for (int64_t kw = 0; kw < k[1]; kw++) {
                        int64_t iw = ow * s[1] - p[1] + kw;
                        if (iw < 0 || iw >= W) continue;
                        double v = px[ih * W + iw];
                        if (!is_max) acc += v;
                        else if (acc == acc && (v != v || v > acc)) acc = v;
                    }
                }
                po[oh * Wo + ow] = is_max ? acc : acc / (double)(k[0] * k[1]);
            }
    }
}

tf_ir_status ik_maxpool2d(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip;
    pool2d(n, in[0], out, true);
    return TF_IR_OK;
}

tf_ir_status ik_avgpool2d(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip;
    pool2d(n, in[0], out, false);
    return TF_IR_OK;
}

/* ---- normalization ---------------------------------------------------------------------- */

/* Mean and biased variance of cnt elements base[o*ostride + j*jstride],
 * o < outer, j < len (two passes). */
static void moments(const double *base, int64_t outer, int64_t ostride, int64_t len, int64_t jstride, double *mean,
                    double *var)
{
    double cnt = (double)(outer * len), s = 0, ss = 0;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < len; j++) s += base[o * ostride + j * jstride];
    double m = s / cnt;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < len; j++) {
            double d = base[o * ostride + j * jstride] - m;
            ss += d * d;
        }
    *mean = m;
    *var = ss / cnt;
}

tf_ir_status ik_batchnorm(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    const tf_tensor *x = in[0], *g = in[1], *be = in[2], *rm = in[3], *rv = in[4];
    double eps = tf_node_float(n, "eps"), mom = tf_node_float(n, "momentum");
    bool train = tf_interp_mode(ip) == TF_IR_TRAIN;
    int64_t outer, C, inner;
    split3(x, 1, &outer, &C, &inner);
    int64_t cnt = outer * inner;
    tf_tensor nrm = {0}, nrv = {0};
    tf_ir_status st = TF_IR_OK;
    if (train) {
        if ((st = tf_tensor_alloc(&nrm, &n->in[3]->type, DIAG))) return st;
        if ((st = tf_tensor_alloc(&nrv, &n->in[4]->type, DIAG))) {
            tf_tensor_release(&nrm);
            return st;
        }
    }
    for (int64_t c = 0; c < C; c++) {
        double mean = rm->data[c], var = rv->data[c];
        if (train) {
            moments(x->data + c * inner, outer, C * inner, inner, 1, &mean, &var);
            double uvar = cnt > 1 ? var * (double)cnt / (double)(cnt - 1) : var;
            nrm.data[c] = tf_dtype_round(nrm.dtype, (1.0 - mom) * rm->data[c] + mom * mean);
            nrv.data[c] = tf_dtype_round(nrv.dtype, (1.0 - mom) * rv->data[c] + mom * uvar);
        }
        double inv = 1.0 / sqrt(var + eps);
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                int64_t at = (o * C + c) * inner + j;
                out->data[at] = (x->data[at] - mean) * inv * g->data[c] + be->data[c];
            }
    }
    if (train) {
        st = tf_interp_defer_update(ip, n->in[3], &nrm);
        if (!st) st = tf_interp_defer_update(ip, n->in[4], &nrv);
        tf_tensor_release(&nrm);
        tf_tensor_release(&nrv);
    }
    return st;
}

tf_ir_status ik_layernorm(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip;
    const tf_tensor *x = in[0], *g = in[1], *be = in[2];
    double eps = tf_node_float(n, "eps");
    int64_t D = x->dims[x->rank - 1], rows = x->numel / D;
    for (int64_t r = 0; r < rows; r++) {
        double mean, var;
        moments(x->data + r * D, 1, 0, D, 1, &mean, &var);
        double inv = 1.0 / sqrt(var + eps);
        for (int64_t j = 0; j < D; j++)
            out->data[r * D + j] = (x->data[r * D + j] - mean) * inv * g->data[j] + be->data[j];
    }
    return TF_IR_OK;
}

/* max and log(sum(exp(v - max))) of len elements v[j*stride]. */
static void log_sum_exp(const double *v, int64_t len, int64_t stride, double *mx, double *lse)
{
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < len; j++)
        if (v[j * stride] > m || v[j * stride] != v[j * stride]) m = v[j * stride];
    for (int64_t j = 0; j < len; j++) s += exp(v[j * stride] - m);
    *mx = m;
    *lse = log(s);
}

static tf_ir_status softmax_common(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *x, tf_tensor *out, bool lg)
{
    int64_t axis = tf_node_int(n, "axis"), outer, len, inner;
    int ax = 0;
    if (x->rank > 0 && !tf_axis_norm(axis, x->rank, &ax)) return bad_axis(ip, n, axis, x->rank);
    split3(x, ax, &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            double mx, lse;
            log_sum_exp(x->data + base, len, inner, &mx, &lse);
            for (int64_t j = 0; j < len; j++) {
                double z = x->data[base + j * inner] - mx - lse;
                out->data[base + j * inner] = lg ? z : exp(z);
            }
        }
    return TF_IR_OK;
}

tf_ir_status ik_softmax(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    return softmax_common(ip, n, in[0], out, false);
}

tf_ir_status ik_log_softmax(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    return softmax_common(ip, n, in[0], out, true);
}

/* ---- losses ---------------------------------------------------------------------------- */

tf_ir_status ik_cross_entropy(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    const tf_tensor *lg = in[0], *lb = in[1];
    int64_t C = lg->dims[lg->rank - 1], P = lb->numel, kept = 0;
    double ignore = (double)tf_node_int(n, "ignore_index"), total = 0;
    const char *red = tf_node_str(n, "reduction");
    bool rows = !strcmp(red, "none");
    for (int64_t i = 0; i < P; i++) {
        double loss = 0;
        if (lb->data[i] != ignore) {
            int64_t c = as_index(lb->data[i], C);
            if (c < 0) return out_of_range(ip, n, "label", lb->data[i], i, C);
            double mx, lse;
            log_sum_exp(lg->data + i * C, C, 1, &mx, &lse);
            loss = mx + lse - lg->data[i * C + c];
            kept++;
        }
        if (rows) out->data[i] = loss;
        total += loss;
    }
    if (!rows) out->data[0] = !strcmp(red, "sum") ? total : total / (double)kept;   /* none kept: 0/0, NaN as in PyTorch */
    return TF_IR_OK;
}

tf_ir_status ik_mse_loss(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip; (void)n;
    double s = 0;
    for (int64_t i = 0; i < in[0]->numel; i++) {
        double d = in[0]->data[i] - in[1]->data[i];
        s += d * d;
    }
    out->data[0] = s / (double)in[0]->numel;
    return TF_IR_OK;
}

/* ---- layout ------------------------------------------------------------------------------ */

tf_ir_status ik_transpose(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    const tf_tensor *x = in[0];
    const tf_attr *perm = tf_node_attr_named(n, "perm");
    if (!perm || perm->u.ints.n != x->rank)
        return tf_diag_error(DIAG, TF_IR_ERR_INTERNAL, &n->loc, "transpose: perm does not match rank %d", x->rank);
    int64_t cs[TF_MAX_RANK], src[TF_MAX_RANK], dst[TF_MAX_RANK];
    contig_strides(x->dims, x->rank, 1, cs);
    contig_strides(out->dims, out->rank, 1, dst);
    for (int i = 0; i < x->rank; i++) src[i] = cs[perm->u.ints.v[i].v];
    copy_strided(out->data, 0, dst, x->data, 0, src, out->rank, out->dims);
    return TF_IR_OK;
}

tf_ir_status ik_broadcast_to(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)ip; (void)n;
    int64_t src[TF_MAX_RANK], dst[TF_MAX_RANK];
    bcast_strides(in[0]->dims, in[0]->rank, 1, out->rank, src);
    contig_strides(out->dims, out->rank, 1, dst);
    copy_strided(out->data, 0, dst, in[0]->data, 0, src, out->rank, out->dims);
    return TF_IR_OK;
}

tf_ir_status ik_slice(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    const tf_tensor *x = in[0];
    int ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), x->rank, &ax)) return bad_axis(ip, n, tf_node_int(n, "axis"), x->rank);
    int64_t len = x->dims[ax], start = tf_node_int(n, "start"), step = tf_node_int(n, "step");
    tf_slice_bounds(len, start, len, &start, NULL);
    int64_t src[TF_MAX_RANK], dst[TF_MAX_RANK];
    contig_strides(x->dims, x->rank, 1, src);
    contig_strides(out->dims, out->rank, 1, dst);
    int64_t base = start * src[ax];
    src[ax] *= step;
    copy_strided(out->data, 0, dst, x->data, base, src, out->rank, out->dims);
    return TF_IR_OK;
}

tf_ir_status ik_concat(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    int ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), out->rank, &ax))
        return bad_axis(ip, n, tf_node_int(n, "axis"), out->rank);
    int64_t dst[TF_MAX_RANK], pos = 0;
    contig_strides(out->dims, out->rank, 1, dst);
    for (int i = 0; i < n->nin; i++) {
        int64_t src[TF_MAX_RANK];
        contig_strides(in[i]->dims, in[i]->rank, 1, src);
        copy_strided(out->data, pos * dst[ax], dst, in[i]->data, 0, src, in[i]->rank, in[i]->dims);
        pos += in[i]->dims[ax];
    }
    return TF_IR_OK;
}

/* ---- gather and generators ---------------------------------------------------------------- */

/* embedding(ids, table) and gather(ids, table): out[i..., j...] = table[ids[i...], j...]. */
tf_ir_status ik_embedding(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    const tf_tensor *ids = in[0], *tab = in[1];
    int64_t V = tab->dims[0], row = tab->numel / (V > 0 ? V : 1);
    for (int64_t i = 0; i < ids->numel; i++) {
        int64_t id = as_index(ids->data[i], V);
        if (id < 0) return out_of_range(ip, n, "id", ids->data[i], i, V);
        memcpy(out->data + i * row, tab->data + id * row, (size_t)row * sizeof *out->data);
    }
    return TF_IR_OK;
}

tf_ir_status ik_one_hot(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    const tf_tensor *lb = in[0];
    int64_t depth = out->dims[out->rank - 1];
    for (int64_t i = 0; i < out->numel; i++) out->data[i] = 0.0;
    for (int64_t i = 0; i < lb->numel; i++) {
        int64_t c = as_index(lb->data[i], depth);
        if (c < 0) return out_of_range(ip, n, "label", lb->data[i], i, depth);
        out->data[i * depth + c] = 1.0;
    }
    return TF_IR_OK;
}

tf_ir_status ik_iota(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out)
{
    (void)in;
    int ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), out->rank, &ax))
        return bad_axis(ip, n, tf_node_int(n, "axis"), out->rank);
    int64_t inner = prod(out->dims, ax + 1, out->rank), len = out->dims[ax];
    for (int64_t i = 0; i < out->numel; i++) out->data[i] = (double)((i / inner) % len);
    return TF_IR_OK;
}
