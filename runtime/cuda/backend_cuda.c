/* backend_cuda.c — the `cuda` target: the kernel plan run on an NVIDIA GPU
 * through the driver API, everything loaded with dlopen (loader.c), so the
 * same binary runs on a machine without a GPU and says why it cannot.
 *
 * A session:
 *
 *   - takes the program's kernel IR (codegen/kernel.c, built once by
 *     tf_program_compile) and emits CUDA C
 *     for every elementwise and reduction kernel, every GEMM region's
 *     epilogue and every library op but matmul and the convolutions
 *     (codegen/cuda.c); identical sources compile once, several kernels
 *     to an NVRTC program, the programs on every core (jit.c, cuda_jit.h),
 *     and the cubins are cached on disk;
 *   - allocates device memory twice: memplan's arena, where every planned
 *     value lives at its offset (in-place reuse and the planned peak are what
 *     runs), and one block for inputs, params, buffers, values memplan did not
 *     place, the updates' staging, the {seed, step} pair dropout kernels read
 *     and cuBLASLt's workspace, which cuDNN shares (a third block only when
 *     the convolutions' algorithms need more); reshapes alias their operand;
 *   - starts from the interpreter's initial state (the same seed gives the
 *     same params as the interp and cpu targets), converted to storage dtype;
 *   - runs a step asynchronously: tf_cuda_run copies {seed, step} and the
 *     inputs into one of two pinned slots and returns once the step is
 *     enqueued; a copy stream takes the slot to a device staging area
 *     (in_dev) while the previous step still runs, and the compute stream
 *     (events both ways) moves it into place, then runs the kernels in plan order, matmuls through cuBLASLt (blas.c: the fastest
 *     of the heuristic's algorithms, timed once per shape and cached on
 *     disk; a region's row bias and ReLU as cuBLASLt's epilogue where that
 *     is all the region adds; in the backward pass a weight gradient's bias
 *     gradient (BGRADA/BGRADB) and ReLU's backward (DRELU_BGRAD, on the
 *     forward GEMM's RELU_AUX_BIAS mask), the kernels they replace not run:
 *     plan_backward), conv2d and its two gradients through cuDNN
 *     (dnn.c: the algorithm cudnnFind picks once per shape, cached on disk
 *     beside the cubins), the updates (every new value read before any
 *     state is written), the outputs back into pinned memory, and records
 *     an event; tf_cuda_wait (tf_backend.wait, called by api.c before anything
 *     reads results) waits for it, copies the outputs out and reports a
 *     failure of the GPU, which is the session's error from then on;
 *   - captures that step (from the inputs in place on) as one CUDA graph on its first run and replays it
 *     after (no host work inside a step: constants it writes are copies
 *     from device buffers filled when the session starts), unless a kernel
 *     runs on the host, --cuda-sync or --cuda-graphs=off, or profiling
 *     (per-kernel events) asks for launches one by one.
 *
 * The `cuda-emu` target is this code over emu.h's stand-ins for the driver,
 * NVRTC, cuBLASLt and cuDNN: the same code, every kernel run on the host.
 *
 * Library ops other than matmul and the convolutions (pooling and its
 * gradients, gather, scatter_add, concat, slice_grad, flash_attention and
 * flash_attention_grad) run their own generated kernel
 * (tf_cuda_emit_library_mode for the program's mode, its own function and
 * launch parameters; flash_attention_grad's second entry point right after
 * the first; {seed, step} last where flash attention draws dropout), then
 * the region's epilogue if there is one; scatter_add in f32/f64 into a
 * result zeroed first. Their ids are guarded: a kernel that
 * meets one out of range stores its position in an error word (one per
 * library kernel, after {seed, step}); where the API did not check the ids
 * before the step (they are computed, not an input a gather reads), the
 * words are read after the kernels and a bad id fails the step before any
 * update, with the interpreter's message (that step is launched kernel by
 * kernel, not as a graph: it synchronizes before its updates).
 *
 * What the GPU does not run yet runs on the host, correctly and visibly: a
 * library op without a GPU implementation here (a matmul cuBLASLt cannot
 * take; a convolution when cuDNN is missing or has no algorithm for it) or
 * a kernel the emitter refuses is copied to the host, run by the
 * interpreter's kernel (tf_kernels_eval on a one-kernel plan) and copied
 * back. Such kernels are counted in info().fallbacks, named "fallback" in
 * profiles, and a GEMM region's epilogue still runs on the GPU.
 *
 * Settings, from the program (tf_compile_options; the environment gives
 * their defaults in tf_compile_options_init): no_tf32 (--no-tf32,
 * TFUSE_NO_TF32=1) keeps fp32 GEMMs and convolutions in full fp32 (TF32
 * tensor cores otherwise); cuda_sync (--cuda-sync, TFUSE_CUDA_SYNC=1) synchronizes after
 * every kernel, so an asynchronous fault names the kernel that caused it;
 * cuda_fallback_all (--cuda-fallback=all, TFUSE_CUDA_FALLBACK=all) runs
 * every kernel on the host (separates a code generation bug from a runtime
 * one); cuda_explain (--cuda-explain, TFUSE_CUDA_EXPLAIN=1) prints, when a
 * session starts, which kernels run on the host and why, and which cuDNN
 * algorithm each convolution got. TFUSE_CACHE_DIR moves the cubin and
 * algorithm cache (default ~/.cache/tfuse).
 *
 * This file is the backend itself: its two vtables, a session created and
 * freed, its state, profiles and facts. The rest of the session's code
 * lives beside it, one file per part (cuda_session.h lists them): device
 * memory (cuda_mem.c), building the kernels (cuda_build.c), GEMMs
 * (cuda_gemm.c, cuda_gemm_backward.c), convolutions (cuda_conv.c), and
 * running a step (cuda_launch.c). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "artifact.h"
#include "cuda_session.h"
#include "emu.h"

/* ---- can this machine run it? ------------------------------------------------ */

