/* kernel.c — the kernel IR built from a fused module, and its text. See
 * kernel.h for the model. */
#include "kernel.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kb {
    const tf_module *m;
    tf_kernel *k;
    int *expr_of;          /* value id -> expr of this kernel, -1 */
    struct place *place_of;   /* value id -> where its expr lies, when expr_of is set */
    int *touched;          /* ids set in expr_of, reset after the kernel */
    int ntouched, cap_touched;
    int cap_bufs, cap_exprs, cap_reds, cap_stores;
    tf_diag *d;
} kb;

static bool grow(void **p, int n, int *cap, size_t elem)
{
    if (n < *cap) return true;
    int c = *cap ? *cap * 2 : 8;
    void *q = tf_realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* A value an update writes in place (memplan's home) is its param's or
 * buffer's memory: one buffer of the kernel, so that the kernel computing
 * it loads the old value and stores the new one through the same pointer. */
static int add_buf(kb *b, const tf_value *v, bool written)
{
    tf_kernel *k = b->k;
    if (v->home) v = v->home;
    for (int i = 0; i < k->nbufs; i++)
        if (k->bufs[i].value == v) {
            k->bufs[i].written |= written;
            return i;
        }
    if (!grow((void **)&k->bufs, k->nbufs, &b->cap_bufs, sizeof *k->bufs)) return -1;
    k->bufs[k->nbufs] = (tf_kbuf){v, written, false};
    return k->nbufs++;
}

static int add_expr(kb *b, tf_kexpr e)
{
    tf_kernel *k = b->k;
    if (!grow((void **)&k->exprs, k->nexprs, &b->cap_exprs, sizeof *k->exprs)) return -1;
    k->exprs[k->nexprs] = e;
    return k->nexprs++;
}

bool tf_kernel_reduction_ok(int op)
{
    return tf_op_exec_of(op) == TF_OPX_REDUCE;
}

static bool is_pointwise(const tf_node *n)
{
    tf_op_exec x = tf_op_exec_of(n->op);
    return tf_exec_elementwise(x) || x == TF_OPX_BCAST;
}

static bool is_reduction(const tf_node *n) { return tf_op_exec_of(n->op) == TF_OPX_REDUCE; }

bool tf_kernel_op_is_expr(int op) { return tf_op_exec_of(op) == TF_OPX_EXPR; }

static unsigned reduce_mask(const tf_node *n)
{
    const tf_attr *a = tf_node_attr_named(n, "axes");
    int rank = n->in[0]->type.rank;
    if (a->u.ints.n == 0) return (1u << rank) - 1;
    unsigned mask = 0;
    for (int i = 0; i < a->u.ints.n; i++) {
        int ax;
        if (tf_axis_norm(a->u.ints.v[i].v, rank, &ax)) mask |= 1u << ax;
    }
    return mask;
}

/* Where a tensor's axes run in the kernel's index space (tf_place_result
 * and tf_place_operand in ir.h say how). */
typedef struct place {
    int8_t axis[TF_MAX_RANK];
} place;

static bool same_place(const place *a, const place *b, int rank)
{
    for (int j = 0; j < rank; j++)
        if (a->axis[j] != b->axis[j]) return false;
    return true;
}

/* A load's strides over the index space from a tensor's place: its
 * row-major strides on the axes it runs along, 0 on the others. */
static void place_strides(const tf_kernel *k, const tf_type *t, const place *p, int64_t *st)
{
    for (int i = 0; i < k->rank; i++) st[i] = 0;
    int64_t s = 1;
    for (int j = t->rank - 1; j >= 0; j--) {
        if (p->axis[j] >= 0) st[p->axis[j]] = s;
        s *= t->dims[j].n;
    }
}

static bool on_outer(const tf_kernel *k, const int64_t *st)
{
    for (int i = 0; i < k->rank; i++)
        if (((k->reduce_mask >> i) & 1) && st[i]) return false;
    return true;
}

static bool remember(kb *b, int value_id, int expr)
{
    if (!grow((void **)&b->touched, b->ntouched, &b->cap_touched, sizeof *b->touched)) return false;
    b->touched[b->ntouched++] = value_id;
    b->expr_of[value_id] = expr;
    return true;
}

/* Operand q of n, whose result lies at res (a reduction's operand is the
 * index space itself). A value computed earlier in the kernel is reused
 * only where it is read along the axes it was computed on; fuse forms no
 * kernel that would read it otherwise, and a kernel that did is refused
 * here rather than computed wrong. A buffer read the same way twice is one
 * load. -1: out of memory or refused (d set). */
static int operand(kb *b, const tf_node *n, int q, const place *res, int rrank)
{
    tf_value *v = n->in[q];
    if (v->kind == TF_VAL_CONST) {
        tf_kexpr e = {.kind = TF_KX_CONST, .dtype = v->type.dtype, .value = v->cval, .reduced_domain = true, .node = n};
        int id = add_expr(b, e);
        if (id < 0) tf_diag_error(b->d, TF_IR_ERR_OOM, &n->loc, "out of memory building kernels");
        return id;
    }
    place p;
    if (!tf_place_operand(b->k->dims, res->axis, rrank, &v->type, n->op == TF_OP_ONE_HOT, p.axis)) {
        tf_diag_error(b->d, TF_IR_ERR_INTERNAL, &n->loc, "internal: %s: operand '%s' does not fit kernel %s's index space",
                      tf_op_info_of(n->op)->name, v->name, b->k->name);
        return -1;
    }
    if (v->id >= 0 && b->expr_of[v->id] >= 0) {
        if (same_place(&b->place_of[v->id], &p, v->type.rank)) return b->expr_of[v->id];
        tf_diag_error(b->d, TF_IR_ERR_INTERNAL, &n->loc,
                      "internal: %s reads '%s' along other axes than kernel %s computed it on", tf_op_info_of(n->op)->name,
                      v->name, b->k->name);
        return -1;
    }
    tf_kexpr e = {.kind = TF_KX_LOAD, .dtype = v->type.dtype, .node = n};
    if ((e.buf = add_buf(b, v, false)) < 0) {
        tf_diag_error(b->d, TF_IR_ERR_OOM, &n->loc, "out of memory building kernels");
        return -1;
    }
    place_strides(b->k, &v->type, &p, e.strides);
    for (int x = 0; x < b->k->nexprs; x++) {
        const tf_kexpr *o = &b->k->exprs[x];
        if (o->kind == TF_KX_LOAD && o->buf == e.buf && !o->offset && !memcmp(o->strides, e.strides, sizeof e.strides)) return x;
    }
    e.reduced_domain = on_outer(b->k, e.strides);
    int id = add_expr(b, e);
    if (id < 0) tf_diag_error(b->d, TF_IR_ERR_OOM, &n->loc, "out of memory building kernels");
    return id;
}

/* One node of an elementwise or reduction kernel into expressions. */
static tf_ir_status add_node(kb *b, const tf_node *n)
{
    tf_kernel *k = b->k;
    place res, full;
    for (int i = 0; i < k->rank; i++) full.axis[i] = (int8_t)i;
    if (!tf_place_result(k->rank, k->dims, k->reduce_mask, &n->out->type, res.axis))
        return tf_diag_error(b->d, TF_IR_ERR_INTERNAL, &n->loc, "internal: %s's result '%s' does not fit kernel %s's index space",
                             tf_op_info_of(n->op)->name, n->out->name, k->name);
    if (is_reduction(n)) {
        int arg = operand(b, n, 0, &full, k->rank);
        if (arg < 0) return b->d->status;
        if (!grow((void **)&k->reds, k->nreds, &b->cap_reds, sizeof *k->reds))
            return tf_diag_error(b->d, TF_IR_ERR_OOM, &n->loc, "out of memory building kernels");
        double count = 1;
        unsigned mask = reduce_mask(n);
        for (int i = 0; i < n->in[0]->type.rank; i++)
            if ((mask >> i) & 1) count *= (double)n->in[0]->type.dims[i].n;
        bool wide = tf_node_wide(b->m, n);
        k->reds[k->nreds] = (tf_kreduce){n->op, arg, n->out->type.dtype, count, wide};
        tf_kexpr e = {.kind = TF_KX_REDUCED, .dtype = n->out->type.dtype, .red = k->nreds++, .reduced_domain = true, .node = n,
                      .wide = wide};
        int id = add_expr(b, e);
        if (id < 0 || !remember(b, n->out->id, id)) return tf_diag_error(b->d, TF_IR_ERR_OOM, &n->loc, "out of memory building kernels");
        b->place_of[n->out->id] = res;
        return TF_IR_OK;
    }
    if (tf_op_exec_of(n->op) == TF_OPX_BCAST) {   /* its operand, read with zero strides along the axes it spreads over */
        int id = operand(b, n, 0, &res, n->out->type.rank);
        if (id < 0) return b->d->status;
        if (!remember(b, n->out->id, id)) return tf_diag_error(b->d, TF_IR_ERR_OOM, &n->loc, "out of memory building kernels");
        b->place_of[n->out->id] = res;
        return TF_IR_OK;
    }
    tf_kexpr e = {.kind = TF_KX_OP, .op = n->op, .dtype = n->out->type.dtype, .reduced_domain = true, .node = n,
                  .wide = tf_node_wide(b->m, n)};
    if (tf_op_exec_of(n->op) == TF_OPX_INDEX) {   /* iota: the index along its axis */
        int ax = 0;
        tf_axis_norm(tf_node_int(n, "axis"), n->out->type.rank, &ax);
        if (res.axis[ax] < 0) {   /* along a size-1 axis: always 0 */
            e.kind = TF_KX_CONST;
            e.value = 0;
        } else {
            e.kind = TF_KX_INDEX;
            e.axis = res.axis[ax];
            e.reduced_domain = !((k->reduce_mask >> e.axis) & 1);
        }
    } else {
        e.nargs = n->nin;
        for (int q = 0; q < n->nin; q++) {
            if ((e.args[q] = operand(b, n, q, &res, n->out->type.rank)) < 0) return b->d->status;
            e.reduced_domain &= k->exprs[e.args[q]].reduced_domain;
        }
        if (n->op == TF_OP_ONE_HOT) {   /* compares with the index along the class axis */
            int last = res.axis[n->out->type.rank - 1];
            tf_kexpr ix = {.kind = TF_KX_INDEX, .dtype = TF_DT_I64, .axis = last, .node = n};
            if (last < 0) {   /* one class: index 0 */
                ix.kind = TF_KX_CONST;
                ix.value = 0;
                ix.reduced_domain = true;
            } else {
                ix.reduced_domain = !((k->reduce_mask >> ix.axis) & 1);
            }
            if ((e.args[1] = add_expr(b, ix)) < 0) return tf_diag_error(b->d, TF_IR_ERR_OOM, &n->loc, "out of memory");
            e.nargs = 2;
            e.reduced_domain &= ix.reduced_domain;
        }
        if (n->op == TF_OP_DROPOUT_MASK) {
            /* one draw per element of its result, counted as the interpreter
             * counts them: by the flat index of the full space, or of the
             * outer axes for a result on the reduced space (kernel.h) */
            int64_t outer = 1;
            for (int i = 0; i < k->rank; i++)
                if (!((k->reduce_mask >> i) & 1)) outer *= k->dims[i];
            e.reduced_domain = k->reduce_mask && tf_type_numel(&n->out->type) == outer;
        }
    }
    int id = add_expr(b, e);
    if (id < 0 || !remember(b, n->out->id, id)) return tf_diag_error(b->d, TF_IR_ERR_OOM, &n->loc, "out of memory building kernels");
    b->place_of[n->out->id] = res;
    return TF_IR_OK;
}

/* Does n's value leave the kernel made of nodes[lo, hi)? A lone op's
 * always does; in a region, a yielded value does, and so does one that a
 * later kernel of the same region reads (a multi region splits into one
 * kernel per shape). */
/* Is n's value stored: a region's yield, or (a multi-tensor region, whose
 * kernels are its chains) read by a node outside nodes[lo, hi)? uses: reads
 * of each value id by every node; inside: by nodes[lo, hi) (multi only). */
static bool leaves(const tf_module *m, const tf_node *n, const int *uses, const int *inside)
{
    if (!n->region) return true;
    const tf_region *r = &m->regions[n->region - 1];
    for (int i = 0; i < r->nyields; i++)
        if (r->yields[i] == n->out) return true;
    return r->kind == TF_REGION_MULTI && uses[n->out->id] > inside[n->out->id];
}

static int64_t space_numel(const tf_kernel *k)
{
    int64_t n = 1;
    for (int i = 0; i < k->rank; i++) n *= k->dims[i];
    return n;
}

static tf_ir_status add_store(kb *b, const tf_node *n)
{
    tf_kernel *k = b->k;
    if (!grow((void **)&k->stores, k->nstores, &b->cap_stores, sizeof *k->stores))
        return tf_diag_error(b->d, TF_IR_ERR_OOM, &n->loc, "out of memory building kernels");
    int buf = add_buf(b, n->out, true), ex = b->expr_of[n->out->id];
    if (buf < 0) return tf_diag_error(b->d, TF_IR_ERR_OOM, &n->loc, "out of memory building kernels");
    /* a value of a reduction kernel lives on the full space or the outer
     * one; a store writes each element once, so nothing else is stored */
    bool outer = k->reduce_mask && tf_type_numel(&n->out->type) != space_numel(k);
    int64_t outer_numel = 1;
    for (int i = 0; i < k->rank; i++)
        if (!((k->reduce_mask >> i) & 1)) outer_numel *= k->dims[i];
    if (tf_type_numel(&n->out->type) != (outer ? outer_numel : space_numel(k)))
        return tf_diag_error(b->d, TF_IR_ERR_INTERNAL, &n->loc, "internal: kernel %s cannot store '%s' (%lld elements over an index space of %lld)",
                             k->name, n->out->name, (long long)tf_type_numel(&n->out->type), (long long)space_numel(k));
    k->stores[k->nstores++] = (tf_kstore){buf, ex, outer};
    return TF_IR_OK;
}

static void set_space(tf_kernel *k, const tf_type *t)
{
    k->rank = t->rank;
    for (int i = 0; i < t->rank; i++) k->dims[i] = t->dims[i].n;
}

static tf_kernel *new_kernel(tf_kernel_plan *p, int *cap, const tf_node *first, tf_kernel_kind kind, int region)
{
    if (!grow((void **)&p->kernels, p->nkernels, cap, sizeof *p->kernels)) return NULL;
    tf_kernel *k = &p->kernels[p->nkernels];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "k%d_%s", p->nkernels, tf_op_info_of(first->op)->name);
    k->kind = kind;
    k->region = region;
    p->nkernels++;
    return k;
}

/* A lone transpose, broadcast or slice: a copy over the result's space whose
 * load reads the operand through permuted, broadcast or stepped strides. */
static tf_ir_status build_layout(tf_kernel_plan *p, int *cap, const tf_node *n, tf_diag *d)
{
    tf_kernel *k = new_kernel(p, cap, n, TF_K_ELEMENTWISE, n->region);
    if (!k) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory building kernels");
    set_space(k, &n->out->type);
    const tf_value *x = n->in[0];
    tf_kexpr e = {.kind = TF_KX_LOAD, .dtype = x->type.dtype, .node = n, .reduced_domain = true};
    if (x->kind == TF_VAL_CONST) {
        e.kind = TF_KX_CONST;
        e.value = x->cval;
    } else {
        int64_t row[TF_MAX_RANK], s = 1;
        for (int i = x->type.rank - 1; i >= 0; i--) {
            row[i] = s;
            s *= x->type.dims[i].n;
        }
        if (n->op == TF_OP_TRANSPOSE) {
            const tf_attr *perm = tf_node_attr_named(n, "perm");
            for (int j = 0; j < k->rank; j++) e.strides[j] = row[perm->u.ints.v[j].v];
        } else if (n->op == TF_OP_SLICE) {
            int ax = 0;
            tf_axis_norm(tf_node_int(n, "axis"), x->type.rank, &ax);
            int64_t len = x->type.dims[ax].n, start = 0;
            tf_slice_bounds(len, tf_node_int(n, "start"), len, &start, NULL);
            for (int j = 0; j < k->rank; j++) e.strides[j] = row[j];
            e.offset = start * row[ax];
            e.strides[ax] *= tf_node_int(n, "step");
        } else {
            for (int j = 0; j < x->type.rank; j++)
                e.strides[k->rank - x->type.rank + j] = x->type.dims[j].n == 1 ? 0 : row[j];
        }
        for (int j = 0; j < k->rank; j++)
            if (k->dims[j] == 1) e.strides[j] = 0;
    }
    kb b = {.m = NULL, .k = k, .d = d};
    int ex = -1, buf = -1;
    if ((e.kind == TF_KX_LOAD && (e.buf = add_buf(&b, x, false)) < 0) || (ex = add_expr(&b, e)) < 0 ||
        (buf = add_buf(&b, n->out, true)) < 0 || !grow((void **)&k->stores, 0, &b.cap_stores, sizeof *k->stores))
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory building kernels");
    k->stores[k->nstores++] = (tf_kstore){buf, ex, false};
    return TF_IR_OK;
}

/* nodes[lo, hi) run as one kernel */
static tf_ir_status build_unit(const tf_module *m, tf_kernel_plan *p, int *cap, int *expr_of, place *place_of, const int *uses,
                               int *inside, int lo, int hi, tf_diag *d)
{
    tf_node **nodes = (tf_node **)m->nodes.items;
    const tf_node *n0 = nodes[lo];
    int region = n0->region;
    tf_op_exec x0 = tf_op_exec_of(n0->op);
    if (hi - lo == 1 && x0 == TF_OPX_VIEW) {
        tf_kernel *k = new_kernel(p, cap, n0, TF_K_VIEW, region);
        if (!k) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory building kernels");
        k->lib = n0;
        set_space(k, &n0->out->type);
        return TF_IR_OK;
    }
    if (hi - lo == 1 && (x0 == TF_OPX_COPY || x0 == TF_OPX_BCAST))
        return build_layout(p, cap, n0, d);
    /* a gemm region: its matmul/conv is a library call; the rest an epilogue */
    const tf_node *lib = NULL;
    for (int i = lo; i < hi; i++) {
        const tf_node *n = nodes[i];
        if (!is_pointwise(n) && !is_reduction(n)) {
            if (lib) return tf_diag_error(d, TF_IR_ERR_INTERNAL, &n->loc, "internal: two library ops in one kernel");
            lib = n;
        }
    }
    tf_kernel *k = new_kernel(p, cap, n0, lib ? TF_K_LIBRARY : TF_K_ELEMENTWISE, region);
    if (!k) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory building kernels");
    kb b = {.m = m, .k = k, .expr_of = expr_of, .place_of = place_of, .d = d};
    k->lib = lib;
    /* the index space: a reduction's input, else the (epilogue's) output */
    const tf_node *red = NULL;
    for (int i = lo; i < hi && !red; i++)
        if (is_reduction(nodes[i])) red = nodes[i];
    if (red) {
        k->kind = TF_K_REDUCTION;
        set_space(k, &red->in[0]->type);
        k->reduce_mask = reduce_mask(red);
    } else {
        set_space(k, &(lib ? lib : nodes[hi - 1])->out->type);
    }
    tf_ir_status st = TF_IR_OK;
    if (lib) {   /* the library result feeds the epilogue through its buffer */
        if (add_buf(&b, lib->out, true) < 0) st = tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory building kernels");
        for (int q = 0; q < lib->nin && !st; q++)
            if (lib->in[q]->kind != TF_VAL_CONST && add_buf(&b, lib->in[q], false) < 0)
                st = tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory building kernels");
    }
    for (int i = lo; i < hi && !st; i++)
        if (nodes[i] != lib) st = add_node(&b, nodes[i]);
    bool multi = region && m->regions[region - 1].kind == TF_REGION_MULTI;
    for (int i = lo; i < hi && multi; i++)
        for (int q = 0; q < nodes[i]->nin; q++)
            if (nodes[i]->in[q]->id >= 0) inside[nodes[i]->in[q]->id]++;
    for (int i = lo; i < hi && !st; i++)
        if (nodes[i] != lib && leaves(m, nodes[i], uses, inside)) st = add_store(&b, nodes[i]);
    for (int i = lo; i < hi && multi; i++)
        for (int q = 0; q < nodes[i]->nin; q++)
            if (nodes[i]->in[q]->id >= 0) inside[nodes[i]->in[q]->id] = 0;
    for (int i = 0; i < b.ntouched; i++) expr_of[b.touched[i]] = -1;   /* expressions are per kernel */
    tf_free(b.touched);
    return st;
}

char *tf_kernel_key(const tf_kernel *k)
{
    size_t cap = 256 + (size_t)k->nexprs * (96 + 24 * TF_MAX_RANK) + (size_t)(k->nbufs + k->nreds + k->nstores) * 48;
    char *s = tf_malloc(cap);
    if (!s) return NULL;
    size_t n = 0;
#define KEY(...) (n += (size_t)snprintf(s + n, n < cap ? cap - n : 0, __VA_ARGS__))
    KEY("%d r%d m%u s%d [", (int)k->kind, k->rank, k->reduce_mask, tf_kernel_split_axis(k));
    for (int a = 0; a < k->rank; a++) KEY("%lld,", (long long)k->dims[a]);
    KEY("] b");
    for (int b = 0; b < k->nbufs; b++)
        KEY("%d%c%c", (int)k->bufs[b].value->type.dtype, k->bufs[b].written ? 'w' : 'r', k->bufs[b].disjoint ? 'd' : 'a');
    for (int e = 0; e < k->nexprs; e++) {
        const tf_kexpr *x = &k->exprs[e];
        KEY(" e%d:%d:%d%s:%d(", (int)x->kind, x->op, (int)x->dtype, x->wide ? "w" : "", x->reduced_domain);
        for (int q = 0; q < x->nargs; q++) KEY("%d,", x->args[q]);
        switch (x->kind) {
        case TF_KX_LOAD:
            KEY("b%d+%lld", x->buf, (long long)x->offset);
            for (int a = 0; a < k->rank; a++) KEY(",%lld", (long long)x->strides[a]);
            break;
        case TF_KX_CONST: KEY("%a", x->value); break;
        case TF_KX_REDUCED: KEY("r%d", x->red); break;
        case TF_KX_INDEX: KEY("i%d", x->axis); break;
        case TF_KX_OP:
            if (x->op == TF_OP_DROPOUT_MASK) KEY("p%a s%lld", tf_node_float(x->node, "p"), (long long)tf_node_int(x->node, "salt"));
            break;
        }
        KEY(")");
    }
    for (int r = 0; r < k->nreds; r++)
        KEY(" r%d:%d:%d%s:%a", k->reds[r].op, k->reds[r].arg, (int)k->reds[r].dtype, k->reds[r].wide ? "w" : "", k->reds[r].count);
    for (int t = 0; t < k->nstores; t++) KEY(" s%d:%d:%d", k->stores[t].buf, k->stores[t].expr, k->stores[t].reduced_domain);
#undef KEY
    if (n >= cap) {   /* cannot happen with the estimate above; never hand out a truncated key */
        tf_free(s);
        return NULL;
    }
    return s;
}

/* The value whose memory v uses: views are their operand's, and a value
 * memplan placed in another's block is that one's. */
static const tf_value *storage_root(const tf_value *v)
{
    v = tf_value_storage(v);
    return v->home ? v->home : v;
}

/* Can a's and b's memory overlap? Inputs, params and buffers have their own
 * blocks, and so does every result memplan did not place. */
static bool overlap(const tf_value *a, const tf_value *b)
{
    a = storage_root(a), b = storage_root(b);
    if (a == b) return true;
    if (a->kind != TF_VAL_NODE || b->kind != TF_VAL_NODE || a->offset < 0 || b->offset < 0) return false;
    int64_t ea = a->offset + tf_type_numel(&a->type) * tf_dtype_bytes(a->type.dtype);
    int64_t eb = b->offset + tf_type_numel(&b->type) * tf_dtype_bytes(b->type.dtype);
    return a->offset < eb && b->offset < ea;
}

int tf_kernels_count(const tf_kernel_plan *p)
{
    int n = 0;
    for (int i = 0; i < p->nkernels; i++) {
        const tf_kernel *k = &p->kernels[i];
        if (k->kind == TF_K_VIEW) continue;
        if (k->multi && i > 0 && p->kernels[i - 1].multi && p->kernels[i - 1].region == k->region) continue;
        n++;
    }
    return n;
}

/* Elements of buffer b that k's loads touch (tf_kernel_bytes). */
static int64_t loaded_elements(const tf_kernel *k, int b, int64_t cap)
{
    int64_t n = 0;
    for (int e = 0; e < k->nexprs && n < cap; e++) {
        const tf_kexpr *x = &k->exprs[e];
        if (x->kind != TF_KX_LOAD || x->buf != b) continue;
        bool seen = false;   /* the same load twice reads the same elements */
        for (int f = 0; f < e && !seen; f++) {
            const tf_kexpr *y = &k->exprs[f];
            seen = y->kind == TF_KX_LOAD && y->buf == b && y->offset == x->offset &&
                   !memcmp(y->strides, x->strides, sizeof x->strides);
        }
        if (seen) continue;
        int64_t t = 1;
        for (int a = 0; a < k->rank; a++)
            if (x->strides[a]) t *= k->dims[a];
        n += t;
    }
    return n < cap ? n : cap;
}

int64_t tf_kernel_bytes(const tf_kernel *k)
{
    if (k->kind == TF_K_VIEW) return 0;
    const tf_node *lib = k->lib;
    bool gather = lib && tf_exec_indexed(tf_op_exec_of(lib->op));
    int64_t bytes = 0;
    for (int b = 0; b < k->nbufs; b++) {
        const tf_value *v = k->bufs[b].value;
        int64_t numel = tf_type_numel(&v->type), elems = loaded_elements(k, b, numel);
        for (int q = 0; lib && q < lib->nin; q++) {
            const tf_value *in = lib->in[q]->home ? lib->in[q]->home : lib->in[q];
            if (in != v) continue;
            int64_t whole = gather && tf_type_numel(&lib->out->type) < numel ? tf_type_numel(&lib->out->type) : numel;
            if (whole > elems) elems = whole;
        }
        if (k->bufs[b].written) elems += numel;
        bytes += elems * tf_dtype_bytes(v->type.dtype);
    }
    return bytes;
}

/* A buffer's memory as overlap() sees it, worked out once. */
typedef struct extent {
    const tf_value *root;
    bool placed;                /* in the arena: [lo, hi) */
    int64_t lo, hi;
} extent;

static extent extent_of(const tf_value *v)
{
    extent e = {storage_root(v), false, 0, 0};
    if (e.root->kind == TF_VAL_NODE && e.root->offset >= 0) {
        e.placed = true;
        e.lo = e.root->offset;
        e.hi = e.lo + tf_type_numel(&e.root->type) * tf_dtype_bytes(e.root->type.dtype);
    }
    return e;
}

bool tf_kernels_independent(const tf_kernel *a, const tf_kernel *b)
{
    enum { MAX_FAST = 64 };   /* the multi-tensor check compares each part with every earlier one: extents once per buffer */
    if (a->nbufs > MAX_FAST || b->nbufs > MAX_FAST) {
        for (int i = 0; i < a->nbufs; i++)
            for (int j = 0; j < b->nbufs; j++)
                if ((a->bufs[i].written || b->bufs[j].written) && overlap(a->bufs[i].value, b->bufs[j].value)) return false;
        return true;
    }
    extent ea[MAX_FAST], eb[MAX_FAST];
    for (int i = 0; i < a->nbufs; i++) ea[i] = extent_of(a->bufs[i].value);
    for (int j = 0; j < b->nbufs; j++) eb[j] = extent_of(b->bufs[j].value);
    for (int i = 0; i < a->nbufs; i++)
        for (int j = 0; j < b->nbufs; j++) {
            if (!a->bufs[i].written && !b->bufs[j].written) continue;
            if (ea[i].root == eb[j].root || (ea[i].placed && eb[j].placed && ea[i].lo < eb[j].hi && eb[j].lo < ea[i].hi)) return false;
        }
    return true;
}

int tf_kernel_split_axis(const tf_kernel *k)
{
    if (k->kind == TF_K_VIEW) return -1;
    int best = -1;
    for (int a = 0; a < k->rank; a++) {
        if (k->kind == TF_K_REDUCTION && ((k->reduce_mask >> a) & 1)) continue;
        if (k->dims[a] >= 16) return a;
        if (best < 0 || k->dims[a] > k->dims[best]) best = a;
    }
    return best;
}

/* Whether axes a and a + 1 of k may be one axis: the same kind (both
 * reduced or both not; two reduced axes only up to TF_KERNEL_MERGE_REDUCED
 * elements together, the longest row the LLVM emitter keeps in one block,
 * so that its blocks stay as they were), and every load steps them as one
 * row-major axis (an axis of extent 1 goes with either neighbour). */
enum { TF_KERNEL_MERGE_REDUCED = 4096 };
static bool axes_merge(const tf_kernel *k, int a)
{
    bool ra = (k->reduce_mask >> a) & 1, rb = (k->reduce_mask >> (a + 1)) & 1;
    if (ra != rb || (ra && k->dims[a] * k->dims[a + 1] > TF_KERNEL_MERGE_REDUCED)) return false;
    if (k->dims[a] == 1 || k->dims[a + 1] == 1) return true;
    for (int e = 0; e < k->nexprs; e++) {
        const tf_kexpr *x = &k->exprs[e];
        if (x->kind == TF_KX_LOAD && x->strides[a] != x->strides[a + 1] * k->dims[a + 1]) return false;
    }
    return true;
}

/* Adjacent axes that every load steps as one become one axis, outermost
 * first: an update of a [512, 512, 3, 3] conv weight runs as one loop of
 * 2.4 M elements that vectorizes, not 262 144 loops of 3 that do not. Row-
 * major order is kept, so each element's flat index, and with it every
 * store, dropout draw and reduction lane (by its flat position among the
 * reduced elements), is the same. A kernel with an index expression (iota)
 * names its axes and keeps them. */
static void merge_axes_of(tf_kernel *k)
{
    for (int e = 0; e < k->nexprs; e++)
        if (k->exprs[e].kind == TF_KX_INDEX) return;
    for (int a = k->rank - 2; a >= 0; a--) {
        if (!axes_merge(k, a)) continue;
        for (int e = 0; e < k->nexprs; e++) {
            tf_kexpr *x = &k->exprs[e];
            if (x->kind != TF_KX_LOAD) continue;
            if (k->dims[a + 1] != 1) x->strides[a] = x->strides[a + 1];
            for (int b = a + 1; b + 1 < k->rank; b++) x->strides[b] = x->strides[b + 1];
            x->strides[k->rank - 1] = 0;
        }
        k->dims[a] *= k->dims[a + 1];
        for (int b = a + 1; b + 1 < k->rank; b++) k->dims[b] = k->dims[b + 1];
        k->dims[k->rank - 1] = 0;
        unsigned low = k->reduce_mask & ((1u << (a + 1)) - 1);
        k->reduce_mask = low | ((k->reduce_mask >> (a + 2)) << (a + 1));
        k->rank--;
    }
}

/* A library kernel's epilogue keeps the library op's shape (the GEMM and
 * convolution code match their epilogues against it). */
static void merge_axes(tf_kernel *k)
{
    if (k->kind == TF_K_ELEMENTWISE || k->kind == TF_K_REDUCTION) merge_axes_of(k);
}

/* A reduced axis longer than TF_KERNEL_MERGE_REDUCED becomes two, [L / b,
 * b] with b the largest multiple of 8 up to that many that divides L: the
 * LLVM emitter adds a long row in blocks of its innermost reduced axes, and
 * a row of 16 384 in one axis (a GroupNorm(1) over [C, H, W] flattened)
 * had no block to take and was added one element at a time. Row-major
 * order is kept, so every lane adds what it added. */
static void split_long_rows(tf_kernel *k)
{
    if (k->kind != TF_K_REDUCTION) return;
    for (int e = 0; e < k->nexprs; e++)
        if (k->exprs[e].kind == TF_KX_INDEX) return;   /* it names its axes */
    for (int a = k->rank - 1; a >= 0 && k->rank < TF_MAX_RANK; a--) {
        int64_t L = k->dims[a], b = 0;
        if (!((k->reduce_mask >> a) & 1) || L <= TF_KERNEL_MERGE_REDUCED) continue;
        for (int64_t c = TF_KERNEL_MERGE_REDUCED; c >= 8 && !b; c -= 8)
            if (L % c == 0) b = c;
        if (!b) continue;
        for (int e = 0; e < k->nexprs; e++) {
            tf_kexpr *x = &k->exprs[e];
            if (x->kind != TF_KX_LOAD) continue;
            for (int q = k->rank; q > a + 1; q--) x->strides[q] = x->strides[q - 1];
            x->strides[a + 1] = x->strides[a];
            x->strides[a] *= b;
        }
        for (int q = k->rank; q > a + 1; q--) k->dims[q] = k->dims[q - 1];
        k->dims[a] = L / b, k->dims[a + 1] = b;
        unsigned low = k->reduce_mask & ((1u << (a + 1)) - 1), high = k->reduce_mask >> (a + 1);
        k->reduce_mask = low | (high << (a + 2)) | (1u << (a + 1));
        k->rank++;
        return;   /* one: the emitter's blocks come from the innermost reduced axes */
    }
}

tf_ir_status tf_kernels_build(const tf_module *m, tf_kernel_plan *out, tf_diag *d)
{
    memset(out, 0, sizeof *out);
    int V = 0;
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        if (n->out->id + 1 > V) V = n->out->id + 1;
        for (int q = 0; q < n->nin; q++)   /* operands (decls): numbered before the nodes, but say so here */
            if (n->in[q]->id + 1 > V) V = n->in[q]->id + 1;
    }
    int *expr_of = tf_malloc((size_t)(V ? V : 1) * sizeof *expr_of);
    place *place_of = tf_malloc((size_t)(V ? V : 1) * sizeof *place_of);
    int *uses = tf_calloc((size_t)(V ? V : 1), sizeof *uses), *inside = tf_calloc((size_t)(V ? V : 1), sizeof *inside);
    if (!expr_of || !place_of || !uses || !inside) {
        tf_free(expr_of);
        tf_free(place_of);
        tf_free(uses);
        tf_free(inside);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory building kernels");
    }
    for (int i = 0; i < V; i++) expr_of[i] = -1;
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        for (int q = 0; q < n->nin; q++)
            if (n->in[q]->id >= 0) uses[n->in[q]->id]++;   /* constants are -1 */
    }
    int cap = 0;
    tf_ir_status st = TF_IR_OK;
    for (int i = 0; i < m->nodes.n && !st;) {
        const tf_node *n = m->nodes.items[i];
        int j = i + 1;
        if (n->region && m->regions[n->region - 1].kind != TF_REGION_MULTI)
            while (j < m->nodes.n && ((tf_node *)m->nodes.items[j])->region == n->region) j++;
        else if (n->region) {   /* multi: one elementwise kernel per independent chain (one launch on a GPU) */
            while (j < m->nodes.n && ((tf_node *)m->nodes.items[j])->region == n->region &&
                   tf_type_same_shape(&((tf_node *)m->nodes.items[j])->out->type, &n->out->type))
                j++;
        }
        int first = out->nkernels;
        st = build_unit(m, out, &cap, expr_of, place_of, uses, inside, i, j, d);
        for (int q = first; !st && q < out->nkernels; q++)
            out->kernels[q].multi = out->kernels[q].kind == TF_K_ELEMENTWISE && n->region && m->regions[n->region - 1].kind == TF_REGION_MULTI;
        i = j;
    }
    for (int i = 0; !st && i < out->nkernels; i++) {
        tf_kernel *k = &out->kernels[i];
        merge_axes(k);
        split_long_rows(k);
        for (int b = 0; b < k->nbufs; b++) {
            k->bufs[b].disjoint = true;
            for (int c = 0; c < k->nbufs && k->bufs[b].disjoint; c++)
                if (c != b && overlap(k->bufs[b].value, k->bufs[c].value)) k->bufs[b].disjoint = false;
        }
    }
    tf_free(expr_of);
    tf_free(place_of);
    tf_free(uses);
    tf_free(inside);
    if (st) tf_kernels_free(out);
    return st;
}

