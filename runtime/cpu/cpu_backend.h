/* cpu_backend.h — what the files of the cpu target share (private to
 * runtime/cpu). backend_cpu.c places a session's values, runs its plan and
 * is the target's tf_backend; the rest is split by what it does:
 *   cpu_jit.c      each kernel's code: the JIT cache in the context's
 *                  tf_cache_t, the disk cache and packages looked up by
 *                  its key, the misses compiled through LLVM;
 *   cpu_objects.c  the record a kernel's object code is stored in (a disk
 *                  cache file, a package's section), and packages;
 *   cpu_gemm.c     matmuls: widened operand copies, packed weights, GEMMs;
 *   cpu_libops.c   the other library kernels (conv2d, pooling, gather and
 *                  scatter_add, concat and slice_grad) and f16/bf16
 *                  conversion;
 *   cpu_attention.c  flash_attention and its gradient over tiles (sgemm
 *                  per tile, the online softmax between);
 *   cpu_layout.c   which activations stay in oneDNN's blocked layout
 *                  between convolutions;
 *   cpu_explain.c  --cpu-explain, `tfuse doctor` and op support.
 * Almost all of it exists only in a build with LLVM (TFUSE_HAVE_LLVM). */
#ifndef TF_RUNTIME_CPU_BACKEND_H
#define TF_RUNTIME_CPU_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "conv_dnnl.h"
#include "gemm_dnnl.h"
#include "interp.h"
#include "kernel.h"
#include "package.h"
#include "pool.h"
#include "runtime.h"
#ifdef TFUSE_HAVE_LLVM
#include "llvm.h"
#endif

/* ---- in every build ---- */

/* NULL when the target can run here, else why not (backend_cpu.c). */
const char *tf_cpu_unavailable(void);
/* Whether LLVM compiles kernel k; why says why not (backend_cpu.c). */
bool tf_cpu_jit_supports(const tf_kernel *k, char *why, size_t n);
/* The target's lines of `tfuse doctor` (cpu_explain.c). */
void tf_cpu_doctor(tf_strbuf *out);
/* How the target runs op, for tf_backend.op_support (cpu_explain.c). */
const char *tf_cpu_op_support(tf_op op, char *detail, size_t n);

#ifdef TFUSE_HAVE_LLVM

/* ---- a session's state ---- */

/* How a kernel runs (backend_cpu.c's how_names spell them in this order). */
typedef enum how {
    RUN_JIT, RUN_VIEW, RUN_MATMUL, RUN_MATMUL_BF16, RUN_CONV, RUN_CONV_GI, RUN_CONV_GW, RUN_POOL, RUN_POOL_GRAD, RUN_GATHER, RUN_SCATTER,
    RUN_CONCAT, RUN_SLICE_GRAD, RUN_ATTENTION, RUN_ALLREDUCE, RUN_FALLBACK, RUN_NOTHING
} how;

/* One kernel of the plan as a session runs it. */
typedef struct ckernel {
    const tf_kernel *k;
    how how;
    tf_kernel_fn fn;       /* the elementwise part (all of it, or the epilogue) */
    int jit_slot;          /* its reference in the JIT cache, -1 none */
    void **bufs;           /* storage per k->bufs */
    int64_t extent;        /* of the split axis; 1 when none */
    int64_t work;          /* elements of the index space, to decide threading */
    double ns;             /* profile: total time */
    int64_t calls;
    int label_expr;        /* a one_hot whose labels load an integer buffer (checked before the kernel), or -1 */
    tf_dnnl_conv *dnnl;    /* RUN_CONV*: oneDNN's primitives, or NULL: im2col (conv_why says why) */
    bool epi_in_conv;      /* RUN_CONV: the primitive writes the region's epilogue (bias, ReLU): fn does not run */
    bool conv_failed;      /* RUN_CONV*: a primitive failed where im2col cannot take over (tf_cpu_run_conv) */
    int epi_bias, epi_out; /* then: the bias's buffer and the stored result's (indices into k->bufs) */
    char conv_why[320];
    tf_dnnl_gemm *dgemm;   /* RUN_MATMUL(_BF16): oneDNN with the weights packed (cpu_gemm.c's planning), or NULL: OpenBLAS (gemm_why) */
    void *packed;          /* then: the packed weights, current as of write generation packed_gen */
    uint64_t packed_gen;
    bool dgemm_widen;      /* then: f16 operands or result, through f32 (the weights widened when packed) */
    void *kept;            /* RUN_CONV in inference, weights the step never changes: them in the primitive's layout, */
    uint64_t kept_gen;     /* as of this write generation (0: never) */
    bool once;             /* inference: everything it writes is computed from the state alone (value->once) */
    uint64_t once_gen;     /* then: what it wrote is current as of this write generation (0: never run) */
    char gemm_why[200];
} ckernel;