static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static char g_probe_why[2048];   /* "" when the target can run; written once, read-only afterwards */

static void probe(void)
{
    tf_cuda_libs *l = tf_calloc(1, sizeof *l);
    char err[2048] = "";
    if (!l) {
        snprintf(g_probe_why, sizeof g_probe_why, "out of memory probing for the CUDA driver");
        return;
    }
    /* the driver first: where there is none (most machines), NVRTC is not even opened */
    tf_cuda_libs_load(l, TF_CUDA_LIB_DRIVER, NULL, err, sizeof err);
    int ndev = 0;
    if (!(l->loaded & TF_CUDA_LIB_DRIVER)) set_text(g_probe_why, sizeof g_probe_why, l->driver_error);
    else if (tf_cuda_driver_init(l, &ndev, err, sizeof err)) snprintf(g_probe_why, sizeof g_probe_why, "no CUDA device: %.2000s", err);
    else if (tf_cuda_libs_add(l, TF_CUDA_LIB_NVRTC, NULL, err, sizeof err))
        snprintf(g_probe_why, sizeof g_probe_why, "the cuda target compiles its kernels when a session starts, and %.1900s", l->nvrtc_error);
    tf_cuda_libs_free(l);
    tf_free(l);
}

static const char *cuda_unavailable(void)
{
    pthread_once(&g_probe_once, probe);
    return g_probe_why[0] ? g_probe_why : NULL;
}

/* ---- state ---------------------------------------------------------------------------- */

static tf_status cuda_state_read(tf_session_t *s, const tf_value *v, void *dst)
{
    cuda_session *c = s->impl;
    CU_DO("making the session's context current", CtxSetCurrent(c->ctx));
    CU_DO(v->name, MemcpyDtoHAsync(dst, c->ptr[v->id], value_bytes(v), c->stream));
    CU_DO(v->name, StreamSynchronize(c->stream));
    return TF_OK;
}

static tf_status cuda_state_write(tf_session_t *s, const tf_value *v, const void *src)
{
    cuda_session *c = s->impl;
    /* an output left on the device may be this param's memory (or share it): read before it changes */
    for (int i = 0; i < s->p->m->noutputs; i++) {
        tf_status st = tf_cuda_output_fetch(s, i);
        if (st) return st;
    }
    CU_DO("making the session's context current", CtxSetCurrent(c->ctx));
    CU_DO(v->name, MemcpyHtoDAsync(c->ptr[v->id], src, value_bytes(v), c->stream));
    CU_DO(v->name, StreamSynchronize(c->stream));
    return TF_OK;
}

static uint64_t cuda_step_get(tf_session_t *s) { return ((cuda_session *)s->impl)->rt[1]; }
static void cuda_step_set(tf_session_t *s, uint64_t step) { ((cuda_session *)s->impl)->rt[1] = step; }
static void cuda_dropout_seed_set(tf_session_t *s, uint64_t seed)
{
    cuda_session *c = s->impl;
    c->rt[0] = seed;   /* copied into place with the step's inputs */
    if (c->ip) tf_interp_set_seed(c->ip, seed);
}

