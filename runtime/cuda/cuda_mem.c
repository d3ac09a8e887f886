/* cuda_mem.c — the cuda target's device memory: where every value lives
 * (memplan's arena, and one state block for the rest: inputs, params,
 * buffers, the updates' staging, the constants a step writes, {seed, step},
 * the error words and cuBLASLt's workspace), the blocks and the pinned host
 * staging allocated, and the initial state copied in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_session.h"

static const char *human(double bytes, char *buf, size_t n)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
    if (u == 0) snprintf(buf, n, "%.0f bytes", bytes);
    else snprintf(buf, n, "%.2f %s", bytes, units[u]);
    return buf;
}

/* ---- placing values ----------------------------------------------------------- */

/* Offsets of everything in the state block (and which values the arena
 * holds); the pointers follow once the blocks are allocated. */
typedef struct layout {
    int64_t *at;                /* per value id: byte offset, -1: none */
    bool *in_arena;             /* per value id */
    int64_t *stage_at;          /* per update: offset of its staging, -1: none */
    int64_t *kpool_at;          /* per kernel: offset of a RUN_VIEW constant's filled bytes, -1: none */
    int64_t *upool_at;          /* per update to a constant: offset of its filled bytes, -1: none */
    size_t rt_at, ws_at, in_at, size;
} layout;

static void take(layout *L, int id, size_t bytes)
{
    L->size = align_up(L->size);
    L->at[id] = (int64_t)L->size;
    L->size += bytes ? bytes : 1;
}

static tf_status plan_layout(tf_session_t *s, cuda_session *c, layout *L)
{
    const tf_module *m = s->p->m;
    int V = m->next_id > 0 ? m->next_id : 1;
    L->at = tf_malloc((size_t)V * sizeof *L->at);
    L->in_arena = tf_calloc((size_t)V, sizeof *L->in_arena);
    L->stage_at = tf_malloc((size_t)(m->nupdates ? m->nupdates : 1) * sizeof *L->stage_at);
    if (!L->at || !L->in_arena || !L->stage_at) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < V; i++) L->at[i] = -1;
    bool arena = m->plan.planned && m->plan.arena_bytes > 0;
    c->arena_bytes = arena ? (size_t)m->plan.arena_bytes : 0;
    for (int i = 0; i < m->decls.n; i++) {
        const tf_value *v = m->decls.items[i];
        take(L, v->id, value_bytes(v));
    }
    for (int i = 0; i < m->nodes.n; i++) {   /* an update memplan writes in place: its param's or buffer's storage */
        const tf_value *v = ((const tf_node *)m->nodes.items[i])->out;
        if (root_of(v) == v && v->home) L->at[v->id] = L->at[v->home->id];
    }
    for (int i = 0; arena && i < m->nodes.n; i++) {
        const tf_value *v = ((const tf_node *)m->nodes.items[i])->out;
        if (root_of(v) != v || v->offset < 0) continue;
        if ((uint64_t)v->offset + value_bytes(v) > (uint64_t)m->plan.arena_bytes)
            return tf_set_error(s->ctx, TF_ERR_INTERNAL, "error: internal: memplan put %s at %lld, past the %lld-byte arena",
                                v->name ? v->name : "a value", (long long)v->offset, (long long)m->plan.arena_bytes);
        L->at[v->id] = v->offset;
        L->in_arena[v->id] = true;
    }
    /* what memplan left unplaced but a kernel, an output or an update touches */
    for (int i = 0; i < c->plan->nkernels; i++) {
        const tf_kernel *k = &c->plan->kernels[i];
        for (int b = 0; b < k->nbufs; b++) {
            const tf_value *v = root_of(k->bufs[b].value);
            if (v->kind != TF_VAL_CONST && L->at[v->id] < 0) take(L, v->id, value_bytes(v));
        }
        if (k->kind != TF_K_VIEW && k->lib) {
            const tf_value *v = root_of(k->lib->out);
            if (L->at[v->id] < 0) take(L, v->id, value_bytes(v));
        }
    }
    for (int i = 0; i < m->noutputs + m->nupdates; i++) {
        const tf_value *v = root_of(i < m->noutputs ? m->outputs[i].value : m->updates[i - m->noutputs].value);
        if (v->kind != TF_VAL_CONST && L->at[v->id] < 0) take(L, v->id, value_bytes(v));
    }
    /* an update whose new value is itself state (a param, a buffer, a view of
     * one) waits in a copy, so that no update reads state another wrote */
    for (int i = 0; i < m->nupdates; i++) {
        const tf_value *v = root_of(m->updates[i].value);
        L->stage_at[i] = -1;
        if (v->kind == TF_VAL_NODE || v->kind == TF_VAL_CONST) continue;
        L->size = align_up(L->size);
        L->stage_at[i] = (int64_t)L->size;
        L->size += value_bytes(v) ? value_bytes(v) : 1;
    }
    /* constants a step writes: a reshape of a number, an update to one */
    L->kpool_at = tf_malloc((size_t)(c->plan->nkernels ? c->plan->nkernels : 1) * sizeof *L->kpool_at);
    L->upool_at = tf_malloc((size_t)(m->nupdates ? m->nupdates : 1) * sizeof *L->upool_at);
    if (!L->kpool_at || !L->upool_at) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < c->plan->nkernels; i++) {
        const tf_kernel *k = &c->plan->kernels[i];
        L->kpool_at[i] = -1;
        if (k->kind != TF_K_VIEW || k->lib->in[0]->kind != TF_VAL_CONST) continue;
        const tf_value *dst = root_of(k->lib->out);
        if (L->at[dst->id] < 0) continue;
        L->size = align_up(L->size);
        L->kpool_at[i] = (int64_t)L->size;
        L->size += value_bytes(k->lib->out) ? value_bytes(k->lib->out) : 1;
    }
    for (int i = 0; i < m->nupdates; i++) {
        L->upool_at[i] = -1;
        if (m->updates[i].value->kind != TF_VAL_CONST) continue;
        L->size = align_up(L->size);
        L->upool_at[i] = (int64_t)L->size;
        L->size += value_bytes(m->updates[i].buffer) ? value_bytes(m->updates[i].buffer) : 1;
    }
    /* the device's copy of an input slot: {seed, step} in 64 bytes, then each input on 64 bytes */
    c->slot_bytes = 64;
    for (int i = 0; i < s->p->inputs.n; i++) c->slot_bytes += (value_bytes(s->p->inputs.items[i]) + 63) / 64 * 64;
    L->size = align_up(L->size);
    L->in_at = L->size;
    L->size += c->slot_bytes;
    L->size = align_up(L->size);
    L->rt_at = L->size;
    c->nerr = 0;
    for (int i = 0; i < c->plan->nkernels; i++) c->nerr += c->plan->kernels[i].lib && c->plan->kernels[i].kind != TF_K_VIEW;
    L->size += 16 + 8 * (size_t)c->nerr;   /* {seed, step}, the library kernels' error words */
    L->size = align_up(L->size);
    L->ws_at = L->size;
    L->size += c->ws_bytes;
    c->state_bytes = align_up(L->size);
    return TF_OK;
}

