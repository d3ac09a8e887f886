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
 * of the step). Offsets are first-fit in op order, 256-byte aligned (what
 * GPU vector loads and cuBLASLt want). In place: an elementwise result may
 * take the buffer of an operand of the same shape and size that dies at that
 * op — the "inplace ReLU" trick, made safe by liveness (not under --O0).
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

/* The value whose memory v uses: itself, or what a reshape views (a reshape
 * of a number owns its memory). */
static tf_value *root_of(tf_value *v)
{
    while (v->kind == TF_VAL_NODE && v->def->op == TF_OP_RESHAPE && v->def->in[0]->kind != TF_VAL_CONST) v = v->def->in[0];
    return v;
}

/* A region's matmul or convolution (its one op that is not an expression:
 * kernel.c's build_unit makes it a library call): the library writes its
 * result to memory and the epilogue reads it from there, so it is placed,
 * alive while its region's kernel runs. */
static bool library_in_region(const tf_node *n)
{
    tf_op_kind k = tf_op_info_of(n->op)->kind;
    return n->region && k != TF_OPK_POINTWISE && k != TF_OPK_REDUCTION && k != TF_OPK_RNG && k != TF_OPK_GENERATOR &&
           n->op != TF_OP_ONE_HOT && !(n->op == TF_OP_RESHAPE && n->in[0]->kind != TF_VAL_CONST);
}