/* ---- creating and freeing -------------------------------------------------------------- */

static void cuda_free(tf_session_t *s)
{
    cuda_session *c = s->impl;
    if (!c) return;
    tf_cu_api *cu = &c->libs.cu;
    bool driver = (c->libs.loaded & TF_CUDA_LIB_DRIVER) && c->ctx;
    if (driver) {
        cu->CtxSetCurrent(c->ctx);
        if (c->copy) cu->StreamSynchronize(c->copy);
        if (c->stream) cu->StreamSynchronize(c->stream);
    }
    for (int i = 0; c->ks && i < c->plan->nkernels; i++) {
        tf_free(c->ks[i].dptr);
        tf_free(c->ks[i].args);
        tf_free(c->ks[i].ldptr);
        tf_free(c->ks[i].largs);
        tf_cuda_gemm_call_free(c, c->ks[i].mm);
        tf_cuda_epi_free(c->ks[i].rest);
        if (driver && c->ks[i].scratch) cu->MemFree(c->ks[i].scratch);
        tf_cuda_conv_free(c, c->ks[i].conv);
    }
    tf_free(c->ks);
    if (c->lt.handle) c->libs.lt.Destroy(c->lt.handle);
    if (driver && c->graph.exec) cu->GraphExecDestroy(c->graph.exec);
    if (driver) tf_cuda_comm_free(c);
    if (c->dnn.handle) c->libs.dnn.Destroy(c->dnn.handle);
    if (driver) {
        for (int i = 0; c->ev && i < 2 * (c->plan->nkernels ? c->plan->nkernels : 1); i++)
            if (c->ev[i]) cu->EventDestroy(c->ev[i]);
        tf_cuda_jit_free(&c->jit, &c->libs);
        if (c->dnn.ws_own) cu->MemFree(c->dnn.ws_own);
        if (c->dnn.find_ws) cu->MemFree(c->dnn.find_ws);
        if (c->arena) cu->MemFree(c->arena);
        if (c->state) cu->MemFree(c->state);
        if (c->pinned) cu->MemFreeHost(c->pinned);
        for (int k = 0; k < 2; k++)
            if (c->staged[k]) cu->EventDestroy(c->staged[k]);
        if (c->consumed) cu->EventDestroy(c->consumed);
        if (c->done) cu->EventDestroy(c->done);
        if (c->copy) cu->StreamDestroy(c->copy);
        if (c->stream) cu->StreamDestroy(c->stream);
    }
    tf_free(c->ev);
    if (c->ctx_retained) cu->DevicePrimaryCtxRelease(c->dev);
    tf_free(c->ptr);
    tf_free(c->stage);
    tf_free(c->kpool);
    tf_free(c->upool);
    tf_free(c->in_at);
    tf_free(c->out_at);
    tf_free(c->out_fresh);
    tf_free(c->host);
    tf_interp_free(c->ip);
    tf_cuda_libs_free(&c->libs);
    tf_free(c);
    s->impl = NULL;
}

/* The architecture to compile for: the device's own, when NVRTC knows it. */
static tf_status pick_arch(tf_session_t *s, cuda_session *c)
{
    int want = c->cc_major * 10 + c->cc_minor, best = 0;
    for (int i = 0; i < c->libs.narchs; i++)
        if (c->libs.archs[i] == want) best = want;
    if (!c->libs.narchs) best = want;   /* NVRTC did not list them: let it decide */
    if (!best)   /* a cubin runs on later minor versions of its major version */
        for (int i = 0; i < c->libs.narchs; i++)
            if (c->libs.archs[i] / 10 == c->cc_major && c->libs.archs[i] <= want && c->libs.archs[i] > best) best = c->libs.archs[i];
    if (!best)
        return tf_set_error(s->ctx, TF_ERR_UNAVAILABLE,
                            "error: cuda: NVRTC %d.%d (%s) cannot compile for %s (compute capability %d.%d); it knows sm_%d .. sm_%d: "
                            "install a CUDA toolkit (or `pip install nvidia-cuda-nvrtc`) recent enough for this GPU",
                            c->libs.nvrtc_major, c->libs.nvrtc_minor, c->libs.nvrtc_path, c->gpu, c->cc_major, c->cc_minor,
                            c->libs.narchs ? c->libs.archs[0] : 0, c->libs.narchs ? c->libs.archs[c->libs.narchs - 1] : 0);
    snprintf(c->arch, sizeof c->arch, "sm_%d", best);
    const tf_pkg_section *archs = s->p->pkg ? tf_pkg_find(s->p->pkg, "cuda/archs") : NULL;
    if (archs && !c->emu) {   /* a package: its cubins must be for this GPU */
        const char *list = (const char *)archs->data;
        size_t al = strlen(c->arch);
        bool has = false;
        for (const char *a = list; *a && !has; a += strcspn(a, ",") + (a[strcspn(a, ",")] == ',')) has = strcspn(a, ",") == al && !strncmp(a, c->arch, al);
        if (!has)
            return tf_set_error(s->ctx, TF_ERR_UNAVAILABLE,
                                "error: cuda: the package was built for %s; this GPU (%s) is %s: compile the model with --arch=%s",
                                list, c->gpu, c->arch, c->arch);
    }
    return TF_OK;
}