/* Out of memory: what the plan needs, what is free, what to do. */
static tf_status oom(tf_session_t *s, cuda_session *c, size_t free_b, size_t total_b)
{
    char a[32], b[32], f[32], t[32], need[32];
    return tf_set_error(s->ctx, TF_ERR_OOM,
                        "error: out of GPU memory: this program needs %s on the GPU (the activation arena %s, params, "
                        "buffers, inputs and workspace %s) and %s of the %s of %s (GPU 0) are free; "
                        "compile with --checkpoint=auto --memory-budget=BYTES to recompute activations in the backward pass, "
                        "or use a smaller batch (--dim B=...)",
                        human((double)(c->arena_bytes + c->state_bytes), need, sizeof need), human((double)c->arena_bytes, a, sizeof a),
                        human((double)c->state_bytes, b, sizeof b), human((double)free_b, f, sizeof f),
                        human((double)total_b, t, sizeof t), c->gpu);
}

static tf_status allocate(tf_session_t *s, cuda_session *c, const layout *L)
{
    const tf_module *m = s->p->m;
    size_t free_b = 0, total_b = 0;
    CU_DO("asking how much GPU memory is free", MemGetInfo(&free_b, &total_b));
    if (c->arena_bytes + c->state_bytes > free_b) return oom(s, c, free_b, total_b);
    tf_cu_result r;
    if (c->arena_bytes && (r = c->libs.cu.MemAlloc(&c->arena, c->arena_bytes))) {
        c->arena = 0;
        if (r == CUDA_ERROR_OUT_OF_MEMORY) return oom(s, c, free_b, total_b);
        tf_cuda_check(&c->libs, r, "cuMemAlloc", __FILE__, __LINE__, c->err, sizeof c->err);
        return cu_fail(s, c, r, "allocating the activation arena");
    }
    dev_count(c, (int64_t)c->arena_bytes);
    if ((r = c->libs.cu.MemAlloc(&c->state, c->state_bytes))) {
        c->state = 0;
        if (r == CUDA_ERROR_OUT_OF_MEMORY) return oom(s, c, free_b, total_b);
        tf_cuda_check(&c->libs, r, "cuMemAlloc", __FILE__, __LINE__, c->err, sizeof c->err);
        return cu_fail(s, c, r, "allocating params, buffers and inputs");
    }
    dev_count(c, (int64_t)c->state_bytes);
    /* zeroed, so that nothing reads leftovers of another process's data */
    if (c->arena_bytes) CU_DO("clearing the arena", MemsetD8Async(c->arena, 0, c->arena_bytes, c->stream));
    CU_DO("clearing the state block", MemsetD8Async(c->state, 0, c->state_bytes, c->stream));
    int V = m->next_id > 0 ? m->next_id : 1;
    c->ptr = tf_calloc((size_t)V, sizeof *c->ptr);
    c->stage = tf_calloc((size_t)(m->nupdates ? m->nupdates : 1), sizeof *c->stage);
    if (!c->ptr || !c->stage) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < V; i++)
        if (L->at[i] >= 0) c->ptr[i] = (L->in_arena[i] ? c->arena : c->state) + (tf_cu_deviceptr)L->at[i];
    for (int i = 0; i < m->nupdates; i++)
        if (L->stage_at[i] >= 0) c->stage[i] = c->state + (tf_cu_deviceptr)L->stage_at[i];
    c->kpool = tf_calloc((size_t)(c->plan->nkernels ? c->plan->nkernels : 1), sizeof *c->kpool);
    c->upool = tf_calloc((size_t)(m->nupdates ? m->nupdates : 1), sizeof *c->upool);
    if (!c->kpool || !c->upool) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < c->plan->nkernels; i++)
        if (L->kpool_at[i] >= 0) c->kpool[i] = c->state + (tf_cu_deviceptr)L->kpool_at[i];
    for (int i = 0; i < m->nupdates; i++)
        if (L->upool_at[i] >= 0) c->upool[i] = c->state + (tf_cu_deviceptr)L->upool_at[i];
    c->rt_dev = c->state + L->rt_at;
    c->err_dev = c->rt_dev + 16;
    c->ws_dev = c->ws_bytes ? c->state + L->ws_at : 0;
    c->in_dev = c->state + L->in_at;
    /* pinned host staging: the error words, two input slots ({seed, step}, inputs), outputs */
    const tf_program_t *p = s->p;
    c->in_at = tf_calloc((size_t)(p->inputs.n ? p->inputs.n : 1), sizeof *c->in_at);
    c->out_at = tf_calloc((size_t)(m->noutputs ? m->noutputs : 1), sizeof *c->out_at);
    c->out_fresh = tf_calloc((size_t)(m->noutputs ? m->noutputs : 1), sizeof *c->out_fresh);
    if (!c->in_at || !c->out_at || !c->out_fresh) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < m->noutputs; i++) c->out_fresh[i] = true;   /* no step yet: nothing to fetch */
    size_t in = 64;
    for (int i = 0; i < p->inputs.n; i++) {
        c->in_at[i] = in;
        in += (value_bytes(p->inputs.items[i]) + 63) / 64 * 64;
    }
    size_t at = (8 * (size_t)c->nerr + 63) / 64 * 64;
    if (at < 64) at = 64;
    for (int k = 0; k < 2; k++) {
        c->slot_at[k] = at;
        at += c->slot_bytes;
    }
    for (int i = 0; i < m->noutputs; i++) {
        size_t b = value_bytes(m->outputs[i].value);
        if (b > TF_CUDA_EAGER_OUTPUT_BYTES) {   /* copied when read, not every step */
            c->out_at[i] = SIZE_MAX;
            continue;
        }
        c->out_at[i] = at;
        at += (b + 63) / 64 * 64;
    }
    c->pinned_bytes = at;
    void *pin = NULL;
    if ((r = c->libs.cu.MemAllocHost(&pin, c->pinned_bytes))) {
        tf_cuda_check(&c->libs, r, "cuMemAllocHost", __FILE__, __LINE__, c->err, sizeof c->err);
        return cu_fail(s, c, r, "allocating pinned host memory for inputs and outputs");
    }
    c->pinned = pin;
    return TF_OK;
}

