/* memplan.c — liveness, one static arena, in-place reuse, peak bytes.
 *
 * Every value that reaches memory gets a byte offset in one arena allocated
 * once per session: results of ops outside regions, the values regions
 * yield, and the result of a region's matmul or convolution, which its
 * epilogue reads from memory (placed after the rest, each in the lowest gap
 * free while its region runs, so that the others' offsets do not depend on
 * them). Values private to a region live in registers; a reshape is a view
 * of its operand's memory (its operand lives as long as the view is used);
 * inputs, params and buffers are persistent and counted apart. A value
 * lives from its op to its last use (outputs and buffer updates to the end
 * of the step). Offsets are 256-byte aligned (what GPU vector loads and
 * cuBLASLt want), placed twice: first-fit in op order, and largest first
 * (each block at the lowest offset free over its lifetime, the "greedy by
 * size" of TFLite's arena planner); the smaller arena wins. First-fit
 * leaves holes where a small value outlives the large ones around it
 * (resnet at 40% of its peak: 11% over the most bytes ever alive at once);
 * largest-first packs the big blocks first and the small ones into the gaps. In place: an elementwise result may
 * take the buffer of an operand of the same shape and size that dies at that
 * op — the "inplace ReLU" trick, made safe by liveness (not under --O0); in
 * a reduction kernel too, for a result over its whole index space (every
 * emitter finishes an outer index's reductions before its full-space
 * stores), unless the operand is a matmul's product (see the DRELU note).
 * Updates in place: an update's new value is computed straight into the
 * storage of the param or buffer it replaces (value->home), as PyTorch's
 * optimizers update in place, instead of living in the arena to the end of
 * the step and being copied there; see home_updates for when that is safe.
 * peak_bytes = persistent + arena: out-of-memory is a compile-time number. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

enum { ALIGN = 256 };

/* Every size and offset is checked against this limit (2^62 bytes, far past
 * any machine), so no sum or product here can overflow int64 and the peak
 * (arena + persistent) still fits one: past it, planning stops with a
 * TF_IR_ERR_LIMIT error naming the value that crossed it. */
#define PLAN_LIMIT ((int64_t)1 << 62)

typedef struct block { int64_t off, size; } block;

typedef struct heap {
    block *free;           /* free blocks, sorted by offset */
    int n, cap;
    int64_t top;           /* arena high-water mark */
} heap;

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }   /* x <= PLAN_LIMIT */

/* false: no room within PLAN_LIMIT (*off is where the block would start). */
static bool heap_alloc(heap *h, int64_t size, int64_t *off)
{
    size = align_up(size ? size : 1);
    for (int i = 0; i < h->n; i++)
        if (h->free[i].size >= size) {
            *off = h->free[i].off;
            h->free[i].off += size;
            h->free[i].size -= size;
            if (!h->free[i].size) memmove(&h->free[i], &h->free[i + 1], (size_t)(--h->n - i) * sizeof *h->free);
            return true;
        }
    /* grow: extend a free block that ends at the top, else allocate at the top */
    bool extend = h->n && h->free[h->n - 1].off + h->free[h->n - 1].size == h->top;
    *off = extend ? h->free[h->n - 1].off : h->top;
    if (size > PLAN_LIMIT - *off) return false;
    h->n -= extend;
    h->top = *off + size;
    return true;
}

static bool heap_free(heap *h, int64_t off, int64_t size)
{
    size = align_up(size ? size : 1);
    if (tf_grow((void **)&h->free, h->n, &h->cap, sizeof *h->free)) return false;
    int i = 0;
    while (i < h->n && h->free[i].off < off) i++;
    memmove(&h->free[i + 1], &h->free[i], (size_t)(h->n - i) * sizeof *h->free);
    h->free[i] = (block){off, size};
    h->n++;
    /* coalesce with neighbours */
    if (i + 1 < h->n && h->free[i].off + h->free[i].size == h->free[i + 1].off) {
        h->free[i].size += h->free[i + 1].size;
        memmove(&h->free[i + 1], &h->free[i + 2], (size_t)(h->n - i - 2) * sizeof *h->free);
        h->n--;
    }
    if (i > 0 && h->free[i - 1].off + h->free[i - 1].size == h->free[i].off) {
        h->free[i - 1].size += h->free[i].size;
        memmove(&h->free[i], &h->free[i + 1], (size_t)(h->n - i - 1) * sizeof *h->free);
        h->n--;
    }
    return true;
}