int tf_kernel_blocked(const tf_kernel *k, const bool *blocked, int64_t N, int64_t C, int64_t S, int64_t B, tf_kernel *out)
{
    if ((k->kind != TF_K_ELEMENTWISE && !(k->kind == TF_K_LIBRARY && k->nexprs)) || k->multi || B < 1 || C % B ||
        N * C * S != space_numel(k) || N * C * S <= 0)
        return 0;
    for (int e = 0; e < k->nexprs; e++)
        if (k->exprs[e].kind == TF_KX_INDEX || (k->exprs[e].kind == TF_KX_OP && k->exprs[e].op == TF_OP_DROPOUT_MASK)) return 0;
    for (int t = 0; t < k->nstores; t++)
        if (!blocked[k->stores[t].buf] || k->stores[t].reduced_domain) return 0;
    tf_kernel o = *k;
    o.bufs = tf_malloc((size_t)(k->nbufs ? k->nbufs : 1) * sizeof *o.bufs);
    o.exprs = tf_malloc((size_t)(k->nexprs ? k->nexprs : 1) * sizeof *o.exprs);
    o.stores = tf_malloc((size_t)(k->nstores ? k->nstores : 1) * sizeof *o.stores);
    o.reds = NULL, o.nreds = 0;
    if (!o.bufs || !o.exprs || !o.stores) {
        tf_kernel_free(&o);
        return -1;
    }
    memcpy(o.bufs, k->bufs, (size_t)k->nbufs * sizeof *o.bufs);
    memcpy(o.exprs, k->exprs, (size_t)k->nexprs * sizeof *o.exprs);
    memcpy(o.stores, k->stores, (size_t)k->nstores * sizeof *o.stores);
    /* each axis (the library's shape merged as far as the loads allow) a run of whole n, c, s axes */
    merge_axes_of(&o);
    int64_t logical[3] = {C * S, S, 1}, fs[TF_MAX_RANK], f = 1;
    for (int a = o.rank - 1; a >= 0; a--) {
        fs[a] = f;
        f *= o.dims[a];
        bool lo = fs[a] == 1 || fs[a] == S || fs[a] == C * S, hi = f == S || f == C * S || f == N * C * S;
        if (o.dims[a] > 1 && (!lo || !hi)) {
            tf_kernel_free(&o);
            return 0;
        }
    }
    int rank = o.rank;
    int64_t dims[TF_MAX_RANK];
    memcpy(dims, o.dims, sizeof dims);
    o.rank = 4;
    memset(o.dims, 0, sizeof o.dims);
    o.dims[0] = N, o.dims[1] = C / B, o.dims[2] = S, o.dims[3] = B;
    o.reduce_mask = 0;
    for (int e = 0; e < o.nexprs; e++) {
        tf_kexpr *x = &o.exprs[e];
        if (x->kind != TF_KX_LOAD) continue;
        int64_t ls[3];   /* its step along n, c, s: the axis holding that flat stride, scaled within it */
        for (int l = 0; l < 3; l++) {
            ls[l] = 0;
            for (int a = 0; a < rank; a++)
                if (fs[a] <= logical[l] && logical[l] < fs[a] * dims[a]) ls[l] = x->strides[a] * (logical[l] / fs[a]);
        }
        memset(x->strides, 0, sizeof x->strides);
        if (blocked[x->buf]) {
            if ((N > 1 && ls[0] != C * S) || (C > 1 && ls[1] != S) || (S > 1 && ls[2] != 1) || x->offset ||
                tf_type_numel(&o.bufs[x->buf].value->type) != N * C * S) {
                tf_kernel_free(&o);
                return 0;
            }
            x->strides[0] = C * S, x->strides[1] = B * S, x->strides[2] = B, x->strides[3] = 1;
        } else {
            x->strides[0] = ls[0], x->strides[1] = B * ls[1], x->strides[2] = ls[2], x->strides[3] = ls[1];
        }
        for (int a = 0; a < 4; a++)
            if (o.dims[a] == 1) x->strides[a] = 0;
    }
    *out = o;
    return 1;
}

