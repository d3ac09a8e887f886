/* gemm_dnnl.h — GEMMs whose right operand stays the same from run to run
 * (an inference session's weights), through oneDNN's matmul with that
 * operand packed once into the layout oneDNN's kernel reads. Operands are
 * f32 or bf16 (bf16 x bf16 sums in f32, as tf_cpu_gemm_bf16 does; the
 * result f32 or rounded to bf16 once); the caller widens f16 operands to f32.
 *
 * OpenBLAS packs both operands of every call again, and tf_cpu_gemm's
 * pieces each pack their share again: for the thin GEMMs of inference (the
 * bench mlp's 128 x 1024 x 784) that packing is a third of the time. ONNX
 * Runtime packs its weights once per session; so does this. Measured on the
 * bench machine (bench/gemm_libs.c, bench/results/2026-11-24-gemm-libs):
 * with two threads and the operands cold, 128x1024x784 took 2.40 ms through
 * OpenBLAS and 1.51 ms packed; gpt's 1024x1024x256 3.25 and 2.69 ms.
 *
 * C[M,N] = op(A)[M,K] B'[K,N], op(A) = A or A transposed (row-major, lda
 * = K or M), B' = B or B transposed as stored. C's rows are cut into pieces
 * fixed by the shape and the machine (tf_cpu_gemm_pieces, at least
 * TF_DNNL_GEMM_MIN_ROWS rows each), never by the thread count, and each
 * piece is a primitive run on one thread with its own scratchpad, as in
 * conv_dnnl.h; the pieces are independent, so the bits do not depend on the
 * number of threads. A primitive is made per distinct piece size (at most
 * two) when the session starts, both reading one packed layout. */
#ifndef TF_RUNTIME_CPU_GEMM_DNNL_H
#define TF_RUNTIME_CPU_GEMM_DNNL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"

enum { TF_DNNL_GEMM_MIN_ROWS = 16 };

typedef struct tf_dnnl_gemm tf_dnnl_gemm;

/* NULL, with *why filled, when the build has no oneDNN, oneDNN refuses
 * the shape, or memory ran out (*oom set: the caller reports it rather than
 * falling back). threads: the pool's. */
tf_dnnl_gemm *tf_dnnl_gemm_create(int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool bf16_in, bool bf16_out, int threads,
                                  bool *oom, char *why, size_t n);
void tf_dnnl_gemm_free(tf_dnnl_gemm *g);
/* Bytes of the packed operand, and of scratch a run needs (all threads'). */
size_t tf_dnnl_gemm_packed_bytes(const tf_dnnl_gemm *g);
size_t tf_dnnl_gemm_scratch_bytes(const tf_dnnl_gemm *g);
/* B as stored (row-major [K,N], or [N,K] when tb; f32 or bf16 bits) into
 * packed (64-byte aligned, tf_dnnl_gemm_packed_bytes). */
bool tf_dnnl_gemm_pack(tf_dnnl_gemm *g, const void *B, void *packed);
/* C = op(A) B with B packed; scratch 64-byte aligned. false when a primitive
 * failed. */
bool tf_dnnl_gemm_run(tf_dnnl_gemm *g, tf_pool *pool, const void *A, const void *packed, void *C, void *scratch);
/* The implementation, the packed layout and the pieces, for --cpu-explain. */
void tf_dnnl_gemm_explain(const tf_dnnl_gemm *g, char *out, size_t n);

#endif
