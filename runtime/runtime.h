/* runtime.h — what libtfuse's implementation files share: the structures
 * behind the public handles, element conversion and the backend interface.
 *
 * A backend (interp, cpu, cuda) is a struct of function pointers, peers
 * behind one narrow interface (ggml's backend interface is the model).
 * `unavailable` says, before anything is created, why a target cannot run
 * here; no backend silently falls back to another. */
#ifndef TF_RUNTIME_H
#define TF_RUNTIME_H

#include <pthread.h>
#include <stdio.h>
#include <stdbool.h>

#include "../include/tfuse.h"
#include "kernel.h"
#include "ops.h"
#include "passes.h"
#include "package.h"
#include "tensorio.h"

/* A compiled-kernel cache (include/tfuse.h): shared by the contexts that
 * hold it and the sessions that started with it; mu guards everything
 * here and what backends keep in it. */
struct tf_cache {
    pthread_mutex_t mu;
    int refs;               /* its creator's (until tf_cache_free), contexts', sessions' */
    int limit;              /* kernels no session holds that stay */
    const char *limit_from; /* "default", "env TFUSE_JIT_CACHE_KERNELS", "set" */
    int kernels, unused;    /* held, and of them held by no session */
    int64_t evicted;
    void *cpu;              /* the cpu backend's JIT and its kernels (runtime/cpu/cpu_jit.c) */
};
/* A reference for a session (or context); tf_cache_release drops one. */
void tf_cache_retain(tf_cache_t *c);
void tf_cache_release(tf_cache_t *c);

struct tf_context {
    char err[6400];
    tf_allocator alloc;     /* every allocation of a call on this context (ir/alloc.h) */
    tf_cache_t *cache;      /* its own, or one attached with tf_context_set_cache */
    FILE *diag;             /* the targets' explanations and warnings (tf_context_set_diagnostics); NULL: stderr */
};

/* Where the targets write their explanations (--cpu-explain,
 * --cuda-explain) and warnings for this context: never straight to stderr. */
FILE *tf_context_diag(const tf_context_t *ctx);

/* The context's allocator, or the C library's for NULL. */
tf_allocator tf_context_allocator(const tf_context_t *ctx);

/* Settings of the targets (include/tfuse_settings.def), from
 * tf_compile_options (the environment gives their defaults in
 * tf_compile_options_init); a program keeps a copy: a BOOL as a bool, a STR
 * as an owned string (NULL: the target's own default). */
#define TF_SETTING_PTYPE_BOOL bool
#define TF_SETTING_PTYPE_STR char *
typedef struct tf_target_settings {
#define TF_SETTING(NAME, TYPE, TARGET, ENV, ENV_ON, FLAG, ON, OFF, HELP) TF_SETTING_PTYPE_##TYPE NAME;
#include "../include/tfuse_settings.def"
#undef TF_SETTING
} tf_target_settings;

/* The settings table (settings.c): each row's description and where its
 * value lives in tf_compile_options and in tf_target_settings. */
typedef struct tf_setting_row {
    tf_setting_desc d;
    bool is_str;
    size_t opt_off, prog_off;
} tf_setting_row;
extern const tf_setting_row tf_settings[];
extern const size_t tf_nsettings;
static inline int *tf_setting_bool(tf_compile_options *o, const tf_setting_row *r) { return (int *)((char *)o + r->opt_off); }
static inline const char **tf_setting_str(tf_compile_options *o, const tf_setting_row *r)
{
    return (const char **)((char *)o + r->opt_off);
}
/* Each setting's default from its environment variable (the only read). */
void tf_settings_from_env(tf_compile_options *o);
/* The program's copy of o's settings; false when out of memory. */
bool tf_settings_copy(tf_target_settings *dst, const tf_compile_options *o);
void tf_settings_free(tf_target_settings *s);
/* "setting NAME: VALUE (FROM)" for each, FROM "default", "env VAR=VALUE" or "option". */
void tf_settings_doctor(const tf_compile_options *o, tf_strbuf *t);

