/* tfuse.h — the public C API of libtfuse, the only header a host program includes.
 *
 * tfuse compiles a model written in its text format (see docs/ir.md) and runs
 * it on a target: `interp` (the float64 reference interpreter), `cpu`
 * (LLVM JIT + OpenBLAS) or `cuda` (NVRTC + cuBLASLt/cuDNN). The objects:
 *
 *   tf_context_t   error state, settings and the allocator every call on it
 *                  uses (tf_context_create_with_allocator); one per thread of use
 *   tf_cache_t     compiled kernels, kept for reuse; one per context unless shared
 *   tf_model_t     a parsed, verified module (the IR)
 *   tf_program_t   a compiled model: passes run, plan made, stats known
 *   tf_session_t   a program on a target: state (params, buffers) + bindings
 *   tf_array_t     a host tensor owned by tfuse (loaded .npy, say)
 *   tf_loader_t    batches of .npy data for a program's inputs, gathered by
 *                  worker threads, shuffled per epoch, resumable
 *
 * Ownership is explicit: every *_create/_parse/_compile/_load has one *_free;
 * a child holds no reference on its parent, so free children first. Every
 * call returns tf_status; on failure tf_context_last_error() says why (for
 * bad input, as "file:line:col: error: ..."). Nothing here exits or aborts.
 *
 *   tf_context_t *ctx; tf_model_t *m; tf_program_t *p; tf_session_t *s;
 *   tf_context_create(&ctx);
 *   if (tf_model_parse_file(ctx, "mlp.ir", NULL, 0, &m)) { puts(tf_context_last_error(ctx)); ... }
 *   tf_compile_options o; tf_compile_options_init(&o); o.mode = TF_MODE_INFER;
 *   tf_program_compile(ctx, m, &o, &p);
 *   tf_session_create(ctx, p, tf_default_target(), 42, &s);
 *   int64_t shape[2] = {64, 784};
 *   tf_session_bind(s, "x", TF_DTYPE_F32, shape, 2, x_data);   // no copy: x_data must outlive run
 *   tf_session_run(s);
 *   tf_tensor_view out; tf_session_output(s, "logits", &out);   // valid until the next run
 *   tf_session_free(s); tf_program_free(p); tf_model_free(m); tf_context_free(ctx);
 *
 * Training (what `tfuse train` does, cli/train.c): compile in TF_MODE_TRAIN
 * (each run is a whole step), feed it batches from a tf_loader_t, save with
 * tf_session_save_state_meta and the loader's position as metadata:
 *
 *   tf_data_source src[] = {{"x", "x.npy"}, {"y", "y.npy"}};
 *   tf_loader_t *L; tf_loader_create(ctx, p, src, 2, NULL, &L);   // shuffled, seed 0, 2 threads
 *   for (int k = 0; k < steps; k++) { tf_loader_next(L, s, NULL); tf_session_run(s); }
 *   tf_loader_free(L);
 */
#ifndef TFUSE_H
#define TFUSE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TFUSE_VERSION "0.1.0"

typedef enum tf_status {
    TF_OK = 0,
    TF_ERR_INVALID_ARG,     /* a NULL, unknown name, wrong dtype/shape given to the API */
    TF_ERR_PARSE,           /* the model text is malformed */
    TF_ERR_VERIFY,          /* well-formed text, ill-typed or ill-shaped model */
    TF_ERR_LIMIT,           /* sizes beyond what tfuse accepts */
    TF_ERR_IO,              /* a file could not be read or written */
    TF_ERR_FORMAT,          /* a .npy/.safetensors file is malformed */
    TF_ERR_OOM,
    TF_ERR_UNAVAILABLE,     /* the target cannot run here (no GPU, built without LLVM) */
    TF_ERR_UNSUPPORTED,     /* a feature that is not built yet, named in the message */
    TF_ERR_RUNTIME,         /* running failed: bad index in the data, missing input */
    TF_ERR_INTERNAL,
} tf_status;

typedef enum tf_dtype {
    TF_DTYPE_F32, TF_DTYPE_F16, TF_DTYPE_BF16, TF_DTYPE_F64,
    TF_DTYPE_I64, TF_DTYPE_I32, TF_DTYPE_BOOL,
} tf_dtype;

/* TF_TARGET_CUDA_EMU: the cuda target's code with its generated CUDA C run
 * on the host (every thread of every block, stand-ins for the driver,
 * cuBLASLt and cuDNN): slow and exact, for debugging without a GPU. */
typedef enum tf_target { TF_TARGET_INTERP, TF_TARGET_CPU, TF_TARGET_CUDA, TF_TARGET_CUDA_EMU } tf_target;
typedef enum tf_mode { TF_MODE_TRAIN, TF_MODE_INFER } tf_mode;
/* The precision a program computes in: fp32, or 16-bit activations with f32
 * params (`amp`; in train mode fp16 adds dynamic loss scaling).
 * TF_PRECISION_DEFAULT, as a compile option, keeps the train block's (fp32
 * when the model has none or it names none). */
typedef enum tf_precision {
    TF_PRECISION_DEFAULT, TF_PRECISION_FP32, TF_PRECISION_FP16, TF_PRECISION_BF16,
} tf_precision;
/* Activation checkpointing: TF_CHECKPOINT_AUTO recomputes cheap forward
 * values in the backward pass until the step plans within
 * tf_compile_options.memory_budget. */
typedef enum tf_checkpoint { TF_CHECKPOINT_NONE, TF_CHECKPOINT_AUTO } tf_checkpoint;

typedef struct tf_context tf_context_t;
typedef struct tf_model   tf_model_t;
typedef struct tf_program tf_program_t;
typedef struct tf_session tf_session_t;
typedef struct tf_array   tf_array_t;
typedef struct tf_cache   tf_cache_t;

/* A view of tensor memory owned by someone else. */
typedef struct tf_tensor_view {
    tf_dtype dtype;
    int rank;
    int64_t shape[8];
    void *data;              /* row-major, contiguous */
} tf_tensor_view;

/* value TF_DIM_AUTO: compiling picks the largest value whose planned peak
 * memory fits tf_compile_options.memory_limit (one auto dim per model). */