tf_status tf_cuda_allocate(tf_session_t *s, cuda_session *c)
{
    layout L = {0};
    tf_status st = plan_layout(s, c, &L);
    if (!st) st = allocate(s, c, &L);
    tf_free(L.at);
    tf_free(L.in_arena);
    tf_free(L.stage_at);
    tf_free(L.kpool_at);
    tf_free(L.upool_at);
    return st;
}

/* ---- initial state ------------------------------------------------------------- */

/* The interpreter's initializers with the session's seed, in storage dtype. */
tf_status tf_cuda_initial_state(tf_session_t *s, cuda_session *c)
{
    const tf_module *m = s->p->m;
    tf_diag d = {0};
    c->ip = tf_interp_create(s->p->m, s->p->mode, s->seed);
    if (!c->ip) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    if (tf_interp_init_state(c->ip, &d)) return tf_from_diag(s->ctx, &d);
    size_t total = 0;
    for (int i = 0; i < m->decls.n; i++) {
        const tf_value *v = m->decls.items[i];
        if (v->kind != TF_VAL_INPUT) total += value_bytes(v);
    }
    unsigned char *buf = tf_malloc(total ? total : 1), *at = buf;
    if (!buf) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory staging the initial params (%zu bytes)", total);
    tf_status st = TF_OK;
    for (int i = 0; !st && i < m->decls.n; i++) {
        const tf_value *v = m->decls.items[i];
        if (v->kind == TF_VAL_INPUT) continue;
        tf_tensor *t = tf_interp_tensor(c->ip, v, &d);
        if (!t) {
            st = tf_from_diag(s->ctx, &d);
            break;
        }
        for (int64_t k = 0; k < t->numel; k++) tf_elem_store(v->type.dtype, at, k, t->data[k]);
        tf_cu_result r = c->libs.cu.MemcpyHtoDAsync(c->ptr[v->id], at, value_bytes(v), c->stream);
        if (tf_cuda_check(&c->libs, r, "cuMemcpyHtoDAsync", __FILE__, __LINE__, c->err, sizeof c->err))
            st = cu_fail(s, c, r, "copying the initial params to the GPU");
        at += value_bytes(v);
    }
    tf_cu_result r = c->libs.cu.StreamSynchronize(c->stream);   /* before buf goes */
    if (!st && tf_cuda_check(&c->libs, r, "cuStreamSynchronize", __FILE__, __LINE__, c->err, sizeof c->err))
        st = cu_fail(s, c, r, "copying the initial params to the GPU");
    tf_free(buf);
    return st;
}

