/* backend_cpu.c — the `cpu` target: the kernel plan run as compiled code.
 *
 * A session takes the program's kernel IR (codegen/kernel.c, built once by
 * tf_program_compile), compiles
 * each elementwise, reduction and epilogue kernel with the LLVM emitter
 * (codegen/llvm.c) and runs the plan in order over:
 *
 *   - one arena of memplan's size: every value memplan placed lives at its
 *     offset (so in-place reuse and the planned peak are what runs); values
 *     it did not place (with memplan disabled, say) get their own block;
 *   - one block per input, param and buffer;
 *   - reshapes as aliases of their operand.
 *
 * Library kernels: matmul (batched, transposed, broadcast), conv2d with its
 * two gradients, pooling and its gradients through cpu_ops.c (OpenBLAS GEMM,
 * im2col), in fp32 with f16/bf16 operands widened and results rounded to
 * their storage dtype; gather, scatter_add, concat and slice_grad directly on
 * storage (cpu_libops.c). The rest (f64 GEMMs, an operand that is a
 * number, an out-of-range id so that the error names the op) run the
 * interpreter's kernel on widened copies of their
 * operands — correct, and counted as `fallback` in the profile and in
 * `tfuse bench` so they are visible. Elementwise work splits over the pool along each kernel's split
 * axis.
 *
 * Each kernel's code comes from cpu_jit.c (the process's JIT cache, a
 * package or the disk cache, else compiled through LLVM); the library
 * kernels run in cpu_gemm.c and cpu_libops.c; cpu_backend.h lists the
 * target's files and what they share. This file places the values, runs
 * the plan and is the target's tf_backend.
 *
 * Initial state comes from the interpreter's initializers with the session's
 * seed, so a cpu session starts from exactly the params an interp session
 * starts from, and dropout draws the interpreter's masks. */
#include <errno.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "comm.h"
#include "cpu_backend.h"
#include "cpu_ops.h"
#include "interp.h"
#include "lowp.h"
#include "kernel.h"
#include "pool.h"
#include "runtime.h"
#ifdef TFUSE_HAVE_LLVM
#include "llvm.h"
#endif

#ifdef TFUSE_HAVE_LLVM

/* ---- session state ------------------------------------------------------- */

/* the names of cpu_backend.h's `how`, in its order (the profile's) */
static const char *how_names[] = {"jit", "view", "gemm", "gemm_bf16", "conv", "conv_grad_input", "conv_grad_weight", "pool", "pool_grad",
                                  "gather", "scatter_add", "concat", "slice_grad", "attention", "allreduce", "fallback", "-"};

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* Large blocks (the arena, params, optimizer moments) on transparent huge
 * pages where the kernel offers them on request (THP "madvise" mode, the
 * common default): their first touch then costs a fault per 2 MiB, not per
 * 4 KiB, which is most of a package's state copy and of a first training
 * step's arena touch. Only the 2 MiB-aligned interior is advised; a hint,
 * so failure (no THP) changes nothing. */