typedef struct tf_dim_override { const char *name; int64_t value; } tf_dim_override;
#define TF_DIM_AUTO ((int64_t)-1)

/* ---- context ---- */
tf_status   tf_context_create(tf_context_t **out);
/* An embedder's allocator, as Lua's lua_Alloc: ptr NULL and nsize > 0:
 * allocate nsize bytes; nsize 0: free ptr, a block of osize bytes, and
 * return NULL; otherwise resize ptr from osize to nsize bytes (keeping it
 * untouched on failure), aligned as malloc aligns (16 bytes on x86-64 and
 * arm64). Return NULL when an allocation or resize fails:
 * the call that needed it returns TF_ERR_OOM with nothing leaked and the
 * context still usable. Every allocation libtfuse makes during a call on
 * this context, or on the models, programs and sessions made with it, goes
 * through fn (blocks are freed through the allocator that made them), except
 * what LLVM, OpenBLAS and the CUDA libraries allocate for themselves and the
 * strings tfuse hands to the caller to free() (tf_model_print, ...), which
 * come from malloc, and what tfuse's own worker threads (the cpu target's
 * pool, the loader's gatherers) allocate while they work. fn is called from the thread making the call; it must
 * be thread-safe if the context's objects are used from several threads.
 * fn NULL: the C library's (tf_context_create). */
typedef void *(*tf_alloc_fn)(void *ud, void *ptr, size_t osize, size_t nsize);
tf_status   tf_context_create_with_allocator(tf_alloc_fn fn, void *ud, tf_context_t **out);
void        tf_context_free(tf_context_t *ctx);
const char *tf_context_last_error(const tf_context_t *ctx);   /* "" if none */
/* Where the targets write what they explain (the cpu_explain and
 * cuda_explain settings) and their warnings, for sessions of this context:
 * stderr by default (and for NULL). The library writes nothing to stderr
 * but through this. */
void        tf_context_set_diagnostics(tf_context_t *ctx, FILE *out);
const char *tf_status_name(tf_status s);
/* The library's version, "MAJOR.MINOR.PATCH": TFUSE_VERSION as libtfuse was
 * built. A program that loads libtfuse at run time (the Python package, over
 * ctypes, mirrors this header's structs) checks it against the header it was
 * written for. */
const char *tf_version(void);
/* The layout of a public struct as this library was built: its size
 * (field NULL) or a field's offset, for "tf_compile_options",
 * "tf_session_info", "tf_train_config", "tf_kernel_profile",
 * "tf_cache_info" and "tf_package_info"; (size_t)-1 for a name it does not
 * have. A binding that mirrors these structs (the Python package) checks
 * every field against it, so a field added on one side is found at once. */
size_t tf_struct_layout(const char *name, const char *field);

/* ---- compiled-kernel caches ----
 * The cpu target's JIT-compiled kernels are kept in a cache, keyed by what
 * the kernel computes (and the LLVM pipeline), so a second session of the
 * same kernels compiles nothing (tf_session_info.jit_cached). Every context
 * creates its own; contexts may share one (a server's per-thread contexts,
 * say): tf_context_set_cache. A cache is thread-safe: a mutex guards it (a
 * compile holds it), so contexts on different threads may share it. It
 * keeps every kernel a live session runs and, of the kernels no session
 * holds, the `limit` most recently used; older ones give their code and
 * memory back (every JIT'd kernel costs memory mappings, of which a process
 * has a bounded number). The limit's default is $TFUSE_JIT_CACHE_KERNELS
 * when set (read by tf_cache_create), else 2048.
 * Lifetime: tf_cache_free drops the creator's reference; the cache goes
 * when no context or session holds it any more. */
tf_status   tf_cache_create(tf_cache_t **out);
void        tf_cache_free(tf_cache_t *cache);
/* Kernels no session holds that stay (>= 0); evicts down to it at once. */
tf_status   tf_cache_set_limit(tf_cache_t *cache, int kernels);
typedef struct tf_cache_info {
    int limit;              /* tf_cache_set_limit's, or the default */
    int kernels;            /* compiled kernels held */
    int in_use;             /* of them, run by a live session */
    int64_t evicted;        /* kernels whose code was given back so far */
} tf_cache_info;
tf_status   tf_cache_get_info(tf_cache_t *cache, tf_cache_info *out);
/* The context's cache (its own, or the one attached); owned by the context. */
tf_cache_t *tf_context_cache(tf_context_t *ctx);
/* Sessions created from now on use `cache` (the context takes a reference,
 * so the caller may tf_cache_free its own); NULL: a new cache of the
 * context's own. Sessions already made keep theirs. */
tf_status   tf_context_set_cache(tf_context_t *ctx, tf_cache_t *cache);

/* ---- the compile cache on disk ----
 * What a process compiles is kept on disk for the next one: the cpu
 * target's object code, the cuda target's cubins and its cuBLASLt and
 * cuDNN algorithm choices, cuda-emu's host objects. They live under
 * $TFUSE_CACHE_DIR (default ~/.cache/tfuse) in parts cpu/, cuda/ and
 * cuda-emu/, under one bound: $TFUSE_CACHE_MAX bytes (a number, or one
 * with K, M, G or T, powers of 1024), 2 GiB by default. A write that takes
 * the total past it evicts the least recently used entries (a hit counts
 * as a use) down to 90% of it; a file another process is writing is never
 * removed. tf_session_info.disk_hits/disk_misses say what a session found. */
typedef struct tf_disk_cache_part {
    const char *name;                 /* "cpu", "cuda", "cuda-emu" */
    int64_t entries, bytes;
} tf_disk_cache_part;
typedef struct tf_disk_cache_info {
    char dir[4096];                   /* the cache's directory */
    int64_t max_bytes;                /* the bound */
    const char *max_from;             /* "default" or "env TFUSE_CACHE_MAX" */
    tf_disk_cache_part parts[3];      /* cpu, cuda, cuda-emu */
    int64_t entries, bytes;           /* the parts' sums */
} tf_disk_cache_info;
/* The bound. A malformed $TFUSE_CACHE_MAX is TF_ERR_INVALID_ARG, with the
 * reason (the library's own writes then keep the default bound). */
