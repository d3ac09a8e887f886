/* llvm.h — the CPU emitter: TF_K_ELEMENTWISE and TF_K_REDUCTION kernels
 * lowered to LLVM IR and compiled by an ORC LLJIT.
 *
 * Generated code reproduces kernel_eval.c bit for bit: math in double, every
 * expression rounded to its dtype as tf_dtype_round rounds, reductions
 * accumulated in double in the reference's order. Supported value dtypes:
 * f32, f64, i64, i32, bool; f16/bf16 and dropout_mask (which needs the
 * interpreter's seed and step) are reported as unsupported. */
#ifndef TF_CODEGEN_LLVM_H
#define TF_CODEGEN_LLVM_H

#include "kernel.h"

typedef struct tf_jit tf_jit;                 /* an LLJIT instance and its compiled kernels */

tf_ir_status tf_jit_create(tf_jit **out, tf_diag *d);
void tf_jit_free(tf_jit *j);

/* Compile one kernel; *fn receives a function taking an array of buffer
 * pointers (kernel->bufs order, storage dtype layout: f32 as float, f64 as
 * double, i64 as int64_t, i32 as int32_t, bool as uint8_t).
 * TF_IR_ERR_RUNTIME with a clear message when the kernel uses something not
 * supported yet. */
typedef void (*tf_kernel_fn)(void **bufs);
tf_ir_status tf_jit_compile(tf_jit *j, const tf_kernel *k, tf_kernel_fn *fn, tf_diag *d);

/* Whether tf_jit_compile supports k; when not, why (into why, if given). */
bool tf_jit_supports(const tf_kernel *k, char *why, size_t n);

/* The LLVM IR text of a kernel (for --dump-llvm), malloc'd; NULL when the
 * kernel is not supported. */
char *tf_jit_print(const tf_kernel *k);

#endif
