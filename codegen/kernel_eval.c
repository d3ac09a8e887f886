/* kernel_eval.c — run the kernel IR on the interpreter's tensors.
 *
 * The reference semantics of the kernel IR: every expression rounds to its
 * dtype as the interpreter rounds each op, reductions accumulate in double
 * over eight lanes (ir.h),
 * library kernels call the interpreter's kernel of their op. The test
 * (tests/unit/test_kernels.c) runs every example's kernels against the
 * interpreter running the module op by op and demands identical bits, which
 * checks the whole lowering into kernels: loads, broadcasting strides,
 * reductions with their prologue and epilogue, what each region stores. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "interp.h"
#include "kernel.h"

typedef struct ev {
    const tf_kernel *k;
    tf_tensor **bufs;      /* per kernel buffer */
    double *val;           /* per expression, at the current index */
    double *red;           /* per reduction, at the current outer index */
    uint64_t seed, step;
} ev;

static int64_t offset_of(const int64_t *st, const int64_t *idx, int rank)
{
    int64_t o = 0;
    for (int i = 0; i < rank; i++) o += st[i] * idx[i];
    return o;
}

/* Row-major position of idx within the space (all axes) or its outer axes. */
static int64_t flat(const tf_kernel *k, const int64_t *idx, bool outer)
{
    int64_t f = 0;
    for (int i = 0; i < k->rank; i++) {
        if (outer && ((k->reduce_mask >> i) & 1)) continue;
        f = f * k->dims[i] + idx[i];
    }
    return f;
}

static void eval_exprs(ev *e, const int64_t *idx)
{
    const tf_kernel *k = e->k;
    for (int i = 0; i < k->nexprs; i++) {
        const tf_kexpr *x = &k->exprs[i];
        double v = 0;
        switch (x->kind) {
        case TF_KX_LOAD: v = e->bufs[x->buf]->data[x->offset + offset_of(x->strides, idx, k->rank)]; break;
        case TF_KX_CONST: v = tf_dtype_round(x->dtype, x->value); break;
        case TF_KX_REDUCED: v = e->red[x->red]; break;
        case TF_KX_INDEX: v = (double)idx[x->axis]; break;
        case TF_KX_OP: {
            double a = e->val[x->args[0]], b = x->nargs > 1 ? e->val[x->args[1]] : 0;
            if (x->op == TF_OP_WHERE) v = a != 0 ? b : e->val[x->args[2]];
            else if (x->op == TF_OP_CAST) v = a;
            else if (x->op == TF_OP_ONE_HOT) v = a == b;
            else if (x->op == TF_OP_DROPOUT_MASK) {
                double p = tf_node_float(x->node, "p");
                uint64_t stream = tf_dropout_stream(e->step, (uint64_t)tf_node_int(x->node, "salt"));
                v = tf_rng_uniform(e->seed, stream, (uint64_t)flat(k, idx, x->reduced_domain)) >= p ? tf_dtype_round(x->dtype, 1.0 / (1.0 - p)) : 0;
            } else v = tf_op_info_of(x->op)->scalar(a, b);
            break;
        }
        }
        e->val[i] = tf_dtype_round(tf_kexpr_round(x), v);
    }
}

/* Visit every index of the space whose outer axes equal `outer` (or every
 * index when outer is NULL), calling fn. */
typedef void (*visit_fn)(ev *e, const int64_t *idx, void *arg);

static void visit(ev *e, const int64_t *outer, bool inner_only, visit_fn fn, void *arg)
{
    const tf_kernel *k = e->k;
    int64_t idx[TF_MAX_RANK] = {0};
    for (int i = 0; i < k->rank; i++) idx[i] = inner_only && !((k->reduce_mask >> i) & 1) ? outer[i] : 0;
    for (;;) {
        fn(e, idx, arg);
        int i = k->rank - 1;
        for (; i >= 0; i--) {
            if (inner_only && !((k->reduce_mask >> i) & 1)) continue;
            if (++idx[i] < k->dims[i]) break;
            idx[i] = 0;
        }
        if (i < 0) return;
    }
}

static void store_full(ev *e, const int64_t *idx, void *arg)
{
    (void)arg;
    const tf_kernel *k = e->k;
    eval_exprs(e, idx);
    for (int s = 0; s < k->nstores; s++)
        if (!k->stores[s].reduced_domain) e->bufs[k->stores[s].buf]->data[flat(k, idx, false)] = e->val[k->stores[s].expr];
}

/* A reduction's lanes (ir.h): element t of the reduced space goes to lane
 * t % 8; visit() walks that space in row-major order, so t counts calls. */
typedef struct acc { int r; double lanes[TF_RED_LANES]; int64_t t; } acc;

static void accumulate(ev *e, const int64_t *idx, void *arg)
{
    acc *a = arg;
    const tf_kreduce *r = &e->k->reds[a->r];
    eval_exprs(e, idx);
    double x = e->val[r->arg], *l = &a->lanes[a->t++ % TF_RED_LANES];
    *l = r->op == TF_OP_REDUCE_MAX ? tf_max_step(*l, x) : *l + x;
}