/* Bytes of v's type, or -1 past PLAN_LIMIT (computed here with checks:
 * a type made by a pass has not necessarily met the verifier's limits). */
static int64_t bytes_of(const tf_value *v)
{
    int64_t b = tf_dtype_bytes(v->type.dtype);
    for (int i = 0; i < v->type.rank; i++) {
        int64_t n = v->type.dims[i].n;
        if (n < 0 || (n && b > PLAN_LIMIT / n)) return -1;
        b *= n;
    }
    return b;
}

static tf_ir_status too_big(tf_module *m, const tf_options *o, const tf_value *v)
{
    char t[256];
    return tf_diag_error(o->diag, TF_IR_ERR_LIMIT, &v->loc, "memplan: '%s' of type %s needs more than 2^62 bytes (%lld)",
                         v->name ? v->name : "a number", tf_type_str(m, &v->type, t), (long long)PLAN_LIMIT);
}

static int by_offset(const void *a, const void *b)
{
    const block *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* The arena's blocks for the largest-first placement: each lives over the
 * ops [start, end] (an in-place chain is one block). */
typedef struct lifetime { int64_t size, off; int start, end, id; } lifetime;

static int by_size(const void *a, const void *b)
{
    const lifetime *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->id - y->id;
}

/* Largest first: each block at the lowest offset where it overlaps no
 * block placed before it that is alive at the same time. Returns the
 * arena's size; sorted and placed are scratch of nb entries (placed: the
 * blocks placed so far, kept in offset order, so that each new block scans
 * them once and sorts nothing). */
static int64_t place_by_size(lifetime *b, int nb, lifetime *sorted, lifetime *placed)
{
    memcpy(sorted, b, (size_t)nb * sizeof *b);
    qsort(sorted, (size_t)nb, sizeof *sorted, by_size);
    int64_t top = 0;
    for (int k = 0; k < nb; k++) {
        lifetime *x = &sorted[k];
        int64_t at = 0;
        for (int q = 0; q < k && placed[q].off < at + x->size; q++) {
            const lifetime *y = &placed[q];
            if (y->start <= x->end && x->start <= y->end && y->off + y->size > at) at = y->off + y->size;
        }
        x->off = b[x->id].off = at;
        if (at + x->size > top) top = at + x->size;
        int lo = 0, hi = k;   /* after every placed block at an offset <= at */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (placed[mid].off <= at) lo = mid + 1;
            else hi = mid;
        }
        memmove(&placed[lo + 1], &placed[lo], (size_t)(k - lo) * sizeof *placed);
        placed[lo] = *x;
    }
    return top;
}

/* The value whose memory v uses: itself, or what a view views (a reshape
 * of a number owns its memory): ops.c's tf_value_storage. */
static tf_value *root_of(tf_value *v) { return (tf_value *)tf_value_storage(v); }

/* A region's matmul or convolution (its one op that is not an expression:
 * kernel.c's build_unit makes it a library call): the library writes its
 * result to memory and the epilogue reads it from there, so it is placed,
 * alive while its region's kernel runs. */
static bool library_in_region(const tf_node *n)
{
    tf_op_exec x = tf_op_exec_of(n->op);
    /* (a broadcast folded into the region is placed too, though its kernel
     * reads its operand with zero strides instead: kept as it was) */
    return n->region && !tf_exec_elementwise(x) && x != TF_OPX_REDUCE && !tf_node_is_view(n);
}

/* The nodes [*ks, *ke] of the kernel that computes node i, as
 * tf_kernels_build (codegen/kernel.c) cuts them: a lone op, a region's
 * contiguous run of nodes, or in a multi-tensor region a run of nodes whose
 * results have the shape of the run's first. */