/* Initial values for a model's params and buffers that come with it (an
 * ONNX model's initializers): shared by the model and the programs compiled
 * from it, and applied when a session starts in place of the initializers
 * (as a package's state is). */
typedef struct tf_init_state {
    int refs;
    char *source;           /* where they came from, for messages: "model.onnx" */
    tio_tensor *ts;         /* owned */
    size_t n;
} tf_init_state;
tf_init_state *tf_init_state_retain(tf_init_state *s);
void tf_init_state_release(tf_init_state *s);

struct tf_model {
    tf_module *m;
    int auto_dim;           /* index of a --dim NAME=auto, or -1 */
    tf_init_state *init;    /* NULL: the initializers */
};

/* An ONNX model (runtime/onnx_import.c) as a model whose init holds its
 * initializers. */
tf_status tf_onnx_load_model(tf_context_t *ctx, const char *path, const tf_dim_override *dims, size_t ndims, tf_model_t **out);

typedef struct tf_stat_entry { const char *name; int64_t value; } tf_stat_entry;

struct tf_program {
    tf_module *m;           /* after every pass; owned */
    tf_ir_mode mode;
    tf_target target;
    tf_stat_entry stats[24];   /* api.c adds at most 19: room to grow without dropping one */
    int nstats;
    tf_vec inputs, params, buffers;   /* tf_value*, in declaration order */
    int threads;            /* tf_compile_options.threads */
    /* The kernel plan (codegen/kernel.h), built once by tf_program_compile;
     * the cpu and cuda backends' sessions and artifacts run this one. When
     * building it failed for a program compiled for interp (which runs no
     * plan), plan_diag says why and has_plan is false. */
    tf_kernel_plan plan;
    bool has_plan;
    tf_diag plan_diag;
    tf_target_settings settings;
    tf_precision precision; /* what it was compiled in (never DEFAULT) */
    /* For tf_program_save: the model as compiled (canonical text, dims
     * applied) and the options that matter to the result; owned. */
    char *model_text, *model_name;
    tf_compile_options opts;     /* strings and arrays not kept: see api.c's package_manifest */
    char **disabled;             /* opts.disable_passes, owned */
    int ndisabled;
    /* A program loaded from a package: its sections (the backend links the
     * package's object code instead of compiling) and its initial state; owned. */
    tf_pkg *pkg;
    tf_init_state *init;         /* the model's initial state (not a package's), shared */
    bool from_final;             /* its module was read back from the package's final IR: no pass ran */
};

typedef struct tf_backend tf_backend;

struct tf_session {
    tf_context_t *ctx;
    const tf_program_t *p;
    const tf_backend *be;
    void *impl;             /* the backend's state */
    uint64_t seed;
    const void **bound;     /* per program input: caller memory, or NULL */
    void **out;             /* per module output: host buffer in storage dtype */
    char *missing;          /* params the last load_state file lacked, ", "-separated; NULL if none */
    bool state_given;       /* the program's package gives every param and buffer right after session_create
                             * (api.c): a backend may skip the initializers */
    tf_comm_t *comm;        /* tf_session_set_comm's: the ranks allreduce averages over; NULL: one rank */
    int64_t init_elements;  /* elements the cpu backend's initializers drew (zeros() draws none; 0 when
                             * state_given); what tests check a package's session by */
    /* tf_session_set_tracing's timeline (trace.c): backends add their kernel calls with tf_trace_add */
    bool tracing;
    int64_t trace_run;      /* the run being enqueued (tf_session_run counts them while tracing) */
    tf_trace_event *trace;
    size_t ntrace, cap_trace;
    uint64_t trace_dropped;
};

/* One kernel call into s's timeline (when tracing; a no-op otherwise). */
void tf_trace_add(tf_session_t *s, size_t kernel, double start_us, double dur_us, int64_t run, int lane);