tf_status tf_disk_cache_max(tf_context_t *ctx, int64_t *max_bytes);
/* The directory, the bound and what each part holds now (it is walked).
 * TF_ERR_UNAVAILABLE without $TFUSE_CACHE_DIR or $HOME; TF_ERR_INVALID_ARG
 * for a malformed $TFUSE_CACHE_MAX. */
tf_status tf_disk_cache_get_info(tf_context_t *ctx, tf_disk_cache_info *out);
/* Remove the entries of one part ("cpu", "cuda" or "cuda-emu"; NULL: of
 * all), and files of killed writers; those of live writers stay.
 * *removed (may be NULL): the directory, the bound, and per part what was
 * removed. Another name is TF_ERR_INVALID_ARG. */
tf_status tf_disk_cache_clear(tf_context_t *ctx, const char *part, tf_disk_cache_info *removed);
const char *tf_dtype_str(tf_dtype t);                      /* "f32", ... */
int         tf_dtype_size(tf_dtype t);                     /* bytes per element */
/* The names of the enums above ("default", "fp32", "fp16", "bf16"; "none",
 * "auto"; "?" for a value out of range), and back: parsing a name that is
 * not one of them is TF_ERR_INVALID_ARG, and *out is left as it was. */
const char *tf_precision_name(tf_precision p);
tf_status   tf_precision_parse(const char *name, tf_precision *out);
const char *tf_checkpoint_name(tf_checkpoint c);
tf_status   tf_checkpoint_parse(const char *name, tf_checkpoint *out);

/* ---- models ---- */
/* Parse and verify. `dims` override `dim` declarations by name (an unknown
 * name is an error). */
tf_status tf_model_parse_file(tf_context_t *ctx, const char *path,
                              const tf_dim_override *dims, size_t ndims, tf_model_t **out);
tf_status tf_model_parse_string(tf_context_t *ctx, const char *name_for_errors,
                                const char *text, size_t len,
                                const tf_dim_override *dims, size_t ndims, tf_model_t **out);
void      tf_model_free(tf_model_t *m);
/* An ONNX model (docs/onnx.md) as tfuse's text: *ir_text (malloc'd, the
 * caller free()s it), and its initializers' values written as safetensors
 * at params_path (NULL: not written; nothing is written for a model with
 * none). `dims` give its named dims (dim_param) values; each defaults to 1.
 * TF_ERR_FORMAT for a malformed file, TF_ERR_UNSUPPORTED for a node tfuse
 * cannot import (the message names the node, its op and the opset). */
tf_status tf_onnx_import(tf_context_t *ctx, const char *onnx_path, const tf_dim_override *dims, size_t ndims,
                         char **ir_text, const char *params_path);
/* Give a model that has no loss one, so that it can be trained (an ONNX
 * inference model above all; docs/onnx.md): loss is
 * "cross_entropy(OUTPUT, LABELS)" (LABELS a new i64 input shaped like the
 * value OUTPUT without its last axis) or "mse_loss(OUTPUT, TARGET)" (TARGET
 * a new input of OUTPUT's type); the model gets `output loss`. optimizer
 * ("adamw(lr=1e-3)"; NULL: the train block's, else sgd(lr=0.01)) is the
 * train block's optimizer, for a model whose block names none. Either may
 * be NULL. The model is checked again; its initial values stay. */
tf_status tf_model_add_loss(tf_context_t *ctx, tf_model_t *m, const char *loss, const char *optimizer);
/* Canonical text of the model; *out is malloc'd, the caller free()s it. */
tf_status tf_model_print(tf_context_t *ctx, const tf_model_t *m, char **out);
/* Run a comma-separated list of passes on the model in place ("lower,cse"),
 * with the options' mode, precision, explain stream and disabled passes
 * (NULL options: the defaults). The options are declared below. */
struct tf_compile_options;
tf_status tf_model_run_passes(tf_context_t *ctx, tf_model_t *m, const char *passes,
                              const struct tf_compile_options *opts);

/* ---- compiling ---- */
typedef struct tf_compile_options {
    tf_mode   mode;        /* default TF_MODE_TRAIN */
    tf_target target;      /* default tf_default_target() */
    const char *dump_ir;     /* NULL, "all", or a pass name */
    const char *dump_dir;    /* where dumps go; created if missing; default "." */
    int opt_level;           /* 0: only the passes a target needs (--O0); default 1 */
    const char *const *disable_passes;   /* pass names left out of the pipeline */
    size_t ndisable_passes;
    tf_precision precision;  /* default TF_PRECISION_DEFAULT: the train block's; another overrides it */
    FILE *explain;           /* one line per compiler decision, or NULL */
    int64_t memory_limit;    /* bytes, for a TF_DIM_AUTO dim; 0 = none */
    const char *dump_kernels;   /* a directory: kernels.txt, the kernel IR of every kernel; NULL: none */
    tf_checkpoint checkpoint;   /* default TF_CHECKPOINT_NONE; TF_CHECKPOINT_AUTO: recompute forward values
                                 * in the backward pass (cheapest per byte saved first) until the step plans
                                 * within memory_budget */
    int64_t memory_budget;   /* bytes; 0 = none (see memory_budget_percent) */
    double memory_budget_percent;   /* with memory_budget 0: this percentage (0, 100] of the step's planned
                                     * peak without recomputation; 0 = none */
    int threads;             /* cpu target: worker threads, the caller included; 0 = one per CPU the process may run on (its affinity) */
    const char *dump_llvm;   /* a directory: kernels.ll, the optimized LLVM IR of every cpu kernel; NULL: none */
    /* Target settings, one field per row of tfuse_settings.def (installed
     * beside this header), which says what each does, its environment
     * variable and its flag: the program keeps them, and its sessions run by
     * them. tf_compile_options_init takes each default from its environment
     * variable, when set (and only there: nothing reads the environment
     * later); the CLI flag sets it. tf_doctor_options shows each and where
     * it came from; tf_setting_info describes them. A BOOL is an int, 0 or
     * 1; a STR a string, NULL for the target's own default. */
#define TF_SETTING_CTYPE_BOOL int
#define TF_SETTING_CTYPE_STR const char *
#define TF_SETTING(NAME, TYPE, TARGET, ENV, ENV_ON, FLAG, ON, OFF, HELP) TF_SETTING_CTYPE_##TYPE NAME;
#include "tfuse_settings.def"
#undef TF_SETTING
    /* The outputs to compute, by name (`tfuse run --output NAME=FILE`);
     * NULL/0: all of them. The others are dropped before the passes, with
     * every op only they need, and an input that nothing kept reads is no
     * input of the program (a run for `logits` needs no labels). A name that
     * is no output of the model is TF_ERR_INVALID_ARG; train mode must keep
     * `loss`. A program compiled so cannot be saved as a package. */
    const char *const *outputs;
    size_t noutputs;
} tf_compile_options;
void      tf_compile_options_init(tf_compile_options *o);
tf_status tf_program_compile(tf_context_t *ctx, const tf_model_t *m,
                             const tf_compile_options *o, tf_program_t **out);