static void kernel_span(const tf_module *m, int i, int *ks, int *ke)
{
    const tf_node *n = m->nodes.items[i];
    *ks = *ke = i;
    if (!n->region) return;
    int s = i, e = i, N = m->nodes.n;
    while (s > 0 && ((tf_node *)m->nodes.items[s - 1])->region == n->region) s--;
    while (e + 1 < N && ((tf_node *)m->nodes.items[e + 1])->region == n->region) e++;
    if (m->regions[n->region - 1].kind == TF_REGION_MULTI) {
        int end = e;
        for (int j = s; j <= i;) {
            int start = j;
            const tf_type *t = &((tf_node *)m->nodes.items[start])->out->type;
            while (j <= end && tf_type_same_shape(&((tf_node *)m->nodes.items[j])->out->type, t)) j++;
            s = start, e = j - 1;
        }
    }
    *ks = s, *ke = e;
}

/* Updates written in place (value->home). An update `update B = V` stores V
 * straight into B's storage when V is computed by an elementwise kernel (a
 * pointwise op alone, or in a pointwise or multi-tensor region) and that is
 * safe: every op reading B runs in an earlier kernel, or in V's kernel as a
 * pointwise op of V's shape reading B itself (not a view), so at the same
 * index as it writes V (the code generators load every operand of an
 * element before storing any result of it); no output is B and no update
 * reads B (the step's end reads those after the kernels). V then takes no
 * room in the arena, and the update costs no copy. Not under --O0 (no
 * in-place anything there). A multi-tensor optimizer step has a kernel per
 * run of same-shaped update chains, so every param can update in place.
 * Returns how many, -1 when out of memory. */
static int home_updates(tf_module *m, const tf_options *o, bool *mem)
{
    int N = m->nodes.n, homed = 0;
    if (!m->nupdates || o->opt0) return 0;
    /* per value id: the last node reading it (itself or a view of it), -1 */
    int *last_read = tf_malloc((size_t)(m->next_id ? m->next_id : 1) * sizeof *last_read);
    if (!last_read) return -1;
    for (int i = 0; i < m->next_id; i++) last_read[i] = -1;
    for (int j = 0; j < N; j++) {
        tf_node *n = m->nodes.items[j];
        for (int q = 0; q < n->nin; q++)
            if (n->in[q]->kind != TF_VAL_CONST) last_read[root_of(n->in[q])->id] = j;
    }
    for (int u = 0; u < m->nupdates; u++) {
        tf_value *b = m->updates[u].buffer, *v = m->updates[u].value;
        if (v->kind != TF_VAL_NODE || v->home || !mem[v->id] || (b->kind != TF_VAL_PARAM && b->kind != TF_VAL_BUFFER) ||
            tf_op_info_of(v->def->op)->kind != TF_OPK_POINTWISE || bytes_of(v) != bytes_of(b) ||
            !tf_type_same_shape(&v->type, &b->type))
            continue;
        const tf_node *n = v->def;
        if (n->region && m->regions[n->region - 1].kind != TF_REGION_POINTWISE &&
            m->regions[n->region - 1].kind != TF_REGION_MULTI)
            continue;
        bool ok = true;
        for (int k = 0; k < m->noutputs && ok; k++) ok = root_of(m->outputs[k].value) != b;
        for (int k = 0; k < m->nupdates && ok; k++) ok = m->updates[k].value->kind == TF_VAL_CONST || root_of(m->updates[k].value) != b;
        int ks, ke;
        kernel_span(m, v->id - m->decls.n, &ks, &ke);   /* renumbered: decls, then nodes in order */
        ok = ok && last_read[b->id] <= ke;
        for (int j = ks; j <= ke && ok; j++) {
            const tf_node *r = m->nodes.items[j];
            for (int q = 0; q < r->nin && ok; q++) {
                if (r->in[q]->kind == TF_VAL_CONST || root_of(r->in[q]) != b) continue;
                ok = r->in[q] == b && tf_op_info_of(r->op)->kind == TF_OPK_POINTWISE && tf_type_same_shape(&r->out->type, &v->type);
            }
        }
        if (!ok) continue;
        v->home = b;
        mem[v->id] = false;
        homed++;
        tf_explain(o, "memplan", &n->loc, "%s is written in place into %s %s (%lld bytes, no copy at the step's end): "
                   "nothing reads %s after it", v->name, b->kind == TF_VAL_PARAM ? "param" : "buffer", b->name,
                   (long long)bytes_of(v), b->name);
    }
    tf_free(last_read);
    return homed;
}

