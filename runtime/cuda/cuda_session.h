/* cuda_session.h — what the files of the cuda target (backend_cuda.c and
 * its parts) share: a session's state, its per-kernel plan, the small
 * helpers every part uses, and the functions one part calls in another.
 * Private to runtime/cuda; backend_cuda.c's opening comment says what a
 * session does.
 *
 *   backend_cuda.c        the backend: the vtables, sessions created and freed,
 *                         state, profiles and facts, --cuda-explain
 *   cuda_mem.c            device memory: where every value lives, the blocks
 *                         allocated, the initial state
 *   cuda_build.c          how each kernel runs, its code compiled, its launch
 *                         parameters
 *   cuda_gemm.c           matmuls through cuBLASLt, a region's bias (and ReLU)
 *                         as the GEMM's epilogue
 *   cuda_gemm_backward.c  bias gradients and ReLU's backward as a GEMM's
 *                         epilogue (plan_backward)
 *   cuda_conv.c           convolutions through cuDNN
 *   cuda_launch.c         a step: its inputs staged, its kernels launched or
 *                         replayed as a graph, waited for; the host fallback */
#ifndef TF_RUNTIME_CUDA_SESSION_H
#define TF_RUNTIME_CUDA_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "blas.h"
#include "cuda_jit.h"
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
    CUDA_ERROR_UNKNOWN = 999,
    TF_CUDA_COMM_FAILED = -1,   /* tf_cuda_comm_sync: NCCL failed or a rank hung; c->err says which */
};

enum { ALIGN = 256 };   /* every block of device memory starts on this */

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
    RUN_ALLREDUCE,      /* data parallel's gradient mean: NCCL, a copy with one rank, else the host (cuda_comm.c) */
} how;

/* How a kernel runs, in profiles and --cuda-sync's messages. */
static inline const char *how_name(how h)
{
    static const char *const names[] = {"jit", "view", "gemm", "library", "fallback", "fallback", "-", "conv", "multi", "allreduce"};
    return names[h];
}

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

/* cuBLASLt (cuda_gemm.c) */
typedef struct cuda_lt {
    tf_cublaslt_handle handle;
    bool ok;
    char why[1200];
    int relu_probe;             /* cuBLASLt's ReLU mask against blas.h's reading: 0 not probed, 1 the same, -1 not */
    char relu_probe_why[400];
} cuda_lt;

/* cuDNN (cuda_conv.c) */
typedef struct cuda_dnn {
    tf_cudnn_handle handle;
    bool ok;
    char why[1200];
    tf_cu_deviceptr ws, ws_own;   /* the convolutions' workspace: cuBLASLt's, or its own block */
    size_t ws_bytes;
    tf_cu_deviceptr find_ws;    /* cudnnFind*Ex's scratch while the session starts */
    size_t find_ws_bytes, ws_limit;
    bool ws_limited;
} cuda_dnn;

/* CUDA graphs: the step captured on its first run, replayed after (cuda_launch.c) */
typedef struct cuda_graph {
    bool on;
    char why[240];              /* why the step runs kernel by kernel, when it does */
    tf_cu_graph_exec exec;
    int64_t replays;
} cuda_graph;

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
    /* out_at: an output's offset in the pinned buffer, SIZE_MAX for one over
     * TF_CUDA_EAGER_OUTPUT_BYTES, which stays on the device until read
     * (out_fresh: s->out[i] holds the last step's) */
    size_t pinned_bytes, *in_at, *out_at;
    bool *out_fresh;   /* in_at: an input's offset in a slot (and in in_dev) */
    /* asynchronous steps: tf_cuda_run returns once the step is enqueued; tf_cuda_wait waits for it.
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
    double trace_base_us;       /* when that step was enqueued (CLOCK_MONOTONIC), for the timeline */
    int64_t trace_run;          /* ... and which run it was (tf_session_t.trace_run) */
    tf_status failed;           /* a step failed on the GPU: every later call says so (0: none) */
    char failed_msg[2600];
    unsigned char *host;        /* fallback kernels' transfers, grown on demand */
    size_t nhost;
    tf_interp_ctx *ip;          /* initial state, and the fallback kernels' tensors */
    uint64_t rt[2];             /* seed, step */
    cuda_lt lt;
    /* constants written inside a step (a reshape of a number, an update to one): their bytes wait in
     * device memory, filled when the session starts, so that writing them is a device copy */
    tf_cu_deviceptr *kpool;     /* per kernel: the filled constant of a RUN_VIEW of a number, 0: none */
    tf_cu_deviceptr *upool;     /* per update: the filled constant it writes, 0: none */
    cuda_graph graph;
    cuda_dnn dnn;
    /* behaviour */
    bool tf32, sync_each, fallback_all;
    bool profile;
    tf_cu_event *ev;            /* two per kernel while profiling */
    double jit_ms;
    int emu_hits, emu_compiled;   /* cuda-emu: host objects its start found in the disk cache, and compiled */
    struct cuda_comm *comm;     /* the allreduce kernels' buckets and NCCL communicator (cuda_comm.c), NULL: none yet */
} cuda_session;