void      tf_program_free(tf_program_t *p);
/* Counters from compiling, as (name, value) pairs in a fixed order: ops,
 * kernels, fused_regions, casts, params, peak_bytes and arena_bytes (with
 * memplan), the dim --dim K=auto chose, step_flops (two per multiply-add
 * of the step's matmuls and convolutions), with --checkpoint=auto
 * recomputed_ops, recompute_flops and recompute_overhead_permille, inputs,
 * outputs, fused_bytes (the least memory traffic of the step's generated
 * elementwise and reduction kernels, tf_kernel_profile.bytes summed: over a
 * copy's bandwidth, a floor under their time) and kernel_bytes (the same
 * over every kernel: library calls' operands and results and their
 * epilogues too). */
size_t    tf_program_stat_count(const tf_program_t *p);
tf_status tf_program_stat(const tf_program_t *p, size_t i, const char **name, int64_t *value);
/* The compiled module's text (after all passes); *out malloc'd. */
tf_status tf_program_print(tf_context_t *ctx, const tf_program_t *p, char **out);
/* The compiled program as files in dir (created if missing): program.ir
 * (the compiled module) and kernels.txt (its kernel IR); for a program
 * compiled for TF_TARGET_CUDA also cuda/<kernel>.cu, cuda/<kernel>.<arch>.cubin
 * for every generated kernel (NVRTC compiles them; no GPU is needed) and
 * manifest.txt, the launch order. arch: "sm_80", "sm_90", ... (NULL: sm_90).
 * *nbinaries (may be NULL): cubins written. */
/* A compiled program as one file (`tfuse compile` writes `MODEL.tfp`): the
 * model, the options that shaped it, the final IR, the target's compiled
 * code (cpu: object code for this CPU and LLVM) and, with with_params, the
 * initial params and buffers a session of that seed starts from; written
 * atomically. tf_program_load starts from it with no kernel compilation:
 * it checks every checksum, refuses a package made by another tfuse version
 * or for another CPU (saying what it was built for and what this machine
 * is), runs the passes again (milliseconds; the result must hash to the
 * package's final IR) and its sessions link the package's code and start
 * from its params. A cuda program's package holds cubins for each of
 * cuda_archs ("sm_80,sm_90"; NULL: sm_90; NVRTC compiles them, no GPU
 * needed), and a session on a GPU of another architecture is refused,
 * naming both; cuda-emu is not packaged (TF_ERR_UNSUPPORTED). */
typedef struct tf_package_info {
    int objects;          /* kernel binaries in the package (cpu: objects; cuda: cubins, per architecture, each
                           * an NVRTC program holding several kernels) */
    int objects_cached;   /* of those, taken from the disk cache rather than compiled now */
    int has_params;
    int64_t bytes;        /* the file's size */
} tf_package_info;
tf_status tf_program_save(tf_context_t *ctx, const tf_program_t *p, const char *path, int with_params, uint64_t seed,
                          const char *cuda_archs, tf_package_info *info);
tf_status tf_program_load(tf_context_t *ctx, const char *path, tf_program_t **out);
/* Whether path starts like a package (for callers that take either). */
int tf_is_package(const char *path);
/* The model a program was compiled from (a new copy, dims as compiled), to
 * compile it again another way (an evaluation program beside a training
 * one); a package's model for a loaded program. */
tf_status tf_program_model(tf_context_t *ctx, const tf_program_t *p, tf_model_t **out);
/* The cpu target's worker threads for sessions created from now on (the
 * caller included; 0: one per core): tf_compile_options.threads, for a
 * program loaded from a package. Results do not depend on it. */
tf_status tf_program_set_threads(tf_program_t *p, int threads);
/* What a program was compiled for: mode, target and precision (never
 * DEFAULT); any pointer may be NULL. */
tf_status tf_program_describe(const tf_program_t *p, tf_mode *mode, tf_target *target, tf_precision *precision);
tf_status tf_program_write_artifact(tf_context_t *ctx, const tf_program_t *p, const char *dir, const char *arch,
                                    int *nbinaries);
/* The same, saying where the binaries came from: the cubins are taken from
 * the disk cache that sessions share ($TFUSE_CACHE_DIR/cuda, see
 * tf_disk_cache_get_info) where it has them, and those NVRTC compiles are
 * left there, so compiling a model a second time compiles nothing.
 * *info (may be NULL): binaries written (cuda: cubins, each an NVRTC
 * program holding several kernels), the distinct kernels they hold, and
 * of those kernels, compiled now and found in the cache. */
typedef struct tf_artifact_info {
    int binaries, compiled, cached;
    int kernels;
} tf_artifact_info;
tf_status tf_program_write_artifact_info(tf_context_t *ctx, const tf_program_t *p, const char *dir, const char *arch,
                                         tf_artifact_info *info);

/* What this build and this machine can run: version, every target and why
 * one cannot run here, the cpu target's GEMM library and threads, the CUDA
 * libraries found (or not, and where the search looked) and the GPUs.
 * *out malloc'd. */