/* pass_memplan's state, step by step (each step a function below). */
typedef struct mp {
    tf_module *m;
    const tf_options *o;
    int N, V;
    int *last;                    /* value id -> the last node index that reads it (N: an output or update) */
    bool *mem, *yielded;          /* value id -> in memory; yielded by its region */
    int *region_end;              /* region -> its last node index */
    const tf_type **region_space; /* region -> a reduction region's index space (its reductions' input), else NULL */
    heap h;
    int *dies, *next;             /* values by the op after which they die: dies[t] lists node indices via next */
    int *blk;                     /* value id -> its first-fit block, -1 for none */
    lifetime *life, *sorted, *placed;
    block *busy;                  /* the blocks alive while a region runs */
    int nb, reused, homed, peak_at;
    int64_t persistent;
} mp;

static tf_ir_status mp_oom(mp *p) { return tf_diag_error(p->o->diag, TF_IR_ERR_OOM, NULL, "out of memory in memplan"); }

/* How long each value lives (last[]), which values are in memory, and the
 * regions' extents. */
static void mp_lifetimes(mp *p)
{
    tf_module *m = p->m;
    int N = p->N;
    int *last = p->last;
    for (int r = 0; r < m->nregions; r++)
        for (int k = 0; k < m->regions[r].nyields; k++) p->yielded[m->regions[r].yields[k]->id] = true;
    for (int i = 0; i < p->V; i++) last[i] = -1;
    for (int i = 0; i < N; i++) {
        tf_node *n = m->nodes.items[i];
        n->out->offset = -1;
        n->out->home = NULL;
        if (n->region) p->region_end[n->region] = i;
        if (n->region && tf_op_exec_of(n->op) == TF_OPX_REDUCE && !p->region_space[n->region])
            p->region_space[n->region] = &n->in[0]->type;
        /* in memory: results outside regions and yields; not views */
        bool view = tf_node_is_view(n);
        p->mem[n->out->id] = !view && (!n->region || p->yielded[n->out->id]);
        for (int k = 0; k < n->nin; k++) {
            tf_value *v = n->in[k];
            if (v->kind == TF_VAL_CONST) continue;
            tf_value *r = root_of(v);
            if (last[r->id] < i) last[r->id] = i;
        }
    }
    for (int i = 0; i < m->noutputs; i++) last[root_of(m->outputs[i].value)->id] = N;
    for (int i = 0; i < m->nupdates; i++) last[root_of(m->updates[i].value)->id] = N;
    /* a region's operands stay alive to the region's end: its kernel reads them throughout */
    for (int i = 0; i < N; i++) {
        tf_node *n = m->nodes.items[i];
        if (!n->region) continue;
        for (int k = 0; k < n->nin; k++) {
            tf_value *v = n->in[k];
            if (v->kind == TF_VAL_CONST) continue;
            tf_value *r = root_of(v);
            if (!(r->kind == TF_VAL_NODE && r->def->region == n->region) && last[r->id] < p->region_end[n->region])
                last[r->id] = p->region_end[n->region];
        }
    }
    /* a backward matmul whose result ReLU's backward (a `where` in a fused
     * kernel, with the bias gradient) reads: its operands live to that
     * kernel's end, so that the cuda target may run the GEMM in that
     * kernel's place with the kernel's work as cuBLASLt's epilogue
     * (DRELU_BGRAD), its operands intact and apart from what the kernel
     * writes, however the blocks are placed */
    for (int i = 0; i < N; i++) {
        tf_node *n = m->nodes.items[i];
        if (!n->region || !n->backward || n->op != TF_OP_WHERE || m->regions[n->region - 1].kind == TF_REGION_MULTI) continue;
        int end = p->region_end[n->region];
        for (int k = 0; k < n->nin; k++) {
            tf_value *pv = root_of(n->in[k]);
            if (pv->kind != TF_VAL_NODE || pv->def->region == n->region || tf_op_info_of(pv->def->op)->kind != TF_OPK_MATMUL)
                continue;
            for (int q = 0; q < pv->def->nin; q++) {
                tf_value *u = pv->def->in[q];
                if (u->kind != TF_VAL_CONST && last[root_of(u)->id] < end) last[root_of(u)->id] = end;
            }
        }
    }
}