static void huge_pages(void *p, size_t n)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t H = (uintptr_t)2 << 20;
    uintptr_t lo = ((uintptr_t)p + H - 1) & ~(H - 1), hi = ((uintptr_t)p + n) & ~(H - 1);
    if (n >= 2 * H && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

void *tf_cpu_own(cpu *c, size_t bytes)
{
    void **o = tf_realloc(c->owned, (size_t)(c->nowned + 1) * sizeof *o);
    if (!o) return NULL;
    c->owned = o;
    size_t n = (bytes + 63) / 64 * 64;
    void *p = tf_calloc_aligned(64, n ? n : 64);
    if (p) c->owned[c->nowned++] = p;
    if (p) huge_pages(p, n);
    return p;
}

float *tf_cpu_scratch(cpu *c, size_t floats)
{
    if (floats > c->nscratch) {
        tf_free_aligned(c->scratch);
        c->scratch = tf_malloc_aligned(64, (floats * sizeof(float) + 63) / 64 * 64);
        c->nscratch = c->scratch ? floats : 0;
    }
    return c->scratch;
}

/* A block of its own for a value memplan did not place, counted. */
static void *unplanned(cpu *c, const tf_value *v)
{
    void *p = tf_cpu_own(c, value_bytes(v));
    if (p) c->unplanned_bytes += (int64_t)value_bytes(v);
    return p;
}

/* Give every value a kernel, an output or an update touches its storage. */
static tf_status place_values(tf_session_t *s, cpu *c)
{
    const tf_module *m = s->p->m;
    int V = m->next_id > 0 ? m->next_id : 1;
    c->ptr = tf_calloc((size_t)V, sizeof *c->ptr);
    if (!c->ptr) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    if (m->plan.planned && m->plan.arena_bytes > 0) {
        size_t n = ((size_t)m->plan.arena_bytes + 63) / 64 * 64;
        if (!(c->arena = tf_calloc_aligned(64, n)))   /* zero, and only the pages a step touches are ever written */
            return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory allocating the %lld-byte activation arena",
                                (long long)m->plan.arena_bytes);
        c->arena_bytes = (int64_t)n;
        huge_pages(c->arena, n);
    }
    for (int i = 0; i < m->decls.n; i++) {
        const tf_value *v = m->decls.items[i];
        if (!(c->ptr[v->id] = tf_cpu_own(c, value_bytes(v)))) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
        c->state_bytes += (int64_t)value_bytes(v);
    }
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        const tf_value *v = n->out;
        if (root_of(v) != v) continue;
        if (v->home) c->ptr[v->id] = c->ptr[v->home->id];   /* an update memplan writes in place */
        else if (c->arena && v->offset >= 0) c->ptr[v->id] = c->arena + v->offset;
    }
    /* what memplan left unplaced but something reads or writes */
    for (int i = 0; i < c->plan->nkernels; i++)
        for (int b = 0; b < c->plan->kernels[i].nbufs; b++) {
            const tf_value *v = root_of(c->plan->kernels[i].bufs[b].value);
            if (!c->ptr[v->id] && !(c->ptr[v->id] = unplanned(c, v)))
                return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
        }
    for (int i = 0; i < c->plan->nkernels; i++) {
        const tf_kernel *k = &c->plan->kernels[i];
        if (k->kind == TF_K_VIEW || !k->lib) continue;
        const tf_value *v = root_of(k->lib->out);
        if (!c->ptr[v->id] && !(c->ptr[v->id] = unplanned(c, v)))
            return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    }
    for (int i = 0; i < m->noutputs + m->nupdates; i++) {
        const tf_value *v = root_of(i < m->noutputs ? m->outputs[i].value : m->updates[i - m->noutputs].value);
        if (v->kind != TF_VAL_CONST && !c->ptr[v->id] && !(c->ptr[v->id] = unplanned(c, v)))
            return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    }
    return TF_OK;
}

static bool gemm_dtype(tf_dt t) { return t == TF_DT_F32 || is_float16(t); }

static bool ids_dtype(tf_dt t) { return t == TF_DT_I64 || t == TF_DT_I32; }

how tf_cpu_library_how(const tf_node *n)
{
    tf_op_exec ex = tf_op_exec_of(n->op);
    for (int q = 0; q < n->nin; q++)
        if (n->in[q]->kind == TF_VAL_CONST) return RUN_FALLBACK;
    switch (ex) {
    case TF_OPX_GATHER: return ids_dtype(n->in[0]->type.dtype) ? RUN_GATHER : RUN_FALLBACK;
    case TF_OPX_SCATTER:
        return ids_dtype(n->in[0]->type.dtype) && n->out->type.dtype == TF_DT_F32 && n->in[1]->type.dtype == TF_DT_F32
                   ? RUN_SCATTER : RUN_FALLBACK;
    case TF_OPX_ATTENTION: return tf_cpu_attention_supported(n) ? RUN_ATTENTION : RUN_FALLBACK;
    case TF_OPX_COMM: return n->in[0]->type.dtype == n->out->type.dtype ? RUN_ALLREDUCE : RUN_FALLBACK;
    case TF_OPX_CONCAT: case TF_OPX_SLICE_GRAD:   /* copies of any dtype */
        for (int q = 0; q < n->nin; q++)
            if (n->in[q]->type.dtype != n->out->type.dtype) return RUN_FALLBACK;
        return ex == TF_OPX_CONCAT ? RUN_CONCAT : RUN_SLICE_GRAD;
    default: break;
    }
    for (int q = 0; q < n->nin; q++)
        if (!gemm_dtype(n->in[q]->type.dtype)) return RUN_FALLBACK;
    if (!gemm_dtype(n->out->type.dtype)) return RUN_FALLBACK;
    switch (ex) {
    case TF_OPX_GEMM: return RUN_MATMUL;
    case TF_OPX_CONV:   /* conv2d's forward takes 2-d images only; its gradients exist only for those */
        return n->op == TF_OP_CONV2D_GRAD_INPUT ? RUN_CONV_GI : n->op == TF_OP_CONV2D_GRAD_WEIGHT ? RUN_CONV_GW
               : n->in[0]->type.rank == 4 ? RUN_CONV : RUN_FALLBACK;
    case TF_OPX_POOL: return n->in[0]->type.rank == 4 ? RUN_POOL : RUN_FALLBACK;
    case TF_OPX_POOL_GRAD: return n->out->type.rank == 4 ? RUN_POOL_GRAD : RUN_FALLBACK;
    default: return RUN_FALLBACK;
    }
}

