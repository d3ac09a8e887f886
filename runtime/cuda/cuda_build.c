/* cuda_build.c — the cuda target's kernels built when a session starts:
 * how each kernel of the plan runs (generated code, cuBLASLt, cuDNN, a
 * library op's own kernel, a view, or the host), its CUDA C emitted
 * (codegen/cuda.c) and compiled (jit.c: the cubin cache, else NVRTC), and
 * its launch parameters bound to device memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_session.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ---- building the kernels ----------------------------------------------------------- */

/* What runs a library op's generated kernel, in profiles (the cpu target's words). */
static const char *lib_label(int op) { return tf_exec_name(tf_op_exec_of(op)); }

/* Whether tf_session_run has checked the ids of library op n against its
 * table before the step (check_indices in api.c: an input that a gather
 * reads, checked against that gather's table): then its kernel's error word
 * cannot be set, and is not read. */
static bool ids_checked(const tf_module *m, const tf_node *n)
{
    const tf_value *ids = n->in[0];
    int64_t V = n->op == TF_OP_SCATTER_ADD ? n->out->type.dims[0].n : n->in[1]->type.dims[0].n;
    if (ids->kind != TF_VAL_INPUT) return false;
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *g = m->nodes.items[i];
        if (g->op == TF_OP_GATHER && g->in[0] == ids && g->in[1]->type.dims[0].n <= V) return true;
    }
    return false;
}

/* The library op of kernel i as its generated kernel: its job (owner nk + i)
 * and the session's facts about it. false with the reason in gk->why when
 * the emitter does not take it (the host then runs the op); *st set when
 * out of memory. */
static bool lib_setup(tf_session_t *s, cuda_session *c, gkernel *gk, int i, tf_cuda_jit_job *job, tf_status *st)
{
    const tf_kernel *k = gk->k;
    if (!tf_cuda_library_supports(k, gk->why, sizeof gk->why)) return false;
    tf_diag d = {0};
    if (tf_cuda_emit_library_mode(k, s->p->mode, &job->kernel, &d)) {   /* the mode: flash attention's dropout */
        if (d.status != TF_IR_ERR_RUNTIME) *st = tf_from_diag(s->ctx, &d);
        else set_text(gk->why, sizeof gk->why, d.msg);
        return false;
    }
    job->owner = c->plan->nkernels + i;
    gk->lclear = job->kernel.clear_first ? value_bytes(k->lib->out) : 0;
    if (!job->kernel.err) gk->err_slot = -1;
    gk->err_read = job->kernel.err && !ids_checked(s->p->m, k->lib);
    c->err_read |= gk->err_read;
    gk->label = lib_label(k->lib->op);
    return true;
}

/* The code gathered for the compiler: per kernel, its code and its library
 * op's (owner: the kernel, or nkernels + the kernel for a library op's). */
typedef struct build {
    tf_cuda_jit_job *jobs;
    int njobs;
    int nlib;                   /* library kernels so far: the next one's error word */
} build;

/* What every kernel starts from, whatever runs it. */
static void kernel_init(gkernel *gk, const tf_kernel *k, int *nlib)
{
    gk->k = k;
    gk->fn = -1;
    gk->lfn = -1;
    gk->err_slot = k->lib && k->kind != TF_K_VIEW ? (*nlib)++ : -1;   /* plan_layout's count */
    gk->work = 1;
    for (int a = 0; a < k->rank; a++) gk->work *= k->dims[a];
}

/* Kernel i and the next span - 1 (an optimizer's update chains) as one
 * multi-tensor launch. */