/* Inference: the values computed from params, buffers and constants alone (value->once). Each lives for the whole
 * step in memory of its own, placed before the first op, so that what it holds at the end of a step is still there at
 * the start of the next and a target may skip computing it again until the state changes. Not under --O0 (no
 * optimizing pass: the plan stays the plain one). */
static void mp_once(mp *p)
{
    tf_module *m = p->m;
    for (int i = 0; i < p->N; i++) ((tf_node *)m->nodes.items[i])->out->once = false;
    if (p->o->mode != TF_IR_INFER || p->o->opt0) return;
    for (int i = 0; i < p->N; i++) {
        tf_node *n = m->nodes.items[i];
        bool once = n->op != TF_OP_DROPOUT_MASK && n->op != TF_OP_DROPOUT && tf_op_exec_of(n->op) != TF_OPX_COMM;
        for (int k = 0; once && k < n->nin; k++) {
            const tf_value *v = n->in[k];
            once = v->kind == TF_VAL_CONST || v->kind == TF_VAL_PARAM || (v->kind == TF_VAL_BUFFER && !m->nupdates) ||
                   (v->kind == TF_VAL_NODE && v->once);
        }
        n->out->once = once;
        if (once && p->mem[n->out->id]) {
            p->last[n->out->id] = p->N;   /* to the step's end (and, in place, to the next step) */
            tf_explain(p->o, "memplan", &n->loc, "%s is computed from the state alone: memory of its own, and a target may "
                       "compute it once per state", n->out->name);
        }
    }
}

/* The bytes of inputs, params and buffers, which live for the whole step. */
static tf_ir_status mp_persistent(mp *p)
{
    for (int i = 0; i < p->m->decls.n; i++) {
        tf_value *v = p->m->decls.items[i];
        int64_t b = bytes_of(v);
        if (b < 0) return too_big(p->m, p->o, v);
        if (b > PLAN_LIMIT - p->persistent)
            return tf_diag_error(p->o->diag, TF_IR_ERR_LIMIT, &v->loc, "memplan: inputs, params and buffers need more than "
                                 "2^62 bytes (%lld): %lld before '%s' and %lld for it; make a dim smaller",
                                 (long long)PLAN_LIMIT, (long long)p->persistent, v->name, (long long)b);
        p->persistent += b;
    }
    return TF_IR_OK;
}

/* The value an elementwise node n may write in place over: an operand of
 * its shape and size that dies here, in another kernel. An allreduce too:
 * every target reads its operand (into a bucket, or a host copy) before it
 * writes the mean, so a gradient's mean takes the gradient's place. In a reduction
 * kernel, too, for a result over the whole index space: every emitter (and
 * kernel_eval.c) finishes an outer index's reductions, every read of them,
 * before its full-space stores, and each of those reads its operands at the
 * element it writes (a batchnorm's input gradient over the gradient it is
 * computed from). */
static tf_value *mp_donor(const mp *p, const tf_node *n, int i)
{
    const tf_value *v = n->out;
    const tf_region_kind rk = n->region ? p->m->regions[n->region - 1].kind : TF_REGION_POINTWISE;
    bool elementwise = (tf_op_info_of(n->op)->kind == TF_OPK_POINTWISE || tf_op_info_of(n->op)->kind == TF_OPK_COMM) &&
                       (!n->region || rk == TF_REGION_POINTWISE ||
                        (rk == TF_REGION_REDUCTION && p->region_space[n->region] &&
                         tf_type_same_shape(&v->type, p->region_space[n->region])));
    int end = n->region ? p->region_end[n->region] : i;
    for (int k = 0; elementwise && !p->o->opt0 && k < n->nin; k++) {
        tf_value *u = root_of(n->in[k]);
        if (u->kind == TF_VAL_NODE && u->offset >= 0 && p->mem[u->id] && p->last[u->id] <= end && p->last[u->id] >= i &&
            (!n->region || u->def->region != n->region) && tf_type_same_shape(&u->type, &v->type) &&
            bytes_of(u) == bytes_of(v) && n->in[k] == u &&
            /* a matmul's product read by a reduction kernel stays apart from what the kernel writes: the
             * cuda target may run that kernel as the GEMM's epilogue (ReLU's backward with the bias
             * gradient, DRELU_BGRAD), which writes its result beside the product, not over it */
            !(rk == TF_REGION_REDUCTION && tf_op_info_of(u->def->op)->kind == TF_OPK_MATMUL))
            return u;
    }
    return NULL;
}