static tf_status prepare(tf_session_t *s, cpu *c)
{
    c->ks = tf_calloc((size_t)(c->plan->nkernels ? c->plan->nkernels : 1), sizeof *c->ks);
    if (!c->ks) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < c->plan->nkernels; i++) c->ks[i].jit_slot = -1;
    double t0 = now_ns();
    /* the kernels' code: what the process, a package or the disk has, then the rest compiled on the pool's threads */
    jit_req *rs = tf_calloc((size_t)(c->plan->nkernels ? c->plan->nkernels : 1), sizeof *rs);
    if (!rs) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < c->plan->nkernels; i++) rs[i].slot = -1;   /* none yet, also for those a failure leaves unvisited */
    tf_status st = TF_OK;
    for (int i = 0; i < c->plan->nkernels; i++) {
        const tf_kernel *k = &c->plan->kernels[i];
        ckernel *ck = &c->ks[i];
        ck->k = k;
        rs[i].slot = -1;
        ck->bufs = tf_calloc((size_t)(k->nbufs ? k->nbufs : 1), sizeof *ck->bufs);
        if (!ck->bufs) {
            st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
            break;
        }
        ck->once = s->p->mode == TF_IR_INFER && k->kind != TF_K_VIEW && !s->p->settings.cpu_state_every;   /* a view may alias what a step writes */
        bool writes = false;
        for (int b = 0; b < k->nbufs; b++) {
            ck->bufs[b] = storage(c, k->bufs[b].value);
            if (k->bufs[b].written) writes = true, ck->once = ck->once && k->bufs[b].value->once;
        }
        if (k->lib) writes = true, ck->once = ck->once && k->lib->out->once;
        ck->once = ck->once && writes;
        int ax = tf_kernel_split_axis(k);
        ck->extent = ax < 0 ? 1 : k->dims[ax];
        ck->work = 1;
        for (int a = 0; a < k->rank; a++) ck->work *= k->dims[a];
        if (k->kind == TF_K_VIEW) ck->how = RUN_VIEW;
        else if (k->lib) ck->how = tf_cpu_library_how(k->lib);
        else ck->how = k->nexprs ? RUN_JIT : RUN_NOTHING;
        ck->label_expr = -1;
        for (int e = 0; e < k->nexprs && ck->how == RUN_JIT; e++) {
            const tf_kexpr *x = &k->exprs[e], *a = x->kind == TF_KX_OP && x->op == TF_OP_ONE_HOT ? &k->exprs[x->args[0]] : NULL;
            tf_dt t = a && a->kind == TF_KX_LOAD ? k->bufs[a->buf].value->type.dtype : TF_DT_F32;
            if (t == TF_DT_I64 || t == TF_DT_I32) ck->label_expr = e;
        }
        if (!k->nexprs || ck->how == RUN_VIEW || ck->how == RUN_FALLBACK) continue;
        tf_diag d;   /* (not zeroed: 6 KiB for each of hundreds of kernels) */
        d.status = TF_IR_OK;
        rs[i].k = k;
        if (tf_cpu_jit_lookup(c->cache, s->p->settings.llvm_pipeline, s->p->pkg, &rs[i], &d)) {
            st = tf_from_diag(s->ctx, &d);
            break;
        }
    }
    if (!st) tf_cpu_jit_compile_all(c->cache, c->pool, s->p->settings.llvm_pipeline, rs, c->plan->nkernels);
    for (int i = 0; !st && i < c->plan->nkernels; i++) {
        ckernel *ck = &c->ks[i];
        jit_req *r = &rs[i];
        if (!r->k) continue;
        ck->jit_slot = r->slot;
        if (r->st) {
            if (!r->d) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
            else if (r->d->status != TF_IR_ERR_RUNTIME) st = tf_from_diag(s->ctx, r->d);
            ck->how = RUN_FALLBACK;   /* the emitter says it cannot: the reference runs it */
            ck->fn = NULL;
            continue;
        }
        ck->fn = r->fn;
        c->jit_cached += r->hit;
        c->jit_disk += !r->hit && r->disk;
        c->jit_package += !r->hit && r->pkg;
        c->jit_compiled += !r->hit && !r->disk && !r->pkg;
    }
    for (int i = 0; i < c->plan->nkernels; i++) {
        if (c->ks[i].jit_slot < 0 && rs[i].slot >= 0) c->ks[i].jit_slot = rs[i].slot;   /* given back with the session */
        tf_cpu_jit_req_free(&rs[i]);
    }
    tf_free(rs);
    if (st) return st;
    c->jit_ms = (now_ns() - t0) / 1e6;
    for (int i = 0; i < c->plan->nkernels; i++)
        if (c->ks[i].how == RUN_CONV || c->ks[i].how == RUN_CONV_GI || c->ks[i].how == RUN_CONV_GW) tf_cpu_conv_choose(s, c, &c->ks[i]);
    st = tf_cpu_plan_layouts(s, c);
    if (!st) st = tf_cpu_plan_gemm_operands(s, c);
    return st ? st : tf_cpu_plan_packed_gemms(s, c);
}

/* ---- running ------------------------------------------------------------- */