static tf_status open_device(tf_session_t *s, cuda_session *c)
{
    char err[2048];
    const char *why = c->emu ? tf_cuda_emu_unavailable() : NULL;
    if (why) return tf_set_error(s->ctx, TF_ERR_UNAVAILABLE, "error: target 'cuda-emu' cannot run here: %s", why);
    tf_cuda_libs_load(&c->libs, TF_CUDA_LIB_DRIVER | TF_CUDA_LIB_NVRTC, &c->search, err, sizeof err);
    if (!(c->libs.loaded & TF_CUDA_LIB_DRIVER))
        return tf_set_error(s->ctx, TF_ERR_UNAVAILABLE, "error: target 'cuda' cannot run here: %s", c->libs.driver_error);
    if (!(c->libs.loaded & TF_CUDA_LIB_NVRTC))
        return tf_set_error(s->ctx, TF_ERR_UNAVAILABLE, "error: target 'cuda' cannot run here: it compiles its kernels with NVRTC, and %s",
                            c->libs.nvrtc_error);
    int ndev = 0;
    if (tf_cuda_driver_init(&c->libs, &ndev, err, sizeof err))
        return tf_set_error(s->ctx, TF_ERR_UNAVAILABLE, "error: target 'cuda' cannot run here: no CUDA device: %s", err);
    CU_DO("opening GPU 0", DeviceGet(&c->dev, 0));
    CU_DO("naming GPU 0", DeviceGetName(c->gpu, (int)sizeof c->gpu - 1, c->dev));
    CU_DO("opening GPU 0's primary context", DevicePrimaryCtxRetain(&c->ctx, c->dev));
    c->ctx_retained = true;
    CU_DO("making GPU 0's context current", CtxSetCurrent(c->ctx));
    CU_DO("reading the compute capability", DeviceGetAttribute(&c->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev));
    CU_DO("reading the compute capability", DeviceGetAttribute(&c->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev));
    CU_DO("counting multiprocessors", DeviceGetAttribute(&c->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c->dev));
    CU_DO("reading the shared memory limit", DeviceGetAttribute(&c->smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, c->dev));
    CU_DO("creating a stream", StreamCreate(&c->stream, CU_STREAM_NON_BLOCKING));
    CU_DO("creating the copy stream", StreamCreate(&c->copy, CU_STREAM_NON_BLOCKING));
    for (int k = 0; k < 2; k++) CU_DO("creating the input copies' events", EventCreate(&c->staged[k], CU_EVENT_DISABLE_TIMING));
    CU_DO("creating the input copies' events", EventCreate(&c->consumed, CU_EVENT_DISABLE_TIMING));
    CU_DO("creating the step's event", EventCreate(&c->done, CU_EVENT_DISABLE_TIMING));
    return pick_arch(s, c);
}

/* --cuda-explain's lines for the attention ops' generated kernels. */
static void explain_attention(FILE *f, const cuda_session *c)
{
    for (int i = 0; i < c->plan->nkernels; i++) {
        const gkernel *gk = &c->ks[i];
        if (gk->how != RUN_LIBKERNEL || gk->lfn < 0 || tf_op_exec_of(gk->k->lib->op) != TF_OPX_ATTENTION) continue;
        const tf_cuda_jit_fn *fn = &c->jit.fns[gk->lfn];
        char kind[320] = "";
        tf_cuda_attention_kind(gk->k, kind, sizeof kind);
        fprintf(f, "cuda: kernel %s: %s runs as the generated flash-attention kernel%s, %s: grid %u x %u, %u bytes of shared memory",
                gk->k->name, tf_op_info_of(gk->k->lib->op)->name,
                fn->function2 ? "s (dK and dV per key tile, then dQ per query tile)" : "", kind, fn->grid, fn->block, fn->smem);
        if (fn->function2) fprintf(f, "; then grid %u x %u, %u bytes", fn->grid2, fn->block2, fn->smem2);
        fprintf(f, "\n");
    }
}