tf_ir_status pass_memplan(tf_module *m, const tf_options *o)
{
    tf_module_renumber(m);
    int N = m->nodes.n, V = m->next_id;
    int *last = tf_malloc((size_t)(V ? V : 1) * sizeof *last);
    bool *mem = tf_calloc((size_t)(V ? V : 1), sizeof *mem), *yielded = tf_calloc((size_t)(V ? V : 1), sizeof *yielded);
    int *region_end = tf_malloc((size_t)(m->nregions + 1) * sizeof *region_end);
    heap h = {0};
    int *dies = NULL, *next = NULL;
    block *busy = NULL;   /* the blocks alive while a region runs */
    tf_ir_status st = TF_IR_OK;
    if (!last || !mem || !yielded || !region_end) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in memplan");
        goto done;
    }
    for (int r = 0; r < m->nregions; r++)
        for (int k = 0; k < m->regions[r].nyields; k++) yielded[m->regions[r].yields[k]->id] = true;
    for (int i = 0; i < V; i++) last[i] = -1;
    for (int i = 0; i < N; i++) {
        tf_node *n = m->nodes.items[i];
        n->out->offset = -1;
        if (n->region) region_end[n->region] = i;
        /* in memory: results outside regions and yields; not views */
        bool view = n->op == TF_OP_RESHAPE && n->in[0]->kind != TF_VAL_CONST;
        mem[n->out->id] = !view && (!n->region || yielded[n->out->id]);
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
            if (!(r->kind == TF_VAL_NODE && r->def->region == n->region) && last[r->id] < region_end[n->region])
                last[r->id] = region_end[n->region];
        }
    }
    int64_t persistent = 0;
    for (int i = 0; i < m->decls.n; i++) {
        tf_value *v = m->decls.items[i];
        int64_t b = bytes_of(v);
        if (b < 0) {
            st = too_big(m, o, v);
            goto done;
        }
        if (b > PLAN_LIMIT - persistent) {
            st = tf_diag_error(o->diag, TF_IR_ERR_LIMIT, &v->loc, "memplan: inputs, params and buffers need more than "
                               "2^62 bytes (%lld): %lld before '%s' and %lld for it; make a dim smaller",
                               (long long)PLAN_LIMIT, (long long)persistent, v->name, (long long)b);
            goto done;
        }
        persistent += b;
    }

    /* values by the op after which they die: dies[t] lists node indices */
    dies = tf_malloc((size_t)(N + 1) * sizeof *dies);
    next = tf_malloc((size_t)(N ? N : 1) * sizeof *next);
    if (!dies || !next) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in memplan");
        goto done;
    }
    for (int t = 0; t <= N; t++) dies[t] = -1;
    for (int i = 0; i < N; i++) {
        tf_value *v = ((tf_node *)m->nodes.items[i])->out;
        if (last[v->id] < 0) last[v->id] = i;   /* unused result: lives at its op only */
        next[i] = dies[last[v->id]];
        dies[last[v->id]] = i;
    }
    int reused = 0, peak_at = -1;
    for (int i = 0; i < N; i++) {
        tf_node *n = m->nodes.items[i];
        tf_value *v = n->out;
        int64_t vbytes = bytes_of(v);
        /* free what died at the previous op */
        for (int j = i ? dies[i - 1] : -1; j >= 0; j = next[j]) {
            tf_value *w = ((tf_node *)m->nodes.items[j])->out;
            if (mem[w->id] && w->offset >= 0 && !heap_free(&h, w->offset, bytes_of(w))) {
                st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in memplan");
                goto done;
            }
        }
        if (!mem[v->id]) continue;
        if (vbytes < 0) {
            st = too_big(m, o, v);
            goto done;
        }
        /* in place over an operand that dies here */
        bool elementwise = tf_op_info_of(n->op)->kind == TF_OPK_POINTWISE &&
                           (!n->region || m->regions[n->region - 1].kind == TF_REGION_POINTWISE);
        int end = n->region ? region_end[n->region] : i;
        tf_value *donor = NULL;
        for (int k = 0; elementwise && !o->opt0 && k < n->nin && !donor; k++) {
            tf_value *u = root_of(n->in[k]);
            if (u->kind == TF_VAL_NODE && u->offset >= 0 && mem[u->id] && last[u->id] <= end && last[u->id] >= i &&
                (!n->region || u->def->region != n->region) && tf_type_same_shape(&u->type, &v->type) &&
                bytes_of(u) == bytes_of(v) && n->in[k] == u)
                donor = u;
        }
        if (donor) {
            v->offset = donor->offset;
            mem[donor->id] = false;   /* handed over: v frees it */
            reused++;
            tf_explain(o, "memplan", &n->loc, "%s writes in place over %s (%lld bytes): %s dies here", v->name,
                       donor->name, (long long)bytes_of(v), donor->name);
        } else {
            int64_t top = h.top;
            if (!heap_alloc(&h, vbytes, &v->offset)) {
                st = tf_diag_error(o->diag, TF_IR_ERR_LIMIT, &n->loc, "memplan: the arena would pass 2^62 bytes "
                                   "(%lld) placing '%s' (%lld bytes) at byte %lld; the step needs more memory than "
                                   "any machine has: make a dim smaller", (long long)PLAN_LIMIT, v->name,
                                   (long long)vbytes, (long long)v->offset);
                v->offset = -1;
                goto done;
            }
            if (h.top > top) peak_at = i;
        }
    }
    /* the regions' library results that no other kernel reads: placed
     * last, each at the lowest offset free while its region runs (first
     * fit over the blocks of the values alive then), so that the offsets of
     * everything else are as without them */
    int lib_placed = 0;
    int64_t lib_bytes = 0, lib_top = h.top;
    for (int i = 0; i < N; i++) {
        tf_node *n = m->nodes.items[i];
        tf_value *v = n->out;
        if (!library_in_region(n) || mem[v->id] || v->offset >= 0) continue;
        int64_t size = bytes_of(v);
        if (size < 0) {
            st = too_big(m, o, v);
            goto done;
        }
        size = align_up(size ? size : 1);
        if (!busy && !(busy = tf_malloc((size_t)(N ? N : 1) * sizeof *busy))) {
            st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in memplan");
            goto done;
        }
        int nb = 0, end = region_end[n->region];
        for (int j = 0; j <= end; j++) {
            tf_value *w = ((tf_node *)m->nodes.items[j])->out;
            if (w->offset >= 0 && w != v && (last[w->id] < j ? j : last[w->id]) >= i)
                busy[nb++] = (block){w->offset, align_up(bytes_of(w) ? bytes_of(w) : 1)};
        }
        qsort(busy, (size_t)nb, sizeof *busy, by_offset);
        int64_t at = 0;
        for (int k = 0; k < nb && busy[k].off < at + size; k++)
            if (busy[k].off + busy[k].size > at) at = busy[k].off + busy[k].size;
        if (at > PLAN_LIMIT - size) {
            st = tf_diag_error(o->diag, TF_IR_ERR_LIMIT, &n->loc, "memplan: the arena would pass 2^62 bytes (%lld) "
                               "placing '%s' (%lld bytes)", (long long)PLAN_LIMIT, v->name, (long long)size);
            goto done;
        }
        v->offset = at;
        if (at + size > h.top) h.top = at + size;
        lib_placed++;
        lib_bytes += size;
    }
    if (lib_placed)
        tf_explain(o, "memplan", NULL, "%d matmul and convolution results that a fused epilogue reads from memory "
                   "(%lld bytes) fit in the gaps of the arena, which they grow by %lld bytes", lib_placed,
                   (long long)lib_bytes, (long long)(h.top - lib_top));
    /* where the arena reached its size: the largest values alive there */
    if (o->explain && peak_at >= 0) {
        char list[768];
        size_t k = 0;
        list[0] = 0;
        for (int round = 0; round < 6; round++) {   /* the six largest, by selection */
            tf_value *best = NULL;
            for (int j = 0; j <= peak_at; j++) {
                tf_value *w = ((tf_node *)m->nodes.items[j])->out;
                if (w->offset < 0 || last[w->id] < peak_at || strstr(list, w->name)) continue;
                if (!best || bytes_of(w) > bytes_of(best)) best = w;
            }
            if (!best || k >= sizeof list) break;
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s (%lld)", k ? ", " : "", best->name, (long long)bytes_of(best));
        }
        tf_explain(o, "memplan", &((tf_node *)m->nodes.items[peak_at])->loc, "the arena peaks at %s; largest live: %s",
                   ((tf_node *)m->nodes.items[peak_at])->out->name, list);
    }
    if (h.top > PLAN_LIMIT - persistent) {
        st = tf_diag_error(o->diag, TF_IR_ERR_LIMIT, NULL, "memplan: the peak, arena %lld + persistent %lld bytes, "
                           "is more than 2^62 bytes (%lld): make a dim smaller", (long long)h.top,
                           (long long)persistent, (long long)PLAN_LIMIT);
        goto done;
    }
    m->plan.planned = true;
    m->plan.arena_bytes = h.top;
    m->plan.persistent_bytes = persistent;
    m->plan.reused = reused;
    tf_explain(o, "memplan", NULL, "arena %lld bytes + persistent %lld bytes (inputs, params, buffers) = peak %lld bytes; "
               "%d results in place", (long long)h.top, (long long)persistent, (long long)(h.top + persistent), reused);
done:
    tf_free(busy);
    tf_free(h.free);
    tf_free(dies);
    tf_free(next);
    tf_free(last);
    tf_free(mem);
    tf_free(yielded);
    tf_free(region_end);
    return st;
}
