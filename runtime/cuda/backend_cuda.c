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
 *   - runs a step asynchronously: cuda_run copies {seed, step} and the
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
 *     an event; cuda_wait (tf_backend.wait, called by api.c before anything
 *     reads results) waits for it, copies the outputs out and reports a
 *     failure of the GPU, which is the session's error from then on;
 *   - captures that step (from the inputs in place on) as one CUDA graph on its first run and replays it
 *     after (no host work inside a step: constants it writes are copies
 *     from device buffers filled when the session starts), unless a kernel
 *     runs on the host, --cuda-sync or --cuda-graphs=off, or profiling
 *     (per-kernel events) asks for launches one by one.
 *
 * The `cuda-emu` target is this file over emu.h's stand-ins for the driver,
 * NVRTC, cuBLASLt and cuDNN: the same code, every kernel run on the host.
 *
 * Library ops other than matmul and the convolutions (pooling and its
 * gradients, gather, scatter_add, concat, slice_grad) run their own
 * generated kernel (tf_cuda_emit_library, its own function and launch
 * parameters), then the region's epilogue if there is one; scatter_add in
 * f32/f64 into a result zeroed first. Their ids are guarded: a kernel that
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
 * algorithm cache (default ~/.cache/tfuse). */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "artifact.h"
#include "blas.h"
#include "cuda_jit.h"
#include "emu.h"
#include "dnn.h"
#include "interp.h"
#include "kernel.h"
#include "runtime.h"

/* CUDA enumeration values used here (cuda.h, CUDA 13). */
enum {
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    CU_STREAM_NON_BLOCKING = 1,
    CU_EVENT_DEFAULT = 0,
    CU_EVENT_DISABLE_TIMING = 2,
    CUDA_ERROR_NOT_READY = 600,
};

enum { ALIGN = 256 };                                   /* every block of device memory starts on this */
static const size_t GEMM_WORKSPACE = (size_t)32 << 20;  /* cuBLASLt's workspace: 32 MiB, what Hopper's kernels ask for */
static const size_t CONV_WORKSPACE = (size_t)256 << 20; /* the most a cuDNN algorithm may use (and Find*Ex may try) */

/* snprintf("%s") without the truncation warnings: messages are cut on purpose. */
static void set_text(char *dst, size_t n, const char *src)
{
    size_t len = strlen(src);
    if (len >= n) len = n - 1;
    memcpy(dst, src, len);
    dst[len] = 0;
}

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

/* ---- session state ---------------------------------------------------------- */

typedef enum how {
    RUN_JIT,            /* a generated kernel */
    RUN_VIEW,           /* a reshape: nothing, or a copy when storage differs */
    RUN_GEMM,           /* cuBLASLt, then the region's epilogue if any */
    RUN_LIBKERNEL,      /* the library op's generated kernel, then the region's epilogue if any */
    RUN_LIB_FALLBACK,   /* the library op on the host, its epilogue on the GPU */
    RUN_FALLBACK,       /* the whole kernel on the host */
    RUN_NOTHING,
    RUN_CONV,           /* cuDNN (conv2d and its gradients), then the region's epilogue if any */
    RUN_IN_MULTI,       /* a part of an earlier kernel's multi-tensor launch: runs in it */
} how;
static const char *const how_names[] = {"jit", "view", "gemm", "library", "fallback", "fallback", "-", "conv", "multi"};

typedef struct gemm_call {
    tf_gemm g;
    const tf_node *n;           /* the matmul it computes (a kernel's own, or one moved to a later kernel's place) */
    tf_cu_deviceptr own;        /* device memory it owns: the ReLU mask a RELU_AUX_BIAS plan writes (0: none) */
    tf_cu_deviceptr d;          /* where the product goes: the matmul's result, or a value its epilogue stores */
    int64_t calls;              /* 1, or one per batch index when the batch axes do not stride evenly */
    int64_t *off_a, *off_b;     /* per call: element offsets into A and B (NULL when calls == 1) */
    int64_t step_c;             /* elements between consecutive calls' results */
    size_t esz_ab, esz_c;       /* bytes per element */
} gemm_call;

typedef struct gkernel {
    const tf_kernel *k;
    how how;
    int fn;                     /* the generated code (whole kernel or epilogue) in the jit's table; -1: none */
    tf_cu_deviceptr *dptr;      /* per kernel->bufs entry, then {seed, step} when the code draws dropout masks */
    void **args;                /* &dptr[i]: cuLaunchKernel's parameters */
    gemm_call *mm;              /* RUN_GEMM */
    tf_kernel *rest;            /* RUN_GEMM with a cuBLASLt epilogue: what the epilogue kernel still does (NULL: nothing) */
    tf_cu_deviceptr scratch;    /* the generated code's scratch (a split reduction's), 0: none */
    char epi[800];              /* RUN_GEMM: the epilogue cuBLASLt applies, or why none (--cuda-explain) */
    char epi_note[620];         /* why the backward epilogues (BGRAD, DRELU) were not used, when they were looked for */
    bool preplanned;            /* plan_backward decided how it runs: a GEMM with a backward epilogue, or a kernel
                                 * whose work such a GEMM does (RUN_NOTHING, or RUN_GEMM moved to its place) */
    bool no_code;               /* preplanned GEMM: its region needs no epilogue kernel */
    char lab[48];               /* a preplanned kernel's label in profiles ("in GEMM: BGRADA", "GEMM moved: DRELU_BGRAD") */
    tf_conv *conv;              /* RUN_CONV */
    int lfn;                    /* RUN_LIBKERNEL: the library op's own kernel in the jit's table; -1: none */
    tf_cu_deviceptr *ldptr;     /* its parameters: the op's result, its operands that are not constants, */
    void **largs;               /* then its error word (tf_cuda_emit_library's order) */
    size_t lclear;              /* bytes of the result to zero before each launch (atomicAdd into it), 0: none */
    int err_slot;               /* a library kernel's error word in c->err_dev, -1: none */
    bool err_read;              /* the word is read after the kernels: the API did not check the ids */
    const char *label;          /* RUN_LIBKERNEL: what runs it, in profiles (pool, gather, ...) */
    char why[480];              /* RUN_*FALLBACK: why the GPU does not run it */
    int parts;                  /* > 1: its code is a multi-tensor launch of this kernel and the next parts - 1 */
    int64_t work;               /* elements of the index space */
    double ms;                  /* profile: total, over `calls` runs */
    int64_t calls;
} gkernel;

typedef struct cuda_session {
    bool emu;                   /* cuda-emu: the libraries are emu.h's stand-ins */
    tf_cuda_search search;      /* where the libraries come from */
    tf_cuda_libs libs;
    char err[2048];             /* the last failed CUDA call's words (TF_CU_CALL) */
    tf_cu_device dev;
    tf_cu_context ctx;          /* the device's primary context, retained */
    bool ctx_retained;
    tf_cu_stream stream;
    char gpu[128], arch[16];
    int cc_major, cc_minor, sms, smem_optin;
    const tf_kernel_plan *plan;   /* the program's (s->p->plan) */
    gkernel *ks;
    tf_cuda_jit jit;            /* compiled code: modules and functions */
    int relu_probe;             /* cuBLASLt's ReLU mask against blas.h's reading: 0 not probed, 1 the same, -1 not */
    char relu_probe_why[400];
    /* device memory: two allocations */
    tf_cu_deviceptr arena, state;
    size_t arena_bytes, state_bytes;
    size_t dev_bytes;           /* device memory the session's own allocations hold (tf_session_info.device_bytes;
                                 * dev_count at each allocation and release) */
    tf_cu_deviceptr *ptr;       /* per value id: its storage (0: none; reshapes go through root_of) */
    tf_cu_deviceptr *stage;     /* per update: where its new value waits (0: read in place) */
    tf_cu_deviceptr rt_dev, ws_dev;
    size_t ws_bytes;
    tf_cu_deviceptr err_dev;    /* one 8-byte error word per library kernel (ids out of range), after {seed, step} */
    int nerr;                   /* library kernels: error words */
    bool err_read;              /* some kernel's word is read back after the kernels of a step */
    int ids_check_at;           /* err_read: the kernel before which the words are read: the first that
                                 * writes a param or buffer in place (memplan's home), else nkernels */
    /* host memory */
    unsigned char *pinned;      /* the error words, two input slots, then outputs */
    size_t pinned_bytes, *in_at, *out_at;   /* in_at: an input's offset in a slot (and in in_dev) */
    /* asynchronous steps: cuda_run returns once the step is enqueued; cuda_wait waits for it.
     * A slot holds {seed, step} then the inputs; the copy stream copies it into in_dev, the
     * compute stream moves in_dev's contents into place at the start of the step. */
    size_t slot_at[2], slot_bytes;
    int slot;                   /* the slot the next run fills */
    tf_cu_deviceptr in_dev;     /* the device's copy of one slot */
    tf_cu_stream copy;          /* the inputs' host-to-device copies */
    tf_cu_event staged[2];      /* per slot: its copy into in_dev is done (the slot may be refilled) */
    tf_cu_event consumed;       /* the last step moved in_dev's contents into place (in_dev may be overwritten) */
    tf_cu_event done;           /* the last step's end: its outputs are in pinned memory */
    bool staged_rec[2], consumed_rec;
    bool pending;               /* a step was enqueued and not yet waited for */
    bool pending_profile;       /* ... with per-kernel events to read */
    tf_status failed;           /* a step failed on the GPU: every later call says so (0: none) */
    char failed_msg[2600];
    unsigned char *host;        /* fallback kernels' transfers, grown on demand */
    size_t nhost;
    tf_interp_ctx *ip;          /* initial state, and the fallback kernels' tensors */
    uint64_t rt[2];             /* seed, step */
    /* cuBLASLt */
    tf_cublaslt_handle lt;
    bool lt_ok;
    char lt_why[1200];
    /* constants written inside a step (a reshape of a number, an update to one): their bytes wait in
     * device memory, filled when the session starts, so that writing them is a device copy */
    tf_cu_deviceptr *kpool;     /* per kernel: the filled constant of a RUN_VIEW of a number, 0: none */
    tf_cu_deviceptr *upool;     /* per update: the filled constant it writes, 0: none */
    /* CUDA graphs: the step captured on its first run, replayed after */
    bool graphs;
    char graph_why[240];        /* why the step runs kernel by kernel, when it does */
    tf_cu_graph graph;
    tf_cu_graph_exec gexec;
    int64_t replays;
    /* cuDNN */
    tf_cudnn_handle dnn;
    bool dnn_ok;
    char dnn_why[1200];
    tf_cu_deviceptr dnn_ws, dnn_ws_own;   /* the convolutions' workspace: cuBLASLt's, or its own block */
    size_t dnn_ws_bytes;
    tf_cu_deviceptr find_ws;    /* cudnnFind*Ex's scratch while the session starts */
    size_t find_ws_bytes, conv_ws_limit;
    bool conv_ws_limited;
    /* behaviour */
    bool tf32, sync_each, fallback_all;
    bool profile;
    tf_cu_event *ev;            /* two per kernel while profiling */
    double jit_ms;
    int emu_hits, emu_compiled;   /* cuda-emu: host objects its start found in the disk cache, and compiled */
} cuda_session;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static size_t value_bytes(const tf_value *v) { return (size_t)tf_type_numel(&v->type) * (size_t)tf_dtype_bytes(v->type.dtype); }
static int64_t numel(const tf_value *v) { return tf_type_numel(&v->type); }
static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* The value whose storage v uses: through views (ops.c). */
static const tf_value *root_of(const tf_value *v) { return tf_value_storage(v); }

static tf_cu_deviceptr dev_of(const cuda_session *c, const tf_value *v) { return v->kind == TF_VAL_CONST ? 0 : c->ptr[root_of(v)->id]; }