/* A session's state (tf_session_t.impl). */
typedef struct cpu {
    const tf_kernel_plan *plan;   /* the program's (s->p->plan) */
    ckernel *ks;
    void **ptr;            /* per value id: its storage */
    unsigned char *arena;
    void **owned;          /* blocks besides the arena */
    int64_t arena_bytes;   /* the arena's size (memplan's) */
    int64_t state_bytes;   /* the blocks of inputs, params and buffers, each its value's size */
    int64_t unplanned_bytes;   /* the blocks of values memplan did not place (0 after memplan) */
    int nowned;
    tf_pool *pool;
    tf_interp_ctx *ip;     /* the fallback kernels' tensors (made on first use); initializers run in a
                            * temporary one */
    uint64_t rt[2];        /* seed, step: what dropout draws from */
    float *scratch;        /* grows to the largest kernel's need */
    size_t nscratch;
    float **wide;          /* per value id: the f32 copy of an f16/bf16 value that several GEMMs read, or NULL */
    uint64_t *wide_gen;    /* the run whose values the copy holds */
    uint64_t gen;          /* runs started: copies from an earlier one are stale */
    size_t wide_bytes;     /* what the copies take */
    uint64_t state_gen;    /* state writes from outside (load, set): packed weights older than this are repacked */
    size_t packed_bytes;   /* what packed weights take */
    void *gemm_scratch;    /* the oneDNN GEMMs' scratchpads (the largest need) */
    size_t gemm_scratch_bytes;
    bool profile;
    int jit_compiled, jit_cached, jit_disk, jit_package;
    double jit_ms;
    tf_cache_t *cache;     /* where its kernels are (the context's at the start), referenced */
    struct cpu_comm *comm; /* the allreduce kernels' buckets for the session's communicator (cpu_comm.c), or NULL */
    tf_kernel *relaid;     /* kernels rebuilt over nChw16c's index space (cpu_layout.c), which ks[].k then point to */
    int nrelaid;
} cpu;

/* v's elements. */
static inline int64_t numel(const tf_value *v) { return tf_type_numel(&v->type); }

/* v's bytes in its dtype. */
static inline size_t value_bytes(const tf_value *v) { return (size_t)tf_type_numel(&v->type) * (size_t)tf_dtype_bytes(v->type.dtype); }

/* The value whose storage v uses: through views (ops.c). */
static inline const tf_value *root_of(const tf_value *v) { return tf_value_storage(v); }

/* v's storage in session c; NULL for a constant. */
static inline void *storage(cpu *c, const tf_value *v) { return v->kind == TF_VAL_CONST ? NULL : c->ptr[root_of(v)->id]; }

/* f16 or bf16: stored narrower than the float32 the library kernels compute in. */
static inline bool is_float16(tf_dt t) { return t == TF_DT_F16 || t == TF_DT_BF16; }