struct tf_backend {
    const char *name;
    /* NULL when the target can run on this machine, else why not. */
    const char *(*unavailable)(void);
    /* Set up s->impl: allocate state, run initializers with s->seed. */
    tf_status (*session_create)(tf_session_t *s);
    void (*session_free)(tf_session_t *s);
    /* One step over the bound inputs; fills s->out[i] (storage dtype), or,
     * with `wait`, enqueues it (having copied the bound inputs) and returns. */
    tf_status (*run)(tf_session_t *s);
    /* Optional (NULL: run finishes its step): wait for the step run enqueued,
     * fill s->out[i] and the profiles, and return the error the step met on
     * the device. api.c calls it before anything that reads results. */
    tf_status (*wait)(tf_session_t *s);
    /* Optional (NULL: wait filled every s->out[i]): fill s->out[i] with the
     * output of the step wait returned for, where wait left it on the
     * device (cuda: outputs over TF_CUDA_EAGER_OUTPUT_BYTES, copied only
     * when read). api.c calls it after wait, before handing s->out[i] out. */
    tf_status (*output_fetch)(tf_session_t *s, int i);
    /* Copy a param/buffer out of / into the session (storage dtype). */
    tf_status (*state_read)(tf_session_t *s, const tf_value *v, void *dst);
    tf_status (*state_write)(tf_session_t *s, const tf_value *v, const void *src);
    /* The run counter (runs so far; it drives dropout masks), and setting it
     * so that a resumed run draws the masks the uninterrupted one would. */
    uint64_t (*step_get)(tf_session_t *s);
    void (*step_set)(tf_session_t *s, uint64_t step);
    /* The seed dropout draws from from now on (initial state is drawn at
     * session_create with s->seed and stays): a data-parallel rank's own. */
    void (*dropout_seed_set)(tf_session_t *s, uint64_t seed);
    /* Optional (NULL: none): per-kernel profiles and the session's facts. */
    void (*set_profiling)(tf_session_t *s, bool on);
    size_t (*profile_count)(tf_session_t *s);
    void (*profile_get)(tf_session_t *s, size_t i, tf_kernel_profile *out);
    void (*info)(tf_session_t *s, tf_session_info *out);
    /* Optional (NULL: TF_ERR_UNSUPPORTED): a plain copy's bandwidth in the
     * session's memory, GB/s of bytes read plus written (tf_session_copy_bandwidth). */
    tf_status (*copy_bandwidth)(tf_session_t *s, double *gbps);

    /* What the backend can describe, dump or write, without a session. */
    /* Optional: its lines of `tfuse doctor` (cpu: the GEMM library and the
     * thread count; cuda: the libraries found or why not, and the GPUs). */
    void (*doctor)(tf_strbuf *out);
    /* Optional (NULL: the target writes no code): the program's compiled
     * code for this target into dir (which exists), for
     * tf_program_write_artifact; *info: binaries written (cuda: cubins
     * for arch, NULL: its default), compiled now and from the disk cache. */
    tf_status (*write_artifact)(tf_context_t *ctx, const tf_program_t *p, const char *dir, const char *arch,
                                tf_artifact_info *info);
    /* Optional (NULL: nothing to add): the compiled code of every kernel of
     * p as sections of a package (cpu: "cpu/target", the target the code is
     * for, and "cpu/SYM.o" per kernel; cuda: cubins for each architecture
     * of archs, "sm_80,sm_90"); *nobjects of them, *cached of those taken
     * from the disk cache rather than compiled now. */
    tf_status (*package_code)(tf_context_t *ctx, const tf_program_t *p, const char *archs, tf_pkg *pkg, int *nobjects, int *cached);
    /* Optional: whether a loaded package's code runs here: an error (with
     * the package's path) that says what it was built for and what this
     * machine is. */
    tf_status (*package_check)(tf_context_t *ctx, const tf_pkg *pkg, const char *path);
    /* Optional: the generated code of every kernel as text into dir (cpu:
     * kernels.ll, the optimized LLVM IR, for --dump-llvm). */
    tf_status (*dump_code)(tf_context_t *ctx, const tf_program_t *p, const char *dir);
    /* Whether the backend runs core op `op` and how: "interp", "jit",
     * "library", "view", "fallback" (the interpreter's kernel on the host);
     * NULL when it cannot. detail[n] says how or why not. */
    const char *(*op_support)(tf_op op, char *detail, size_t n);
    /* Optional: what the backend keeps in a cache. trim: give back the code
     * of kernels no session holds until at most c->limit remain (under
     * c->mu); cache_free: free it all (no session holds any). */
    void (*cache_trim)(tf_cache_t *c);
    void (*cache_free)(tf_cache_t *c);
};