/* The constants a step writes, filled once into their device copies. */
tf_status tf_cuda_fill_pools(tf_session_t *s, cuda_session *c)
{
    const tf_module *m = s->p->m;
    for (int i = 0; i < c->plan->nkernels + m->nupdates; i++) {
        bool kern = i < c->plan->nkernels;
        tf_cu_deviceptr to = kern ? c->kpool[i] : c->upool[i - c->plan->nkernels];
        if (!to) continue;
        const tf_value *dst = kern ? c->plan->kernels[i].lib->out : m->updates[i - c->plan->nkernels].buffer;
        const tf_value *src = kern ? c->plan->kernels[i].lib->in[0] : m->updates[i - c->plan->nkernels].value;
        size_t bytes = value_bytes(dst);
        unsigned char *h = tf_malloc(bytes ? bytes : 1);
        if (!h) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
        double x = tf_dtype_round(src->type.dtype, src->cval);
        for (int64_t j = 0; j < numel(dst); j++) tf_elem_store(dst->type.dtype, h, j, x);
        tf_cu_result r = bytes ? c->libs.cu.MemcpyHtoD(to, h, bytes) : 0;
        tf_free(h);
        if (tf_cuda_check(&c->libs, r, "cuMemcpyHtoD", __FILE__, __LINE__, c->err, sizeof c->err)) return cu_fail(s, c, r, "filling a constant");
    }
    return TF_OK;
}