tf_status tf_doctor(tf_context_t *ctx, char **out);
/* The same, then one line per setting of `o` (NULL: tf_compile_options_init's)
 * and of the context's cache: "setting NAME: VALUE (FROM)", FROM being
 * "default", "env VAR=VALUE" or "option" (set by the caller: a CLI flag). */
tf_status tf_doctor_options(tf_context_t *ctx, const tf_compile_options *o, char **out);

/* The target settings (tfuse_settings.def's rows, in order), for bindings
 * that build tf_compile_options or a command line from them: the field's
 * name, its type ("bool" or "str"), the target that reads it, its
 * environment variable and the value that sets it, its flag, the flag's
 * values (on/off; "" for a flag without one; for a str its placeholder and
 * the word for NULL) and one line of help. Static strings. */
typedef struct tf_setting_desc {
    const char *name, *type, *target, *env, *env_on, *flag, *on, *off, *help;
} tf_setting_desc;
size_t    tf_setting_count(void);
tf_status tf_setting_info(size_t i, tf_setting_desc *out);   /* TF_ERR_INVALID_ARG past the last */

/* How a target runs a core op of the IR (by its name in the text format):
 * *how is "interp" (the reference kernel), "jit" (generated code: fused
 * with its neighbours, or the op's own generated kernel, as the cuda
 * target's pooling, gather and copies), "library" (GEMM, convolution,
 * pooling, gather ...),
 * "view" (an alias of its operand) or "fallback" (the interpreter's kernel
 * on the host, counted in tf_session_info.fallbacks); NULL when the target
 * does not run it (a layer op, which the `lower` pass rewrites into core
 * ops first; a target this build cannot run). detail[n] (may be NULL):
 * how, or why not. An unknown op name is TF_ERR_INVALID_ARG. */
tf_status tf_target_op_support(tf_context_t *ctx, tf_target target, const char *op, const char **how, char *detail,
                               size_t n);

/* Names and types of the program's inputs, outputs and state (params+buffers). */
typedef enum tf_io_kind { TF_IO_INPUT, TF_IO_OUTPUT, TF_IO_PARAM, TF_IO_BUFFER } tf_io_kind;
size_t    tf_program_io_count(const tf_program_t *p, tf_io_kind kind);
tf_status tf_program_io(const tf_program_t *p, tf_io_kind kind, size_t i,
                        const char **name, tf_dtype *dtype, int *rank, int64_t shape[8]);

/* 1 when the model declares input `name` and the program does not read it
 * (nothing the outputs asked for depends on it: Shape(x) of a static x, an
 * output left out); tf_session_bind accepts data for it and ignores it. */
int tf_program_input_unread(const tf_program_t *p, const char *name);
/* For an integer input used as class labels or embedding ids: the exclusive
 * upper bound of its valid values (*upper = 0 when no use constrains it). */
tf_status tf_program_input_bound(const tf_program_t *p, size_t i, int64_t *upper);

/* ---- sessions ---- */
/* The seed drives initializers and dropout: the same seed gives the same run. */
tf_status tf_session_create(tf_context_t *ctx, const tf_program_t *p, tf_target target,
                            uint64_t seed, tf_session_t **out);
void      tf_session_free(tf_session_t *s);
/* Bind caller memory to an input, without copying: it must stay valid and
 * unchanged until the next tf_session_run returns (run copies it; the caller
 * may change it as soon as run returns). dtype and shape must match. */
tf_status tf_session_bind(tf_session_t *s, const char *input, tf_dtype dtype,
                          const int64_t *shape, int rank, const void *data);
/* One step. On the cuda target run is asynchronous: it returns once the
 * step is enqueued on the GPU (the inputs copied), without waiting for it;
 * the first call after it that reads results waits for the step
 * (tf_session_output, get_state/set_state, load/save_state, tf_session_step,
 * set_profiling and tf_session_profile), and an error the GPU met while
 * the step ran is returned by that call (or by the next run when it is
 * already known), after which every call fails with it. Other targets
 * finish the step inside run. */
tf_status tf_session_run(tf_session_t *s);
/* A view of an output after a run; valid until the next run or free. */
tf_status tf_session_output(tf_session_t *s, const char *output, tf_tensor_view *out);
/* Read a param or buffer by its IR name, copying it into out->data, a
 * caller buffer of `capacity` bytes; dtype, rank and shape are filled in.
 * With out->data NULL only dtype, rank and shape are filled in (to size the
 * buffer). A buffer smaller than the tensor is TF_ERR_INVALID_ARG, and
 * nothing is written. set_state writes one, checking dtype and shape. */
tf_status tf_session_get_state(tf_session_t *s, const char *name, tf_tensor_view *out, size_t capacity);
tf_status tf_session_set_state(tf_session_t *s, const char *name, const tf_tensor_view *value);
/* Load params/buffers from a safetensors file (names = IR names; every tensor
 * must match a param or buffer; params the file lacks keep their initial
 * values) and save all of them. Saving is atomic: temp file, fsync, rename.
 * The state a train-mode program adds (optimizer slots "opt.*", the step
 * counter and loss scale "train.*") is skipped by a program that lacks it,
 * so a training checkpoint loads into an inference session. */
tf_status tf_session_load_state(tf_session_t *s, const char *path);
/* After a load: the params the file had no value for (they kept their
 * initial values), as "a, b"; NULL when it had them all. Owned by s. */
const char *tf_session_missing_params(const tf_session_t *s);
tf_status tf_session_save_state(tf_session_t *s, const char *path);
/* The same, with the file's "__metadata__" object (a training checkpoint's
 * step, data position, ...). Saving: metadata_json_object is a JSON object
 * whose values are all strings (the safetensors rule), e.g.
 * {"step":"100","seed":"0"}, or NULL for none; it is written as given.
 * Loading: *metadata_json_out receives that object as compact JSON text,
 * malloc'd (the caller free()s it), or NULL when the file has none or
 * loading fails. tf_session_load_state reads these files too. */