/* A zeroed 64-byte aligned block of the session's, freed with it; NULL when out of memory (backend_cpu.c). */
void *tf_cpu_own(cpu *c, size_t bytes);
/* The session's scratch of at least floats floats (grown, contents lost), or NULL (backend_cpu.c). */
float *tf_cpu_scratch(cpu *c, size_t floats);
/* How a library kernel's node runs: one of the RUN_* library cases, or RUN_FALLBACK (backend_cpu.c). */
how tf_cpu_library_how(const tf_node *n);

/* Inference: the activations that stay in nChw16c between convolutions,
 * their convolutions told to take and give them as they are (after
 * tf_cpu_conv_choose; cpu_layout.c). Out of memory is an error. */
tf_status tf_cpu_plan_layouts(tf_session_t *s, cpu *c);

/* ---- allreduce (cpu_comm.c) ---- */
/* Plan kernel i, an allreduce: its operand into its bucket (sent when full), or a copy with one rank. */
tf_status tf_cpu_run_allreduce(tf_session_t *s, cpu *c, int i);
/* Before plan kernel i: wait for the buckets whose means it reads. */
tf_status tf_cpu_comm_before(tf_session_t *s, cpu *c, int i);
/* The step's end (or its failure): wait for every bucket sent. */
tf_status tf_cpu_comm_finish(tf_session_t *s, cpu *c);
void tf_cpu_comm_free(cpu *c);
/* ---- the JIT cache (cpu_jit.c) ---- */

/* What a session asks of the cache for one kernel, and what it got. */
typedef struct jit_req {
    const tf_kernel *k;
    char *key;             /* tf_cpu_jit_key (taken by the cache when the kernel is added) */
    tf_kernel_fn fn;
    int slot;              /* its reference in the cache, -1 until it has one */
    bool hit, disk, pkg;   /* where it came from: the process's cache, the disk, a package; else compiled */
    /* a miss, compiled by tf_cpu_jit_compile_all (path and d allocated for
     * misses only: a package's hundreds of hits touch a few pages): */
    char sym[32];
    char *path;            /* where the disk cache keeps it; NULL: no cache directory */
    char *dkey;            /* NULL: no target id, tf_jit_compile under the mutex */
    int same;              /* an earlier request with the same key (that one compiles), or -1 */
    void *obj;
    size_t nobj;
    tf_ir_status st;
    tf_diag *d;            /* st's message; NULL when st is TF_IR_ERR_OOM for want of it */
} jit_req;

/* Look r's kernel up in the process's cache, the package and the disk cache; a miss leaves r->slot -1. */
tf_ir_status tf_cpu_jit_lookup(tf_cache_t *c, const char *pipe, const tf_pkg *pkg, jit_req *r, tf_diag *d);
/* Compile the misses among rs[0..n) on the pool, add them to the cache and the disk cache. */
void tf_cpu_jit_compile_all(tf_cache_t *c, tf_pool *pool, const char *pipe, jit_req *rs, int n);
/* Free what r allocated (not its reference in the cache). */
void tf_cpu_jit_req_free(jit_req *r);
/* Drop a session's reference on the kernel in slot (-1: none). */
void tf_cpu_jit_put(tf_cache_t *c, int slot);
/* The cache key of k under pipeline pipe (NULL: tfuse's own), malloc'd; NULL when out of memory. */
char *tf_cpu_jit_key(const tf_kernel *k, const char *pipe);
/* A kernel's symbol and disk key (malloc'd into *dkey) for target and key; false when out of memory. */
bool tf_cpu_kernel_sym(const char *target, const char *key, char **dkey, char sym[32]);
/* This machine's target id, malloc'd; NULL with *d filled when it cannot be found. */
char *tf_cpu_cache_target(tf_cache_t *c, tf_diag *d);
/* tf_backend.cache_trim: free the least recently used kernels past the cache's limit (under c->mu). */
void tf_cpu_cache_trim(tf_cache_t *c);
/* tf_backend.cache_free: free everything the target keeps in c. */
void tf_cpu_cache_free(tf_cache_t *c);