/* An allocation of the session (bytes > 0) or its release (< 0). */
static void dev_count(cuda_session *c, int64_t bytes) { c->dev_bytes = (size_t)((int64_t)c->dev_bytes + bytes); }

/* A failed CUDA call (c->err holds its words) as the session's error. */
static tf_status cu_fail(tf_session_t *s, cuda_session *c, tf_cu_result r, const char *what)
{
    tf_status st = r == CUDA_ERROR_OUT_OF_MEMORY ? TF_ERR_OOM : TF_ERR_RUNTIME;
    return tf_set_error(s->ctx, st, "error: cuda: %s%s%s", what ? what : "", what ? ": " : "", c->err);
}

/* Run a driver call; on failure return the session's error from the caller. */
#define CU_DO(what, call)                                                                   \
    do {                                                                                    \
        tf_cu_result r_ = c->libs.cu.call;                                                  \
        if (tf_cuda_check(&c->libs, r_, "cu" #call, __FILE__, __LINE__, c->err, sizeof c->err)) \
            return cu_fail(s, c, r_, (what));                                               \
    } while (0)

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
    if (!c->in_at || !c->out_at) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
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
        c->out_at[i] = at;
        at += (value_bytes(m->outputs[i].value) + 63) / 64 * 64;
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

/* ---- initial state ------------------------------------------------------------- */

/* The interpreter's initializers with the session's seed, in storage dtype. */
static tf_status initial_state(tf_session_t *s, cuda_session *c)
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
static tf_status fill_pools(tf_session_t *s, cuda_session *c)
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

/* ---- matmul through cuBLASLt ---------------------------------------------------- */

static bool gemm_type(tf_dt t, tf_gemm_type *out)
{
    if (t == TF_DT_F32) *out = TF_GEMM_F32;
    else if (t == TF_DT_F16) *out = TF_GEMM_F16;
    else if (t == TF_DT_BF16) *out = TF_GEMM_BF16;
    else return false;
    return true;
}

static void gemm_call_free(cuda_session *c, gemm_call *mm)
{
    if (!mm) return;
    tf_gemm_free(&c->libs, &mm->g);
    if (mm->own) c->libs.cu.MemFree(mm->own);
    tf_free(mm->off_a);
    tf_free(mm->off_b);
    tf_free(mm);
}

/* ---- cuBLASLt epilogues ---------------------------------------------------------------- */

/* What a GEMM region's epilogue hands to cuBLASLt: a bias added along the
 * product's rows, and a ReLU after it, when the region computes exactly
 * that (the bias in the product's dtype, broadcast along every axis but the
 * last). The GEMM then writes the biased (and rectified) product straight
 * into the value the region stores it as, where that value overlaps no
 * other buffer of the kernel; what else the region computes from it stays
 * in the epilogue kernel, reading that value. cuBLASLt adds the bias before
 * rounding the product to a 16-bit type once, where the region rounds the
 * product and then the sum: a half-ulp apart at most. GELU is never handed
 * over: cuBLASLt's is the tanh approximation, tfuse's gelu is erf's. */
typedef struct epi_plan {
    tf_gemm_epilogue kind;
    int bias_buf, d_buf;        /* kernel buffers: the bias, and where the product goes */
    tf_kernel *rest;            /* the epilogue kernel left (NULL: none), owning exprs and stores */
    bool gelu;                  /* the rest applies a gelu to the biased product (which cuBLASLt's GELU is not) */
    /* plan_backward's: device addresses, in place of the buffers (0: the buffers') */
    tf_cu_deviceptr bias_dev, d_dev, aux_dev;
} epi_plan;

static int buf_index(const tf_kernel *k, const tf_value *v)
{
    for (int b = 0; b < k->nbufs; b++)
        if (k->bufs[b].value == v) return b;
    return -1;
}

static bool row_major_load(const tf_kernel *k, const tf_kexpr *x, int buf)
{
    if (x->kind != TF_KX_LOAD || x->buf != buf || x->offset) return false;
    int64_t s = 1;
    for (int a = k->rank - 1; a >= 0; a--) {
        if (k->dims[a] > 1 && x->strides[a] != s) return false;
        s *= k->dims[a];
    }
    return true;
}

/* A bias: the last axis at stride 1, every other at 0, a vector of that length. */
static bool bias_load(const tf_kernel *k, const tf_kexpr *x)
{
    if (x->kind != TF_KX_LOAD || x->offset || k->rank < 1 || k->bufs[x->buf].written) return false;
    for (int a = 0; a < k->rank - 1; a++)
        if (k->dims[a] > 1 && x->strides[a]) return false;
    int64_t n = k->dims[k->rank - 1];
    return (n == 1 || x->strides[k->rank - 1] == 1) && tf_type_numel(&k->bufs[x->buf].value->type) == n;
}

static void epi_free(tf_kernel *rest)
{
    if (!rest) return;
    tf_free(rest->exprs);
    tf_free(rest->stores);
    tf_free(rest);
}

/* The kernel applies a gelu (erf's: x/2 (1 + erf(x / sqrt 2)), as the op
 * lowers) to expression x, or to anything when x < 0. */
static bool has_gelu(const tf_kernel *k, int x)
{
    for (int i = 0; i < k->nexprs; i++) {
        const tf_kexpr *e = &k->exprs[i];
        if (e->kind == TF_KX_OP && e->op == TF_OP_GELU && (x < 0 || e->args[0] == x)) return true;
        if (e->kind != TF_KX_OP || e->op != TF_OP_ERF) continue;
        const tf_kexpr *m = &k->exprs[e->args[0]];
        if (m->kind != TF_KX_OP || m->op != TF_OP_MUL || m->nargs != 2) continue;
        for (int q = 0; q < 2; q++)
            if ((x < 0 || m->args[q] == x) && k->exprs[m->args[1 - q]].kind == TF_KX_CONST &&
                fabs(k->exprs[m->args[1 - q]].value - 0.70710678118654752) < 1e-6)
                return true;
    }
    return false;
}

/* false (with why) when the region is not a bias add (and ReLU) cuBLASLt can do. */
static bool plan_epilogue(const tf_kernel *k, epi_plan *e, bool *oom, char *why, size_t n)
{
    memset(e, 0, sizeof *e);
    *oom = false;
    const tf_value *out = k->lib->out;
    tf_dt dt = out->type.dtype;
    int ob = buf_index(k, out);
    if (!k->nexprs || !k->nstores) return snprintf(why, n, "the region has no epilogue"), false;
    if (k->nreds || ob < 0 || (dt != TF_DT_F32 && dt != TF_DT_F16 && dt != TF_DT_BF16))
        return snprintf(why, n, "the epilogue is not a bias add"), false;
    int add = -1;
    for (int i = 0; i < k->nexprs && add < 0; i++) {
        const tf_kexpr *x = &k->exprs[i];
        if (x->kind != TF_KX_OP || x->op != TF_OP_ADD || x->nargs != 2 || x->dtype != dt) continue;
        for (int q = 0; q < 2 && add < 0; q++) {
            const tf_kexpr *p = &k->exprs[x->args[q]], *b = &k->exprs[x->args[1 - q]];
            if (row_major_load(k, p, ob) && bias_load(k, b) && k->bufs[b->buf].value->type.dtype == dt && b->buf != ob) {
                add = i;
                e->bias_buf = b->buf;
            }
        }
    }
    if (add < 0) return snprintf(why, n, "the epilogue has no bias add along the product's rows"), false;
    /* the product is read by the bias add alone */
    for (int i = 0; i < k->nexprs; i++) {
        const tf_kexpr *x = &k->exprs[i];
        bool prod = x->kind == TF_KX_LOAD && x->buf == ob;
        for (int q = 0; prod && q < k->nexprs; q++)
            for (int a = 0; a < k->exprs[q].nargs && a < 3; a++)
                if (k->exprs[q].args[a] == i && q != add) return snprintf(why, n, "the epilogue reads the product apart from its bias add"), false;
        for (int s = 0; prod && s < k->nstores; s++)
            if (k->stores[s].expr == i) return snprintf(why, n, "the epilogue stores the product itself"), false;
    }
    int relu = -1, users = 0;
    e->gelu = has_gelu(k, add);
    for (int i = 0; i < k->nexprs; i++)
        for (int a = 0; a < k->exprs[i].nargs && a < 3; a++)
            if (k->exprs[i].args[a] == add) {
                users++;
                if (k->exprs[i].kind == TF_KX_OP && k->exprs[i].op == TF_OP_RELU && k->exprs[i].dtype == dt) relu = i;
            }
    /* a value the GEMM can write: the region's store of `expr`, of the product's dtype and size, overlapping nothing */
    int d_store = -1, act_store = -1;
    for (int s = 0; s < k->nstores; s++) {
        const tf_kbuf *b = &k->bufs[k->stores[s].buf];
        bool fits = b->disjoint && b->value->type.dtype == dt && tf_type_numel(&b->value->type) == tf_type_numel(&out->type) &&
                    !k->stores[s].reduced_domain;
        if (fits && k->stores[s].expr == add && d_store < 0) d_store = s;
        if (fits && relu >= 0 && k->stores[s].expr == relu) act_store = s;
    }
    e->d_buf = ob;
    if (k->nstores == 1 && act_store == 0 && users == 1) {   /* relu(x @ w + b) alone: nothing left to do */
        e->kind = TF_GEMM_EPI_RELU_BIAS;
        e->d_buf = k->stores[0].buf;
        return true;
    }
    e->kind = TF_GEMM_EPI_BIAS;
    if (k->nstores == 1 && d_store == 0 && !users) {   /* x @ w + b alone */
        e->d_buf = k->stores[0].buf;
        return true;
    }
    /* the rest stays: the bias add becomes a load of what the GEMM wrote */
    tf_kernel *r = tf_calloc(1, sizeof *r);
    if (r) *r = *k;
    if (!r || !(r->exprs = tf_malloc((size_t)k->nexprs * sizeof *r->exprs)) ||
        !(r->stores = tf_malloc((size_t)k->nstores * sizeof *r->stores))) {
        if (r) tf_free(r->exprs);
        tf_free(r);
        *oom = true;
        return false;
    }
    memcpy(r->exprs, k->exprs, (size_t)k->nexprs * sizeof *r->exprs);
    r->nstores = 0;
    if (d_store >= 0) e->d_buf = k->stores[d_store].buf;
    for (int s = 0; s < k->nstores; s++)
        if (s != d_store) r->stores[r->nstores++] = k->stores[s];
    tf_kexpr *x = &r->exprs[add];
    const tf_node *node = x->node;
    memset(x, 0, sizeof *x);
    x->kind = TF_KX_LOAD;
    x->dtype = dt;
    x->buf = e->d_buf;
    x->node = node;
    int64_t st = 1;
    for (int a = k->rank - 1; a >= 0; a--) {
        x->strides[a] = k->dims[a] > 1 ? st : 0;
        st *= k->dims[a];
    }
    if (!r->nstores) {   /* never: a region stores something */
        epi_free(r);
        r = NULL;
    }
    e->rest = r;
    return true;
}

/* What tf_gemm_plan needs to time the candidates of an uncached problem:
 * the session's stream, its workspace and the GEMM's own buffers (the first
 * call's, when it takes several). Nothing has run yet, so the product it
 * overwrites holds nothing. On cuda-emu, one warm-up and one timed run: the
 * host's times say nothing about a GPU, and every run is a full host GEMM. */
static void gemm_timing(const cuda_session *c, tf_gemm_desc *d, tf_cu_deviceptr a, tf_cu_deviceptr b, tf_cu_deviceptr out)
{
    d->gpu = c->gpu;
    d->stream = c->stream;
    d->dev_a = a, d->dev_b = b, d->dev_c = out;
    d->dev_ws = c->ws_dev;
    if (c->emu) d->warmup = d->runs = 1;
}

/* Plan kernel gk's matmul; false with the reason in gk->why when cuBLASLt
 * cannot take it (the host then runs it). */
static bool gemm_setup(cuda_session *c, gkernel *gk, const epi_plan *ep, bool *oom_out)
{
    const tf_node *n = gk->k->lib;
    const tf_value *av = n->in[0], *bv = n->in[1], *ov = n->out;
    tf_gemm_desc d = {0};
    *oom_out = false;
    if (!c->lt_ok) {
        set_text(gk->why, sizeof gk->why, c->lt_why);
        return false;
    }
    if (av->kind == TF_VAL_CONST || bv->kind == TF_VAL_CONST || av->type.dtype != bv->type.dtype || !gemm_type(av->type.dtype, &d.ab) ||
        !gemm_type(ov->type.dtype, &d.c) || (d.c != d.ab && d.c != TF_GEMM_F32)) {
        snprintf(gk->why, sizeof gk->why, "matmul of %s x %s -> %s: cuBLASLt is used for f32, f16 and bf16 operands of one type",
                 tf_dtype_name(av->type.dtype), tf_dtype_name(bv->type.dtype), tf_dtype_name(ov->type.dtype));
        return false;
    }
    d.ta = tf_node_bool(n, "transpose_a");
    d.tb = tf_node_bool(n, "transpose_b");
    int ra = av->type.rank - 2, rb = bv->type.rank - 2, r = ov->type.rank - 2;
    if (ra < 0 || rb < 0 || r < 0) {
        snprintf(gk->why, sizeof gk->why, "matmul of a rank below 2");
        return false;
    }
    d.M = ov->type.dims[r].n;
    d.N = ov->type.dims[r + 1].n;
    d.K = av->type.dims[d.ta ? ra : ra + 1].n;
    d.tf32 = c->tf32;
    d.max_workspace = c->ws_bytes;
    int64_t nb = 1;
    for (int i = 0; i < r; i++) nb *= ov->type.dims[i].n;
    bool a_full = ra == r;   /* a has every batch axis, unbroadcast */
    for (int i = 0; a_full && i < r; i++) a_full = av->type.dims[i].n == ov->type.dims[i].n;
    gemm_call *mm = tf_calloc(1, sizeof *mm);
    if (!mm) {
        *oom_out = true;
        return false;
    }
    mm->esz_ab = (size_t)tf_dtype_bytes(av->type.dtype);
    mm->esz_c = (size_t)tf_dtype_bytes(ov->type.dtype);
    mm->calls = 1;
    mm->step_c = d.M * d.N;
    tf_cu_deviceptr pa = dev_of(c, av), pb = dev_of(c, bv), pc = dev_of(c, ov);
    if (ep && ep->kind != TF_GEMM_EPI_NONE) pc = ep->d_dev ? ep->d_dev : dev_of(c, gk->k->bufs[ep->d_buf].value);
    mm->d = pc;
    mm->n = n;
    uint64_t mix_a = pa, mix_b = pb, mix_c = pc;
    d.batch = 1;
    if (rb == 0 && !d.ta && a_full) {
        d.M *= nb;   /* [.., M, K] x [K, N]: one GEMM of nb * M rows */
    } else if (nb > 1) {
        /* per output batch index: element strides of a and b (0 on broadcast axes) */
        int64_t sa[TF_MAX_RANK] = {0}, sb[TF_MAX_RANK] = {0}, idx[TF_MAX_RANK] = {0};
        int64_t st = d.M * d.K;
        for (int i = ra - 1, j = r - 1; i >= 0; i--, j--) {
            sa[j] = av->type.dims[i].n == 1 ? 0 : st;
            st *= av->type.dims[i].n;
        }
        st = d.K * d.N;
        for (int i = rb - 1, j = r - 1; i >= 0; i--, j--) {
            sb[j] = bv->type.dims[i].n == 1 ? 0 : st;
            st *= bv->type.dims[i].n;
        }
        mm->off_a = tf_malloc((size_t)nb * sizeof *mm->off_a);
        mm->off_b = tf_malloc((size_t)nb * sizeof *mm->off_b);
        if (!mm->off_a || !mm->off_b) {
            gemm_call_free(c, mm);
            *oom_out = true;
            return false;
        }
        for (int64_t bi = 0; bi < nb; bi++) {
            int64_t oa = 0, ob = 0;
            for (int i = 0; i < r; i++) oa += idx[i] * sa[i], ob += idx[i] * sb[i];
            mm->off_a[bi] = oa;
            mm->off_b[bi] = ob;
            for (int i = r - 1; i >= 0; i--) {
                if (++idx[i] < ov->type.dims[i].n) break;
                idx[i] = 0;
            }
        }
        bool even = mm->off_a[1] != 0 && mm->off_b[1] != 0;   /* one strided-batched call */
        for (int64_t bi = 2; even && bi < nb; bi++) even = mm->off_a[bi] == bi * mm->off_a[1] && mm->off_b[bi] == bi * mm->off_b[1];
        if (even && nb <= INT32_MAX) {
            d.batch = nb;
            d.stride_a = mm->off_a[1];
            d.stride_b = mm->off_b[1];
            d.stride_c = mm->step_c;
            mix_a |= (uint64_t)d.stride_a * mm->esz_ab;
            mix_b |= (uint64_t)d.stride_b * mm->esz_ab;
            mix_c |= (uint64_t)d.stride_c * mm->esz_c;
            tf_free(mm->off_a);
            tf_free(mm->off_b);
            mm->off_a = mm->off_b = NULL;
        } else {   /* broadcast batch axes: one call per batch index */
            mm->calls = nb;
            for (int64_t bi = 0; bi < nb; bi++) {
                mix_a |= (uint64_t)mm->off_a[bi] * mm->esz_ab;
                mix_b |= (uint64_t)mm->off_b[bi] * mm->esz_ab;
                mix_c |= (uint64_t)(bi * mm->step_c) * mm->esz_c;
            }
        }
    }
    d.align_a = tf_gemm_alignment(mix_a);
    d.align_b = tf_gemm_alignment(mix_b);
    d.align_c = tf_gemm_alignment(mix_c);
    char err[400];
    if (ep && ep->kind != TF_GEMM_EPI_NONE) {
        if (d.batch != 1 || mm->calls != 1) {
            gemm_call_free(c, mm);
            snprintf(gk->why, sizeof gk->why, "a batched GEMM");
            return false;
        }
        d.epilogue = ep->kind;
        d.bias = ep->bias_dev ? ep->bias_dev : ep->kind == TF_GEMM_EPI_DRELU ? 0 : dev_of(c, gk->k->bufs[ep->bias_buf].value);
        d.aux = ep->aux_dev;
    }
    gemm_timing(c, &d, pa, pb, pc);
    tf_cuda_status st = tf_gemm_plan(&c->libs, c->lt, &d, &mm->g, err, sizeof err);
    if (st) {
        set_text(gk->why, sizeof gk->why, err);
        *oom_out = st == TF_CUDA_ERR_OOM;
        gemm_call_free(c, mm);
        return false;
    }
    gk->mm = mm;
    return true;
}

static tf_status run_gemm(tf_session_t *s, cuda_session *c, gkernel *gk)
{
    gemm_call *mm = gk->mm;
    const tf_node *n = mm->n;
    tf_cu_deviceptr pa = dev_of(c, n->in[0]), pb = dev_of(c, n->in[1]), pc = mm->d;
    char err[600];
    for (int64_t i = 0; i < mm->calls; i++) {
        tf_cu_deviceptr a = pa + (mm->off_a ? (tf_cu_deviceptr)mm->off_a[i] * mm->esz_ab : 0);
        tf_cu_deviceptr b = pb + (mm->off_b ? (tf_cu_deviceptr)mm->off_b[i] * mm->esz_ab : 0);
        tf_cu_deviceptr o = pc + (tf_cu_deviceptr)(i * mm->step_c) * mm->esz_c;
        if (tf_gemm_run(&c->libs, c->lt, &mm->g, a, b, o, c->ws_dev, c->ws_bytes, c->stream, err, sizeof err))
            return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: cuda: kernel %s (matmul %s): %s", gk->k->name, n->out->name ? n->out->name : "?", err);
    }
    return TF_OK;
}

/* ---- backward epilogues: bias gradients and ReLU's derivative in the GEMM ----------------
 *
 * plan_backward looks, before any code is emitted, for two patterns the
 * autodiff writes, and hands them to cuBLASLt when they provably compute
 * what the kernels do:
 *
 *   - BGRAD: a weight gradient dW = X^T dY (a matmul of rank-2 operands)
 *     and, elsewhere in the plan, a reduction kernel whose only work is
 *     db = reduce_sum(dY) over dY's K axis (the batch rows), reading the very
 *     value the GEMM multiplies, into a vector of the GEMM's result type
 *     (cuBLASLt writes the bias gradient in C's type). The GEMM writes db too
 *     (BGRADA when dY is our B, BGRADB when it is our A: cuBLASLt's operands
 *     are swapped, blas.h) and the reduction kernel does not run. Where the
 *     reduction sums a wider copy of dY (mixed precision: it reads the f32
 *     gradient, the GEMM its bf16 rounding) or writes another type, it stays.
 *   - DRELU: a GEMM dA = dY W^T whose only reader is ReLU's backward,
 *     where(h > 0, dA, 0) (passes/grad_rules.c's rule for relu, x > 0), with
 *     or without db = reduce_sum of that over the rows, where h is the
 *     biased product of a forward GEMM region relu(x W + b) that nothing else
 *     reads. The forward GEMM then runs RELU_AUX_BIAS (writing relu's output
 *     and the mask, kept in device memory the plan owns from forward to
 *     backward, no epilogue kernel), the backward one DRELU_BGRAD (or DRELU)
 *     writing dX and db, and ReLU's backward kernel does not run. Only in
 *     f32 (the mask is taken before any rounding to 16 bits, the rule
 *     compares the rounded h), and only once tf_gemm_relu_mask_probe has
 *     found cuBLASLt's mask to be x > 0 in blas.h's layout (cublasLt.h says
 *     nothing of the value at 0).
 *
 * A GEMM that writes a value before the kernel that used to (DRELU: dX and
 * db are the results of the later ReLU kernel) may only do so where
 * memplan's placement lets it: nothing between the two kernels touches
 * their bytes; else the GEMM runs at the later kernel's place, where its
 * operands must still be intact. GELU is never handed over (see above). */

/* The same memory: one root, or an update memplan writes in place and its param or buffer. */
static const tf_value *memory_of(const tf_value *v) { return root_of(v)->home ? root_of(v)->home : root_of(v); }
static bool same_root(const tf_value *a, const tf_value *b) { return memory_of(a) == memory_of(b); }

/* k's load x reads the whole of v row-major, over a space of v's own dims. */
static bool whole_load(const tf_kernel *k, const tf_kexpr *x, const tf_value *v)
{
    if (x->kind != TF_KX_LOAD || !same_root(k->bufs[x->buf].value, v) || k->bufs[x->buf].value->type.dtype != v->type.dtype ||
        k->rank != v->type.rank)
        return false;
    for (int a = 0; a < k->rank; a++)
        if (k->dims[a] != v->type.dims[a].n) return false;
    return row_major_load(k, x, x->buf);
}

/* The kernel evaluates an erf (gelu's, or its gradient's). */
static bool has_erf(const tf_kernel *k)
{
    for (int i = 0; i < k->nexprs; i++)
        if (k->exprs[i].kind == TF_KX_OP && (k->exprs[i].op == TF_OP_ERF || k->exprs[i].op == TF_OP_GELU)) return true;
    return false;
}

static bool is_zero(const tf_kexpr *x) { return x->kind == TF_KX_CONST && x->value == 0; }

/* Bytes [p, p + n) and [q, q + m) overlap. */
static bool overlap(tf_cu_deviceptr p, size_t n, tf_cu_deviceptr q, size_t m) { return p && q && p < q + m && q < p + n; }

/* No kernel in [lo, hi) but `except` has a buffer overlapping v's bytes, other than v itself and views of it. */
static bool untouched(const cuda_session *c, int lo, int hi, int except, const tf_value *v, const char **by, const tf_value **what)
{
    tf_cu_deviceptr p = dev_of(c, v);
    for (int j = lo; j < hi; j++) {
        const tf_kernel *k = &c->plan->kernels[j];
        if (j == except) continue;
        for (int b = 0; b < k->nbufs; b++)
            if (!same_root(k->bufs[b].value, v) && overlap(p, value_bytes(v), dev_of(c, k->bufs[b].value), value_bytes(k->bufs[b].value))) {
                *by = k->name, *what = k->bufs[b].value;
                return false;
            }
    }
    return true;
}

/* Nothing but kernels after `after` (and views that copy nothing) reads v, nor is it read before. */
static bool read_after(const cuda_session *c, const tf_value *v, int from, int after, const int *skip, int nskip)
{
    for (int j = 0; j <= after; j++) {
        const tf_kernel *k = &c->plan->kernels[j];
        bool skipped = false;
        for (int q = 0; q < nskip; q++) skipped |= skip[q] == j;
        if (skipped || j < from) continue;
        if (k->kind == TF_K_VIEW && (!dev_of(c, k->lib->out) || dev_of(c, k->lib->out) == dev_of(c, k->lib->in[0]))) continue;
        for (int b = 0; b < k->nbufs; b++)
            if (!k->bufs[b].written && same_root(k->bufs[b].value, v)) return false;
    }
    return true;
}

/* Some kernel, output or update reads v (or a view of it), but those listed. */
static bool read_elsewhere(const cuda_session *c, const tf_module *m, const tf_value *v, const int *skip, int nskip)
{
    for (int j = 0; j < c->plan->nkernels; j++) {
        const tf_kernel *k = &c->plan->kernels[j];
        bool skipped = false;
        for (int q = 0; q < nskip; q++) skipped |= skip[q] == j;
        for (int b = 0; !skipped && b < k->nbufs; b++)
            if (!k->bufs[b].written && same_root(k->bufs[b].value, v) && !(k->kind == TF_K_VIEW && k->lib->in[0] == k->bufs[b].value))
                return true;
    }
    for (int i = 0; i < m->noutputs; i++)
        if (m->outputs[i].value->kind != TF_VAL_CONST && same_root(m->outputs[i].value, v)) return true;
    for (int i = 0; i < m->nupdates; i++)
        if (m->updates[i].value->kind != TF_VAL_CONST && same_root(m->updates[i].value, v)) return true;
    return false;
}

/* A reduction kernel whose only work is reduce_sum of one load (maybe cast
 * first) into one vector: its load, its store's value; false otherwise. */
static bool lone_sum(const tf_kernel *r, const tf_kexpr **load, const tf_value **out)
{
    if (r->kind != TF_K_REDUCTION || r->nreds != 1 || r->reds[0].op != TF_OP_REDUCE_SUM || r->nstores != 1 || !r->stores[0].reduced_domain ||
        r->nexprs < 2 || r->nexprs > 3)
        return false;
    const tf_kexpr *x = &r->exprs[0], *red = &r->exprs[r->nexprs - 1];
    if (x->kind != TF_KX_LOAD || red->kind != TF_KX_REDUCED || r->stores[0].expr != r->nexprs - 1 || r->reds[0].arg != r->nexprs - 2)
        return false;
    if (r->nexprs == 3 && !(r->exprs[1].kind == TF_KX_OP && r->exprs[1].op == TF_OP_CAST && r->exprs[1].args[0] == 0)) return false;
    *load = x;
    *out = r->bufs[r->stores[0].buf].value;
    return true;
}

/* The BGRAD partner of matmul kernel gi: the reduction kernel summing its
 * dY over K (*ri), and which epilogue; false with a note when a reduction
 * of its operand (or of what it was cast from) is there but cannot be
 * handed over, or silently when there is none. */
static bool match_bgrad(const cuda_session *c, int gi, int *ri, tf_gemm_epilogue *kind, char *note, size_t n)
{
    const tf_node *mm = c->plan->kernels[gi].lib;
    bool ta = tf_node_bool(mm, "transpose_a"), tb = tf_node_bool(mm, "transpose_b");
    tf_dt cdt = mm->out->type.dtype;
    for (int r = 0; r < c->plan->nkernels; r++) {
        const tf_kernel *k = &c->plan->kernels[r];
        const tf_kexpr *ld;
        const tf_value *db;
        if (!lone_sum(k, &ld, &db)) continue;
        const tf_value *src = k->bufs[ld->buf].value;
        for (int q = 1; q >= 0; q--) {
            const tf_value *op = mm->in[q];
            bool copy = op->kind == TF_VAL_NODE && op->def && op->def->op == TF_OP_CAST && same_root(op->def->in[0], src);
            if (!same_root(src, op) && !copy) continue;
            const char *name = tf_gemm_epilogue_name(q ? TF_GEMM_EPI_BGRAD_B : TF_GEMM_EPI_BGRAD_A);
            /* the reduced axis is K: our B is [K, N] (tb: [N, K]), our A [M, K] (ta: [K, M]) */
            unsigned kaxis = q ? (tb ? 2u : 1u) : (ta ? 1u : 2u);
            bool dims = src->type.rank == op->type.rank;
            for (int a = 0; dims && a < op->type.rank; a++) dims = src->type.dims[a].n == op->type.dims[a].n;
            if (!dims || k->reduce_mask != kaxis || !whole_load(k, ld, src)) continue;   /* not this operand's K axis */
            if (copy) {
                snprintf(note, n, "%s not used: kernel %s sums %s, the GEMM multiplies its %s copy %s", name, k->name,
                         src->name ? src->name : "?", tf_dtype_name(op->type.dtype), op->name ? op->name : "?");
                return false;
            }
            if (mm->in[0]->type.rank != 2 || mm->in[1]->type.rank != 2 || !whole_load(k, ld, op) || k->reduce_mask != kaxis) {
                snprintf(note, n, "%s not used: kernel %s sums %s, but not over the GEMM's K axis alone", name, k->name, op->name ? op->name : "?");
                return false;
            }
            if (db->type.dtype != cdt || k->reds[0].dtype != cdt) {
                snprintf(note, n, "%s not used: kernel %s writes %s in %s, cuBLASLt writes a bias gradient in the GEMM's type, %s", name, k->name,
                         db->name ? db->name : "?", tf_dtype_name(db->type.dtype), tf_dtype_name(cdt));
                return false;
            }
            *ri = r;
            *kind = q ? TF_GEMM_EPI_BGRAD_B : TF_GEMM_EPI_BGRAD_A;
            return true;
        }
    }
    return false;
}

/* ReLU's backward after matmul kernel gi: kernel *ri computes where(h > 0, dA, 0)
 * into *dx (and its row sums into *db, or NULL) from the GEMM's result dA; *fi
 * is the forward GEMM region storing h = x W + b and relu(h). */
typedef struct drelu_match {
    int ri, fi;
    const tf_value *h, *dx, *db, *act;
} drelu_match;

static bool match_drelu(const cuda_session *c, int gi, drelu_match *d, char *note, size_t n)
{
    const tf_kernel *g = &c->plan->kernels[gi];
    const tf_value *da = g->lib->out;
    memset(d, 0, sizeof *d);
    if (g->nexprs || g->nstores) {   /* the GEMM's result feeds its own region */
        if (has_erf(g))
            snprintf(note, n, "DGELU not used: the region takes gelu's gradient, which stays in its epilogue kernel: cuBLASLt's DGELU is the "
                     "derivative of the tanh approximation, this model's gelu is erf's");
        return false;
    }
    for (int r = gi + 1; r < c->plan->nkernels; r++) {
        const tf_kernel *k = &c->plan->kernels[r];
        int gt = -1, wh = -1, lda = -1;
        for (int i = 0; i < k->nexprs; i++) {
            const tf_kexpr *x = &k->exprs[i];
            if (x->kind == TF_KX_LOAD && same_root(k->bufs[x->buf].value, da)) lda = i;
            if (x->kind == TF_KX_OP && x->op == TF_OP_GT && x->nargs == 2 && k->exprs[x->args[0]].kind == TF_KX_LOAD &&
                is_zero(&k->exprs[x->args[1]]))
                gt = i;
            if (x->kind == TF_KX_OP && x->op == TF_OP_WHERE && x->nargs == 3) wh = i;
        }
        if (lda < 0) continue;
        /* the one kernel reading dA */
        const tf_kexpr *w = wh >= 0 ? &k->exprs[wh] : NULL;
        if (has_erf(k) && (!w || gt < 0)) {
            snprintf(note, n, "DGELU not used: kernel %s takes gelu's gradient, which stays there: cuBLASLt's DGELU is the derivative of the tanh "
                     "approximation, this model's gelu is erf's", k->name);
            return false;
        }
        if (!w || gt < 0 || w->args[0] != gt || w->args[1] != lda || !is_zero(&k->exprs[w->args[2]])) return false;
        if (da->type.dtype != TF_DT_F32) {
            snprintf(note, n, "DRELU not used: ReLU's backward (kernel %s) is in %s; the mask is handed over in f32 only (cuBLASLt takes it before "
                     "rounding to 16 bits, the gradient rule compares the rounded value)", k->name, tf_dtype_name(da->type.dtype));
            return false;
        }
        int expect = 5;   /* load h, 0, gt, load dA, 0, where: the zeros may be one constant */
        const tf_kexpr *lh = &k->exprs[k->exprs[gt].args[0]];
        d->h = k->bufs[lh->buf].value;
        if (!whole_load(k, lh, d->h) || !whole_load(k, &k->exprs[lda], da) || k->rank != 2) {
            snprintf(note, n, "DRELU not used: kernel %s does not read h and the GEMM's result whole", k->name);
            return false;
        }
        int dxs = -1, dbs = -1;
        for (int st = 0; st < k->nstores; st++) {
            if (k->stores[st].expr == wh && !k->stores[st].reduced_domain) dxs = st;
            else if (k->stores[st].reduced_domain && k->exprs[k->stores[st].expr].kind == TF_KX_REDUCED && k->nreds == 1 &&
                     k->reds[0].op == TF_OP_REDUCE_SUM && k->reds[0].arg == wh && k->reduce_mask == 1u &&
                     k->exprs[k->stores[st].expr].red == 0)
                dbs = st;
        }
        int want_stores = 1 + (k->nreds ? 1 : 0);
        if (dxs < 0 || k->nstores != want_stores || (k->nreds && dbs < 0) || k->nexprs > expect + 1 + (k->nreds ? 1 : 0)) {
            snprintf(note, n, "DRELU not used: kernel %s does more than ReLU's backward%s", k->name, k->nreds ? " and the bias gradient" : "");
            return false;
        }
        d->dx = k->bufs[k->stores[dxs].buf].value;
        d->db = dbs >= 0 ? k->bufs[k->stores[dbs].buf].value : NULL;
        if (d->dx->type.dtype != TF_DT_F32 || (d->db && (d->db->type.dtype != TF_DT_F32 || k->reds[0].dtype != TF_DT_F32)) ||
            !k->bufs[k->stores[dxs].buf].disjoint) {
            snprintf(note, n, "DRELU not used: kernel %s writes another type than the GEMM's f32, or into its own operands", k->name);
            return false;
        }
        /* the forward region that stores h = x W + b and relu(h) */
        for (int f = 0; f < gi; f++) {
            const tf_kernel *fk = &c->plan->kernels[f];
            if (!fk->lib || fk->lib->op != TF_OP_MATMUL || fk->nstores != 2 || fk->nexprs != 4 || fk->nreds) continue;
            int hs = -1, as = -1;
            for (int st = 0; st < 2; st++) {
                const tf_kexpr *x = &fk->exprs[fk->stores[st].expr];
                const tf_value *v = fk->bufs[fk->stores[st].buf].value;
                if (same_root(v, d->h) && x->kind == TF_KX_OP && x->op == TF_OP_ADD) hs = st;
                else if (x->kind == TF_KX_OP && x->op == TF_OP_RELU && x->args[0] == fk->stores[1 - st].expr) as = st;
            }
            if (hs < 0) continue;
            if (as < 0) {
                snprintf(note, n, "DRELU not used: kernel %s stores %s without its relu", fk->name, d->h->name ? d->h->name : "?");
                return false;
            }
            d->fi = f;
            d->act = fk->bufs[fk->stores[as].buf].value;
            d->ri = r;
            return true;
        }
        snprintf(note, n, "DRELU not used: %s is not the biased product of a GEMM region of this step", d->h->name ? d->h->name : "?");
        return false;
    }
    return false;
}

/* Plan the backward epilogues (see above). False only for out of memory. */
static bool plan_backward(tf_session_t *s, cuda_session *c)
{
    int nk = c->plan->nkernels;
    for (int gi = 0; gi < nk; gi++) {
        const tf_kernel *k = &c->plan->kernels[gi];
        gkernel *gk = &c->ks[gi];
        if (!k->lib || k->lib->op != TF_OP_MATMUL || gk->preplanned) continue;
        gk->k = k;
        bool oom = false;
        /* BGRAD */
        int ri;
        tf_gemm_epilogue kind;
        char note[300] = "";
        if (match_bgrad(c, gi, &ri, &kind, note, sizeof note)) {
            const tf_kexpr *ld;
            const tf_value *db;
            lone_sum(&c->plan->kernels[ri], &ld, &db);
            const char *by = NULL;
            const tf_value *what = NULL;
            int skip[1] = {ri};
            epi_plan fwd;
            char why[200];
            bool fwd_epi = plan_epilogue(k, &fwd, &oom, why, sizeof why);
            epi_free(fwd.rest);
            if (oom) return false;
            if (fwd_epi)
                snprintf(note, sizeof note, "%s not used: the GEMM's region has a bias epilogue of its own", tf_gemm_epilogue_name(kind));
            else if (c->ks[ri].preplanned)
                snprintf(note, sizeof note, "%s not used: kernel %s is another GEMM's", tf_gemm_epilogue_name(kind), c->plan->kernels[ri].name);
            else if (ri < gi ? !untouched(c, ri + 1, gi + 1, -1, db, &by, &what) : !untouched(c, gi, ri, -1, db, &by, &what))
                snprintf(note, sizeof note, "%s not used: memplan placed %s over %s, which kernel %s uses between the two kernels",
                         tf_gemm_epilogue_name(kind), db->name ? db->name : "?", what->name ? what->name : "?", by);
            else if (!read_after(c, db, ri < gi ? ri : gi, gi, skip, 1))
                snprintf(note, sizeof note, "%s not used: %s is read before kernel %s", tf_gemm_epilogue_name(kind), db->name ? db->name : "?", k->name);
            else {
                epi_plan ep = {.kind = kind, .bias_dev = dev_of(c, db), .d_dev = dev_of(c, k->lib->out)};
                if (gemm_setup(c, gk, &ep, &oom)) {
                    gk->how = RUN_GEMM;
                    gk->preplanned = true;
                    snprintf(gk->epi, sizeof gk->epi, "%s (the bias gradient %.60s, the sum of %.60s over its rows, written with the product; kernel %s "
                             "does not run)%s", tf_gemm_epilogue_name(kind), db->name ? db->name : "?",
                             k->lib->in[kind == TF_GEMM_EPI_BGRAD_B]->name ? k->lib->in[kind == TF_GEMM_EPI_BGRAD_B]->name : "?",
                             c->plan->kernels[ri].name, k->nexprs && k->nstores ? "; the region in its epilogue kernel" : "; no epilogue kernel");
                    c->ks[ri].k = &c->plan->kernels[ri];
                    c->ks[ri].how = RUN_NOTHING;
                    c->ks[ri].preplanned = true;
                    snprintf(c->ks[ri].lab, sizeof c->ks[ri].lab, "in GEMM: %s", tf_gemm_epilogue_name(kind));
                    c->ks[ri].label = c->ks[ri].lab;
                    snprintf(c->ks[ri].why, sizeof c->ks[ri].why, "its reduce_sum is the %s epilogue of kernel %s's GEMM", tf_gemm_epilogue_name(kind),
                             k->name);
                    continue;
                }
                if (oom) return false;
                snprintf(note, sizeof note, "%s not used: cuBLASLt takes no such epilogue here (%.200s)", tf_gemm_epilogue_name(kind), gk->why);
                gk->why[0] = 0;
            }
        }
        /* DRELU */
        drelu_match dm;
        char dnote[300] = "";
        if (match_drelu(c, gi, &dm, dnote, sizeof dnote)) {
            gkernel *fk = &c->ks[dm.fi], *rk = &c->ks[dm.ri];
            const tf_kernel *fkern = &c->plan->kernels[dm.fi];
            int skip[1] = {dm.ri};
            const char *by = NULL;
            const tf_value *what = NULL;
            epi_plan fwd;
            char why[200];
            bool fwd_ok = plan_epilogue(fkern, &fwd, &oom, why, sizeof why);
            epi_free(fwd.rest);
            if (oom) return false;
            bool at_g = untouched(c, gi, dm.ri, gi, dm.dx, &by, &what) && (!dm.db || untouched(c, gi, dm.ri, gi, dm.db, &by, &what));
            /* at_g: the GEMM's own operands must not be what memplan put dX over either */
            for (int q = 0; at_g && q < 2; q++)
                at_g = !overlap(dev_of(c, k->lib->in[q]), value_bytes(k->lib->in[q]), dev_of(c, dm.dx), value_bytes(dm.dx)) &&
                       (!dm.db || !overlap(dev_of(c, k->lib->in[q]), value_bytes(k->lib->in[q]), dev_of(c, dm.db), value_bytes(dm.db)));
            bool at_r = !at_g;
            for (int q = 0; at_r && q < 2; q++) {   /* run at ReLU's kernel: the operands intact there, and apart from dX and db */
                const tf_value *o = k->lib->in[q];
                at_r = untouched(c, gi + 1, dm.ri, -1, o, &by, &what) && !overlap(dev_of(c, o), value_bytes(o), dev_of(c, dm.dx), value_bytes(dm.dx)) &&
                       (!dm.db || !overlap(dev_of(c, o), value_bytes(o), dev_of(c, dm.db), value_bytes(dm.db)));
            }
            if (!c->relu_probe) {
                bool same = false;
                tf_cuda_status ps = tf_gemm_relu_mask_probe(&c->libs, c->lt, c->stream, c->ws_dev, c->ws_bytes, &same, c->relu_probe_why,
                                                            sizeof c->relu_probe_why);
                if (ps == TF_CUDA_ERR_OOM) return false;
                c->relu_probe = same ? 1 : -1;
            }
            if (c->relu_probe < 0)
                snprintf(dnote, sizeof dnote, "DRELU not used: cuBLASLt's ReLU mask is not x > 0 as blas.h reads it: %.200s", c->relu_probe_why);
            else if (!fwd_ok || fwd.kind != TF_GEMM_EPI_BIAS || fk->preplanned)
                snprintf(dnote, sizeof dnote, "DRELU not used: the forward region (kernel %s) is not one cuBLASLt can write the mask for", fkern->name);
            else if (read_elsewhere(c, s->p->m, dm.h, skip, 1))
                snprintf(dnote, sizeof dnote, "DRELU not used: %s is read apart from ReLU's backward, and RELU_AUX_BIAS does not write it",
                         dm.h->name ? dm.h->name : "?");
            else if (!at_g && !at_r)
                snprintf(dnote, sizeof dnote, "DRELU not used: memplan placed %s or its operands where kernel %s uses %s in between",
                         dm.dx->name ? dm.dx->name : "?", by ? by : "?", what && what->name ? what->name : "?");
            else {
                tf_cu_deviceptr mask = 0;
                int64_t M = dm.dx->type.dims[0].n, N = dm.dx->type.dims[1].n;
                size_t mb = tf_gemm_relu_mask_bytes(M, N);
                tf_cu_result mr = c->libs.cu.MemAlloc(&mask, mb);
                if (mr) return false;
                dev_count(c, (int64_t)mb);
                epi_plan fe = {.kind = TF_GEMM_EPI_RELU_AUX_BIAS, .bias_buf = fwd.bias_buf, .d_dev = dev_of(c, dm.act), .aux_dev = mask};
                epi_plan be = {.kind = dm.db ? TF_GEMM_EPI_DRELU_BGRAD : TF_GEMM_EPI_DRELU, .bias_dev = dm.db ? dev_of(c, dm.db) : 0,
                               .d_dev = dev_of(c, dm.dx), .aux_dev = mask};
                fk->k = fkern;
                bool ok = M == c->plan->kernels[dm.fi].lib->out->type.dims[0].n && gemm_setup(c, fk, &fe, &oom);
                if (ok) fk->mm->own = mask;
                else c->libs.cu.MemFree(mask), dev_count(c, -(int64_t)mb);
                if (ok && !gemm_setup(c, gk, &be, &oom)) {
                    gemm_call_free(c, fk->mm);
                    fk->mm = NULL;
                    ok = false;
                }
                if (oom) return false;
                if (!ok) {
                    snprintf(dnote, sizeof dnote, "DRELU not used: cuBLASLt takes no such epilogue here (%.200s)", gk->why[0] ? gk->why : fk->why);
                    gk->why[0] = fk->why[0] = 0;
                } else {
                    const char *en = tf_gemm_epilogue_name(be.kind);
                    fk->how = RUN_GEMM, fk->preplanned = true, fk->no_code = true;
                    snprintf(fk->epi, sizeof fk->epi, "RELU_AUX_BIAS (bias %.60s, relu written to %.60s, its ReLU mask kept for kernel %s's %s; "
                             "%.60s, read by ReLU's backward alone, is not written); no epilogue kernel",
                             fkern->bufs[fwd.bias_buf].value->name ? fkern->bufs[fwd.bias_buf].value->name : "?", dm.act->name ? dm.act->name : "?",
                             k->name, en, dm.h->name ? dm.h->name : "?");
                    rk->k = &c->plan->kernels[dm.ri];
                    rk->preplanned = true;
                    gk->preplanned = true;
                    char what_text[400];
                    snprintf(what_text, sizeof what_text, "%s (the mask of kernel %s, dX written to %.60s%s%.60s: ReLU's backward%s, kernel %s's work)",
                             en, fkern->name, dm.dx->name ? dm.dx->name : "?", dm.db ? ", the bias gradient to " : "",
                             dm.db && dm.db->name ? dm.db->name : "", dm.db ? " and the bias gradient" : "", c->plan->kernels[dm.ri].name);
                    if (at_g) {
                        gk->how = RUN_GEMM;
                        snprintf(gk->epi, sizeof gk->epi, "%s; no epilogue kernel", what_text);
                        rk->how = RUN_NOTHING;
                        snprintf(rk->lab, sizeof rk->lab, "in GEMM: %s", en);
                        rk->label = rk->lab;
                        snprintf(rk->why, sizeof rk->why, "ReLU's backward is the %s epilogue of kernel %s's GEMM", en, k->name);
                    } else {   /* memplan put dX where the kernels in between still work: the GEMM runs in ReLU's kernel's place */
                        rk->how = RUN_GEMM;
                        rk->mm = gk->mm;
                        gk->mm = NULL;
                        rk->no_code = true;
                        snprintf(rk->epi, sizeof rk->epi, "kernel %s's GEMM, run here: %s; no epilogue kernel", k->name, what_text);
                        gk->how = RUN_NOTHING;
                        snprintf(gk->lab, sizeof gk->lab, "GEMM moved: %s", en);
                        gk->label = gk->lab;
                        snprintf(gk->why, sizeof gk->why, "its GEMM runs in kernel %s's place, with the %s epilogue (memplan puts %s where kernels in "
                                 "between still work)", c->plan->kernels[dm.ri].name, en, dm.dx->name ? dm.dx->name : "?");
                    }
                    continue;
                }
            }
        }
        snprintf(gk->epi_note, sizeof gk->epi_note, "%s%s%s", note, note[0] && dnote[0] ? "; " : "", dnote);
    }
    (void)s;
    return true;
}

/* ---- convolutions through cuDNN ------------------------------------------------ */

static bool is_conv(tf_op op) { return tf_op_exec_of(op) == TF_OPX_CONV; }

/* A conv kernel's x, w and y (dy for the gradients), one of them its result. */
static tf_conv_dir conv_operands(const tf_node *n, const tf_value **x, const tf_value **w, const tf_value **y)
{
    if (n->op == TF_OP_CONV2D) {
        *x = n->in[0], *w = n->in[1], *y = n->out;
        return TF_CONV_FORWARD;
    }
    if (n->op == TF_OP_CONV2D_GRAD_INPUT) {
        *y = n->in[0], *w = n->in[1], *x = n->out;
        return TF_CONV_GRAD_INPUT;
    }
    *x = n->in[0], *y = n->in[1], *w = n->out;
    return TF_CONV_GRAD_WEIGHT;
}

static void conv_free(cuda_session *c, tf_conv *cv)
{
    if (!cv) return;
    tf_conv_free(&c->libs, cv);
    tf_free(cv);
}

/* The most workspace a convolution may use: CONV_WORKSPACE, or half the
 * free memory when that is less (read once). */
static size_t conv_ws_limit(cuda_session *c)
{
    if (!c->conv_ws_limited) {
        size_t free_b = 0, total_b = 0;
        c->conv_ws_limited = true;
        c->conv_ws_limit = CONV_WORKSPACE;
        if (c->libs.cu.MemGetInfo(&free_b, &total_b)) c->conv_ws_limit = 0;
        else if (free_b / 2 < c->conv_ws_limit) c->conv_ws_limit = free_b / 2 / ALIGN * ALIGN;
    }
    return c->conv_ws_limit;
}

/* Scratch for cudnnFind*Ex, allocated when a first convolution is not in
 * the algorithm cache (a smaller block, or none, when the device refuses). */
static tf_cu_deviceptr find_workspace(cuda_session *c, size_t *bytes)
{
    if (!c->find_ws) {
        size_t want = conv_ws_limit(c);
        for (; want >= ((size_t)1 << 20); want = want / 2 / ALIGN * ALIGN)
            if (!c->libs.cu.MemAlloc(&c->find_ws, want)) break;
        if (want < ((size_t)1 << 20)) c->find_ws = 0;
        c->find_ws_bytes = c->find_ws ? want : 0;
        dev_count(c, (int64_t)c->find_ws_bytes);
        c->conv_ws_limit = c->find_ws_bytes;   /* what every later choice must fit */
    }
    *bytes = c->find_ws_bytes;
    return c->find_ws;
}

/* Plan kernel gk's convolution; false with the reason in gk->why when cuDNN
 * cannot take it (the host then runs it). The algorithm comes from the
 * disk cache, else from cudnnFind*Ex on the session's own buffers (it
 * overwrites the result, which nothing has written yet). */
static bool conv_setup(cuda_session *c, gkernel *gk, bool *oom_out)
{
    const tf_node *n = gk->k->lib;
    const tf_value *x, *w, *y;
    tf_conv_desc d;
    memset(&d, 0, sizeof d);
    *oom_out = false;
    if (!c->dnn_ok) {
        set_text(gk->why, sizeof gk->why, c->dnn_why);
        return false;
    }
    d.dir = conv_operands(n, &x, &w, &y);
    if (n->nin > 2 && n->op == TF_OP_CONV2D) {
        snprintf(gk->why, sizeof gk->why, "conv2d with a bias operand (lower splits the bias into an add, which cuDNN's conv leaves out)");
        return false;
    }
    tf_dt t = x->type.dtype;
    if (x->kind == TF_VAL_CONST || w->kind == TF_VAL_CONST || y->kind == TF_VAL_CONST || x->type.rank != 4 || w->type.rank != 4 ||
        y->type.rank != 4 || w->type.dtype != t || y->type.dtype != t || (t != TF_DT_F32 && t != TF_DT_F16 && t != TF_DT_BF16)) {
        snprintf(gk->why, sizeof gk->why, "%s of %s x, %s w, %s y: cuDNN is used for rank-4 f32, f16 and bf16 tensors of one type",
                 tf_op_info_of(n->op)->name, tf_dtype_name(x->type.dtype), tf_dtype_name(w->type.dtype), tf_dtype_name(y->type.dtype));
        return false;
    }
    d.type = t == TF_DT_F32 ? TF_CONV_F32 : t == TF_DT_F16 ? TF_CONV_F16 : TF_CONV_BF16;
    d.N = x->type.dims[0].n, d.C = x->type.dims[1].n, d.H = x->type.dims[2].n, d.W = x->type.dims[3].n;
    d.O = w->type.dims[0].n, d.KH = w->type.dims[2].n, d.KW = w->type.dims[3].n;
    d.Ho = y->type.dims[2].n, d.Wo = y->type.dims[3].n;
    tf_node_pair(n, "stride", 1, 1, d.stride);
    tf_node_pair(n, "padding", 0, 0, d.pad);
    tf_node_pair(n, "dilation", 1, 1, d.dilation);
    d.groups = tf_node_int(n, "groups");
    if (d.groups < 1) d.groups = 1;
    d.tf32 = c->tf32;
    d.gpu = c->gpu;
    d.x = dev_of(c, x), d.w = dev_of(c, w), d.y = dev_of(c, y);
    if (!d.x || !d.w || !d.y) {
        snprintf(gk->why, sizeof gk->why, "%s: an operand or the result is not in device memory", tf_op_info_of(n->op)->name);
        return false;
    }
    d.max_workspace = conv_ws_limit(c);
    d.cached_only = true;   /* Find's scratch only when something is not cached */
    tf_conv *cv = tf_calloc(1, sizeof *cv);
    if (!cv) {
        *oom_out = true;
        return false;
    }
    char err[1200];
    tf_cuda_status st = tf_conv_plan(&c->libs, c->dnn, &d, cv, err, sizeof err);
    if (st == TF_CUDA_ERR_NOT_FOUND && cv->cache_miss) {
        d.cached_only = false;
        d.ws = find_workspace(c, &d.max_workspace);
        st = tf_conv_plan(&c->libs, c->dnn, &d, cv, err, sizeof err);
    }
    if (st) {
        char why[1300];
        snprintf(why, sizeof why, "cuDNN: %s", err);
        set_text(gk->why, sizeof gk->why, why);
        *oom_out = st == TF_CUDA_ERR_OOM;
        tf_free(cv);
        return false;
    }
    gk->conv = cv;
    return true;
}

/* Once every convolution is planned: Find's scratch goes back, and the
 * workspace the chosen algorithms need (the largest) is cuBLASLt's when
 * that is big enough, else one block of its own. */
static tf_status conv_workspace(tf_session_t *s, cuda_session *c)
{
    if (c->find_ws) {
        CU_DO("freeing cuDNN's search workspace", MemFree(c->find_ws));
        dev_count(c, -(int64_t)c->find_ws_bytes);
        c->find_ws = 0;
        c->find_ws_bytes = 0;
    }
    size_t need = 0;
    for (int i = 0; i < c->plan->nkernels; i++)
        if (c->ks[i].conv && c->ks[i].conv->workspace > need) need = c->ks[i].conv->workspace;
    if (!need) return TF_OK;
    if (c->ws_dev && need <= c->ws_bytes) {   /* one stream: a GEMM and a conv never run at once */
        c->dnn_ws = c->ws_dev;
        c->dnn_ws_bytes = c->ws_bytes;
        return TF_OK;
    }
    tf_cu_result r = c->libs.cu.MemAlloc(&c->dnn_ws_own, need);
    if (r) {
        c->dnn_ws_own = 0;
        tf_cuda_check(&c->libs, r, "cuMemAlloc", __FILE__, __LINE__, c->err, sizeof c->err);
        return cu_fail(s, c, r, "allocating cuDNN's workspace");
    }
    dev_count(c, (int64_t)need);
    c->dnn_ws = c->dnn_ws_own;
    c->dnn_ws_bytes = need;
    return TF_OK;
}

static tf_status run_conv(tf_session_t *s, cuda_session *c, gkernel *gk)
{
    const tf_value *x, *w, *y;
    conv_operands(gk->k->lib, &x, &w, &y);
    char err[600];
    tf_cuda_status st = tf_conv_run(&c->libs, c->dnn, gk->conv, dev_of(c, x), dev_of(c, w), dev_of(c, y), c->dnn_ws, c->dnn_ws_bytes,
                                    err, sizeof err);
    if (st)
        return tf_set_error(s->ctx, st == TF_CUDA_ERR_OOM ? TF_ERR_OOM : TF_ERR_RUNTIME, "error: cuda: kernel %s (%s): %s", gk->k->name,
                            tf_op_info_of(gk->k->lib->op)->name, err);
    return TF_OK;
}

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

/* Write a constant's filled bytes (pool: fill_pools made them) into dst:
 * a device copy, inside the step's stream and its graph. */
static tf_status fill_const(tf_session_t *s, cuda_session *c, const tf_value *dst, tf_cu_deviceptr pool)
{
    if (!pool) return tf_set_error(s->ctx, TF_ERR_INTERNAL, "error: internal: cuda: no filled copy of the constant written to %s",
                                   dst->name ? dst->name : "a value");
    if (value_bytes(dst)) CU_DO("filling a constant", MemcpyDtoDAsync(dev_of(c, dst), pool, value_bytes(dst), c->stream));
    return TF_OK;
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
    if (tf_cuda_emit_library(k, &job->kernel, &d)) {
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

static tf_status build_kernels(tf_session_t *s, cuda_session *c)
{
    int nk = c->plan->nkernels;
    c->ks = tf_calloc((size_t)(nk ? nk : 1), sizeof *c->ks);
    if (!c->ks) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    double t0 = now_ms();
    tf_cuda_jit_job *jobs = tf_calloc((size_t)(nk ? 2 * nk : 1), sizeof *jobs);   /* per kernel: its code, its library op's */
    if (!jobs) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    tf_status st = TF_OK;
    int njobs = 0, nlib = 0;
    /* GEMMs with backward epilogues first: they decide which kernels do not run */
    if (!c->fallback_all && c->lt_ok && !plan_backward(s, c)) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory planning GEMMs");
    for (int i = 0; !st && i < nk; i++) {
        const tf_kernel *k = &c->plan->kernels[i];
        gkernel *gk = &c->ks[i];
        gk->k = k;
        gk->fn = -1;
        gk->lfn = -1;
        gk->err_slot = k->lib && k->kind != TF_K_VIEW ? nlib++ : -1;   /* plan_layout's count */
        gk->work = 1;
        for (int a = 0; a < k->rank; a++) gk->work *= k->dims[a];
        if (k->kind == TF_K_VIEW) {
            gk->how = RUN_VIEW;
            continue;
        }
        if (c->fallback_all) {
            gk->how = k->lib || k->nexprs ? RUN_FALLBACK : RUN_NOTHING;
            snprintf(gk->why, sizeof gk->why, "--cuda-fallback=all");
            continue;
        }
        /* a kernel whose work a GEMM's epilogue does, or a GEMM run in another kernel's place (plan_backward) */
        if (gk->preplanned && (gk->how != RUN_GEMM || !k->lib)) continue;
        int span = tf_cuda_multi_span(k, nk - i);   /* an optimizer's update chains: one launch */
        if (span > 1) {
            tf_diag d = {0};
            if (tf_cuda_emit_multi(k, span, &jobs[njobs].kernel, &d)) {
                st = tf_from_diag(s->ctx, &d);
                break;
            }
            jobs[njobs++].owner = i;
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
            i += span - 1;
            continue;
        }
        /* a matmul first: cuBLASLt may take over its region's bias (and ReLU) */
        const tf_kernel *ek = k;   /* the code to emit: the kernel, or what its GEMM leaves of it */
        bool gemm_done = false, oom_hit = false;
        if (k->lib && k->lib->op == TF_OP_MATMUL && gk->preplanned) {   /* its backward epilogue planned: the region as it is, or nothing */
            if (gk->no_code) ek = NULL;
            gemm_done = true;
        } else if (k->lib && k->lib->op == TF_OP_MATMUL && c->lt_ok) {
            epi_plan ep;
            char why[200];
            bool use = plan_epilogue(k, &ep, &oom_hit, why, sizeof why);
            static const char gelu_why[] = "; GELU stays in the epilogue kernel: cuBLASLt's GELU is the tanh approximation, this model's gelu is erf's";
            if (use && gemm_setup(c, gk, &ep, &oom_hit)) {
                snprintf(gk->epi, sizeof gk->epi, "%s (bias %.60s, written to %.60s)%s%s", tf_gemm_epilogue_name(ep.kind),
                         k->bufs[ep.bias_buf].value->name ? k->bufs[ep.bias_buf].value->name : "?",
                         k->bufs[ep.d_buf].value->name ? k->bufs[ep.d_buf].value->name : "?",
                         ep.rest ? "; the rest of the region in its epilogue kernel" : "; no epilogue kernel", ep.gelu ? gelu_why : "");
                gk->rest = ep.rest;
                ek = ep.rest;
                gemm_done = true;
            } else {
                epi_free(ep.rest);
                if (use && !oom_hit) snprintf(why, sizeof why, "cuBLASLt takes no bias epilogue here (%.150s)", gk->why);
                if (!gk->epi_note[0] && k->lib->backward && !use)
                    snprintf(gk->epi_note, sizeof gk->epi_note, "no kernel only sums one of its operands over K (BGRAD), no ReLU backward reads "
                             "its result alone (DRELU)");
                snprintf(gk->epi, sizeof gk->epi, "none: %.200s%s%.420s%s", why, gk->epi_note[0] ? "; " : "", gk->epi_note, ep.gelu ? gelu_why : "");
                gk->why[0] = 0;
                gemm_done = !oom_hit && gemm_setup(c, gk, NULL, &oom_hit);
            }
            if (oom_hit) {
                st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory planning the GEMM of kernel %s", k->name);
                break;
            }
            if (gemm_done) gk->how = RUN_GEMM;
        }
        bool code = ek && ek->nexprs && (!ek->lib || ek->nstores);   /* the whole kernel, or a GEMM region's epilogue */
        if (code) {
            tf_diag d = {0};
            if (tf_cuda_emit(ek, &jobs[njobs].kernel, &d)) {
                if (d.status != TF_IR_ERR_RUNTIME) {
                    st = tf_from_diag(s->ctx, &d);
                    break;
                }
                set_text(gk->why, sizeof gk->why, d.msg);   /* the emitter says why it cannot */
                gk->how = RUN_FALLBACK;
                continue;
            }
            jobs[njobs].owner = i;
            njobs++;
        }
        if (!k->lib) {
            gk->how = code ? RUN_JIT : RUN_NOTHING;
            continue;
        }
        if (gemm_done) continue;
        tf_op_exec ex = tf_op_exec_of(k->lib->op);
        if (ex == TF_OPX_GEMM && gemm_setup(c, gk, NULL, &oom_hit)) gk->how = RUN_GEMM;
        else if (ex == TF_OPX_CONV && conv_setup(c, gk, &oom_hit)) gk->how = RUN_CONV;
        else if (oom_hit) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory planning the %s of kernel %s",
                                            ex == TF_OPX_GEMM ? "GEMM" : "convolution", k->name);
        else if (tf_exec_own_kernel(ex) && lib_setup(s, c, gk, i, &jobs[njobs], &st)) {
            njobs++;
            gk->how = RUN_LIBKERNEL;
        } else if (!st) {
            if (!gk->why[0])
                snprintf(gk->why, sizeof gk->why, "%s has no GPU implementation in this build", tf_op_info_of(k->lib->op)->name);
            gk->how = code ? RUN_LIB_FALLBACK : RUN_FALLBACK;
        }
    }
    if (!st) st = conv_workspace(s, c);
    char err[2048];
    if (!st) {
        tf_cuda_status cs = tf_cuda_jit_build(&c->jit, &c->libs, c->arch, s->p->pkg, jobs, njobs, err, sizeof err);
        if (cs) st = tf_set_error(s->ctx, cs == TF_CUDA_ERR_OOM ? TF_ERR_OOM : TF_ERR_RUNTIME, "error: cuda: %s", err);
    }
    for (int j = 0; !st && j < njobs; j++) {
        if (jobs[j].owner >= nk) c->ks[jobs[j].owner - nk].lfn = jobs[j].fn;
        else c->ks[jobs[j].owner].fn = jobs[j].fn;
    }
    for (int j = 0; j < njobs; j++) tf_cuda_kernel_free(&jobs[j].kernel);
    tf_free(jobs);
    c->jit_ms = now_ms() - t0;
    if (st) return st;
    /* launch parameters: the buffers' device pointers, then {seed, step} */
    for (int i = 0; i < nk; i++) {
        gkernel *gk = &c->ks[i];
        if (gk->fn < 0) continue;
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
    }
    /* the library kernels': the op's result, its operands that are not constants, the error word */
    for (int i = 0; i < nk; i++) {
        gkernel *gk = &c->ks[i];
        if (gk->lfn < 0) continue;
        const tf_node *n = gk->k->lib;
        const tf_cuda_jit_fn *f = &c->jit.fns[gk->lfn];
        gk->ldptr = tf_calloc((size_t)n->nin + 2, sizeof *gk->ldptr);
        gk->largs = tf_calloc((size_t)n->nin + 2, sizeof *gk->largs);
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
        }
    }
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
    if (f->function2) {   /* a split reduction's full-space stores */
        r = c->libs.cu.LaunchKernel(f->function2, f->grid2, 1, 1, f->block2, 1, 1, 0, c->stream, args, NULL);
        if (tf_cuda_check(&c->libs, r, "cuLaunchKernel", __FILE__, __LINE__, c->err, sizeof c->err))
            return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: cuda: launching kernel %s (%s_b, grid %u, block %u): %s", gk->k->name,
                                f->name, f->grid2, f->block2, c->err);
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
    case RUN_LIB_FALLBACK: st = run_fallback(s, c, k, true); break;
    case RUN_GEMM: st = run_gemm(s, c, gk); break;
    case RUN_LIBKERNEL: st = run_libkernel(s, c, gk); break;
    case RUN_CONV: st = run_conv(s, c, gk); break;
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
static tf_status cuda_wait(tf_session_t *s)
{
    cuda_session *c = s->impl;
    const tf_module *m = s->p->m;
    if (c->failed) return tf_set_error(s->ctx, c->failed, "%s", c->failed_msg);
    if (!c->pending) return TF_OK;
    CU_DO("making the session's context current", CtxSetCurrent(c->ctx));
    tf_cu_result r = c->libs.cu.EventSynchronize(c->done);
    if (r) return step_failed(s, c, r, "cuEventSynchronize");
    c->pending = false;
    for (int i = 0; i < m->noutputs; i++) {
        const tf_value *v = m->outputs[i].value;
        if (v->kind == TF_VAL_CONST) {
            for (int64_t j = 0; j < numel(v); j++) tf_elem_store(v->type.dtype, s->out[i], j, tf_dtype_round(v->type.dtype, v->cval));
        } else {
            memcpy(s->out[i], c->pinned + c->out_at[i], value_bytes(v));
        }
    }
    if (c->pending_profile) {
        c->pending_profile = false;
        for (int i = 0; i < c->plan->nkernels; i++) {
            float ms = 0;
            CU_DO("reading the profiler's events", EventElapsedTime(&ms, c->ev[2 * i], c->ev[2 * i + 1]));
            c->ks[i].ms += ms;
            c->ks[i].calls++;
        }
    }
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
        if ((st = run_kernel(s, c, gk))) return st;
        if (c->profile) {
            tf_cu_result r = c->libs.cu.EventRecord(c->ev[2 * i + 1], c->stream);
            if (tf_cuda_check(&c->libs, r, "cuEventRecord", __FILE__, __LINE__, c->err, sizeof c->err)) return cu_fail(s, c, r, gk->k->name);
        }
        if (c->sync_each) {
            tf_cu_result r = c->libs.cu.StreamSynchronize(c->stream);
            if (tf_cuda_check(&c->libs, r, "cuStreamSynchronize", __FILE__, __LINE__, c->err, sizeof c->err))
                return tf_set_error(s->ctx, r == CUDA_ERROR_OUT_OF_MEMORY ? TF_ERR_OOM : TF_ERR_RUNTIME,
                                    "error: cuda: kernel %s (%s) failed: %s", gk->k->name, how_names[gk->how], c->err);
        }
    }
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
        if (v->kind == TF_VAL_CONST) continue;
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
        snprintf(c->graph_why, sizeof c->graph_why, "capturing the step failed: %.200s", c->err);
        c->graphs = false;
        return TF_OK;
    }
    tf_status st = enqueue_step(s, c);
    tf_cu_graph g = NULL;
    r = c->libs.cu.StreamEndCapture(c->stream, &g);
    if (st) {   /* the step's own error, whatever the capture made of it */
        if (g) c->libs.cu.GraphDestroy(g);
        return st;
    }
    if (!r) r = c->libs.cu.GraphInstantiate(&c->gexec, g, 0);
    if (g) c->libs.cu.GraphDestroy(g);
    if (r) {
        c->gexec = NULL;
        tf_cuda_check(&c->libs, r, "capturing the step", __FILE__, __LINE__, c->err, sizeof c->err);
        snprintf(c->graph_why, sizeof c->graph_why, "the driver refused the captured step: %.200s", c->err);
        c->graphs = false;
    }
    return TF_OK;
}

/* A step enqueued, not waited for: the host copies {seed, step} and the
 * inputs into a pinned slot (so the caller may change its buffers as soon
 * as this returns), the copy stream takes them to the GPU, the compute
 * stream runs the step (its graph, or kernel by kernel) and copies the
 * outputs into pinned memory; cuda_wait waits for it. No host
 * synchronization but for a slot's copy two runs ago (two slots: step
 * N+1's memcpy never overwrites what step N's copy reads), a profiled
 * step's events, and what --cuda-sync, host kernels and ids checked on the
 * host (err_read) ask for. */
static tf_status cuda_run(tf_session_t *s)
{
    cuda_session *c = s->impl;
    const tf_program_t *p = s->p;
    tf_status st;
    if (c->failed) return tf_set_error(s->ctx, c->failed, "%s", c->failed_msg);
    CU_DO("making the session's context current", CtxSetCurrent(c->ctx));
    /* a profiled step's events are read before they are recorded again */
    if (c->pending && c->pending_profile && (st = cuda_wait(s))) return st;
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
    bool graph = c->graphs && !c->profile;   /* profiles time each kernel: launched one by one */
    if (graph && !c->gexec && (st = capture_step(s, c))) return drain(c, st);
    if (graph && c->gexec) {
        tf_cu_result r = c->libs.cu.GraphLaunch(c->gexec, c->stream);
        if (tf_cuda_check(&c->libs, r, "cuGraphLaunch", __FILE__, __LINE__, c->err, sizeof c->err))
            return drain(c, cu_fail(s, c, r, "launching the step's graph"));
        c->replays++;
    } else if ((st = enqueue_step(s, c))) {
        return drain(c, st);
    }
    tf_cu_result r = c->libs.cu.EventRecord(c->done, c->stream);
    if (tf_cuda_check(&c->libs, r, "cuEventRecord", __FILE__, __LINE__, c->err, sizeof c->err))
        return drain(c, cu_fail(s, c, r, "marking the step's end"));
    c->pending = true;
    c->pending_profile = c->profile;
    c->rt[1]++;
    return TF_OK;
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
    CU_DO("making the session's context current", CtxSetCurrent(c->ctx));
    CU_DO(v->name, MemcpyHtoDAsync(c->ptr[v->id], src, value_bytes(v), c->stream));
    CU_DO(v->name, StreamSynchronize(c->stream));
    return TF_OK;
}

static uint64_t cuda_step_get(tf_session_t *s) { return ((cuda_session *)s->impl)->rt[1]; }
static void cuda_step_set(tf_session_t *s, uint64_t step) { ((cuda_session *)s->impl)->rt[1] = step; }

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
        gemm_call_free(c, c->ks[i].mm);
        epi_free(c->ks[i].rest);
        if (driver && c->ks[i].scratch) cu->MemFree(c->ks[i].scratch);
        conv_free(c, c->ks[i].conv);
    }
    tf_free(c->ks);
    if (c->lt) c->libs.lt.Destroy(c->lt);
    if (driver && c->gexec) cu->GraphExecDestroy(c->gexec);
    if (c->dnn) c->libs.dnn.Destroy(c->dnn);
    if (driver) {
        for (int i = 0; c->ev && i < 2 * (c->plan->nkernels ? c->plan->nkernels : 1); i++)
            if (c->ev[i]) cu->EventDestroy(c->ev[i]);
        tf_cuda_jit_free(&c->jit, &c->libs);
        if (c->dnn_ws_own) cu->MemFree(c->dnn_ws_own);
        if (c->find_ws) cu->MemFree(c->find_ws);
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

/* cuBLASLt when it loads and starts; its absence is no error (the host then
 * runs the GEMMs, counted as fallbacks), and lt_why says what happened. */
static void open_cublaslt(cuda_session *c)
{
    bool any = false;
    for (int i = 0; i < c->plan->nkernels && !any; i++) any = c->plan->kernels[i].lib && c->plan->kernels[i].lib->op == TF_OP_MATMUL;
    if (!any || c->fallback_all) {
        snprintf(c->lt_why, sizeof c->lt_why, any ? "--cuda-fallback=all" : "no matmul");
        return;
    }
    char err[1200];
    if (tf_cuda_libs_add(&c->libs, TF_CUDA_LIB_CUBLASLT, &c->search, err, sizeof err)) {
        set_text(c->lt_why, sizeof c->lt_why, c->libs.cublaslt_error);
        return;
    }
    tf_cublas_status r = c->libs.lt.Create(&c->lt);
    if (r) {
        c->lt = NULL;
        const char *name = c->libs.lt.GetStatusName(r);
        snprintf(c->lt_why, sizeof c->lt_why, "cublasLtCreate failed: %.200s (%.900s)", name ? name : "?", c->libs.cublaslt_path);
        return;
    }
    c->lt_ok = true;
    c->ws_bytes = GEMM_WORKSPACE;
}

/* cuDNN when the plan has a convolution and cuDNN loads and starts; its
 * absence is no error (the host then runs the convolutions, counted as
 * fallbacks), and dnn_why says what happened. */
static void open_cudnn(cuda_session *c)
{
    bool any = false;
    for (int i = 0; i < c->plan->nkernels && !any; i++) any = c->plan->kernels[i].lib && is_conv(c->plan->kernels[i].lib->op);
    if (!any || c->fallback_all) {
        snprintf(c->dnn_why, sizeof c->dnn_why, any ? "--cuda-fallback=all" : "no convolution");
        return;
    }
    char err[1200];
    if (tf_cuda_libs_add(&c->libs, TF_CUDA_LIB_CUDNN, &c->search, err, sizeof err)) {
        set_text(c->dnn_why, sizeof c->dnn_why, c->libs.cudnn_error);
        return;
    }
    tf_cudnn_status r = c->libs.dnn.Create(&c->dnn);
    const char *call = "cudnnCreate";
    if (!r) {
        call = "cudnnSetStream";
        r = c->libs.dnn.SetStream(c->dnn, c->stream);
        if (r) c->libs.dnn.Destroy(c->dnn);
    }
    if (r) {
        c->dnn = NULL;
        const char *name = c->libs.dnn.GetErrorString(r);
        snprintf(c->dnn_why, sizeof c->dnn_why, "%s failed: %.200s (%.900s)", call, name ? name : "?", c->libs.cudnn_path);
        return;
    }
    c->dnn_ok = true;
}

/* --cuda-explain: the algorithm each convolution got, and from where. */
static void explain_convs(FILE *f, const cuda_session *c)
{
    for (int i = 0; i < c->plan->nkernels; i++) {
        const gkernel *gk = &c->ks[i];
        if (gk->how != RUN_CONV) continue;
        const tf_conv *cv = gk->conv;
        fprintf(f, "cuda: kernel %s: %s through cuDNN, %s algorithm %s (%d), %s, %s, %zu bytes of workspace, %s (%.3f ms)\n",
                gk->k->name, tf_op_info_of(gk->k->lib->op)->name, tf_conv_dir_name(cv->dir), tf_conv_algo_name(cv->dir, cv->algo),
                cv->algo, tf_conv_math_name(cv->math), cv->deterministic ? "deterministic" : "non-deterministic", cv->workspace,
                cv->from_cache ? "from the algorithm cache" : "found by cudnnFind", cv->ms);
    }
}

/* --cuda-explain: the cuBLASLt algorithm each GEMM got: which of the
 * heuristic's candidates, its time, timed now or from the disk cache. */
static void explain_gemms(FILE *f, const cuda_session *c)
{
    char how[4600];
    for (int i = 0; i < c->plan->nkernels; i++) {
        if (c->ks[i].how == RUN_NOTHING && c->ks[i].preplanned)
            fprintf(f, "cuda: kernel %s does not run: %s\n", c->ks[i].k->name, c->ks[i].why);
        if (c->ks[i].how != RUN_GEMM) continue;
        tf_gemm_explain(&c->ks[i].mm->g, how, sizeof how);
        fprintf(f, "cuda: kernel %s: cuBLASLt algorithm: %s\n", c->ks[i].k->name, how);
    }
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
    layout L = {0};
    tf_status st = open_device(s, c);
    if (!st) st = tf_program_plan(s->ctx, s->p, &c->plan);
    if (!st) open_cublaslt(c);
    if (!st) open_cudnn(c);
    if (!st) st = plan_layout(s, c, &L);
    if (!st) st = allocate(s, c, &L);   /* before anything slow: out of memory is said at once */
    if (!st) st = initial_state(s, c);
    if (!st) st = fill_pools(s, c);
    long hits0 = 0, compiled0 = 0, hits1 = 0, compiled1 = 0;
    if (c->emu) tf_cuda_emu_cache_counts(&hits0, &compiled0);   /* cuda-emu compiles at the synchronization below */
    if (!st) st = build_kernels(s, c);
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
    tf_free(L.at);
    tf_free(L.in_arena);
    tf_free(L.stage_at);
    tf_free(L.kpool_at);
    tf_free(L.upool_at);
    if (st) {
        cuda_free(s);
        return st;
    }
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
    c->graphs = true;
    if (s->p->settings.cuda_no_graphs) snprintf(c->graph_why, sizeof c->graph_why, "--cuda-graphs=off");
    else if (c->sync_each) snprintf(c->graph_why, sizeof c->graph_why, "--cuda-sync synchronizes after every kernel");
    for (int i = 0; !c->graph_why[0] && i < c->plan->nkernels; i++)
        if (c->ks[i].how == RUN_FALLBACK || c->ks[i].how == RUN_LIB_FALLBACK)
            snprintf(c->graph_why, sizeof c->graph_why, "kernel %.60s runs on the host (%.120s)", c->ks[i].k->name, c->ks[i].why);
    for (int i = 0; !c->graph_why[0] && i < c->plan->nkernels; i++)
        if (c->ks[i].how == RUN_LIBKERNEL && c->ks[i].err_read)
            snprintf(c->graph_why, sizeof c->graph_why,
                     "kernel %.60s reads ids the step computes, checked on the host before the updates", c->ks[i].k->name);
    if (c->graph_why[0]) c->graphs = false;
    if (s->p->settings.cuda_explain) {   /* what runs where, and why not on the GPU */
        FILE *f = tf_context_diag(s->ctx);
        char dnn[64];
        snprintf(dnn, sizeof dnn, "cuDNN %zu.%zu.%zu", c->libs.cudnn_version / 10000, c->libs.cudnn_version / 100 % 100,
                 c->libs.cudnn_version % 100);
        int launches = 0;   /* per step: generated kernels and library calls */
        for (int i = 0; i < c->plan->nkernels; i++) {
            const gkernel *gk = &c->ks[i];
            if (gk->fn >= 0) launches += 1 + (c->jit.fns[gk->fn].function2 != NULL);
            launches += gk->lfn >= 0;
            launches += gk->how == RUN_GEMM ? (int)gk->mm->calls : gk->how == RUN_CONV;
        }
        fprintf(f, "cuda: %s (%s), %d kernels, %d launches a step (generated kernels and library calls); code: %d compiled, "
                "%d from the cache (%.0f ms); GEMMs: %s; convolutions: %s\n", c->gpu, c->arch, tf_kernels_count(c->plan), launches,
                c->jit.compiled, c->jit.cached, c->jit_ms, c->lt_ok ? "cuBLASLt" : c->lt_why, c->dnn_ok ? dnn : c->dnn_why);
        explain_convs(f, c);
        explain_gemms(f, c);
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
        for (int i = 0; i < c->plan->nkernels; i++)
            if (c->ks[i].how == RUN_FALLBACK || c->ks[i].how == RUN_LIB_FALLBACK)
                fprintf(f, "cuda: kernel %s runs %son the host: %s\n", c->ks[i].k->name,
                        c->ks[i].how == RUN_LIB_FALLBACK ? "its library op " : "", c->ks[i].why);
        if (c->graphs) fprintf(f, "cuda: each step runs as one CUDA graph, captured on the first run\n");
        else fprintf(f, "cuda: each step is launched kernel by kernel: %s\n", c->graph_why);
    }
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
    out->how = gk->label ? gk->label : how_names[gk->how];
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
    out->library = c->lt_ok && c->dnn_ok ? "cuBLASLt + cuDNN" : c->lt_ok ? "cuBLASLt" : c->dnn_ok ? "cuDNN" : "none";
    out->step_graph = c->graphs ? "graph" : c->graph_why;
    out->graph_replays = c->replays;
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
    tf_cuda_libs_load(&libs, TF_CUDA_LIB_NVRTC | TF_CUDA_LIB_DRIVER | TF_CUDA_LIB_CUBLASLT | TF_CUDA_LIB_CUDNN, NULL, err, sizeof err);
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
    .session_create = cuda_create, .session_free = cuda_free, .run = cuda_run, .wait = cuda_wait, \
    .state_read = cuda_state_read, .state_write = cuda_state_write, .step_get = cuda_step_get, \
    .step_set = cuda_step_set, .set_profiling = cuda_set_profiling,                          \
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