typedef struct jit_job { tf_kernel_fn fn; void **bufs; const uint64_t *rt; } jit_job;

static void jit_piece(void *arg, int64_t lo, int64_t hi)
{
    const jit_job *j = arg;
    j->fn(j->bufs, lo, hi, j->rt);
}

static void run_fn(cpu *c, ckernel *ck)
{
    jit_job j = {ck->fn, ck->bufs, c->rt};
    if (ck->work < 16384 || ck->extent < 2) jit_piece(&j, 0, ck->extent);   /* threads would cost more than they save */
    else tf_pool_run(c->pool, ck->extent, jit_piece, &j);
}

/* The reference runs the kernel on widened copies of its buffers. */
static tf_status run_fallback(tf_session_t *s, cpu *c, const tf_kernel *k)
{
    tf_diag d = {0};
    if (!c->ip && !(c->ip = tf_interp_create(s->p->m, s->p->mode, c->rt[0])))   /* its tensors: only what fallbacks touch */
        return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    tf_interp_set_step(c->ip, c->rt[1]);
    tf_comm_interp_attach(c->ip, s->comm);
    for (int b = 0; b < k->nbufs; b++) {
        const tf_value *v = k->bufs[b].value;
        tf_tensor *t = tf_interp_tensor(c->ip, v, &d);
        if (!t) return tf_from_diag(s->ctx, &d);
        const void *p = storage(c, v);
        for (int64_t i = 0; i < t->numel; i++) t->data[i] = tf_elem_load(v->type.dtype, p, i);
    }
    tf_kernel_plan one = {.kernels = (tf_kernel *)k, .nkernels = 1};
    if (tf_kernels_eval(&one, c->ip, &d)) return tf_from_diag(s->ctx, &d);
    for (int b = 0; b < k->nbufs; b++) {
        const tf_value *v = k->bufs[b].value;
        if (!k->bufs[b].written) continue;
        tf_tensor *t = tf_interp_tensor(c->ip, v, &d);
        if (!t) return tf_from_diag(s->ctx, &d);
        void *p = storage(c, v);
        for (int64_t i = 0; i < t->numel; i++) tf_elem_store(v->type.dtype, p, i, t->data[i]);
    }
    return TF_OK;
}

/* A one_hot's labels, when they come from a computed buffer (inputs are
 * checked by the API before the step): out of range is an error with the
 * op's place, as the interpreter reports it, not a row of zeros. */
static tf_status check_labels(tf_session_t *s, cpu *c, const ckernel *ck)
{
    const tf_kernel *k = ck->k;
    const tf_kexpr *x = &k->exprs[ck->label_expr], *a = &k->exprs[x->args[0]];
    const tf_value *v = k->bufs[a->buf].value;
    const void *p = storage(c, v);
    int64_t depth = tf_node_int(x->node, "depth"), n = numel(v);
    for (int64_t i = 0; i < n; i++) {
        int64_t y = v->type.dtype == TF_DT_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
        if (y >= 0 && y < depth) continue;
        tf_diag d = {0};
        tf_diag_error(&d, TF_IR_ERR_RUNTIME, &x->node->loc, "one_hot: label %lld at position %lld is out of range [0, %lld)",
                      (long long)y, (long long)i, (long long)depth);
        return tf_from_diag(s->ctx, &d);
    }
    return TF_OK;
}

static tf_status run_kernel(tf_session_t *s, cpu *c, ckernel *ck)
{
    const tf_kernel *k = ck->k;
    if (ck->label_expr >= 0) {
        tf_status st = check_labels(s, c, ck);
        if (st) return st;
    }
    switch (ck->how) {
    case RUN_NOTHING: return TF_OK;
    case RUN_VIEW: {
        const tf_value *src = k->lib->in[0], *dst = k->lib->out;
        void *to = storage(c, dst);
        if (src->kind == TF_VAL_CONST) {
            for (int64_t i = 0; i < numel(dst); i++) tf_elem_store(dst->type.dtype, to, i, tf_dtype_round(src->type.dtype, src->cval));
        } else if (storage(c, src) != to) {
            memmove(to, storage(c, src), value_bytes(dst));
        }
        return TF_OK;
    }
    case RUN_FALLBACK: return run_fallback(s, c, k);
    case RUN_MATMUL: case RUN_MATMUL_BF16:
        if (ck->dgemm && !tf_cpu_run_packed(c, ck))
            return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: kernel %s: oneDNN's matmul failed (--cpu-gemm=openblas avoids it)",
                                k->name);
        if (!ck->dgemm) tf_cpu_run_matmul(c, k->lib, ck->how == RUN_MATMUL_BF16);
        break;
    case RUN_CONV: case RUN_CONV_GI: case RUN_CONV_GW:
        if (tf_cpu_run_conv(c, ck)) {   /* the epilogue ran piece by piece */
            if (ck->conv_failed)
                return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: kernel %s: a oneDNN convolution primitive failed (--cpu-conv=im2col "
                                    "avoids oneDNN; --cpu-conv-layout=plain keeps the images in NCHW)", k->name);
            return TF_OK;
        }
        if (ck->epi_in_conv) return TF_OK;   /* the primitive wrote the epilogue's result */
        break;
    case RUN_POOL: case RUN_POOL_GRAD: tf_cpu_run_pool(c, k->lib, ck->how == RUN_POOL_GRAD); break;
    case RUN_GATHER: case RUN_SCATTER:
        if (!tf_cpu_run_gather(c, k->lib, ck->how == RUN_SCATTER)) return run_fallback(s, c, k);
        break;
    case RUN_CONCAT: case RUN_SLICE_GRAD:
        if (!tf_cpu_run_copy(c, k->lib)) return run_fallback(s, c, k);
        break;
    case RUN_ATTENTION:
        if (!tf_cpu_run_attention(c, k->lib, s->p->mode == TF_IR_TRAIN))
            return tf_set_error(s->ctx, TF_ERR_OOM, "error: kernel %s: out of memory for the attention kernel's tiles", k->name);
        break;
    case RUN_ALLREDUCE: return tf_cpu_run_allreduce(s, c, (int)(ck - c->ks));
    case RUN_JIT: break;
    }
    if (ck->fn) run_fn(c, ck);
    return TF_OK;
}