/* ---- helpers every part uses ------------------------------------------------- */

/* snprintf("%s") without the truncation warnings: messages are cut on purpose. */
static inline void set_text(char *dst, size_t n, const char *src)
{
    size_t len = strlen(src);
    if (len >= n) len = n - 1;
    memcpy(dst, src, len);
    dst[len] = 0;
}

static inline size_t value_bytes(const tf_value *v) { return (size_t)tf_type_numel(&v->type) * (size_t)tf_dtype_bytes(v->type.dtype); }
static inline int64_t numel(const tf_value *v) { return tf_type_numel(&v->type); }
static inline size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* The value whose storage v uses: through views (ops.c). */
static inline const tf_value *root_of(const tf_value *v) { return tf_value_storage(v); }

static inline tf_cu_deviceptr dev_of(const cuda_session *c, const tf_value *v) { return v->kind == TF_VAL_CONST ? 0 : c->ptr[root_of(v)->id]; }

/* An allocation of the session (bytes > 0) or its release (< 0). */
static inline void dev_count(cuda_session *c, int64_t bytes) { c->dev_bytes = (size_t)((int64_t)c->dev_bytes + bytes); }

/* conv2d and its two gradients: what cuDNN runs. */
static inline bool is_conv(tf_op op) { return tf_op_exec_of(op) == TF_OPX_CONV; }

/* A failed CUDA call (c->err holds its words) as the session's error. */
static inline tf_status cu_fail(tf_session_t *s, cuda_session *c, tf_cu_result r, const char *what)
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

/* ---- cuda_mem.c: device memory ------------------------------------------------ */

/* Every value placed, then the arena, the state block and the pinned staging allocated (out of memory says what to do). */
tf_status tf_cuda_allocate(tf_session_t *s, cuda_session *c);
/* The params and buffers' initial values (the interpreter's, with the session's seed) onto the device. */
tf_status tf_cuda_initial_state(tf_session_t *s, cuda_session *c);
/* The constants a step writes, filled once into their device copies. */
tf_status tf_cuda_fill_pools(tf_session_t *s, cuda_session *c);

/* ---- cuda_build.c: the kernels ------------------------------------------------ */

/* How each kernel runs (c->ks), its code compiled, its launch parameters bound. */
tf_status tf_cuda_build_kernels(tf_session_t *s, cuda_session *c);

/* ---- cuda_gemm.c: matmuls through cuBLASLt --------------------------------------- */

/* What a GEMM region's epilogue hands to cuBLASLt (cuda_gemm.c says what can be). */
typedef struct epi_plan {
    tf_gemm_epilogue kind;
    int bias_buf, d_buf;        /* kernel buffers: the bias, and where the product goes */
    tf_kernel *rest;            /* the epilogue kernel left (NULL: none), owning exprs and stores */
    bool gelu;                  /* the rest applies a gelu to the biased product (which cuBLASLt's GELU is not) */
    /* plan_backward's: device addresses, in place of the buffers (0: the buffers') */
    tf_cu_deviceptr bias_dev, d_dev, aux_dev;
} epi_plan;

/* cuBLASLt opened when the plan has a matmul (c->lt; its absence is no error). */
void tf_cuda_open_cublaslt(cuda_session *c);
/* Kernel gk's matmul, and its region's bias (and ReLU) as the epilogue where cuBLASLt can take it. */
tf_status tf_cuda_plan_matmul(tf_session_t *s, cuda_session *c, gkernel *gk, const tf_kernel **ek, bool *done);
/* Kernel gk's matmul planned with epilogue ep (NULL: none); false with the reason in gk->why. */
bool tf_cuda_gemm_setup(cuda_session *c, gkernel *gk, const epi_plan *ep, bool *oom_out);
/* Kernel gk's matmul onto the stream. */
tf_status tf_cuda_run_gemm(tf_session_t *s, cuda_session *c, gkernel *gk);
/* false (with why) when kernel k's region is not a bias add (and ReLU) cuBLASLt can do. */
bool tf_cuda_plan_epilogue(const tf_kernel *k, epi_plan *e, bool *oom, char *why, size_t n);
/* What an epi_plan's rest owns, and the rest itself. */
void tf_cuda_epi_free(tf_kernel *rest);
/* A planned matmul's cuBLASLt plan, offsets and owned device memory. */
void tf_cuda_gemm_call_free(cuda_session *c, gemm_call *mm);
/* k's load x reads buffer buf row-major over the kernel's whole space. */
bool tf_cuda_row_major_load(const tf_kernel *k, const tf_kexpr *x, int buf);
/* --cuda-explain: the cuBLASLt algorithm each GEMM got. */
void tf_cuda_explain_gemms(FILE *f, const cuda_session *c);