/* --cuda-explain: what runs where, and why not on the GPU. */
static void explain(tf_session_t *s, const cuda_session *c)
{
    FILE *f = tf_context_diag(s->ctx);
    char dnn[64];
    snprintf(dnn, sizeof dnn, "cuDNN %zu.%zu.%zu", c->libs.cudnn_version / 10000, c->libs.cudnn_version / 100 % 100,
             c->libs.cudnn_version % 100);
    int launches = 0;   /* per step: generated kernels and library calls */
    for (int i = 0; i < c->plan->nkernels; i++) {
        const gkernel *gk = &c->ks[i];
        if (gk->fn >= 0) launches += 1 + (c->jit.fns[gk->fn].function2 != NULL);
        if (gk->lfn >= 0) launches += 1 + (c->jit.fns[gk->lfn].function2 != NULL);
        launches += gk->how == RUN_GEMM ? (int)gk->mm->calls : gk->how == RUN_CONV;
    }
    fprintf(f, "cuda: %s (%s), %d kernels, %d launches a step (generated kernels and library calls); code: %d compiled, "
            "%d from the cache (%.0f ms); GEMMs: %s; convolutions: %s\n", c->gpu, c->arch, tf_kernels_count(c->plan), launches,
            c->jit.compiled, c->jit.cached, c->jit_ms, c->lt.ok ? "cuBLASLt" : c->lt.why, c->dnn.ok ? dnn : c->dnn.why);
    tf_cuda_explain_convs(f, c);
    tf_cuda_explain_gemms(f, c);
    for (int i = 0; i < c->plan->nkernels; i++) {
        const gkernel *gk = &c->ks[i];
        if (gk->parts < 2 || gk->fn < 0) continue;
        fprintf(f, "cuda: kernel %s: one multi-tensor launch of %d update chains (grid %u x %u), with", gk->k->name, gk->parts,
                c->jit.fns[gk->fn].grid, c->jit.fns[gk->fn].block);
        for (int q = 1; q < gk->parts; q++) fprintf(f, "%s %s", q > 1 ? "," : "", gk->k[q].name);
        fprintf(f, "\n");
    }
    for (int i = 0; i < c->plan->nkernels; i++)
        if (c->ks[i].how == RUN_GEMM) fprintf(f, "cuda: kernel %s: cuBLASLt epilogue %s\n", c->ks[i].k->name, c->ks[i].epi);
    explain_attention(f, c);
    for (int i = 0; i < c->plan->nkernels; i++)
        if (c->ks[i].how == RUN_FALLBACK || c->ks[i].how == RUN_LIB_FALLBACK)
            fprintf(f, "cuda: kernel %s runs %son the host: %s\n", c->ks[i].k->name,
                    c->ks[i].how == RUN_LIB_FALLBACK ? "its library op " : "", c->ks[i].why);
    if (c->graph.on) fprintf(f, "cuda: each step runs as one CUDA graph, captured on the first run\n");
    else fprintf(f, "cuda: each step is launched kernel by kernel: %s\n", c->graph.why);
}

static tf_status cuda_create(tf_session_t *s)
{
    static const tf_kernel_plan no_plan;
    cuda_session *c = tf_calloc(1, sizeof *c);
    if (!c) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    s->impl = c;
    c->plan = &no_plan;
    c->emu = s->be == &tf_backend_cuda_emu;
    c->search.mode = c->emu ? TF_CUDA_SEARCH_EMU : TF_CUDA_SEARCH_ENV;
    c->rt[0] = s->seed;
    c->tf32 = !s->p->settings.no_tf32;
    c->sync_each = s->p->settings.cuda_sync;
    c->fallback_all = s->p->settings.cuda_fallback_all;
    tf_status st = open_device(s, c);
    if (!st) st = tf_program_plan(s->ctx, s->p, &c->plan);
    if (!st) tf_cuda_open_cublaslt(c);
    if (!st) tf_cuda_open_cudnn(c);
    if (!st) st = tf_cuda_allocate(s, c);   /* before anything slow: out of memory is said at once */
    if (!st) st = tf_cuda_initial_state(s, c);
    if (!st) st = tf_cuda_fill_pools(s, c);
    long hits0 = 0, compiled0 = 0, hits1 = 0, compiled1 = 0;
    if (c->emu) tf_cuda_emu_cache_counts(&hits0, &compiled0);   /* cuda-emu compiles at the synchronization below */
    if (!st) st = tf_cuda_build_kernels(s, c);
    if (!st) {
        tf_cu_result r = c->libs.cu.StreamSynchronize(c->stream);
        if (tf_cuda_check(&c->libs, r, "cuStreamSynchronize", __FILE__, __LINE__, c->err, sizeof c->err))
            st = cu_fail(s, c, r, "starting the session");
    }
    if (c->emu) {
        tf_cuda_emu_cache_counts(&hits1, &compiled1);
        c->emu_hits = (int)(hits1 - hits0);
        c->emu_compiled = (int)(compiled1 - compiled0);
    }
    if (st) {
        cuda_free(s);
        return st;
    }
    tf_cuda_plan_steps(s, c);
    if (s->p->settings.cuda_explain) explain(s, c);
    return TF_OK;
}