/* ---- object code outside the process (cpu_objects.c) ---- */

/* The object stored under key in record b (size bytes), malloc'd into *obj; false when torn, foreign or another key's. */
bool tf_cpu_record_parse(const unsigned char *b, size_t size, const char *key, void **obj, size_t *n);
/* The object stored under key in the disk cache file path (as tf_cpu_record_parse). */
bool tf_cpu_disk_read(const char *path, const char *key, void **obj, size_t *n);
/* Store obj under key in the disk cache file path (nothing when out of memory). */
void tf_cpu_disk_write(const char *path, const char *key, const void *obj, size_t n);
/* tf_backend.package_code: every kernel's object code into pkg. */
tf_status tf_cpu_package_code(tf_context_t *ctx, const tf_program_t *p, const char *archs, tf_pkg *pkg, int *nobjects, int *cached);
/* tf_backend.package_check: whether pkg's code was built for this machine. */
tf_status tf_cpu_package_check(tf_context_t *ctx, const tf_pkg *pkg, const char *path);

/* ---- matmuls (cpu_gemm.c) ---- */

/* Which f16/bf16 GEMM operands get a float32 copy, and which matmuls run the bf16 GEMM. */
tf_status tf_cpu_plan_gemm_operands(tf_session_t *s, cpu *c);
/* Which f32 GEMMs run oneDNN on packed weights, and their memory. */
tf_status tf_cpu_plan_packed_gemms(tf_session_t *s, cpu *c);
/* A GEMM on packed weights (repacked first when stale); false when oneDNN failed. */
bool tf_cpu_run_packed(cpu *c, ckernel *ck);
/* Matmul node n through OpenBLAS, or the bf16 GEMM when bf16. */
void tf_cpu_run_matmul(cpu *c, const tf_node *n, bool bf16);

/* ---- attention (cpu_attention.c) ---- */

/* Whether the attention kernels take node n (f32, f16, bf16 operands in memory); else the interpreter's. */
bool tf_cpu_attention_supported(const tf_node *n);
/* flash_attention or flash_attention_grad node n (train: dropout applies); false when out of memory. */
bool tf_cpu_run_attention(cpu *c, const tf_node *n, bool train);

/* ---- the other library kernels (cpu_libops.c) ---- */

/* f16/bf16 (t) to f32 when widen, else back, over n elements, on the pool when long. */
void tf_cpu_convert(cpu *c, tf_dt t, bool widen, const void *src, void *dst, int64_t n);
/* v as float32: its storage, or widened into dst. */
const float *tf_cpu_as_f32(cpu *c, const tf_value *v, float *dst);
/* A float32 result rounded into v's storage. */
void tf_cpu_from_f32(cpu *c, const tf_value *v, const float *src);
/* How a convolution kernel runs: oneDNN's primitives, made now, or im2col (ck->conv_why says why). */
void tf_cpu_conv_choose(tf_session_t *s, cpu *c, ckernel *ck);
/* A convolution or one of its gradients; true when it also ran the
 * kernel's epilogue (piece by piece, tf_dnnl_conv_run's after), or when a
 * primitive failed where im2col cannot take over (ck->conv_failed: the
 * step fails). */
bool tf_cpu_run_conv(cpu *c, ckernel *ck);
/* Pooling, or its gradient when grad. */
void tf_cpu_run_pool(cpu *c, const tf_node *n, bool grad);
/* gather, or scatter_add when scatter; false when an id is out of range. */
bool tf_cpu_run_gather(cpu *c, const tf_node *n, bool scatter);
/* concat or slice_grad as copies; false for an axis or slice out of range. */
bool tf_cpu_run_copy(cpu *c, const tf_node *n);

/* ---- explaining (cpu_explain.c) ---- */

/* --cpu-explain: how each matmul and convolution of the session runs, into f. */
void tf_cpu_explain(FILE *f, const cpu *c);

#endif /* TFUSE_HAVE_LLVM */

#endif