extern const tf_backend tf_backend_interp, tf_backend_cpu, tf_backend_cuda, tf_backend_cuda_emu;
/* The backend of a target (context.c); NULL for one this build lacks. */
const tf_backend *tf_backend_for(tf_target t);

/* ---- what backends call back into: context.c and convert.c, never api.c ---- */

/* Set the context's message; returns st. */
tf_status tf_set_error(tf_context_t *ctx, tf_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Carry an IR diagnostic into the context. */
tf_status tf_from_diag(tf_context_t *ctx, const tf_diag *d);
/* The median of v[0..n) (n > 0; the upper one of an even count), sorting v
 * in place: a timing's figure (tf_session_copy_bandwidth). */
double tf_median(double *v, int n);

/* The program's kernel plan, or the reason it has none (into ctx). */
tf_status tf_program_plan(tf_context_t *ctx, const tf_program_t *p, const tf_kernel_plan **out);

/* How the kernel plan treats a core op (codegen/kernel.c), for backends'
 * op_support: a layer op (`lower` rewrites it first), a view (reshape), a
 * generated kernel (pointwise, reduction, layout copy) or a library call
 * (matmul, conv2d, pooling, gather, concat, ...). For TF_OPC_CODE, *probe
 * becomes a one-op f32 kernel (using x and r) an emitter's supports() can
 * judge. */
typedef enum tf_op_class { TF_OPC_LAYER, TF_OPC_VIEW, TF_OPC_CODE, TF_OPC_LIBRARY } tf_op_class;
tf_op_class tf_op_classify(tf_op op, tf_kernel *probe, tf_kexpr *x, tf_kreduce *r);
/* A code-generating backend's op_support for what the kernel plan decides:
 * a layer op (NULL), a view (`view`, described by `alias`), or generated
 * code judged by supports() ("jit", described by `compiled`, or
 * "fallback", by `fallback` and the reason). For a library op it returns
 * NULL with *library set: the backend describes its own library calls. */
const char *tf_op_support_plan(tf_op op, bool (*supports)(const tf_kernel *, char *, size_t), const char *alias,
                               const char *compiled, const char *fallback, char *detail, size_t n, bool *library);
/* training.c: the public precision as the passes take it (*set false for
 * TF_PRECISION_DEFAULT: the train block's); false for a value out of range.
 * And back. */
bool tf_ir_precision_of(tf_precision p, bool *set, tf_ir_precision *out);
tf_precision tf_precision_of_ir(tf_ir_precision p);
/* api.c: a program whose module m is final already (read back from a
 * package's final IR): everything tf_program_compile does after the passes,
 * no pass. Takes m and model_text (the model as compiled, for
 * tf_program_save and tf_program_model), also on failure. opts: mode,
 * target, threads and the target settings; auto_dim (or NULL) the dim
 * --dim NAME=auto chose, with its value. */
tf_status tf_program_from_final(tf_context_t *ctx, tf_module *m, char *model_text, const tf_compile_options *opts, const char *auto_dim,
                                int64_t chosen, tf_program_t **out);
/* api.c: tf_session_save_state_meta, leaving out the params and buffers
 * whose initializer is zeros() when skip_zero_init (a package's initial
 * state: a session starts those at zero without being given them). */
tf_status tf_session_save_state_ex(tf_session_t *s, const char *path, const char *metadata_json_object, bool skip_zero_init);

#endif