/* ---- profiles and facts ------------------------------------------------------------------- */

static void cuda_set_profiling(tf_session_t *s, bool on)
{
    cuda_session *c = s->impl;
    c->profile = on;
    for (int i = 0; i < c->plan->nkernels; i++) c->ks[i].ms = 0, c->ks[i].calls = 0;
}

static size_t cuda_profile_count(tf_session_t *s) { return (size_t)((cuda_session *)s->impl)->plan->nkernels; }

static void cuda_profile_get(tf_session_t *s, size_t i, tf_kernel_profile *out)
{
    cuda_session *c = s->impl;
    const gkernel *gk = &c->ks[i];
    out->name = gk->k->name;
    out->how = gk->label ? gk->label : how_name(gk->how);
    out->total_ms = gk->ms;
    out->calls = gk->calls;
    out->elements = gk->work;
    /* a multi-tensor launch moves its parts' bytes; a part, or a kernel whose work a GEMM's epilogue does, none of its own */
    out->bytes = 0;
    if (gk->how != RUN_IN_MULTI && gk->how != RUN_NOTHING)
        for (int q = 0; q < (gk->parts > 1 ? gk->parts : 1); q++) out->bytes += tf_kernel_bytes(&gk->k[q]);
}

/* tf_session_copy_bandwidth: a device-to-device copy on the session's
 * stream, timed with events: 256 MiB (five times the H100's L2, so the
 * copy streams from memory), 64 or 16 when the device has no room for
 * two of those beside the session; one untimed, then the median of seven. */
static tf_status cuda_copy_bandwidth(tf_session_t *s, double *gbps)
{
    cuda_session *c = s->impl;
    const tf_cu_api *cu = &c->libs.cu;
    enum { TIMED = 7 };
    tf_cu_deviceptr a = 0, b = 0;
    tf_cu_event ev[2] = {0, 0};
    float f = 0;
    double ms[TIMED];
    size_t bytes = (size_t)256 << 20;
    tf_cu_result r = cu->CtxSetCurrent(c->ctx);
    const char *what = "making the session's context current";
    for (; !r && bytes >= (size_t)16 << 20; bytes /= 4) {
        if (!(r = cu->MemAlloc(&a, bytes)) && !(r = cu->MemAlloc(&b, bytes))) break;
        if (a) cu->MemFree(a);
        a = 0;
        if (r != CUDA_ERROR_OUT_OF_MEMORY || bytes == (size_t)16 << 20) break;
        r = 0;
    }
    if (r) what = "allocating two blocks to copy between";
    if (!r && (r = cu->MemsetD8Async(a, 1, bytes, c->stream))) what = "filling the block to copy";
    for (int i = 0; i < 2 && !r; i++)
        if ((r = cu->EventCreate(&ev[i], CU_EVENT_DEFAULT))) what = "creating the timing events";
    for (int t = -1; t < TIMED && !r; t++) {
        what = "timing the copy";
        if (!(r = cu->EventRecord(ev[0], c->stream)) && !(r = cu->MemcpyDtoDAsync(b, a, bytes, c->stream)) &&
            !(r = cu->EventRecord(ev[1], c->stream)) && !(r = cu->EventSynchronize(ev[1])) && t >= 0 &&
            !(r = cu->EventElapsedTime(&f, ev[0], ev[1])))
            ms[t] = f;
    }
    tf_status st = TF_OK;
    if (r) {
        tf_cuda_check(&c->libs, r, "copy bandwidth", __FILE__, __LINE__, c->err, sizeof c->err);
        st = cu_fail(s, c, r, what);
    }
    for (int i = 0; i < 2; i++)
        if (ev[i]) cu->EventDestroy(ev[i]);
    if (a) cu->MemFree(a);
    if (b) cu->MemFree(b);
    if (st) return st;
    double mid = tf_median(ms, TIMED);
    if (!(mid > 0)) return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: cuda: a %zu MiB copy took no measurable time", bytes >> 20);
    *gbps = 2.0 * (double)bytes / (mid * 1e6);
    return TF_OK;
}