static void outer_step(ev *e, const int64_t *idx, void *arg)
{
    (void)arg;
    const tf_kernel *k = e->k;
    for (int r = 0; r < k->nreds; r++) e->red[r] = NAN;
    for (int r = 0; r < k->nreds; r++) {   /* in order: a later one may read an earlier one */
        acc a = {.r = r};
        for (int l = 0; l < TF_RED_LANES; l++) a.lanes[l] = k->reds[r].op == TF_OP_REDUCE_MAX ? -INFINITY : 0.0;
        visit(e, idx, true, accumulate, &a);
        double v = k->reds[r].op == TF_OP_REDUCE_MAX ? tf_lanes_max(a.lanes) : tf_lanes_sum(a.lanes);
        if (k->reds[r].op == TF_OP_REDUCE_MEAN) v /= k->reds[r].count;
        e->red[r] = tf_dtype_round(tf_kreduce_round(&k->reds[r]), v);
    }
    eval_exprs(e, idx);   /* outer stores: the index's inner part is irrelevant to them */
    for (int s = 0; s < k->nstores; s++)
        if (k->stores[s].reduced_domain) e->bufs[k->stores[s].buf]->data[flat(k, idx, true)] = e->val[k->stores[s].expr];
    visit(e, idx, true, store_full, NULL);
}

static tf_ir_status run_library(const tf_node *n, tf_interp_ctx *ip, tf_diag *d)
{
    const tf_tensor *in[64];
    tf_tensor consts[64];
    double cv[64];
    for (int q = 0; q < n->nin; q++) {
        if (n->in[q]->kind == TF_VAL_CONST) {
            memset(&consts[q], 0, sizeof consts[q]);
            consts[q].dtype = n->in[q]->type.dtype;
            consts[q].numel = 1;
            cv[q] = tf_dtype_round(consts[q].dtype, n->in[q]->cval);
            consts[q].data = &cv[q];
            in[q] = &consts[q];
        } else if (!(in[q] = tf_interp_tensor(ip, n->in[q], d))) {
            return d->status;
        }
    }
    tf_tensor *out = tf_interp_tensor(ip, n->out, d);
    if (!out) return d->status;
    memset(out->data, 0, (size_t)out->numel * sizeof *out->data);   /* kernels may accumulate into it */
    tf_ir_status st = tf_op_info_of(n->op)->interp(ip, n, in, out);
    for (int64_t i = 0; !st && i < out->numel; i++) out->data[i] = tf_dtype_round(out->dtype, out->data[i]);
    return st;
}

tf_ir_status tf_kernels_eval(const tf_kernel_plan *p, tf_interp_ctx *ip, tf_diag *d)
{
    tf_diag *saved = tf_interp_diag(ip);
    tf_interp_set_diag(ip, d);   /* the op kernels report bad ids and the like there */
    tf_ir_status st = TF_IR_OK;
    for (int i = 0; i < p->nkernels && !st; i++) {
        const tf_kernel *k = &p->kernels[i];
        if (k->kind == TF_K_VIEW) {
            tf_value *src = k->lib->in[0];
            tf_tensor *b = tf_interp_tensor(ip, k->lib->out, d), *a = src->kind == TF_VAL_CONST ? NULL : tf_interp_tensor(ip, src, d);
            if (!b || (!a && src->kind != TF_VAL_CONST)) {
                st = d->status;
                break;
            }
            for (int64_t j = 0; j < b->numel; j++) b->data[j] = a ? a->data[j] : tf_dtype_round(src->type.dtype, src->cval);
            continue;
        }
        if (k->lib && (st = run_library(k->lib, ip, d))) break;
        if (!k->nexprs) continue;
        ev e = {.k = k, .seed = tf_interp_seed(ip), .step = tf_interp_step(ip)};
        e.bufs = tf_malloc((size_t)k->nbufs * sizeof *e.bufs);
        e.val = tf_malloc((size_t)k->nexprs * sizeof *e.val);
        e.red = tf_malloc((size_t)(k->nreds ? k->nreds : 1) * sizeof *e.red);
        if (!e.bufs || !e.val || !e.red) st = tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
        for (int b = 0; !st && b < k->nbufs; b++)
            if (!(e.bufs[b] = tf_interp_tensor(ip, k->bufs[b].value, d))) st = d->status;
        if (!st) {
            int64_t zero[TF_MAX_RANK] = {0};
            if (k->kind == TF_K_REDUCTION) {
                /* every outer index: its reductions, then its stores */
                int64_t idx[TF_MAX_RANK] = {0};
                for (;;) {
                    outer_step(&e, idx, NULL);
                    int a = k->rank - 1;
                    for (; a >= 0; a--) {
                        if ((k->reduce_mask >> a) & 1) continue;
                        if (++idx[a] < k->dims[a]) break;
                        idx[a] = 0;
                    }
                    if (a < 0) break;
                }
            } else {
                visit(&e, zero, false, store_full, NULL);
            }
        }
        tf_free(e.bufs);
        tf_free(e.val);
        tf_free(e.red);
    }
    tf_interp_set_diag(ip, saved);
    return st;
}

/* rt = {seed, step}, as generated code receives it. */
static double runtime_dropout_uniform(const uint64_t *rt, int64_t salt, int64_t flat)
{
    return tf_rng_uniform(rt[0], tf_dropout_stream(rt[1], (uint64_t)salt), (uint64_t)flat);
}

void *tf_kernel_runtime_symbol(const char *name, void *ctx)
{
    (void)ctx;
    union { double (*f)(const uint64_t *, int64_t, int64_t); void *p; } u;
    u.f = runtime_dropout_uniform;
    return name && strcmp(name, "tf_jit_dropout_uniform") == 0 ? u.p : NULL;
}
