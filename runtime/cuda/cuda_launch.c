/* cuda_launch.c — running the cuda target's steps: tf_cuda_run stages the
 * inputs through a pinned slot and enqueues the step (its CUDA graph once
 * captured, else kernel by kernel), tf_cuda_wait waits for it and reads the
 * outputs; kernels the GPU does not run go through the interpreter on host
 * copies (the host fallback). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "cuda_session.h"

/* ---- the host fallback ---------------------------------------------------------- */

static unsigned char *host_scratch(cuda_session *c, size_t bytes)
{
    if (bytes > c->nhost) {
        tf_free(c->host);
        c->host = tf_malloc(bytes);
        c->nhost = c->host ? bytes : 0;
    }
    return c->host;
}

/* Device value v into its interpreter tensor. */
static tf_status to_interp(tf_session_t *s, cuda_session *c, const tf_value *v)
{
    tf_diag d = {0};
    tf_tensor *t = tf_interp_tensor(c->ip, v, &d);
    if (!t) return tf_from_diag(s->ctx, &d);
    size_t bytes = value_bytes(v);
    unsigned char *h = host_scratch(c, bytes ? bytes : 1);
    if (!h) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory (%zu bytes for a host copy of %s)", bytes, v->name ? v->name : "a value");
    CU_DO("copying a fallback kernel's operand to the host", MemcpyDtoHAsync(h, dev_of(c, v), bytes, c->stream));
    CU_DO("copying a fallback kernel's operand to the host", StreamSynchronize(c->stream));
    for (int64_t i = 0; i < t->numel; i++) t->data[i] = tf_elem_load(v->type.dtype, h, i);
    return TF_OK;
}

/* v's interpreter tensor, in storage dtype, onto the device. */
static tf_status from_interp(tf_session_t *s, cuda_session *c, const tf_value *v)
{
    tf_diag d = {0};
    tf_tensor *t = tf_interp_tensor(c->ip, v, &d);
    if (!t) return tf_from_diag(s->ctx, &d);
    size_t bytes = value_bytes(v);
    unsigned char *h = host_scratch(c, bytes ? bytes : 1);
    if (!h) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory (%zu bytes for a host copy of %s)", bytes, v->name ? v->name : "a value");
    for (int64_t i = 0; i < t->numel; i++) tf_elem_store(v->type.dtype, h, i, t->data[i]);
    CU_DO("copying a fallback kernel's result to the GPU", MemcpyHtoDAsync(dev_of(c, v), h, bytes, c->stream));
    CU_DO("copying a fallback kernel's result to the GPU", StreamSynchronize(c->stream));   /* before h is reused */
    return TF_OK;
}

/* The interpreter's kernel on host copies: the whole kernel, or only its
 * library op (lib_only: the epilogue then runs on the GPU). */
static tf_status run_fallback(tf_session_t *s, cuda_session *c, const tf_kernel *k, bool lib_only)
{
    tf_diag d = {0};
    tf_status st = TF_OK;
    tf_interp_set_step(c->ip, c->rt[1]);
    tf_comm_interp_attach(c->ip, s->comm);
    if (lib_only) {
        for (int q = 0; !st && q < k->lib->nin; q++)
            if (k->lib->in[q]->kind != TF_VAL_CONST) st = to_interp(s, c, k->lib->in[q]);
    } else {
        for (int b = 0; !st && b < k->nbufs; b++) st = to_interp(s, c, k->bufs[b].value);
    }
    if (st) return st;
    tf_kernel one_k = *k;
    if (lib_only) one_k.nexprs = 0;   /* tf_kernels_eval then runs the library op alone */
    tf_kernel_plan one = {.kernels = &one_k, .nkernels = 1};
    if (tf_kernels_eval(&one, c->ip, &d)) return tf_from_diag(s->ctx, &d);
    if (lib_only) return from_interp(s, c, k->lib->out);
    for (int b = 0; !st && b < k->nbufs; b++)
        if (k->bufs[b].written) st = from_interp(s, c, k->bufs[b].value);
    return st;
}

/* Write a constant's filled bytes (pool: tf_cuda_fill_pools made them) into dst:
 * a device copy, inside the step's stream and its graph. */