static tf_status cpu_run(tf_session_t *s)
{
    cpu *c = s->impl;
    const tf_program_t *p = s->p;
    const tf_module *m = p->m;
    for (int i = 0; i < p->inputs.n; i++) {
        const tf_value *v = p->inputs.items[i];
        memcpy(c->ptr[v->id], s->bound[i], value_bytes(v));
    }
    if (c->nscratch == 0 && !tf_cpu_scratch(c, 1)) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    c->gen++;
    for (int i = 0; i < c->plan->nkernels; i++) {
        ckernel *ck = &c->ks[i];
        if (ck->once && ck->once_gen == c->state_gen) continue;   /* from the state alone, and the state is as it was */
        double t0 = c->profile ? now_ns() : 0;
        tf_status st = tf_cpu_comm_before(s, c, i);
        if (!st) st = run_kernel(s, c, ck);
        if (st) {
            tf_cpu_comm_finish(s, c);   /* no bucket in flight once the step has returned */
            return st;
        }
        if (c->profile) {
            double t1 = now_ns();
            ck->ns += t1 - t0;
            ck->calls++;
            tf_trace_add(s, (size_t)i, t0 / 1e3, (t1 - t0) / 1e3, s->trace_run, 0);
        }
        if (ck->once) ck->once_gen = c->state_gen;
    }
    tf_status cst = tf_cpu_comm_finish(s, c);
    if (cst) return cst;
    /* updates: read every new value before writing any state */
    void **staged = tf_calloc((size_t)(m->nupdates ? m->nupdates : 1), sizeof *staged);
    if (!staged) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < m->nupdates; i++) {
        const tf_value *v = root_of(m->updates[i].value);
        if (v->kind == TF_VAL_NODE) continue;   /* activations are not state: safe to read late */
        if ((staged[i] = tf_malloc(value_bytes(v) ? value_bytes(v) : 1))) memcpy(staged[i], storage(c, v), value_bytes(v));
    }
    for (int i = 0; i < m->nupdates; i++) {
        const tf_value *v = m->updates[i].value, *dst = m->updates[i].buffer;
        void *src = staged[i] ? staged[i] : storage(c, v);
        if (v->kind == TF_VAL_CONST) {
            for (int64_t j = 0; j < numel(dst); j++) tf_elem_store(dst->type.dtype, storage(c, dst), j, tf_dtype_round(v->type.dtype, v->cval));
        } else if (src && src != storage(c, dst)) {
            memcpy(storage(c, dst), src, value_bytes(dst));
        }
        tf_free(staged[i]);
    }
    tf_free(staged);
    for (int i = 0; i < m->noutputs; i++) {
        const tf_value *v = m->outputs[i].value;
        if (v->kind == TF_VAL_CONST) {
            for (int64_t j = 0; j < numel(v); j++) tf_elem_store(v->type.dtype, s->out[i], j, tf_dtype_round(v->type.dtype, v->cval));
        } else {
            memcpy(s->out[i], storage(c, v), value_bytes(v));
        }
    }
    c->rt[1]++;
    return TF_OK;
}

static void cpu_dropout_seed_set(tf_session_t *s, uint64_t seed)
{
    cpu *c = s->impl;
    c->rt[0] = seed;
    if (c->ip) tf_interp_set_seed(c->ip, seed);
}

/* ---- the backend interface ------------------------------------------------ */