/* First fit in op order: each value in memory gets a block when made (or
 * its donor's), freed after its last reader. */
static tf_ir_status mp_first_fit(mp *p)
{
    tf_module *m = p->m;
    for (int t = 0; t <= p->N; t++) p->dies[t] = -1;
    for (int i = 0; i < p->N; i++) {
        tf_value *v = ((tf_node *)m->nodes.items[i])->out;
        if (p->last[v->id] < 0) p->last[v->id] = i;   /* unused result: lives at its op only */
        p->next[i] = p->dies[p->last[v->id]];
        p->dies[p->last[v->id]] = i;
    }
    for (int i = 0; i < p->V; i++) p->blk[i] = -1;
    for (int i = 0; i < p->N; i++) {   /* once values first, alive from before the first op to after the last */
        tf_value *v = ((tf_node *)m->nodes.items[i])->out;
        int64_t vbytes = bytes_of(v);
        if (!v->once || !p->mem[v->id]) continue;
        if (vbytes < 0) return too_big(m, p->o, v);
        if (!heap_alloc(&p->h, vbytes, &v->offset)) return mp_oom(p);
        p->blk[v->id] = p->nb;
        p->life[p->nb] = (lifetime){align_up(vbytes ? vbytes : 1), 0, 0, p->N, p->nb};
        p->nb++;
    }
    for (int i = 0; i < p->N; i++) {
        tf_node *n = m->nodes.items[i];
        tf_value *v = n->out;
        int64_t vbytes = bytes_of(v);
        if (v->once && p->blk[v->id] >= 0) continue;   /* placed above */
        /* free what died at the previous op */
        for (int j = i ? p->dies[i - 1] : -1; j >= 0; j = p->next[j]) {
            tf_value *w = ((tf_node *)m->nodes.items[j])->out;
            if (p->mem[w->id] && w->offset >= 0 && !heap_free(&p->h, w->offset, bytes_of(w))) return mp_oom(p);
        }
        if (!p->mem[v->id]) continue;
        if (vbytes < 0) return too_big(m, p->o, v);
        tf_value *donor = mp_donor(p, n, i);
        if (donor) {
            v->offset = donor->offset;
            p->blk[v->id] = p->blk[donor->id];
            p->mem[donor->id] = false;   /* handed over: v frees it */
            p->reused++;
            tf_explain(p->o, "memplan", &n->loc, "%s writes in place over %s (%lld bytes): %s dies here", v->name,
                       donor->name, (long long)bytes_of(v), donor->name);
            continue;
        }
        int64_t top = p->h.top;
        if (!heap_alloc(&p->h, vbytes, &v->offset)) {
            tf_ir_status st = tf_diag_error(p->o->diag, TF_IR_ERR_LIMIT, &n->loc, "memplan: the arena would pass 2^62 bytes "
                                            "(%lld) placing '%s' (%lld bytes) at byte %lld; the step needs more memory than "
                                            "any machine has: make a dim smaller", (long long)PLAN_LIMIT, v->name,
                                            (long long)vbytes, (long long)v->offset);
            v->offset = -1;
            return st;
        }
        if (p->h.top > top) p->peak_at = i;
        p->blk[v->id] = p->nb;
        p->life[p->nb] = (lifetime){align_up(vbytes ? vbytes : 1), 0, i, i, p->nb};
        p->nb++;
    }
    return TF_IR_OK;
}