static tf_status fill_const(tf_session_t *s, cuda_session *c, const tf_value *dst, tf_cu_deviceptr pool)
{
    if (!pool) return tf_set_error(s->ctx, TF_ERR_INTERNAL, "error: internal: cuda: no filled copy of the constant written to %s",
                                   dst->name ? dst->name : "a value");
    if (value_bytes(dst)) CU_DO("filling a constant", MemcpyDtoDAsync(dev_of(c, dst), pool, value_bytes(dst), c->stream));
    return TF_OK;
}

/* ---- running ---------------------------------------------------------------------- */

static tf_status launch_fn(tf_session_t *s, cuda_session *c, gkernel *gk, int fn, void **args)
{
    const tf_cuda_jit_fn *f = &c->jit.fns[fn];
    tf_cu_result r = c->libs.cu.LaunchKernel(f->function, f->grid, 1, 1, f->block, 1, 1, f->smem, c->stream, args, NULL);
    if (tf_cuda_check(&c->libs, r, "cuLaunchKernel", __FILE__, __LINE__, c->err, sizeof c->err))
        return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: cuda: launching kernel %s (%s, grid %u, block %u, %u bytes of shared memory): %s",
                            gk->k->name, f->name, f->grid, f->block, f->smem, c->err);
    if (f->function2) {   /* a split reduction's full-space stores, flash_attention_grad's dQ */
        r = c->libs.cu.LaunchKernel(f->function2, f->grid2, 1, 1, f->block2, 1, 1, f->smem2, c->stream, args, NULL);
        if (tf_cuda_check(&c->libs, r, "cuLaunchKernel", __FILE__, __LINE__, c->err, sizeof c->err))
            return tf_set_error(s->ctx, TF_ERR_RUNTIME,
                                "error: cuda: launching kernel %s (%s_b, grid %u, block %u, %u bytes of shared memory): %s", gk->k->name,
                                f->name, f->grid2, f->block2, f->smem2, c->err);
    }
    return TF_OK;
}

static tf_status launch(tf_session_t *s, cuda_session *c, gkernel *gk) { return launch_fn(s, c, gk, gk->fn, gk->args); }

/* The library op's generated kernel, into a zeroed result where it adds with atomics. */
static tf_status run_libkernel(tf_session_t *s, cuda_session *c, gkernel *gk)
{
    if (gk->lclear) CU_DO(gk->k->name, MemsetD8Async(gk->ldptr[0], 0, gk->lclear, c->stream));
    return launch_fn(s, c, gk, gk->lfn, gk->largs);
}

/* A library kernel saw an id out of range (its error word, 1 + the id's
 * position): the interpreter's error, with the id when its memory still
 * holds it. */
static tf_status bad_id(tf_session_t *s, cuda_session *c, const gkernel *gk, uint64_t word)
{
    const tf_node *n = gk->k->lib;
    const tf_value *ids = n->in[0];
    int64_t pos = (int64_t)(word - 1), V = n->op == TF_OP_SCATTER_ADD ? n->out->type.dims[0].n : n->in[1]->type.dims[0].n;
    long long id = 0;
    bool have = false;
    if (ids->kind != TF_VAL_CONST && pos >= 0 && pos < numel(ids)) {
        size_t es = (size_t)tf_dtype_bytes(ids->type.dtype);
        unsigned char *h = host_scratch(c, 8);
        if (h && !c->libs.cu.MemcpyDtoHAsync(h, dev_of(c, ids) + (tf_cu_deviceptr)((size_t)pos * es), es, c->stream) &&
            !c->libs.cu.StreamSynchronize(c->stream)) {
            if (es == 8) {
                int64_t v;
                memcpy(&v, h, 8);
                id = v;
            } else {
                int32_t v;
                memcpy(&v, h, 4);
                id = v;
            }
            have = id < 0 || id >= V;
        }
    }
    tf_diag d = {0};
    if (have)
        tf_diag_error(&d, TF_IR_ERR_RUNTIME, &n->loc, "%s: id %lld at position %lld is out of range [0, %lld)", tf_op_info_of(n->op)->name,
                      id, (long long)pos, (long long)V);
    else
        tf_diag_error(&d, TF_IR_ERR_RUNTIME, &n->loc, "%s: the id at position %lld was out of range [0, %lld) when kernel %s ran on the GPU",
                      tf_op_info_of(n->op)->name, (long long)pos, (long long)V, gk->k->name);
    return tf_from_diag(s->ctx, &d);
}