static tf_status plan_multi(tf_session_t *s, cuda_session *c, build *b, int i, int span)
{
    const tf_kernel *k = &c->plan->kernels[i];
    gkernel *gk = &c->ks[i];
    tf_diag d = {0};
    if (tf_cuda_emit_multi(k, span, &b->jobs[b->njobs].kernel, &d)) return tf_from_diag(s->ctx, &d);
    b->jobs[b->njobs++].owner = i;
    gk->how = RUN_JIT;
    gk->parts = span;
    for (int q = 1; q < span; q++) {
        gkernel *part = &c->ks[i + q];
        part->k = &c->plan->kernels[i + q];
        part->fn = part->lfn = part->err_slot = -1;
        part->how = RUN_IN_MULTI;
        part->work = 1;
        for (int a = 0; a < part->k->rank; a++) part->work *= part->k->dims[a];
        snprintf(part->why, sizeof part->why, "runs in %s's multi-tensor launch", k->name);
    }
    return TF_OK;
}

/* Kernel i's library op, its region's code already queued when there is
 * some (code): cuBLASLt, cuDNN, the op's own generated kernel, else the host. */
static tf_status plan_library(tf_session_t *s, cuda_session *c, build *b, int i, bool code)
{
    gkernel *gk = &c->ks[i];
    const tf_kernel *k = gk->k;
    tf_status st = TF_OK;
    bool oom_hit = false;
    tf_op_exec ex = tf_op_exec_of(k->lib->op);
    if (ex == TF_OPX_COMM && k->lib->op == TF_OP_ALLREDUCE && !code && k->lib->in[0]->type.dtype == k->lib->out->type.dtype) {
        gk->how = RUN_ALLREDUCE;   /* NCCL, a copy or the host: decided once the session has its communicator (cuda_comm.c) */
        return TF_OK;
    }
    if (ex == TF_OPX_GEMM && tf_cuda_gemm_setup(c, gk, NULL, &oom_hit)) gk->how = RUN_GEMM;
    else if (ex == TF_OPX_CONV && tf_cuda_conv_setup(c, gk, &oom_hit)) gk->how = RUN_CONV;
    else if (oom_hit) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory planning the %s of kernel %s",
                                        ex == TF_OPX_GEMM ? "GEMM" : "convolution", k->name);
    else if (tf_exec_own_kernel(ex) && lib_setup(s, c, gk, i, &b->jobs[b->njobs], &st)) {
        b->njobs++;
        gk->how = RUN_LIBKERNEL;
    } else if (!st) {
        if (!gk->why[0])
            snprintf(gk->why, sizeof gk->why, "%s has no GPU implementation in this build", tf_op_info_of(k->lib->op)->name);
        gk->how = code ? RUN_LIB_FALLBACK : RUN_FALLBACK;
    }
    return st;
}

/* How kernel i runs, its code queued in b; *covered: how many kernels that
 * decided (a multi-tensor launch decides for its parts). */
static tf_status plan_kernel(tf_session_t *s, cuda_session *c, build *b, int i, int *covered)
{
    const tf_kernel *k = &c->plan->kernels[i];
    gkernel *gk = &c->ks[i];
    *covered = 1;
    kernel_init(gk, k, &b->nlib);
    if (k->kind == TF_K_VIEW) {
        gk->how = RUN_VIEW;
        return TF_OK;
    }
    if (c->fallback_all) {
        gk->how = k->lib || k->nexprs ? RUN_FALLBACK : RUN_NOTHING;
        snprintf(gk->why, sizeof gk->why, "--cuda-fallback=all");
        return TF_OK;
    }
    /* a kernel whose work a GEMM's epilogue does, or a GEMM run in another kernel's place (plan_backward) */
    if (gk->preplanned && (gk->how != RUN_GEMM || !k->lib)) return TF_OK;
    int span = tf_cuda_multi_span(k, c->plan->nkernels - i);   /* an optimizer's update chains: one launch */
    if (span > 1) {
        *covered = span;
        return plan_multi(s, c, b, i, span);
    }
    /* a matmul first: cuBLASLt may take over its region's bias (and ReLU) */
    const tf_kernel *ek;   /* the code to emit: the kernel, or what its GEMM leaves of it */
    bool gemm_done;
    tf_status st = tf_cuda_plan_matmul(s, c, gk, &ek, &gemm_done);
    if (st) return st;
    bool code = ek && ek->nexprs && (!ek->lib || ek->nstores);   /* the whole kernel, or a GEMM region's epilogue */
    if (code) {
        tf_diag d = {0};
        if (tf_cuda_emit(ek, &b->jobs[b->njobs].kernel, &d)) {
            if (d.status != TF_IR_ERR_RUNTIME) return tf_from_diag(s->ctx, &d);
            set_text(gk->why, sizeof gk->why, d.msg);   /* the emitter says why it cannot */
            gk->how = RUN_FALLBACK;
            return TF_OK;
        }
        b->jobs[b->njobs].owner = i;
        b->njobs++;
    }
    if (!k->lib) {
        gk->how = code ? RUN_JIT : RUN_NOTHING;
        return TF_OK;
    }
    if (gemm_done) return TF_OK;
    return plan_library(s, c, b, i, code);
}

