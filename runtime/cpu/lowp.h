/* lowp.h — the cpu target's 16-bit floats: conversions between f16/bf16
 * storage and float32 arrays, and the bf16 GEMM kernels.
 *
 * Conversions are exact where exactness exists and otherwise round to
 * nearest even, bit for bit as ir/core.c's tf_elem_load/tf_elem_store do
 * (a NaN is stored as the quiet NaN 0x7e00 / 0x7fc0, whatever its sign and
 * payload), so a vectorized conversion never changes a result. Each runs
 * with AVX-512 (16 lanes), F16C (8 lanes, f16 only) or plain C, picked once
 * per process from the CPU's features (__builtin_cpu_supports); the binary
 * needs none of them to run. The intrinsics live in functions with target
 * attributes, so this file builds with the project's ordinary flags.
 *
 * The bf16 GEMM micro-kernel (AVX512-BF16's vdpbf16ps) multiplies pairs of
 * bf16 values, products exact in f32, into f32 accumulators: the same
 * numbers an sgemm on the widened operands sums, added in its own order.
 * Like vdpbf16ps itself it treats f32 subnormals as zero. */
#ifndef TF_RUNTIME_CPU_LOWP_H
#define TF_RUNTIME_CPU_LOWP_H

#include <stdbool.h>
#include <stdint.h>

/* n values: widen 16-bit storage to f32; round f32 to 16-bit storage. */
void tf_cpu_f16_to_f32(const uint16_t *src, float *dst, int64_t n);
void tf_cpu_bf16_to_f32(const uint16_t *src, float *dst, int64_t n);
void tf_cpu_f32_to_f16(const float *src, uint16_t *dst, int64_t n);
void tf_cpu_f32_to_bf16(const float *src, uint16_t *dst, int64_t n);

/* Which conversion code runs: "avx512", "f16c" or "scalar". */
const char *tf_cpu_lowp_isa(void);
/* Tests: run the plain-C conversions (true) or the best this CPU has. */
void tf_cpu_lowp_force_scalar(bool on);

/* Whether this CPU has AVX512-BF16 (vdpbf16ps) and AVX-512F. */
bool tf_cpu_has_avx512_bf16(void);

/* C[M,N] (ldc) = op(A) op(B) (+ C when accumulate), A and B bf16, row-major
 * as tf_cpu_gemm takes them; on the calling thread. Only where
 * tf_cpu_has_avx512_bf16(). */
void tf_cpu_bf16_gemm_kernel(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                             const uint16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate);

#endif