static tf_status run_kernel(tf_session_t *s, cuda_session *c, gkernel *gk)
{
    const tf_kernel *k = gk->k;
    tf_status st = TF_OK;
    switch (gk->how) {
    case RUN_NOTHING:
    case RUN_IN_MULTI: return TF_OK;
    case RUN_VIEW: {
        const tf_value *src = k->lib->in[0], *dst = k->lib->out;
        if (!dev_of(c, dst)) return TF_OK;   /* nothing reads it */
        if (src->kind == TF_VAL_CONST) return fill_const(s, c, dst, c->kpool[gk - c->ks]);
        if (dev_of(c, src) != dev_of(c, dst))
            CU_DO(k->name, MemcpyDtoDAsync(dev_of(c, dst), dev_of(c, src), value_bytes(dst), c->stream));
        return TF_OK;
    }
    case RUN_FALLBACK: return run_fallback(s, c, k, false);
    case RUN_ALLREDUCE:
        if (tf_cuda_comm_on_host(s, c)) return run_fallback(s, c, k, false);
        return tf_cuda_run_allreduce(s, c, (int)(gk - c->ks));
    case RUN_LIB_FALLBACK: st = run_fallback(s, c, k, true); break;
    case RUN_GEMM: st = tf_cuda_run_gemm(s, c, gk); break;
    case RUN_LIBKERNEL: st = run_libkernel(s, c, gk); break;
    case RUN_CONV: st = tf_cuda_run_conv(s, c, gk); break;
    case RUN_JIT: break;
    }
    if (!st && gk->fn >= 0) st = launch(s, c, gk);
    return st;
}

static tf_status ensure_events(tf_session_t *s, cuda_session *c)
{
    if (c->ev) return TF_OK;
    int n = 2 * (c->plan->nkernels ? c->plan->nkernels : 1);
    c->ev = tf_calloc((size_t)n, sizeof *c->ev);
    if (!c->ev) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < n; i++) CU_DO("creating the profiler's events", EventCreate(&c->ev[i], CU_EVENT_DEFAULT));
    return TF_OK;
}

/* After a failure inside a step: let the stream drain so that nothing still
 * reads the pinned buffers, keeping the first error's message. */
static tf_status drain(cuda_session *c, tf_status st)
{
    c->libs.cu.StreamSynchronize(c->copy);
    c->libs.cu.StreamSynchronize(c->stream);
    return st;
}

/* The input slot k the host filled, onto the GPU: the copy stream copies
 * it into in_dev once the previous step has taken in_dev's contents
 * (consumed), then records staged[k]; the compute stream waits for that,
 * moves {seed, step} and each input into place and records consumed. So
 * the copy of step N+1's inputs overlaps step N, and neither the slot nor
 * in_dev is overwritten while something still reads it. Outside the
 * graph: a replay is the same whichever slot was used. */
static tf_status stage_inputs(tf_session_t *s, cuda_session *c, int k)
{
    const tf_program_t *p = s->p;
    if (c->consumed_rec) CU_DO("ordering the input copy after the previous step", StreamWaitEvent(c->copy, c->consumed, 0));
    CU_DO("copying the inputs to the GPU", MemcpyHtoDAsync(c->in_dev, c->pinned + c->slot_at[k], c->slot_bytes, c->copy));
    CU_DO("copying the inputs to the GPU", EventRecord(c->staged[k], c->copy));
    c->staged_rec[k] = true;
    CU_DO("ordering the step after its inputs' copy", StreamWaitEvent(c->stream, c->staged[k], 0));
    CU_DO("copying {seed, step} into place", MemcpyDtoDAsync(c->rt_dev, c->in_dev, sizeof c->rt, c->stream));
    for (int i = 0; i < p->inputs.n; i++) {
        const tf_value *v = p->inputs.items[i];
        tf_cu_result r = c->libs.cu.MemcpyDtoDAsync(c->ptr[v->id], c->in_dev + c->in_at[i], value_bytes(v), c->stream);
        if (tf_cuda_check(&c->libs, r, "cuMemcpyDtoDAsync", __FILE__, __LINE__, c->err, sizeof c->err))
            return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: cuda: copying input '%s' to the GPU: %s", v->name, c->err);
    }
    CU_DO("ordering the next input copy after this step's", EventRecord(c->consumed, c->stream));
    c->consumed_rec = true;
    return TF_OK;
}

