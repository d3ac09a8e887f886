/* cost.c — what an op costs to compute, from the op table's kind and the
 * node's types: floating-point operations, two per multiply-add.
 *
 * The checkpoint pass ranks recomputations by bytes saved per FLOP, and
 * --stats reports a step's FLOPs (step_flops: matmul and convolution only,
 * what GFLOP/s divides; recompute_flops: everything recomputed). An estimate,
 * not a measurement: an element of a pointwise, layout, gather or reduction
 * op counts one (what it costs is moving it), a reshape is a view and costs
 * nothing, a pooling window element one. */
#include "ops.h"

static double numel(const tf_type *t) { return (double)tf_type_numel(t); }

/* matmul: 2 * |out| * K; a convolution and both its gradients: the forward's
 * multiply-adds, every forward output element over Cg x KH x KW; attention:
 * its matmuls over the (query, key) pairs it does not skip. */
static double heavy(const tf_node *n)
{
    if (n->op == TF_OP_FLASH_ATTENTION || n->op == TF_OP_FLASH_ATTENTION_GRAD || n->op == TF_OP_ATTENTION) {
        /* per (batch, head): the visible (query, key) pairs times the dot products each takes: S and PV
         * forward; S again, dP, dV, dQ and dK backward (a mask's hidden pairs are counted: not known here) */
        tf_attn_geom g;
        tf_attn_geom_of(n, &g);
        double pairs = (double)g.Tq * (double)g.Tk;
        if (g.causal) {
            double full = g.Tq > g.Tk ? (double)(g.Tq - g.Tk) * (double)g.Tk : 0, tri = (double)(g.Tq < g.Tk ? g.Tq : g.Tk);
            pairs = full + tri * (tri + 1) / 2;
        }
        double per = n->op == TF_OP_FLASH_ATTENTION_GRAD ? 3.0 * (double)g.D + 2.0 * (double)g.Dv : (double)(g.D + g.Dv);
        return 2.0 * (double)g.B * (double)g.H * pairs * per;
    }
    if (n->op == TF_OP_MATMUL) {
        if (n->nin != 2 || n->in[0]->type.rank < 2) return 0;
        const tf_type *a = &n->in[0]->type;
        int64_t k = tf_node_bool(n, "transpose_a") ? a->dims[a->rank - 2].n : a->dims[a->rank - 1].n;
        return 2.0 * numel(&n->out->type) * (double)k;
    }
    if (n->nin < 2) return 0;
    const tf_type *y = n->op == TF_OP_CONV2D ? &n->out->type : n->op == TF_OP_CONV2D_GRAD_INPUT ? &n->in[0]->type : &n->in[1]->type;
    const tf_type *w = n->op == TF_OP_CONV2D_GRAD_WEIGHT ? &n->out->type : &n->in[1]->type;
    if (w->rank != 4) return 0;
    return 2.0 * numel(y) * (double)(w->dims[1].n * w->dims[2].n * w->dims[3].n);
}

static int64_t clamp(double f) { return f > 9e18 ? INT64_MAX : (int64_t)f; }

int64_t tf_node_flops_heavy(const tf_node *n)
{
    tf_op_kind k = tf_op_info_of(n->op)->kind;
    return k == TF_OPK_MATMUL || k == TF_OPK_CONV ? clamp(heavy(n)) : 0;
}

int64_t tf_node_flops(const tf_node *n)
{
    tf_op_kind k = tf_op_info_of(n->op)->kind;
    switch (k) {
    case TF_OPK_MATMUL:
    case TF_OPK_CONV:
        return clamp(heavy(n));
    case TF_OPK_REDUCTION: {
        double f = 0;   /* every operand element read once */
        for (int i = 0; i < n->nin; i++) f += numel(&n->in[i]->type);
        return clamp(f > numel(&n->out->type) ? f : numel(&n->out->type));
    }
    case TF_OPK_POOL: {
        int64_t kv[2];
        if (!tf_node_attr_named(n, "kernel")) return clamp(numel(&n->out->type));
        tf_node_pair(n, "kernel", 1, 1, kv);
        return clamp(numel(&n->out->type) * (double)(kv[0] * kv[1]));
    }
    case TF_OPK_LAYOUT:
        return n->op == TF_OP_RESHAPE ? 0 : clamp(numel(&n->out->type));
    default:
        return clamp(numel(&n->out->type));
    }
}