/* The queued code compiled (the cubin cache, else NVRTC), each function
 * handed to its kernel. */
static tf_status compile(tf_session_t *s, cuda_session *c, const build *b)
{
    int nk = c->plan->nkernels;
    char err[2048];
    tf_cuda_status cs = tf_cuda_jit_build(&c->jit, &c->libs, c->arch, s->p->pkg, b->jobs, b->njobs, err, sizeof err);
    if (cs) return tf_set_error(s->ctx, cs == TF_CUDA_ERR_OOM ? TF_ERR_OOM : TF_ERR_RUNTIME, "error: cuda: %s", err);
    for (int j = 0; j < b->njobs; j++) {
        if (b->jobs[j].owner >= nk) c->ks[b->jobs[j].owner - nk].lfn = b->jobs[j].fn;
        else c->ks[b->jobs[j].owner].fn = b->jobs[j].fn;
    }
    return TF_OK;
}

/* Generated code's launch parameters: the buffers' device pointers, then {seed, step}. */
static tf_status bind_kernel(tf_session_t *s, cuda_session *c, gkernel *gk)
{
    if (gk->fn < 0) return TF_OK;
    const tf_kernel *k = gk->k;
    const tf_cuda_jit_fn *f = &c->jit.fns[gk->fn];
    /* a multi-tensor launch: the parts' buffers in turn, each value once (tf_cuda_multi_params) */
    int nparts = gk->parts > 1 ? gk->parts : 1, nb = 0;
    for (int q = 0; q < nparts; q++) nb += k[q].nbufs;
    int *first = nparts > 1 ? tf_calloc((size_t)nb + 1, sizeof *first) : NULL;
    gk->dptr = tf_calloc((size_t)nb + 2, sizeof *gk->dptr);
    gk->args = tf_calloc((size_t)nb + 2, sizeof *gk->args);
    if (!gk->dptr || !gk->args || (nparts > 1 && !first)) {
        tf_free(first);
        return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    }
    if (first) tf_cuda_multi_params(k, nparts, first);
    int at = 0;
    for (int q = 0, o = 0; q < nparts; q++)
        for (int b = 0; b < k[q].nbufs; b++, o++) {
            if (first && first[o] != o) continue;   /* passed already, for an earlier part */
            gk->dptr[at] = dev_of(c, k[q].bufs[b].value);
            gk->args[at] = &gk->dptr[at];
            if (!gk->dptr[at] || (f->align > 1 && gk->dptr[at] % f->align)) {
                tf_free(first);
                return tf_set_error(s->ctx, TF_ERR_INTERNAL, "error: internal: kernel %s: buffer %d (%s) is %s", k[q].name, b,
                                    k[q].bufs[b].value->name ? k[q].bufs[b].value->name : "?",
                                    gk->dptr[at] ? "not aligned as its vector loads need" : "not placed in device memory");
            }
            at++;
        }
    tf_free(first);
    if (f->scratch) {   /* a split reduction's partials and counters: zeroed once, left zeroed by each launch */
        CU_DO("allocating a reduction's scratch", MemAlloc(&gk->scratch, f->scratch));
        dev_count(c, (int64_t)f->scratch);
        CU_DO("clearing a reduction's scratch", MemsetD8Async(gk->scratch, 0, f->scratch, c->stream));
        gk->dptr[at] = gk->scratch;
        gk->args[at] = &gk->dptr[at];
        at++;
    }
    if (f->rng) {
        gk->dptr[at] = c->rt_dev;
        gk->args[at] = &gk->dptr[at];
    }
    return TF_OK;
}