tf_status tf_session_save_state_meta(tf_session_t *s, const char *path, const char *metadata_json_object);
tf_status tf_session_load_state_meta(tf_session_t *s, const char *path, char **metadata_json_out);
/* The session's run counter: how many runs it has done (0 before the first).
 * Dropout masks depend on (seed, salt, step), so a training run resumed from
 * a checkpoint sets the counter to the checkpoint's step and draws the masks
 * the uninterrupted run would have drawn. */
tf_status tf_session_step(tf_session_t *s, uint64_t *step);
tf_status tf_session_set_step(tf_session_t *s, uint64_t step);

/* ---- data parallel (docs/distributed.md) ----
 * A communicator joins the processes of one job, its ranks. A program
 * compiled with tf_compile_options.data_parallel averages every gradient
 * over the ranks inside the step (allreduce ops, in buckets, overlapping the
 * backward pass), so each rank runs the same program on its own slice of the
 * global batch and ends the step with the same params, bit for bit. MPI is
 * opened with dlopen (Open MPI's libmpi.so.40): a machine without it runs
 * everything else as before, and tf_comm_create_mpi says why it cannot.
 *
 *   tf_comm_t *comm; tf_comm_create_mpi(ctx, NULL, &comm);   // under mpirun: MPI_COMM_WORLD
 *   o.data_parallel = 1; tf_program_compile(ctx, m, &o, &p);
 *   tf_session_create(ctx, p, TF_TARGET_CPU, 42, &s);         // the same seed on every rank
 *   tf_session_set_comm(s, comm);
 *   ... each rank binds its own batch and runs ...
 *   tf_session_free(s); tf_comm_free(comm);                    // after its sessions
 *
 * mpi_comm: the caller's MPI_Comm (Open MPI's handle, a pointer; tfuse
 * duplicates it) or NULL for MPI_COMM_WORLD. MPI is initialized (at
 * MPI_THREAD_SERIALIZED) unless the caller did it, and then finalized by
 * tf_comm_free. A collective that does not complete within
 * $TFUSE_COMM_TIMEOUT seconds (default 300) fails with a message naming the
 * rank: a rank has died or hangs. tf_comm_create_self: a job of one rank. */
typedef struct tf_comm tf_comm_t;
/* Whether an MPI launcher (mpirun; srun and MPICH's mpiexec are detected
 * and refused by tf_comm_create_mpi) started this process as one of more
 * than one rank: nonzero, with *rank and *size from its environment (0 and 1
 * when not). Reads the environment only; `tfuse train` joins the job then. */
int       tf_comm_launched(int *rank, int *size);
tf_status tf_comm_create_mpi(tf_context_t *ctx, void *mpi_comm, tf_comm_t **out);
tf_status tf_comm_create_self(tf_context_t *ctx, tf_comm_t **out);
void      tf_comm_free(tf_comm_t *c);
int       tf_comm_rank(const tf_comm_t *c);   /* 0 for NULL */
int       tf_comm_size(const tf_comm_t *c);   /* 1 for NULL */
/* Every rank's `bytes` bytes at send, into recv (size * bytes, rank order). */
tf_status tf_comm_allgather(tf_context_t *ctx, tf_comm_t *c, const void *send, void *recv, size_t bytes);
/* root's bytes at buf into every rank's buf. */
tf_status tf_comm_broadcast(tf_context_t *ctx, tf_comm_t *c, void *buf, size_t bytes, int root);
/* End every rank of the job now, with exit status code (a rank that cannot go on). */
void      tf_comm_abort(tf_comm_t *c, int code);
/* What the communicator has done since it was made. */
typedef struct tf_comm_totals {
    int rank, size;
    int64_t bytes_reduced;   /* bytes of values averaged (each rank's share counted once) */
    double comm_ms;          /* time the collectives took, on the communication thread */
    double wait_ms;          /* of the steps' time, what the sessions waited for them: comm_ms - wait_ms overlapped compute */
    int64_t bytes_nccl;      /* of bytes_reduced, what NCCL averaged on the GPUs (the cuda target; not in comm_ms) */
} tf_comm_totals;
void      tf_comm_stats(const tf_comm_t *c, tf_comm_totals *out);
/* Run the session's allreduce ops over c's ranks (NULL: one rank, each
 * allreduce is a copy). c must outlive the session's runs. With several
 * ranks, each draws its dropout masks from the seed mixed with its rank
 * (rank 0: the seed's own); the initial state stays the seed's. A program
 * compiled with shard_optimizer = "N" needs a job of N ranks; its sessions'
 * save is then a collective (every rank calls it), and with several ranks
 * tf_session_save_state* writes on rank 0 only. */
tf_status tf_session_set_comm(tf_session_t *s, tf_comm_t *c);

/* How a session runs: its target, threads, kernels, and for the cpu target
 * how many kernels were JIT-compiled now and how many came from the
 * context's cache (tf_cache_t above; for cuda, the on-disk cubin cache), how
 * long that took, how many library kernels run through the reference
 * implementation (`fallbacks`), and the GEMM library. Fields a target does
 * not have are 0 or NULL. */