static void cpu_free(tf_session_t *s)
{
    cpu *c = s->impl;
    if (!c) return;
    for (int i = 0; c->ks && i < c->plan->nkernels; i++) {
        tf_free(c->ks[i].bufs);
        tf_cpu_jit_put(c->cache, c->ks[i].jit_slot);
        tf_dnnl_conv_free(c->ks[i].dnnl);
        tf_dnnl_gemm_free(c->ks[i].dgemm);
    }
    tf_cpu_comm_free(c);
    for (int i = 0; i < c->nrelaid; i++) tf_kernel_free(&c->relaid[i]);
    tf_free(c->relaid);
    tf_free_aligned(c->gemm_scratch);
    tf_cache_release(c->cache);
    tf_free(c->ks);
    for (int i = 0; i < c->nowned; i++) tf_free_aligned(c->owned[i]);
    tf_free(c->owned);
    tf_free_aligned(c->arena);
    tf_free(c->ptr);
    tf_free_aligned(c->scratch);
    tf_free(c->wide);
    tf_free(c->wide_gen);
    tf_pool_free(c->pool);
    tf_interp_free(c->ip);
    tf_free(c);
    s->impl = NULL;
}

/* A param's or buffer's initial value into storage, INIT_CHUNK elements
 * at a time: f32 and f16/bf16 through float (exact: the values are
 * already rounded to dt), the rest through tf_elem_store. */
enum { INIT_CHUNK = 1024 };
typedef struct init_job {
    const tf_value *v;
    uint64_t seed;
    void *dst;
    int64_t n;
} init_job;

static void init_chunks(void *arg, int64_t lo, int64_t hi)
{
    const init_job *j = arg;
    tf_dt dt = j->v->type.dtype;
    double x[INIT_CHUNK];
    float f[INIT_CHUNK];
    for (int64_t c = lo; c < hi; c++) {
        int64_t k0 = c * INIT_CHUNK, n = j->n - k0 < INIT_CHUNK ? j->n - k0 : INIT_CHUNK;
        tf_interp_init_range(j->v, j->seed, k0, k0 + n, x);
        if (dt != TF_DT_F32 && !is_float16(dt)) {
            for (int64_t k = 0; k < n; k++) tf_elem_store(dt, j->dst, k0 + k, x[k]);
            continue;
        }
        float *to = dt == TF_DT_F32 ? (float *)j->dst + k0 : f;
        for (int64_t k = 0; k < n; k++) to[k] = (float)x[k];
        if (dt == TF_DT_BF16) tf_cpu_f32_to_bf16(f, (uint16_t *)j->dst + k0, n);
        else if (dt == TF_DT_F16) tf_cpu_f32_to_f16(f, (uint16_t *)j->dst + k0, n);
    }
}

static tf_status cpu_create(tf_session_t *s)
{
    static const tf_kernel_plan no_plan;
    cpu *c = tf_calloc(1, sizeof *c);
    if (!c) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    s->impl = c;
    c->plan = &no_plan;
    c->cache = s->ctx->cache;
    tf_cache_retain(c->cache);
    tf_status st = TF_OK;
    c->rt[0] = s->seed;
    tf_cpu_blas_init();
    int threads = s->p->threads > 0 ? s->p->threads : tf_cpu_count();
    st = tf_program_plan(s->ctx, s->p, &c->plan);
    if (!st && !(c->pool = tf_pool_create(threads))) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: cannot start %d threads", threads);
    if (!st) st = place_values(s, c);
    if (!st) st = prepare(s, c);
    /* the interpreter's initial state (tf_interp_init_range: the same bits), straight into storage, on the pool;
     * not when a package gives it (api.c writes it next). zeros() needs nothing: place_values's storage is
     * calloc'd (tf_cpu_own), so optimizer moments and the like are not written twice, nor their pages touched before
     * the first step uses them. */
    for (int i = 0; !st && !s->state_given && i < s->p->m->decls.n; i++) {
        const tf_value *v = s->p->m->decls.items[i];
        if (v->kind == TF_VAL_INPUT || tf_interp_init_is_zero(v)) continue;
        init_job j = {.v = v, .seed = s->seed, .dst = c->ptr[v->id], .n = numel(v)};
        tf_pool_run(c->pool, (j.n + INIT_CHUNK - 1) / INIT_CHUNK, init_chunks, &j);
        s->init_elements += j.n;
    }
    if (!st && tf_cpu_blas_warning()) {   /* once a process: GEMMs without OpenBLAS */
        static atomic_flag said = ATOMIC_FLAG_INIT;
        if (!atomic_flag_test_and_set(&said))
            fprintf(tf_context_diag(s->ctx), "tfuse: warning: cpu GEMMs run through %s, many times slower than OpenBLAS\n",
                    tf_cpu_blas_name());
    }
    if (!st && s->p->settings.cpu_explain) tf_cpu_explain(tf_context_diag(s->ctx), c);
    if (st) cpu_free(s);
    return st;
}