/* The GPU failed a step (r, found by a wait): the session's error from now on. */
static tf_status step_failed(tf_session_t *s, cuda_session *c, tf_cu_result r, const char *call)
{
    tf_cuda_check(&c->libs, r, call, __FILE__, __LINE__, c->err, sizeof c->err);
    c->failed = r == CUDA_ERROR_OUT_OF_MEMORY ? TF_ERR_OOM : TF_ERR_RUNTIME;
    c->pending = false;
    snprintf(c->failed_msg, sizeof c->failed_msg,
             "error: cuda: the step failed on the GPU: %.2048s (the failure may come from any kernel of the step; "
             "--cuda-sync names the kernel, compute-sanitizer finds the access)", c->err);
    return tf_set_error(s->ctx, c->failed, "%s", c->failed_msg);
}

/* Wait for the step the last run enqueued, then its outputs into s->out
 * and its profile read: what every call that reads results does first
 * (tf_backend.wait). The GPU's error from the step is returned here. */
tf_status tf_cuda_wait(tf_session_t *s)
{
    cuda_session *c = s->impl;
    const tf_module *m = s->p->m;
    if (c->failed) return tf_set_error(s->ctx, c->failed, "%s", c->failed_msg);
    if (!c->pending) return TF_OK;
    CU_DO("making the session's context current", CtxSetCurrent(c->ctx));
    tf_cu_result r = tf_cuda_comm_sync(s, c, c->done);
    if (r == TF_CUDA_COMM_FAILED) {   /* the job cannot go on: every later call says so */
        c->failed = TF_ERR_RUNTIME;
        c->pending = false;
        snprintf(c->failed_msg, sizeof c->failed_msg, "error: %.2500s", c->err);
        return tf_set_error(s->ctx, c->failed, "%s", c->failed_msg);
    }
    if (r) return step_failed(s, c, r, "cuEventSynchronize");
    c->pending = false;
    for (int i = 0; i < m->noutputs; i++) {
        const tf_value *v = m->outputs[i].value;
        c->out_fresh[i] = true;
        if (v->kind == TF_VAL_CONST) {
            for (int64_t j = 0; j < numel(v); j++) tf_elem_store(v->type.dtype, s->out[i], j, tf_dtype_round(v->type.dtype, v->cval));
        } else if (c->out_at[i] != SIZE_MAX) {
            memcpy(s->out[i], c->pinned + c->out_at[i], value_bytes(v));
        } else {
            c->out_fresh[i] = false;   /* tf_cuda_output_fetch copies it when it is read */
        }
    }
    if (c->pending_profile) {
        c->pending_profile = false;
        for (int i = 0; i < c->plan->nkernels; i++) {
            float ms = 0, at = 0;
            CU_DO("reading the profiler's events", EventElapsedTime(&ms, c->ev[2 * i], c->ev[2 * i + 1]));
            c->ks[i].ms += ms;
            c->ks[i].calls++;
            if (s->tracing) {   /* the device's timeline: from the step's first event, after the moment it was enqueued */
                CU_DO("reading the profiler's events", EventElapsedTime(&at, c->ev[0], c->ev[2 * i]));
                tf_trace_add(s, (size_t)i, c->trace_base_us + 1e3 * at, 1e3 * ms, c->trace_run, 1);
            }
        }
    }
    return TF_OK;
}

/* Output i of the last step into s->out[i], when tf_cuda_wait left it on
 * the device (a large output: GPT-2's logits are 1.6 GB, which the first
 * GPU run copied to the host every step, read or not). Its memory holds
 * it until the next step is enqueued: nothing after the step writes it. */
tf_status tf_cuda_output_fetch(tf_session_t *s, int i)
{
    cuda_session *c = s->impl;
    if (c->out_fresh[i]) return TF_OK;
    const tf_value *v = s->p->m->outputs[i].value;
    CU_DO("making the session's context current", CtxSetCurrent(c->ctx));
    tf_cu_result r = c->libs.cu.MemcpyDtoH(s->out[i], dev_of(c, v), value_bytes(v));
    if (tf_cuda_check(&c->libs, r, "cuMemcpyDtoH", __FILE__, __LINE__, c->err, sizeof c->err))
        return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: cuda: copying output '%s' to the host: %s", s->p->m->outputs[i].name, c->err);
    c->out_fresh[i] = true;
    return TF_OK;
}

