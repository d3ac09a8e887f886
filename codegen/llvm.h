/* llvm.h — the CPU emitter: TF_K_ELEMENTWISE and TF_K_REDUCTION kernels
 * lowered to LLVM IR and compiled by an ORC LLJIT.
 *
 * Generated code reproduces kernel_eval.c bit for bit: math in double, every
 * expression rounded to its dtype as tf_dtype_round rounds, reductions
 * accumulated in double in the reference's order. Every storage dtype (f16
 * and bf16 as 16-bit patterns), every pointwise op of the table, dropout
 * masks, and the epilogues of library kernels (the library call itself is
 * the runtime's). */
#ifndef TF_CODEGEN_LLVM_H
#define TF_CODEGEN_LLVM_H

#include "kernel.h"

typedef struct tf_jit tf_jit;                 /* an LLJIT instance and its compiled kernels */

tf_ir_status tf_jit_create(tf_jit **out, tf_diag *d);
void tf_jit_free(tf_jit *j);

/* Compile one kernel; *fn receives a function taking
 *   bufs    buffer pointers in kernel->bufs order, storage dtype layout (f32
 *           as float, f64 as double, f16/bf16 as uint16_t, i64 as int64_t,
 *           i32 as int32_t, bool as uint8_t);
 *   lo, hi  the range of the split axis (tf_kernel_split_axis) this call
 *           covers: [0, dims[axis]) for all of it; any lo, hi for a kernel
 *           with no split axis (-1), which always runs whole;
 *   rt      {seed, step}: what dropout masks draw from.
 * TF_IR_ERR_RUNTIME with a clear message when the kernel uses something not
 * supported. */
typedef void (*tf_kernel_fn)(void **bufs, int64_t lo, int64_t hi, const uint64_t *rt);
/* *code: the kernel's code and memory in the JIT, until tf_jit_release (or
 * tf_jit_free) gives them back. An LLVM failure (out of memory, too many
 * mappings) is TF_IR_ERR_INTERNAL with LLVM's message, never RUNTIME. */
typedef struct tf_jit_code tf_jit_code;
tf_ir_status tf_jit_compile(tf_jit *j, const tf_kernel *k, tf_kernel_fn *fn, tf_jit_code **code, tf_diag *d);
/* Remove a compiled kernel's code from the JIT and free its memory; its
 * function must not be called again. */
tf_ir_status tf_jit_release(tf_jit *j, tf_jit_code *code, tf_diag *d);

/* Object code that outlives the process (the cpu target's disk cache):
 *
 * tf_jit_target_id: what the object code depends on besides the kernel and
 * the pipeline (LLVM's version, the target triple, the host CPU and its
 * features), as text, malloc'd; NULL when out of memory.
 * tf_jit_compile_object: tf_jit_compile with the function named sym (a name
 * that says what it computes, the same in every process: a hash of the
 * kernel's key), going through an object file, which *obj receives
 * (malloc'd, *obj_n bytes) for the caller to keep.
 * tf_jit_load_object: that object file linked into this JIT, no compiling,
 * and sym's address; only for objects compiled for this tf_jit_target_id
 * (the caller keys them by it). A name this JIT already defines is
 * TF_IR_ERR_INTERNAL. */
char *tf_jit_target_id(tf_jit *j);
tf_ir_status tf_jit_compile_object(tf_jit *j, const tf_kernel *k, const char *sym, tf_kernel_fn *fn, tf_jit_code **code, void **obj,
                                   size_t *obj_n, tf_diag *d);
tf_ir_status tf_jit_load_object(tf_jit *j, const char *sym, const void *obj, size_t n, tf_kernel_fn *fn, tf_jit_code **code, tf_diag *d);
/* The object code tf_jit_compile_object makes for k under pipeline pipe
 * (NULL: tfuse's own), byte for byte, made without a tf_jit: its own LLVM
 * context and target machine, so that several threads compile at once
 * (the cpu target compiles a session's kernels on its threads and links
 * the objects one by one). *obj is malloc'd, *obj_n bytes. */
tf_ir_status tf_jit_object(const tf_kernel *k, const char *sym, const char *pipe, void **obj, size_t *obj_n, tf_diag *d);

/* The LLVM pass pipeline of the following compiles (text as `opt
 * -passes=` takes it, e.g. "default<O3>"); NULL: tfuse's own. A pipeline
 * LLVM cannot parse fails the compile (TF_IR_ERR_INTERNAL, LLVM's message). */
tf_ir_status tf_jit_set_pipeline(tf_jit *j, const char *pipeline);

/* Whether tf_jit_compile supports k; when not, why (into why, if given). */
bool tf_jit_supports(const tf_kernel *k, char *why, size_t n);
/* Whether this generator lowers the op's scalar expression (ops.def's
 * LOWER column, codegen/scalar.h) inside a kernel; if not, why. */
bool tf_jit_lowers(int op, char *why, size_t n);

/* The LLVM IR text of a kernel (for --dump-llvm), malloc'd; NULL when the
 * kernel is not supported. */
char *tf_jit_print(const tf_kernel *k);
/* The same through the given pipeline (NULL: tfuse's own). */
char *tf_jit_print_pipeline(const tf_kernel *k, const char *pipeline);

/* NULL when the functions above work; else why not (libtfuse.so's LLVM
 * module could not be opened: codegen/llvm_lazy.c). */
const char *tf_jit_unavailable(void);
/* Where the functions above come from, for `tfuse doctor`: libtfuse.so's
 * LLVM module (its path, and whether this process has opened it yet), or
 * "linked in" (libtfuse.a). */
const char *tf_jit_where(char *buf, size_t n);

/* libtfuse.so opens llvm.c as a module of its own, libtfuse-llvm.so
 * (codegen/llvm_lazy.c says why), and finds these functions in its
 * tf_llvm_module_api; the version (the build's TFUSE_VERSION, from CMake)
 * and the sizes say both sides come from one build. */
#ifndef TF_LLVM_BUILD
#define TF_LLVM_BUILD "?"
#endif
#define TF_LLVM_API_VERSION "tfuse-llvm-api 1, tfuse " TF_LLVM_BUILD
typedef struct tf_llvm_api {
    const char *version;
    size_t size, kernel_size, diag_size;
    tf_ir_status (*create)(tf_jit **out, tf_diag *d);
    void (*free)(tf_jit *j);
    tf_ir_status (*compile)(tf_jit *j, const tf_kernel *k, tf_kernel_fn *fn, tf_jit_code **code, tf_diag *d);
    tf_ir_status (*release)(tf_jit *j, tf_jit_code *code, tf_diag *d);
    char *(*target_id)(tf_jit *j);
    tf_ir_status (*compile_object)(tf_jit *j, const tf_kernel *k, const char *sym, tf_kernel_fn *fn, tf_jit_code **code, void **obj,
                                   size_t *obj_n, tf_diag *d);
    tf_ir_status (*load_object)(tf_jit *j, const char *sym, const void *obj, size_t n, tf_kernel_fn *fn, tf_jit_code **code, tf_diag *d);
    tf_ir_status (*object)(const tf_kernel *k, const char *sym, const char *pipe, void **obj, size_t *obj_n, tf_diag *d);
    tf_ir_status (*set_pipeline)(tf_jit *j, const char *pipeline);
    bool (*supports)(const tf_kernel *k, char *why, size_t n);
    bool (*lowers)(int op, char *why, size_t n);
    char *(*print)(const tf_kernel *k);
    char *(*print_pipeline)(const tf_kernel *k, const char *pipeline);
} tf_llvm_api;

#endif