/* The same blocks placed largest first, kept where that makes a smaller arena. */
static void mp_largest_first(mp *p)
{
    tf_module *m = p->m;
    for (int i = 0; i < p->N; i++) {   /* a block lives until the last value in it dies */
        const tf_value *v = ((tf_node *)m->nodes.items[i])->out;
        if (p->blk[v->id] >= 0 && p->last[v->id] > p->life[p->blk[v->id]].end) p->life[p->blk[v->id]].end = p->last[v->id];
    }
    int64_t by_size_top = place_by_size(p->life, p->nb, p->sorted, p->placed);
    if (by_size_top >= p->h.top) return;
    tf_explain(p->o, "memplan", NULL, "largest-first placement: an arena of %lld bytes (first-fit in op order: %lld)",
               (long long)by_size_top, (long long)p->h.top);
    for (int i = 0; i < p->N; i++) {
        tf_value *v = ((tf_node *)m->nodes.items[i])->out;
        if (p->blk[v->id] >= 0) v->offset = p->life[p->blk[v->id]].off;
    }
    p->h.top = by_size_top;
    for (int b = 0; b < p->nb; b++)   /* the peak: where the block that ends the arena is made */
        if (p->life[b].off + p->life[b].size == by_size_top) {
            p->peak_at = p->life[b].start;
            break;
        }
}

/* The regions' library results that no other kernel reads: placed last,
 * each at the lowest offset free while its region runs (first fit over the
 * blocks of the values alive then), so that the offsets of everything else
 * are as without them. */
static tf_ir_status mp_region_libraries(mp *p)
{
    tf_module *m = p->m;
    int lib_placed = 0;
    int64_t lib_bytes = 0, lib_top = p->h.top;
    for (int i = 0; i < p->N; i++) {
        tf_node *n = m->nodes.items[i];
        tf_value *v = n->out;
        if (!library_in_region(n) || p->mem[v->id] || v->offset >= 0) continue;
        int64_t size = bytes_of(v);
        if (size < 0) return too_big(m, p->o, v);
        size = align_up(size ? size : 1);
        int nb = 0, end = p->region_end[n->region];
        for (int j = 0; j < p->N; j++) {   /* what is alive then: made by the region's end, or once (alive throughout) */
            tf_value *w = ((tf_node *)m->nodes.items[j])->out;
            if (w->offset >= 0 && w != v && ((j <= end && (p->last[w->id] < j ? j : p->last[w->id]) >= i) || w->once))
                p->busy[nb++] = (block){w->offset, align_up(bytes_of(w) ? bytes_of(w) : 1)};
        }
        qsort(p->busy, (size_t)nb, sizeof *p->busy, by_offset);
        int64_t at = 0;
        for (int k = 0; k < nb && p->busy[k].off < at + size; k++)
            if (p->busy[k].off + p->busy[k].size > at) at = p->busy[k].off + p->busy[k].size;
        if (at > PLAN_LIMIT - size)
            return tf_diag_error(p->o->diag, TF_IR_ERR_LIMIT, &n->loc, "memplan: the arena would pass 2^62 bytes (%lld) "
                                 "placing '%s' (%lld bytes)", (long long)PLAN_LIMIT, v->name, (long long)size);
        v->offset = at;
        if (at + size > p->h.top) p->h.top = at + size;
        lib_placed++;
        lib_bytes += size;
    }
    if (lib_placed)
        tf_explain(p->o, "memplan", NULL, "%d matmul and convolution results that a fused epilogue reads from memory "
                   "(%lld bytes) fit in the gaps of the arena, which they grow by %lld bytes", lib_placed,
                   (long long)lib_bytes, (long long)(p->h.top - lib_top));
    return TF_IR_OK;
}