static void cuda_info(tf_session_t *s, tf_session_info *out)
{
    cuda_session *c = s->impl;
    out->threads = 1;
    out->kernels = tf_kernels_count(c->plan);
    out->jit_compiled = c->jit.compiled;
    out->jit_cached = c->jit.cached;
    out->jit_package = c->jit.packaged;
    out->disk_hits = c->emu ? c->emu_hits : c->jit.cached;
    out->disk_misses = c->emu ? c->emu_compiled : c->jit.compiled;
    out->jit_ms = c->jit_ms;
    out->fallbacks = 0;
    for (int i = 0; i < c->plan->nkernels; i++) out->fallbacks += c->ks[i].how == RUN_FALLBACK || c->ks[i].how == RUN_LIB_FALLBACK;
    out->library = c->lt.ok && c->dnn.ok ? "cuBLASLt + cuDNN" : c->lt.ok ? "cuBLASLt" : c->dnn.ok ? "cuDNN" : "none";
    out->step_graph = c->graph.on ? "graph" : c->graph.why;
    out->graph_replays = c->graph.replays;
    out->arena_bytes = (int64_t)c->arena_bytes;
    out->device_bytes = (int64_t)c->dev_bytes;
}

/* `tfuse doctor`'s CUDA lines: every library the cuda target would load,
 * found where or missing why, and the GPUs if a driver and a device are
 * there. */
static void cuda_doctor(tf_strbuf *sb)
{
    size_t cap = 8192;
    char *out = tf_malloc(cap), err[2048];
    if (!out) {
        tf_strbuf_printf(sb, "cuda: out of memory describing it\n");
        return;
    }
    tf_cuda_libs libs;
    tf_cuda_libs_load(&libs, TF_CUDA_LIB_NVRTC | TF_CUDA_LIB_DRIVER | TF_CUDA_LIB_CUBLASLT | TF_CUDA_LIB_CUDNN | TF_CUDA_LIB_NCCL, NULL,
                      err, sizeof err);
    int at = tf_cuda_libs_describe(&libs, out, cap);
    if (at < 0 || (size_t)at >= cap) at = (int)strlen(out);
    tf_strbuf_printf(sb, "%s", out);
    tf_free(out);
    int ndev = 0;
    if ((libs.loaded & TF_CUDA_LIB_DRIVER) && !tf_cuda_driver_init(&libs, &ndev, err, sizeof err)) {
        for (int i = 0; i < ndev; i++) {
            tf_cu_device dev;
            char name[256] = "?";
            int major = 0, minor = 0;
            if (libs.cu.DeviceGet(&dev, i)) continue;
            libs.cu.DeviceGetName(name, sizeof name, dev);
            libs.cu.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
            libs.cu.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
            tf_strbuf_printf(sb, "gpu %d: %s (sm_%d%d)\n", i, name, major, minor);
        }
    } else if (libs.loaded & TF_CUDA_LIB_DRIVER) {
        tf_strbuf_printf(sb, "gpu: none usable: %s\n", err);
    } else {
        tf_strbuf_printf(sb, "gpu: none (no driver)\n");
    }
    tf_cuda_libs_free(&libs);
}

/* compile -o DIR --target=cuda: every kernel's CUDA C and cubin for arch
 * (default sm_90), and the launch manifest (artifact.c); no GPU needed. */
static tf_status cuda_write_artifact(tf_context_t *ctx, const tf_program_t *p, const char *dir, const char *arch,
                                     tf_artifact_info *info)
{
    const tf_kernel_plan *plan;
    tf_status st = tf_program_plan(ctx, p, &plan);
    if (st) return st;
    char err[4096];
    int rc = tf_cuda_write_artifact(p->m, plan, arch ? arch : "sm_90", dir, &info->binaries, &info->kernels, &info->compiled,
                                    &info->cached, err, sizeof err);
    return rc ? tf_set_error(ctx, TF_ERR_UNAVAILABLE, "%s", err) : TF_OK;
}