static tf_status cpu_state_read(tf_session_t *s, const tf_value *v, void *dst)
{
    cpu *c = s->impl;
    memcpy(dst, c->ptr[v->id], value_bytes(v));
    return TF_OK;
}

/* A copy of n bytes split over the pool in COPY_CHUNK pieces: a package's
 * params go into fresh storage, whose first touch (a page fault per page)
 * costs more than the copy; two threads take half each. */
enum { COPY_CHUNK = 1 << 18 };
typedef struct copy_job { unsigned char *dst; const unsigned char *src; size_t n; } copy_job;

static void copy_chunks(void *arg, int64_t lo, int64_t hi)
{
    const copy_job *j = arg;
    size_t a = (size_t)lo * COPY_CHUNK, b = (size_t)hi * COPY_CHUNK < j->n ? (size_t)hi * COPY_CHUNK : j->n;
    memcpy(j->dst + a, j->src + a, b - a);
}

static tf_status cpu_state_write(tf_session_t *s, const tf_value *v, const void *src)
{
    cpu *c = s->impl;
    copy_job j = {c->ptr[v->id], src, value_bytes(v)};
    tf_pool_run(c->pool, (int64_t)((j.n + COPY_CHUNK - 1) / COPY_CHUNK), copy_chunks, &j);
    c->state_gen++;   /* packed weights repack before their next use */
    return TF_OK;
}

/* tf_session_copy_bandwidth: 128 MiB, far past any cache, copied over the
 * session's threads as its kernels' work is; one untimed copy (which also
 * faults the pages in), then the median of seven. */
static tf_status cpu_copy_bandwidth(tf_session_t *s, double *gbps)
{
    cpu *c = s->impl;
    enum { BYTES = 128 << 20, TIMED = 7 };
    unsigned char *a = tf_malloc(BYTES), *b = tf_malloc(BYTES);
    if (!a || !b) {
        tf_free(a), tf_free(b);
        return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory: measuring a copy's bandwidth takes two blocks of %d MiB", BYTES >> 20);
    }
    memset(a, 1, BYTES);
    double ns[TIMED];
    copy_job j = {b, a, BYTES};
    for (int r = -1; r < TIMED; r++) {
        double t0 = now_ns();
        tf_pool_run(c->pool, (BYTES + COPY_CHUNK - 1) / COPY_CHUNK, copy_chunks, &j);
        if (r >= 0) ns[r] = now_ns() - t0;
    }
    tf_free(a), tf_free(b);
    *gbps = 2.0 * BYTES / tf_median(ns, TIMED);
    return TF_OK;
}

static uint64_t cpu_step_get(tf_session_t *s) { return ((cpu *)s->impl)->rt[1]; }
static void cpu_step_set(tf_session_t *s, uint64_t step) { ((cpu *)s->impl)->rt[1] = step; }

const char *tf_cpu_unavailable(void) { return tf_jit_unavailable(); }   /* libtfuse.so: its LLVM module is there */

static void cpu_set_profiling(tf_session_t *s, bool on)
{
    cpu *c = s->impl;
    c->profile = on;
    for (int i = 0; i < c->plan->nkernels; i++) c->ks[i].ns = 0, c->ks[i].calls = 0;
}

static size_t cpu_profile_count(tf_session_t *s) { return (size_t)((cpu *)s->impl)->plan->nkernels; }

static void cpu_profile_get(tf_session_t *s, size_t i, tf_kernel_profile *out)
{
    cpu *c = s->impl;
    const ckernel *ck = &c->ks[i];
    out->name = ck->k->name;
    static const char *dnnl_names[] = {"conv.onednn", "conv_grad_input.onednn", "conv_grad_weight.onednn"};
    out->how = ck->dnnl ? dnnl_names[ck->how - RUN_CONV] : ck->dgemm ? "gemm.onednn" : how_names[ck->how];
    out->total_ms = ck->ns / 1e6;
    out->calls = ck->calls;
    out->elements = ck->work;
    out->bytes = tf_kernel_bytes(ck->k);
}

static void cpu_info(tf_session_t *s, tf_session_info *out)
{
    cpu *c = s->impl;
    out->threads = tf_pool_threads(c->pool);
    out->kernels = tf_kernels_count(c->plan);
    out->jit_compiled = c->jit_compiled;
    out->jit_cached = c->jit_cached;
    out->jit_disk = c->jit_disk;
    out->jit_package = c->jit_package;
    out->disk_hits = c->jit_disk;
    out->disk_misses = c->jit_compiled;
    out->jit_ms = c->jit_ms;
    out->fallbacks = 0;
    for (int i = 0; i < c->plan->nkernels; i++) out->fallbacks += c->ks[i].how == RUN_FALLBACK;
    out->library = tf_cpu_blas_name();
    out->arena_bytes = c->arena_bytes;
    out->value_bytes = c->arena_bytes + c->state_bytes + c->unplanned_bytes;
    out->unplanned_bytes = c->unplanned_bytes;
    out->aux_bytes = (int64_t)(c->wide_bytes + c->packed_bytes + c->gemm_scratch_bytes + c->nscratch * sizeof(float));
}