typedef struct tf_session_info {
    const char *target;
    int threads, kernels, jit_compiled, jit_cached, fallbacks;   /* kernels: as compile --stats counts them */
    int jit_disk;               /* cpu: kernels whose object code an earlier process left in the disk
                                 * cache ($TFUSE_CACHE_DIR/cpu), linked, not compiled (jit_compiled
                                 * counts those compiled now, jit_cached those this process had) */
    int jit_package;            /* cpu and cuda: kernels whose object code or cubin came from the
                                 * program's package (tf_program_load), linked, not compiled */
    double jit_ms;
    /* The target's kernel cache on disk ($TFUSE_CACHE_DIR, see
     * tf_disk_cache_get_info) at this session's start: kernels found there
     * (hits) and compiled now and written there (misses; also when there is
     * no cache directory). cpu: object code in cpu/ (= jit_disk and
     * jit_compiled); cuda: cubins in cuda/ (= jit_cached and jit_compiled);
     * cuda-emu: host objects in cuda-emu/. Kernels this process already
     * had (jit_cached on cpu) are neither. */
    int disk_hits, disk_misses;
    const char *library;
    /* cuda: how a step runs: "graph" (captured as one CUDA graph on its first
     * run, replayed since: graph_replays times), or why it is launched kernel
     * by kernel; NULL on targets without graphs */
    const char *step_graph;
    int64_t graph_replays;
    /* cpu: the memory the session holds for the step's values (cuda fills
     * arena_bytes, and device_bytes below). arena_bytes:
     * the activation arena, memplan's size (compile --stats arena_bytes);
     * value_bytes: the arena plus one block per input, param and buffer and
     * per value memplan did not place (unplanned_bytes of them; 0 when
     * memplan ran), each block its value's size (rounded up to 64 bytes for
     * alignment, which is not counted): compile --stats peak_bytes is what
     * runs. aux_bytes: caches besides the values (f32 copies of bf16 GEMM
     * operands, packed weights, kernel scratch), at this moment. */
    int64_t arena_bytes, value_bytes, unplanned_bytes, aux_bytes;
    /* cuda: the device memory the session's own allocations hold (the
     * activation arena, params, buffers, inputs, the cuBLASLt and cuDNN
     * workspaces, reduction scratch, ReLU masks): what every step runs in,
     * as steps allocate nothing. Not the CUDA context, loaded code or the
     * libraries' handles, which torch.cuda.max_memory_allocated leaves out
     * too, nor cuDNN's algorithm search, whose scratch is given back when
     * the session is set up. 0 elsewhere. */
    int64_t device_bytes;
} tf_session_info;
tf_status tf_session_get_info(const tf_session_t *s, tf_session_info *out);

/* Per-kernel wall time over the runs since profiling was switched on (which
 * also clears it); targets without kernels (interp) report none. One entry
 * per entry of the kernel IR (--dump-kernels), in its order: views and each
 * update chain of a multi-tensor region included, so there are as many as
 * tf_session_info.kernels or more. `how` says what runs the kernel: "jit",
 * "gemm", "conv", "view", "fallback", ...; on the cuda target "multi" for an
 * update chain that runs in the multi-tensor launch of the entry before it
 * (whose time is the whole launch's). `bytes` is the least memory traffic
 * of one call of what total_ms times (the kernel's buffers, each byte read
 * or written once; a multi-tensor launch's whole; 0 for a view and for work
 * timed in another entry): bytes * calls / total_ms is the kernel's
 * effective bandwidth, to hold against tf_session_copy_bandwidth. */
typedef struct tf_kernel_profile {
    const char *name, *how;
    double total_ms;
    int64_t calls, elements, bytes;
} tf_kernel_profile;
tf_status tf_session_set_profiling(tf_session_t *s, int on);
size_t    tf_session_profile_count(const tf_session_t *s);
tf_status tf_session_profile(const tf_session_t *s, size_t i, tf_kernel_profile *out);
/* A timeline of the session's kernel calls, for trace viewers (`--trace`
 * writes it as Chrome/Perfetto trace-event JSON). tf_session_set_tracing(s,
 * 1) switches profiling on too (clearing the profile, so the two count the
 * same calls) and starts an empty timeline; every kernel call of every run
 * after it is an event: its kernel (an index of tf_session_profile's
 * entries, which name it), its start on CLOCK_MONOTONIC in microseconds,
 * its duration, the run (from 0 since tracing started) and the lane: 0 the
 * host thread that ran it (cpu), 1 the device (cuda: start and duration from
 * CUDA events, the start placed after the moment the run was enqueued). A
 * kernel's durations over the timeline add up to its profile's total_ms.
 * At most TF_TRACE_MAX_EVENTS are kept; tf_session_trace_dropped counts the
 * rest. Switching it off keeps the timeline; the interp target has no
 * kernels and records none. */
#define TF_TRACE_MAX_EVENTS 2000000
typedef struct tf_trace_event {
    size_t kernel;
    double start_us, dur_us;
    int64_t run;
    int lane;
} tf_trace_event;
tf_status tf_session_set_tracing(tf_session_t *s, int on);
size_t    tf_session_trace_count(const tf_session_t *s);
uint64_t  tf_session_trace_dropped(const tf_session_t *s);
tf_status tf_session_trace_event(const tf_session_t *s, size_t i, tf_trace_event *out);
/* The bandwidth of a plain copy in the session's memory, in GB/s (1e9
 * bytes, counting each byte read and each byte written): cuda, one
 * device-to-device cuMemcpyDtoDAsync of 256 MiB (less when the device
 * lacks room), timed with events; cpu, a memcpy of 128 MiB split over the
 * session's threads; the median of 7 timed copies after one untimed. What a
 * memory-bound kernel can at best approach: `tfuse bench --profile` holds
 * each generated kernel's bytes / time against it. TF_ERR_UNSUPPORTED on
 * the interp target. Takes a few ms; the session's state is untouched. */
tf_status tf_session_copy_bandwidth(tf_session_t *s, double *gbps);

/* ---- training facts ---- */
/* What a model's train block says, with every default filled in: the
 * optimizer (sgd with lr 0.01 without one) and its parameters, the learning
 * rate schedule (constant without one) and its parameters, the precision,
 * gradient clipping and accumulation. Names point to static strings.
 * Booleans and integers are given as doubles. */
typedef struct tf_train_param { const char *name; double value; } tf_train_param;
typedef struct tf_train_config {
    int has_block;                     /* the model has a train block */
    const char *optimizer;             /* "sgd", "adam", "adamw", "lamb" */
    double lr;                         /* the optimizer's lr (the schedule's base) */
    tf_train_param optimizer_params[8];   /* all of them, lr included, in the IR's order */
    size_t noptimizer_params;
    const char *schedule;              /* "constant", "step", "cosine", "onecycle" */
    tf_train_param schedule_params[8];
    size_t nschedule_params;
    tf_precision precision;            /* FP32, FP16 or BF16: never DEFAULT */
    double clip_grad_norm;             /* 0: no clipping */
    int64_t accumulate;                /* micro-batches per optimizer step, >= 1 */
    const char *const *metrics;        /* `metrics = a, b`: outputs `tfuse train` logs beside the loss; the model's or
                                        * program's strings, valid while it lives */
    size_t nmetrics;
} tf_train_config;
/* The model's train block (precision: the block's, fp32 when it names none). */
tf_status tf_model_train_config(tf_context_t *ctx, const tf_model_t *m, tf_train_config *out);
/* The same for a compiled program, whose precision is the one it was
 * compiled in: tf_compile_options.precision where that is not DEFAULT. */