void tf_kernel_free(tf_kernel *k)
{
    tf_free(k->bufs);
    tf_free(k->exprs);
    tf_free(k->reds);
    tf_free(k->stores);
    memset(k, 0, sizeof *k);
}

void tf_kernels_free(tf_kernel_plan *p)
{
    for (int i = 0; i < p->nkernels; i++) {
        tf_free(p->kernels[i].bufs);
        tf_free(p->kernels[i].exprs);
        tf_free(p->kernels[i].reds);
        tf_free(p->kernels[i].stores);
    }
    tf_free(p->kernels);
    memset(p, 0, sizeof *p);
}

/* ---- text ---- */

typedef tf_strbuf sb;

char *tf_kernels_print(const tf_module *m, const tf_kernel_plan *p)
{
    static const char *kinds[] = {"elementwise", "reduction", "library", "view"};
    sb s = {0};
    int views = 0, n = tf_kernels_count(p);
    for (int i = 0; i < p->nkernels; i++) views += p->kernels[i].kind == TF_K_VIEW;
    if (n == p->nkernels) tf_strbuf_printf(&s, "# %d kernels\n", n);
    else tf_strbuf_printf(&s, "# %d kernels (%d entries below: %d view%s, no work%s)\n", n, p->nkernels, views, views == 1 ? "" : "s",
                          p->nkernels - views > n ? "; a multi-tensor region's update chains, one entry each, are one kernel" : "");
    for (int i = 0; i < p->nkernels; i++) {
        const tf_kernel *k = &p->kernels[i];
        tf_strbuf_printf(&s, "\nkernel %s %s", k->name, kinds[k->kind]);
        if (k->region) tf_strbuf_printf(&s, " (region %s)", m->regions[k->region - 1].name);
        tf_strbuf_printf(&s, " over [");
        for (int a = 0; a < k->rank; a++) tf_strbuf_printf(&s, "%s%lld%s", a ? ", " : "", (long long)k->dims[a], (k->reduce_mask >> a) & 1 ? "r" : "");
        tf_strbuf_printf(&s, "]");
        if (k->kind != TF_K_VIEW) tf_strbuf_printf(&s, ", %lld bytes", (long long)tf_kernel_bytes(k));   /* its least traffic */
        tf_strbuf_printf(&s, "\n");
        if (k->lib) tf_strbuf_printf(&s, "  call %s -> %s\n", tf_op_info_of(k->lib->op)->name, k->lib->out->name);
        for (int e = 0; e < k->nexprs; e++) {
            const tf_kexpr *x = &k->exprs[e];
            tf_strbuf_printf(&s, "  e%d : %s%s%s = ", e, tf_dtype_name(x->dtype), x->wide ? " held f32" : "",
                             x->reduced_domain && k->reduce_mask ? " outer" : "");
            switch (x->kind) {
            case TF_KX_LOAD:
                tf_strbuf_printf(&s, "load %s[", k->bufs[x->buf].value->name);
                for (int a = 0; a < k->rank; a++) tf_strbuf_printf(&s, "%s%lld", a ? ", " : "", (long long)x->strides[a]);
                tf_strbuf_printf(&s, "]");
                if (x->offset) tf_strbuf_printf(&s, " + %lld", (long long)x->offset);
                break;
            case TF_KX_CONST: tf_strbuf_printf(&s, "%.17g", x->value); break;
            case TF_KX_REDUCED: tf_strbuf_printf(&s, "%s(e%d)", tf_op_info_of(k->reds[x->red].op)->name, k->reds[x->red].arg); break;
            case TF_KX_INDEX: tf_strbuf_printf(&s, "index %d", x->axis); break;
            case TF_KX_OP:
                tf_strbuf_printf(&s, "%s(", tf_op_info_of(x->op)->name);
                for (int q = 0; q < x->nargs; q++) tf_strbuf_printf(&s, "%se%d", q ? ", " : "", x->args[q]);
                tf_strbuf_printf(&s, ")");
                break;
            }
            tf_strbuf_printf(&s, "\n");
        }
        for (int t = 0; t < k->nstores; t++) {
            const tf_value *bv = k->bufs[k->stores[t].buf].value;
            const tf_node *xn = k->exprs[k->stores[t].expr].node;
            if (xn && xn->out->home == bv)   /* an update memplan writes in place */
                tf_strbuf_printf(&s, "  store %s (%s, in place) = e%d\n", bv->name, xn->out->name, k->stores[t].expr);
            else
                tf_strbuf_printf(&s, "  store %s%s = e%d\n", bv->name, k->stores[t].reduced_domain ? " (outer)" : "",
                                 k->stores[t].expr);
        }
    }
    if (s.oom) {
        tf_free(s.p);
        return NULL;
    }
    return s.p;
}