/* Ids the API could not check before the step (computed ones): a kernel
 * that saw one out of range fails the step before any update, as the
 * interpreter does: before the first kernel that writes state in place, or
 * after the kernels (a synchronization inside the step: such a step is
 * never captured as a graph). */
static tf_status check_ids(tf_session_t *s, cuda_session *c)
{
    tf_cu_result r = c->libs.cu.MemcpyDtoHAsync(c->pinned, c->err_dev, 8 * (size_t)c->nerr, c->stream);
    if (!r) r = c->libs.cu.StreamSynchronize(c->stream);
    if (tf_cuda_check(&c->libs, r, "cuMemcpyDtoHAsync", __FILE__, __LINE__, c->err, sizeof c->err))
        return drain(c, cu_fail(s, c, r, "reading the library kernels' error words"));
    for (int i = 0; i < c->plan->nkernels; i++) {
        const gkernel *gk = &c->ks[i];
        uint64_t word;
        if (gk->how != RUN_LIBKERNEL || !gk->err_read) continue;
        memcpy(&word, c->pinned + 8 * (size_t)gk->err_slot, 8);
        if (word) return drain(c, bad_id(s, c, gk, word));
    }
    return TF_OK;
}

/* One step onto the stream, from the inputs in place (stage_inputs) to the
 * outputs copied back into pinned memory: no host synchronization inside
 * (but for ids checked on the host, err_read), so that it can be captured
 * as a graph; the graph does not depend on which input slot a run filled. */
static tf_status enqueue_step(tf_session_t *s, cuda_session *c)
{
    const tf_program_t *p = s->p;
    const tf_module *m = p->m;
    tf_status st;
    if (c->err_read) CU_DO("clearing the library kernels' error words", MemsetD8Async(c->err_dev, 0, 8 * (size_t)c->nerr, c->stream));
    for (int i = 0; i < c->plan->nkernels; i++) {
        gkernel *gk = &c->ks[i];
        if (c->err_read && i == c->ids_check_at && (st = check_ids(s, c))) return st;
        if (c->profile) {
            tf_cu_result r = c->libs.cu.EventRecord(c->ev[2 * i], c->stream);
            if (tf_cuda_check(&c->libs, r, "cuEventRecord", __FILE__, __LINE__, c->err, sizeof c->err)) return cu_fail(s, c, r, gk->k->name);
        }
        if ((st = tf_cuda_comm_before(s, c, i)) || (st = run_kernel(s, c, gk))) return st;
        if (c->profile) {
            tf_cu_result r = c->libs.cu.EventRecord(c->ev[2 * i + 1], c->stream);
            if (tf_cuda_check(&c->libs, r, "cuEventRecord", __FILE__, __LINE__, c->err, sizeof c->err)) return cu_fail(s, c, r, gk->k->name);
        }
        if (c->sync_each) {
            tf_cu_result r = c->libs.cu.StreamSynchronize(c->stream);
            if (tf_cuda_check(&c->libs, r, "cuStreamSynchronize", __FILE__, __LINE__, c->err, sizeof c->err))
                return tf_set_error(s->ctx, r == CUDA_ERROR_OUT_OF_MEMORY ? TF_ERR_OOM : TF_ERR_RUNTIME,
                                    "error: cuda: kernel %s (%s) failed: %s", gk->k->name, how_name(gk->how), c->err);
        }
    }
    if ((st = tf_cuda_comm_finish(s, c))) return st;
    if (c->err_read && c->ids_check_at >= c->plan->nkernels && (st = check_ids(s, c))) return st;
    /* updates: every new value that is itself state is copied aside first */
    for (int i = 0; i < m->nupdates; i++) {
        if (!c->stage[i]) continue;
        const tf_value *v = m->updates[i].value;
        tf_cu_result r = c->libs.cu.MemcpyDtoDAsync(c->stage[i], dev_of(c, v), value_bytes(v), c->stream);
        if (tf_cuda_check(&c->libs, r, "cuMemcpyDtoDAsync", __FILE__, __LINE__, c->err, sizeof c->err))
            return cu_fail(s, c, r, "staging an update");
    }
    for (int i = 0; i < m->nupdates; i++) {
        const tf_value *v = m->updates[i].value, *dst = m->updates[i].buffer;
        if (v->kind == TF_VAL_CONST) {
            if ((st = fill_const(s, c, dst, c->upool[i]))) return st;
            continue;
        }
        tf_cu_deviceptr from = c->stage[i] ? c->stage[i] : dev_of(c, v), to = dev_of(c, dst);
        if (from == to) continue;
        tf_cu_result r = c->libs.cu.MemcpyDtoDAsync(to, from, value_bytes(dst), c->stream);
        if (tf_cuda_check(&c->libs, r, "cuMemcpyDtoDAsync", __FILE__, __LINE__, c->err, sizeof c->err))
            return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: cuda: updating %s: %s", dst->name, c->err);
    }
    for (int i = 0; i < m->noutputs; i++) {
        const tf_value *v = m->outputs[i].value;
        if (v->kind == TF_VAL_CONST || c->out_at[i] == SIZE_MAX) continue;
        tf_cu_result r = c->libs.cu.MemcpyDtoHAsync(c->pinned + c->out_at[i], dev_of(c, v), value_bytes(v), c->stream);
        if (tf_cuda_check(&c->libs, r, "cuMemcpyDtoHAsync", __FILE__, __LINE__, c->err, sizeof c->err))
            return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: cuda: copying output '%s' to the host: %s", m->outputs[i].name, c->err);
    }
    return TF_OK;
}

enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0 };

/* The step captured as a graph and instantiated. A capture the driver or a
 * library refuses is no error: the step then runs kernel by kernel, and
 * graph_why says why. Errors of the step itself are returned. */
static tf_status capture_step(tf_session_t *s, cuda_session *c)
{
    tf_cu_result r = c->libs.cu.StreamBeginCapture(c->stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (r) {
        tf_cuda_check(&c->libs, r, "cuStreamBeginCapture", __FILE__, __LINE__, c->err, sizeof c->err);
        snprintf(c->graph.why, sizeof c->graph.why, "capturing the step failed: %.200s", c->err);
        c->graph.on = false;
        return TF_OK;
    }
    tf_status st = enqueue_step(s, c);
    tf_cu_graph g = NULL;
    r = c->libs.cu.StreamEndCapture(c->stream, &g);
    if (st) {   /* the step's own error, whatever the capture made of it */
        if (g) c->libs.cu.GraphDestroy(g);
        return st;
    }
    if (!r) r = c->libs.cu.GraphInstantiate(&c->graph.exec, g, 0);
    if (g) c->libs.cu.GraphDestroy(g);
    if (r) {
        c->graph.exec = NULL;
        tf_cuda_check(&c->libs, r, "capturing the step", __FILE__, __LINE__, c->err, sizeof c->err);
        snprintf(c->graph.why, sizeof c->graph.why, "the driver refused the captured step: %.200s", c->err);
        c->graph.on = false;
    }
    return TF_OK;
}

/* A step enqueued, not waited for: the host copies {seed, step} and the
 * inputs into a pinned slot (so the caller may change its buffers as soon
 * as this returns), the copy stream takes them to the GPU, the compute
 * stream runs the step (its graph, or kernel by kernel) and copies the
 * outputs into pinned memory; tf_cuda_wait waits for it. No host
 * synchronization but for a slot's copy two runs ago (two slots: step
 * N+1's memcpy never overwrites what step N's copy reads), a profiled
 * step's events, and what --cuda-sync, host kernels and ids checked on the
 * host (err_read) ask for. */
tf_status tf_cuda_run(tf_session_t *s)
{
    cuda_session *c = s->impl;
    const tf_program_t *p = s->p;
    tf_status st;
    if (c->failed) return tf_set_error(s->ctx, c->failed, "%s", c->failed_msg);
    CU_DO("making the session's context current", CtxSetCurrent(c->ctx));
    if ((st = tf_cuda_comm_prepare(s, c))) return st;   /* before any capture: the graph depends on it */
    /* a profiled step's events are read before they are recorded again */
    if (c->pending && c->pending_profile && (st = tf_cuda_wait(s))) return st;
    if (c->pending) {   /* the last step's failure, when the GPU has said it already */
        tf_cu_result r = c->libs.cu.EventQuery(c->done);
        if (r && r != CUDA_ERROR_NOT_READY) return step_failed(s, c, r, "cuEventQuery");
    }
    if (c->profile && (st = ensure_events(s, c))) return st;
    /* the host's part: this step's {seed, step} and inputs into the slot, once its last copy has read it */
    int k = c->slot;
    if (c->staged_rec[k]) {
        tf_cu_result r = c->libs.cu.EventSynchronize(c->staged[k]);
        if (r) return step_failed(s, c, r, "cuEventSynchronize");
    }
    unsigned char *slot = c->pinned + c->slot_at[k];
    memcpy(slot, c->rt, sizeof c->rt);
    for (int i = 0; i < p->inputs.n; i++) memcpy(slot + c->in_at[i], s->bound[i], value_bytes(p->inputs.items[i]));
    c->pending = false;
    if ((st = stage_inputs(s, c, k))) return drain(c, st);
    c->slot = 1 - k;
    bool graph = c->graph.on && !c->profile;   /* profiles time each kernel: launched one by one */
    if (c->profile) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        c->trace_base_us = (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
    }
    if (graph && !c->graph.exec && (st = capture_step(s, c))) return drain(c, st);
    if (graph && c->graph.exec) {
        tf_cu_result r = c->libs.cu.GraphLaunch(c->graph.exec, c->stream);
        if (tf_cuda_check(&c->libs, r, "cuGraphLaunch", __FILE__, __LINE__, c->err, sizeof c->err))
            return drain(c, cu_fail(s, c, r, "launching the step's graph"));
        c->graph.replays++;
    } else if ((st = enqueue_step(s, c))) {
        return drain(c, st);
    }
    tf_cu_result r = c->libs.cu.EventRecord(c->done, c->stream);
    if (tf_cuda_check(&c->libs, r, "cuEventRecord", __FILE__, __LINE__, c->err, sizeof c->err))
        return drain(c, cu_fail(s, c, r, "marking the step's end"));
    c->pending = true;
    c->pending_profile = c->profile;
    c->trace_run = s->trace_run;
    c->rt[1]++;
    tf_cuda_comm_count(s, c);
    return TF_OK;
}

/* ---- how steps run, decided once the kernels are built ------------------------- */

void tf_cuda_plan_steps(tf_session_t *s, cuda_session *c)
{
    /* the first kernel writing a param or buffer in place: an update kernel
     * (and the earlier parts of its multi-tensor launch) */
    c->ids_check_at = c->plan->nkernels;
    for (int i = 0; i < c->plan->nkernels && c->ids_check_at == c->plan->nkernels; i++)
        for (int b = 0; b < c->plan->kernels[i].nbufs; b++) {
            const tf_kbuf *kb = &c->plan->kernels[i].bufs[b];
            if (kb->written && (kb->value->kind == TF_VAL_PARAM || kb->value->kind == TF_VAL_BUFFER)) c->ids_check_at = i;
        }
    for (int i = c->ids_check_at; i > 0 && i < c->plan->nkernels && c->plan->kernels[i].multi && c->plan->kernels[i - 1].multi &&
                                   c->plan->kernels[i - 1].region == c->plan->kernels[i].region;
         i--)
        c->ids_check_at = i - 1;
    /* one graph per step, unless something in it cannot be captured */
    c->graph.on = true;
    if (s->p->settings.cuda_no_graphs) snprintf(c->graph.why, sizeof c->graph.why, "--cuda-graphs=off");
    else if (c->sync_each) snprintf(c->graph.why, sizeof c->graph.why, "--cuda-sync synchronizes after every kernel");
    for (int i = 0; !c->graph.why[0] && i < c->plan->nkernels; i++)
        if (c->ks[i].how == RUN_FALLBACK || c->ks[i].how == RUN_LIB_FALLBACK)
            snprintf(c->graph.why, sizeof c->graph.why, "kernel %.60s runs on the host (%.120s)", c->ks[i].k->name, c->ks[i].why);
        else if (c->ks[i].how == RUN_ALLREDUCE && tf_cuda_comm_on_host(s, c))
            snprintf(c->graph.why, sizeof c->graph.why, "kernel %.60s averages on the host (%.100s)", c->ks[i].k->name,
                     tf_cuda_comm_why(c));
    for (int i = 0; !c->graph.why[0] && i < c->plan->nkernels; i++)
        if (c->ks[i].how == RUN_LIBKERNEL && c->ks[i].err_read)
            snprintf(c->graph.why, sizeof c->graph.why,
                     "kernel %.60s reads ids the step computes, checked on the host before the updates", c->ks[i].k->name);
    if (c->graph.why[0]) c->graph.on = false;
}