/* A library kernel's: the op's result, its operands that are not constants,
 * the error word, {seed, step} (flash attention's dropout). */
static tf_status bind_library(tf_session_t *s, cuda_session *c, gkernel *gk)
{
    if (gk->lfn < 0) return TF_OK;
    const tf_node *n = gk->k->lib;
    const tf_cuda_jit_fn *f = &c->jit.fns[gk->lfn];
    gk->ldptr = tf_calloc((size_t)n->nin + 3, sizeof *gk->ldptr);
    gk->largs = tf_calloc((size_t)n->nin + 3, sizeof *gk->largs);
    if (!gk->ldptr || !gk->largs) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    int np = 0;
    for (int q = -1; q < n->nin; q++) {
        const tf_value *v = q < 0 ? n->out : n->in[q];
        if (v->kind == TF_VAL_CONST) continue;
        gk->ldptr[np] = dev_of(c, v);
        gk->largs[np] = &gk->ldptr[np];
        if (!gk->ldptr[np] || (f->align > 1 && gk->ldptr[np] % f->align))
            return tf_set_error(s->ctx, TF_ERR_INTERNAL, "error: internal: kernel %s: %s's %s (%s) is %s", gk->k->name,
                                tf_op_info_of(n->op)->name, q < 0 ? "result" : "operand", v->name ? v->name : "?",
                                gk->ldptr[np] ? "not aligned as its loads need" : "not placed in device memory");
        np++;
    }
    if (gk->err_slot >= 0) {
        gk->ldptr[np] = c->err_dev + 8 * (tf_cu_deviceptr)gk->err_slot;
        gk->largs[np] = &gk->ldptr[np];
        np++;
    }
    if (f->rng) {
        gk->ldptr[np] = c->rt_dev;
        gk->largs[np] = &gk->ldptr[np];
    }
    return TF_OK;
}

tf_status tf_cuda_build_kernels(tf_session_t *s, cuda_session *c)
{
    int nk = c->plan->nkernels;
    c->ks = tf_calloc((size_t)(nk ? nk : 1), sizeof *c->ks);
    if (!c->ks) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    double t0 = now_ms();
    build b = {.jobs = tf_calloc((size_t)(nk ? 2 * nk : 1), sizeof *b.jobs)};   /* per kernel: its code, its library op's */
    if (!b.jobs) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    tf_status st = TF_OK;
    /* GEMMs with backward epilogues first: they decide which kernels do not run */
    if (!c->fallback_all && c->lt.ok && !tf_cuda_plan_backward(s, c)) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory planning GEMMs");
    for (int i = 0, covered = 1; !st && i < nk; i += covered) st = plan_kernel(s, c, &b, i, &covered);
    if (!st) st = tf_cuda_conv_workspace(s, c);
    if (!st) st = compile(s, c, &b);
    for (int j = 0; j < b.njobs; j++) tf_cuda_kernel_free(&b.jobs[j].kernel);
    tf_free(b.jobs);
    c->jit_ms = now_ms() - t0;
    for (int i = 0; !st && i < nk; i++) st = bind_kernel(s, c, &c->ks[i]);
    for (int i = 0; !st && i < nk; i++) st = bind_library(s, c, &c->ks[i]);
    return st;
}