tf_status tf_program_train_config(tf_context_t *ctx, const tf_program_t *p, tf_train_config *out);

/* Checkpoint metadata: a flat JSON object whose values are strings, as
 * tf_session_save_state_meta writes and tf_session_load_state_meta returns.
 * get: the value of `key`, decoded, into *value (malloc'd; the caller
 * free()s it), or NULL when the object has no such key. set: *json (NULL:
 * a new, empty object) becomes a new malloc'd text with key = value (a key
 * already there keeps its place), compact, keys in order; the old text is
 * freed. Text that is not such an object is TF_ERR_FORMAT; on failure
 * nothing changes. */
tf_status tf_metadata_get(tf_context_t *ctx, const char *json, const char *key, char **value);
tf_status tf_metadata_set(tf_context_t *ctx, char **json, const char *key, const char *value);

/* Element i (row-major) of a tensor as a double: f16 and bf16 decoded,
 * integers and bool converted. NaN when the view has no data or i is out of
 * range. */
double tf_view_element(const tf_tensor_view *v, int64_t i);

/* ---- data loading: batches of .npy arrays for a program's inputs ----
 *
 * One .npy array per program input (every input needs one), its first axis
 * counting samples; each sample's shape and the dtype must match the
 * input's type without its first axis, which is the batch size B (no
 * conversion). With `shuffle`, each epoch visits the samples in a fresh
 * order (Fisher-Yates, seeded by (seed, epoch)) in batches of B, and the
 * N mod B samples left at the end of that order are not used that epoch;
 * without it, an epoch is ceil(N / B) batches in file order, the last one
 * filled up with samples from the start (tf_batch_info.samples counts the
 * real ones). Worker threads gather batches into a ring ahead of
 * tf_loader_next; batch k depends only on the position, never on which
 * thread filled it or when, so a run resumed from a position sees the
 * batches the uninterrupted run saw. Bad data is TF_ERR_INVALID_ARG naming
 * the file and what was expected (opts.name names the data set); a file
 * that cannot be read, as tf_array_load_npy. A loader is used from one
 * thread at a time. */
typedef struct tf_loader tf_loader_t;
typedef struct tf_data_source { const char *input; const char *path; } tf_data_source;
typedef struct tf_loader_options {
    const char *name;        /* names the data in messages ("--data"); NULL: "data" */
    int shuffle;             /* default 1 */
    uint64_t seed;           /* the shuffle's seed; default 0 */
    int workers;             /* threads gathering batches ahead, 1 to 64; default 2 */
    int rank, ranks;         /* data parallel (shuffled only): each step's global batch is `ranks` consecutive
                              * batches of the epoch's order, and this loader gives the rank-th; positions and
                              * epochs count global batches. Default 0 of 1 */
} tf_loader_options;
/* Where the stream is: the next batch starts `offset` samples into epoch
 * `epoch`'s order, shuffled with `seed` (where that epoch has no batch left
 * from the offset, the next epoch begins). A training checkpoint stores it
 * (tf_metadata_set) so that a resumed run continues the data order. */
typedef struct tf_loader_position { uint64_t epoch; int64_t offset; uint64_t seed; } tf_loader_position;
typedef struct tf_batch_info {
    uint64_t epoch;          /* the epoch the batch belongs to */
    int64_t samples;         /* real samples in it: B, or fewer in an unshuffled epoch's last batch */
    tf_loader_position next; /* the position after it: save this to resume after the batch */
} tf_batch_info;
void      tf_loader_options_init(tf_loader_options *o);
/* Load and check the arrays against p's inputs (the loader does not keep p;
 * opts NULL: the defaults). Shuffled data needs at least B samples. */
tf_status tf_loader_create(tf_context_t *ctx, const tf_program_t *p, const tf_data_source *sources, size_t nsources,
                           const tf_loader_options *opts, tf_loader_t **out);
void      tf_loader_free(tf_loader_t *l);
int64_t   tf_loader_samples(const tf_loader_t *l);        /* N */
int64_t   tf_loader_batch_size(const tf_loader_t *l);     /* B */
uint64_t  tf_loader_epoch_batches(const tf_loader_t *l);  /* shuffled: floor(N / (ranks B)); else ceil(N / B) */
/* Wait for the next batch and, with s (may be NULL), bind its arrays to s's
 * inputs (tf_session_bind: no copy). The batch stays valid until the next
 * tf_loader_next, set_position or free; tf_loader_view gives its array for
 * an input. info may be NULL. */
tf_status tf_loader_next(tf_loader_t *l, tf_session_t *s, tf_batch_info *info);
tf_status tf_loader_view(const tf_loader_t *l, const char *input, tf_tensor_view *out);
/* get: the position after the last batch tf_loader_next gave ({0, 0, seed}
 * before the first). set: the next batch is the one at pos (the ring is
 * emptied; the current batch is no longer valid). */
tf_status tf_loader_get_position(const tf_loader_t *l, tf_loader_position *out);
tf_status tf_loader_set_position(tf_loader_t *l, const tf_loader_position *pos);

/* The target that runs best here: cuda when a GPU can run, else cpu when
 * this build has LLVM, else interp. tf_compile_options_init picks it. */
tf_target tf_default_target(void);

/* ---- host arrays (.npy files) ---- */
tf_status tf_array_load_npy(tf_context_t *ctx, const char *path, tf_array_t **out);
tf_status tf_array_save_npy(tf_context_t *ctx, const char *path, const tf_tensor_view *t);
tf_status tf_array_view(const tf_array_t *a, tf_tensor_view *out);
void      tf_array_free(tf_array_t *a);

#ifdef __cplusplus
}
#endif
#endif