/* ---- cuda_gemm_backward.c: backward epilogues ------------------------------------- */

/* Bias gradients and ReLU's backward handed to the GEMMs where they provably match; false only for out of memory. */
bool tf_cuda_plan_backward(tf_session_t *s, cuda_session *c);

/* ---- cuda_conv.c: convolutions through cuDNN --------------------------------------- */

/* cuDNN opened when the plan has a convolution (c->dnn; its absence is no error). */
void tf_cuda_open_cudnn(cuda_session *c);
/* Kernel gk's convolution planned; false with the reason in gk->why. */
bool tf_cuda_conv_setup(cuda_session *c, gkernel *gk, bool *oom_out);
/* Find's scratch released, and the workspace the chosen algorithms need set up. */
tf_status tf_cuda_conv_workspace(tf_session_t *s, cuda_session *c);
/* Kernel gk's convolution onto the stream. */
tf_status tf_cuda_run_conv(tf_session_t *s, cuda_session *c, gkernel *gk);
/* A planned convolution's descriptors, and the plan itself (NULL: nothing). */
void tf_cuda_conv_free(cuda_session *c, tf_conv *cv);
/* --cuda-explain: the algorithm each convolution got, and from where. */
void tf_cuda_explain_convs(FILE *f, const cuda_session *c);

/* ---- cuda_launch.c: running a step -------------------------------------------------- */

/* Where computed ids are checked, and whether a step runs as one graph (or why not). */
void tf_cuda_plan_steps(tf_session_t *s, cuda_session *c);
/* tf_backend.run: a step enqueued, not waited for. */
tf_status tf_cuda_run(tf_session_t *s);
/* tf_backend.wait: the last step waited for, its outputs and profile read. */
tf_status tf_cuda_wait(tf_session_t *s);
/* Outputs up to this size ride back with the step (in its graph, to pinned
 * memory); larger ones stay on the device until read (tf_cuda_output_fetch). */
#define TF_CUDA_EAGER_OUTPUT_BYTES ((size_t)1 << 20)
tf_status tf_cuda_output_fetch(tf_session_t *s, int i);

/* ---- cuda_comm.c: data parallel's gradient means ---- */
/* For s->comm, before a step is enqueued or captured: NCCL's communicator
 * and the buckets, once per communicator (a graph captured for another one
 * is dropped, and tf_cuda_plan_steps decides again). */
tf_status tf_cuda_comm_prepare(tf_session_t *s, cuda_session *c);
/* Whether RUN_ALLREDUCE kernels run on the host (several ranks, no NCCL). */
bool tf_cuda_comm_on_host(const tf_session_t *s, const cuda_session *c);
/* RUN_ALLREDUCE kernel i, on the GPU: a copy with one rank, else its
 * operand packed into its bucket, the bucket averaged by NCCL on the
 * communication stream once its last member is in. */
tf_status tf_cuda_run_allreduce(tf_session_t *s, cuda_session *c, int i);
/* Before kernel i: the buckets whose means it reads, waited for and unpacked. */
tf_status tf_cuda_comm_before(tf_session_t *s, cuda_session *c, int i);
/* After the step's kernels, before its updates: every bucket unpacked. */
tf_status tf_cuda_comm_finish(tf_session_t *s, cuda_session *c);
/* Wait for event e on the host; with NCCL, polling, so that a rank that
 * died or hangs ends the wait after TFUSE_COMM_TIMEOUT: TF_CUDA_COMM_FAILED,
 * c->err the reason (NCCL's communicator aborted). */
tf_cu_result tf_cuda_comm_sync(tf_session_t *s, cuda_session *c, tf_cu_event e);
/* --cuda-explain's line, and the release. */
void tf_cuda_comm_explain(FILE *f, const tf_session_t *s, const cuda_session *c);
const char *tf_cuda_comm_why(const cuda_session *c);   /* why not NCCL, "" when it is */
/* A step enqueued: its bytes averaged through NCCL into the communicator's totals. */
void tf_cuda_comm_count(tf_session_t *s, const cuda_session *c);
void tf_cuda_comm_free(cuda_session *c);

#endif