/* --explain: where the arena reached its size, and the largest values alive there. */
static void mp_explain_peak(const mp *p)
{
    if (!p->o->explain || p->peak_at < 0) return;
    char list[768];
    size_t k = 0;
    list[0] = 0;
    for (int round = 0; round < 6; round++) {   /* the six largest, by selection */
        tf_value *best = NULL;
        for (int j = 0; j <= p->peak_at; j++) {
            tf_value *w = ((tf_node *)p->m->nodes.items[j])->out;
            if (w->offset < 0 || p->last[w->id] < p->peak_at || strstr(list, w->name)) continue;
            if (!best || bytes_of(w) > bytes_of(best)) best = w;
        }
        if (!best || k >= sizeof list) break;
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%s (%lld)", k ? ", " : "", best->name, (long long)bytes_of(best));
    }
    const tf_node *at = p->m->nodes.items[p->peak_at];
    tf_explain(p->o, "memplan", &at->loc, "the arena peaks at %s; largest live: %s", at->out->name, list);
}

static void mp_free(mp *p)
{
    tf_free(p->busy);
    tf_free(p->blk);
    tf_free(p->life);
    tf_free(p->sorted);
    tf_free(p->placed);
    tf_free(p->h.free);
    tf_free(p->dies);
    tf_free(p->next);
    tf_free(p->last);
    tf_free(p->mem);
    tf_free(p->yielded);
    tf_free(p->region_end);
    tf_free(p->region_space);
}

tf_ir_status pass_memplan(tf_module *m, const tf_options *o)
{
    tf_module_renumber(m);
    mp p = {.m = m, .o = o, .N = m->nodes.n, .V = m->next_id, .peak_at = -1};
    size_t V1 = (size_t)(p.V ? p.V : 1), N1 = (size_t)(p.N ? p.N : 1);
    p.last = tf_malloc(V1 * sizeof *p.last);
    p.mem = tf_calloc(V1, sizeof *p.mem);
    p.yielded = tf_calloc(V1, sizeof *p.yielded);
    p.region_end = tf_malloc((size_t)(m->nregions + 1) * sizeof *p.region_end);
    p.region_space = tf_calloc((size_t)(m->nregions + 1), sizeof *p.region_space);
    p.dies = tf_malloc((size_t)(p.N + 1) * sizeof *p.dies);
    p.next = tf_malloc(N1 * sizeof *p.next);
    p.blk = tf_malloc(V1 * sizeof *p.blk);
    p.life = tf_malloc(N1 * sizeof *p.life);
    p.sorted = tf_malloc(N1 * sizeof *p.sorted);
    p.placed = tf_malloc(N1 * sizeof *p.placed);
    p.busy = tf_malloc(N1 * sizeof *p.busy);
    tf_ir_status st = TF_IR_OK;
    if (!p.last || !p.mem || !p.yielded || !p.region_end || !p.region_space || !p.dies || !p.next || !p.blk || !p.life ||
        !p.sorted || !p.placed || !p.busy) {
        st = mp_oom(&p);
        goto done;
    }
    mp_lifetimes(&p);
    mp_once(&p);
    if ((p.homed = home_updates(m, o, p.mem)) < 0) {
        st = mp_oom(&p);
        goto done;
    }
    if ((st = mp_persistent(&p)) || (st = mp_first_fit(&p))) goto done;
    mp_largest_first(&p);
    if ((st = mp_region_libraries(&p))) goto done;
    mp_explain_peak(&p);
    if (p.h.top > PLAN_LIMIT - p.persistent) {
        st = tf_diag_error(o->diag, TF_IR_ERR_LIMIT, NULL, "memplan: the peak, arena %lld + persistent %lld bytes, "
                           "is more than 2^62 bytes (%lld): make a dim smaller", (long long)p.h.top,
                           (long long)p.persistent, (long long)PLAN_LIMIT);
        goto done;
    }
    m->plan.planned = true;
    m->plan.arena_bytes = p.h.top;
    m->plan.persistent_bytes = p.persistent;
    m->plan.reused = p.reused;
    m->plan.updates_in_place = p.homed;
    tf_explain(o, "memplan", NULL, "arena %lld bytes + persistent %lld bytes (inputs, params, buffers) = peak %lld bytes; "
               "%d results in place, %d of %d updates in place", (long long)p.h.top, (long long)p.persistent,
               (long long)(p.h.top + p.persistent), p.reused, p.homed, m->nupdates);
done:
    mp_free(&p);
    return st;
}