/* A package's cuda code: cubins for each of archs (default sm_90), no GPU needed. */
static tf_status cuda_package_code(tf_context_t *ctx, const tf_program_t *p, const char *archs, tf_pkg *pkg, int *nobjects,
                                   int *cached)
{
    const tf_kernel_plan *plan;
    tf_status st = tf_program_plan(ctx, p, &plan);
    if (st) return st;
    char err[4096];
    int compiled = 0;
    int rc = tf_cuda_package_cubins(plan, archs && *archs ? archs : "sm_90", pkg, nobjects, &compiled, cached, err, sizeof err);
    return rc ? tf_set_error(ctx, TF_ERR_UNAVAILABLE, "%s", err) : TF_OK;
}

static tf_status cuda_package_check(tf_context_t *ctx, const tf_pkg *pkg, const char *path)
{
    if (!tf_pkg_find(pkg, "cuda/archs"))
        return tf_set_error(ctx, TF_ERR_FORMAT, "%s: error: the package has no cuda code (no section cuda/archs)", path);
    return TF_OK;
}

static const char *cuda_op_support(tf_op op, char *detail, size_t n)
{
    const char *name = tf_op_info_of(op)->name;
    bool library;
    const char *how = tf_op_support_plan(op, tf_cuda_supports, "an alias of its operand's device memory",
                                         "CUDA C compiled by NVRTC into its kernel (fused with its neighbours)",
                                         "on the host, the interpreter's kernel", detail, n, &library);
    if (!library) return how;
    if (tf_op_exec_of(op) == TF_OPX_GEMM) {
        snprintf(detail, n, "cuBLASLt (when it loads; else the interpreter's kernel on the host)");
        return "library";
    }
    if (is_conv(op)) {
        snprintf(detail, n, "cuDNN, the algorithm cudnnFind picks, cached on disk (when cuDNN loads and has an algorithm for the "
                 "shape and type; else the interpreter's kernel on the host)");
        return "library";
    }
    tf_op_exec ex = tf_op_exec_of(op);
    if (ex == TF_OPX_ATTENTION) {
        snprintf(detail, n, "the generated flash-attention kernel%s (CUDA C compiled by NVRTC): tiles of queries and keys in shared "
                 "memory, an online softmax in fp32 (fp64 for f64), no [Tq, Tk] tensor, deterministic (no atomics); on tensor cores "
                 "for f16/bf16 with head dims that are multiples of 16 (to 128 forward, 64 backward), else scalar; head dims up to "
                 "256 (else the interpreter's kernel on the host)",
                 op == TF_OP_FLASH_ATTENTION_GRAD ? "s (dK and dV a block per key tile, then dQ a block per query tile)" : "");
        return "jit";
    }
    if (tf_exec_own_kernel(ex)) {
        snprintf(detail, n, "its own CUDA C kernel, generated for the op (not fused) and compiled by NVRTC%s",
                 ex == TF_OPX_SCATTER ? "; f32 and f64 add with atomicAdd, not bit-deterministic" : "");
        return "jit";
    }
    snprintf(detail, n, "%s has no GPU implementation in this build: the interpreter's kernel runs it on the host", name);
    return "fallback";
}

/* What the cuda and cuda-emu targets share: all but how they start and what
 * doctor says (cuda-emu writes no cubin artifact: compile -o for it is the IR). */
#define CUDA_SESSION_OPS                                                                     \
    .session_create = cuda_create, .session_free = cuda_free, .run = tf_cuda_run, .wait = tf_cuda_wait, .output_fetch = tf_cuda_output_fetch, \
    .state_read = cuda_state_read, .state_write = cuda_state_write, .step_get = cuda_step_get, \
    .step_set = cuda_step_set, .dropout_seed_set = cuda_dropout_seed_set, .set_profiling = cuda_set_profiling, \
    .profile_count = cuda_profile_count, .profile_get = cuda_profile_get, .info = cuda_info, \
    .copy_bandwidth = cuda_copy_bandwidth, \
    .op_support = cuda_op_support

const tf_backend tf_backend_cuda = {
    .name = "cuda",
    .unavailable = cuda_unavailable,
    .doctor = cuda_doctor,
    .write_artifact = cuda_write_artifact,
    .package_code = cuda_package_code,
    .package_check = cuda_package_check,
    CUDA_SESSION_OPS,
};

/* cuda-emu: the same session code over emu.h's stand-ins. */
const tf_backend tf_backend_cuda_emu = {
    .name = "cuda-emu",
    .unavailable = tf_cuda_emu_unavailable,
    .doctor = tf_cuda_emu_describe,
    CUDA_SESSION_OPS,
};