/* --dump-llvm=DIR: DIR/kernels.ll, the optimized LLVM IR of every kernel
 * (one module per kernel, one after another). */
static tf_status cpu_dump_code(tf_context_t *ctx, const tf_program_t *p, const char *dir)
{
    const tf_kernel_plan *plan;
    tf_status st = tf_program_plan(ctx, p, &plan);
    if (st) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/kernels.ll", dir);
    FILE *f = fopen(path, "w");
    bool ok = f != NULL;
    for (int i = 0; ok && i < plan->nkernels; i++) {
        char why[512];
        if (!tf_jit_supports(&plan->kernels[i], why, sizeof why)) {
            ok = fprintf(f, "; %s: not compiled: %s\n\n", plan->kernels[i].name, why) >= 0;
            continue;
        }
        char *ir = tf_jit_print_pipeline(&plan->kernels[i], p->settings.llvm_pipeline);
        ok = ir && fprintf(f, "; ---- kernel %s\n%s\n", plan->kernels[i].name, ir) >= 0;
        tf_free(ir);
    }
    if (f && fclose(f) != 0) ok = false;
    return ok ? TF_OK : tf_set_error(ctx, TF_ERR_IO, "%s: error: cannot write: %s", path, strerror(errno));
}

bool tf_cpu_jit_supports(const tf_kernel *k, char *why, size_t n) { return tf_jit_supports(k, why, n); }

#else /* !TFUSE_HAVE_LLVM */

const char *tf_cpu_unavailable(void)
{
    return "this build has no LLVM (configured with -DTFUSE_WITH_LLVM=OFF or without llvm-config); "
           "use --target=interp, or rebuild with LLVM 14 installed";
}
static tf_status cpu_create(tf_session_t *s) { return tf_set_error(s->ctx, TF_ERR_UNAVAILABLE, "error: %s", tf_cpu_unavailable()); }
static void cpu_free(tf_session_t *s) { (void)s; }
static tf_status cpu_run(tf_session_t *s) { (void)s; return TF_ERR_UNAVAILABLE; }
static tf_status cpu_state_read(tf_session_t *s, const tf_value *v, void *dst) { (void)s; (void)v; (void)dst; return TF_ERR_UNAVAILABLE; }
static tf_status cpu_state_write(tf_session_t *s, const tf_value *v, const void *src) { (void)s; (void)v; (void)src; return TF_ERR_UNAVAILABLE; }
static uint64_t cpu_step_get(tf_session_t *s) { (void)s; return 0; }
static void cpu_step_set(tf_session_t *s, uint64_t step) { (void)s; (void)step; }
static void cpu_dropout_seed_set(tf_session_t *s, uint64_t seed) { (void)s; (void)seed; }
static void cpu_set_profiling(tf_session_t *s, bool on) { (void)s; (void)on; }
static size_t cpu_profile_count(tf_session_t *s) { (void)s; return 0; }
static void cpu_profile_get(tf_session_t *s, size_t i, tf_kernel_profile *out) { (void)s; (void)i; (void)out; }
static void cpu_info(tf_session_t *s, tf_session_info *out) { (void)s; (void)out; }
static tf_status cpu_dump_code(tf_context_t *ctx, const tf_program_t *p, const char *dir)
{
    (void)p;
    (void)dir;
    return tf_set_error(ctx, TF_ERR_UNAVAILABLE, "error: --dump-llvm needs a build with LLVM (this one has none)");
}
bool tf_cpu_jit_supports(const tf_kernel *k, char *why, size_t n)
{
    (void)k;
    snprintf(why, n, "%s", tf_cpu_unavailable());
    return false;
}

#endif

const tf_backend tf_backend_cpu = {
    .name = "cpu",
    .unavailable = tf_cpu_unavailable,
    .session_create = cpu_create,
    .session_free = cpu_free,
    .run = cpu_run,
    .state_read = cpu_state_read,
    .state_write = cpu_state_write,
    .step_get = cpu_step_get,
    .step_set = cpu_step_set,
    .dropout_seed_set = cpu_dropout_seed_set,
    .set_profiling = cpu_set_profiling,
    .profile_count = cpu_profile_count,
    .profile_get = cpu_profile_get,
    .info = cpu_info,
#ifdef TFUSE_HAVE_LLVM
    .copy_bandwidth = cpu_copy_bandwidth,
#endif
    .doctor = tf_cpu_doctor,
    .dump_code = cpu_dump_code,
    .op_support = tf_cpu_op_support,
#ifdef TFUSE_HAVE_LLVM
    .cache_trim = tf_cpu_cache_trim,
    .cache_free = tf_cpu_cache_free,
    .package_code = tf_cpu_package_code,
    .package_check = tf_cpu_package_check,
#endif
};
