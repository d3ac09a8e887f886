/* cuda.h — the CUDA emitter: CUDA C++ source text for NVRTC from the kernel
 * IR (kernel.h), the GPU twin of llvm.h. Pure text: nothing here includes a
 * CUDA header or links a CUDA library (runtime/cuda/ compiles and runs the
 * text).
 *
 * What each kernel kind becomes:
 *
 *   TF_K_ELEMENTWISE  a grid-stride loop over the index space; buffers read
 *                     contiguously and every store move in 16-byte vectors
 *                     (a tail loop takes the last elements), broadcast or
 *                     strided loads index per element;
 *   TF_K_REDUCTION    a group of threads per outer index: a warp or more for
 *                     a row (innermost axis reduced), a column of a
 *                     32-wide tile when the innermost axis is outer
 *                     (coalesced column sums: batchnorm statistics, bias
 *                     gradients); warp shuffles, then shared memory across
 *                     warps, in a fixed order (deterministic); a reduction of
 *                     65536 elements or more over fewer outer indices than
 *                     264 blocks (two per SM of an H100) is split: each block
 *                     folds a contiguous share into scratch memory, and the
 *                     last block of an outer index to finish (an atomic
 *                     count) folds the partials in order and stores, so the
 *                     result does not depend on the order blocks ran in;
 *                     a column reduction over fewer 32-wide tiles than 132
 *                     (an H100's SMs) and 2048 rows or more that stores
 *                     nothing but its results splits its rows
 *                     the same way (shares of 1024 rows or more, the last
 *                     block of a tile folding each column's partials);
 *                     full-size values the region computes from the result
 *                     are a second kernel (name2) over the whole space,
 *                     launched after, reading the result from scratch;
 *                     the reductions in the kernel IR's order, each result
 *                     broadcast to the group before the next one reads it;
 *   TF_K_LIBRARY      with an epilogue (a gemm region): the epilogue alone,
 *                     to launch after the library op has written its
 *                     result; without one, not emitted by tf_cuda_emit. The
 *                     library op itself: matmul is cuBLASLt's and the
 *                     convolutions the runtime's (cuDNN or the host); the
 *                     others get their own kernel from tf_cuda_emit_library
 *                     (below), launched before the epilogue;
 *   TF_K_VIEW         not emitted: no work.
 *
 * Shapes, strides and counts are compile-time constants. Math runs in fp32
 * for f32/f16/bf16 (f16/bf16 through cuda_fp16.h / cuda_bf16.h), in double
 * for f64, integers as their C types; every expression is rounded to its
 * dtype as the interpreter rounds each op (an f16/bf16 value is rounded
 * and kept in a float). Reductions accumulate in float (double when the data
 * or result is f64, long long for integer sums). Dropout masks draw the
 * interpreter's counter-based stream bit for bit (tf_dropout_stream and
 * tf_rng_uniform): the kernel then takes one more parameter, a device
 * pointer to {seed, step}, so a captured CUDA graph replays with the step a
 * device kernel advances.
 *
 * Entry point: extern "C" __global__ void tf_<16 hex digits>(one pointer per
 * kernel->bufs entry, in order, typed by storage dtype: float, __half,
 * __nv_bfloat16, double, long long, int, unsigned char for bool; const when
 * the kernel does not write it, __restrict__ when the kernel IR marks it
 * disjoint[, const unsigned long long *rng]). The hex
 * digits are the FNV-1a 64 hash of the source with the name blanked: the
 * source carries no buffer or op names, so two identical kernels (the same
 * cast of two weights) get one source and one name; compile and cache once.
 *
 * Example:
 *
 *     tf_cuda_kernel ck;
 *     if (tf_cuda_supports(k, NULL, 0) && !tf_cuda_emit(k, &ck, &diag)) {
 *         // nvrtc: compile ck.src, look up ck.name in the cubin, launch
 *         // with ck.grid blocks of ck.block threads and ck.smem bytes
 *         tf_cuda_kernel_free(&ck);
 *     }
 *
 * Library ops' own kernels (tf_cuda_emit_library): maxpool2d, avgpool2d,
 * maxpool2d_grad, avgpool2d_grad, gather (and embedding, the same kernel
 * when an unlowered module reaches the plan), scatter_add, concat and
 * slice_grad. Parameters: b0 the op's result, then b1, b2, ... one per
 * operand that is not a constant, in operand order (an operand given twice
 * is passed twice; a constant id is written into the source), typed and
 * const/__restrict__ as above, then for ids (gather, embedding,
 * scatter_add) `unsigned long long *tf_err`. One grid-stride loop over the
 * result (scatter_add on f32/f64: over dy), a thread per element, in the
 * same conventions as the generated kernels (name, constants, any grid
 * >= 1, block `block`). What each does, against the interpreter
 * (interp_kernels.c, interp_backward.c):
 *
 *   maxpool2d        the window in row-major order, padding skipped, the
 *                    running max from -inf replaced by a value that is
 *                    greater or NaN, never after a NaN: pool2d's rule, so
 *                    the same value (the max of stored values is exact);
 *   avgpool2d        the in-bounds sum in float (double for f64) divided
 *                    by kh * kw (count_include_pad), rounded once;
 *   maxpool2d_grad   a thread per dx element visits the windows that cover
 *                    it in row-major order; each window recomputes its
 *                    selected element as pool_backward does (the first
 *                    maximum in window order, the first NaN, the first
 *                    in-bounds element of an all -inf window) and adds its
 *                    dy when that is this element: deterministic, no
 *                    atomics, the interpreter's order of additions (in
 *                    float, double for f64), rounded once;
 *   avgpool2d_grad   the same gather of dy / (kh * kw) over the covering
 *                    windows (f64: dy * (1 / (kh * kw)), the interpreter's
 *                    arithmetic exactly);
 *   gather           rows copied as stored bits, any dtype;
 *   scatter_add      f32 and f64: atomicAdd of each dy element into a
 *                    result the runtime zeroes before the launch
 *                    (clear_first) — fast at any vocabulary, but the order
 *                    of the additions is the GPU's, so the sums are NOT
 *                    bit-deterministic from run to run (float addition does
 *                    not associate); f16, bf16 and the integer and bool
 *                    dtypes, which have no atomicAdd here: a thread per
 *                    result element adds the rows whose id is its own in
 *                    order r = 0, 1, ... (float for f16/bf16, double for the
 *                    integers and bool, rounded once as tf_dtype_round
 *                    does): deterministic, O(V * N * row), for the small
 *                    tables those dtypes get (amp keeps embedding tables
 *                    and their gradients in f32);
 *   concat           each result element copied from the operand whose part
 *                    of the axis holds it, as stored bits;
 *   slice_grad       zeros, dy's elements at start + j * step (start as
 *                    Python slices it), as stored bits.
 *
 * flash_attention and flash_attention_grad (codegen/cuda_attention.c) are
 * tiled kernels rather than loops over the result (shape TF_CUDA_ATTENTION):
 *
 *   flash_attention       a block of 128 threads per (batch, head, tile of
 *                         query rows): query, key and value tiles staged in
 *                         shared memory, an online softmax in float (double
 *                         for f64) over the key tiles, no [Tq, Tk] tensor;
 *                         causal, bool or additive masks (broadcast),
 *                         grouped-query heads, head dims 1 to 256, dropout
 *                         in train mode with the interpreter's draw (then
 *                         the {seed, step} parameter comes last, rng);
 *   flash_attention_grad  two entry points, no atomics: the first a block
 *                         per (batch, key/value head, key tile) recomputing
 *                         P and dS for every query row of the group's heads
 *                         and accumulating dK and dV, the second (name2) a
 *                         block per (batch, head, query tile) accumulating
 *                         dQ; both with smem bytes of shared memory.
 *
 * Their sums are in float (double for f64) in a fixed order, so not the
 * interpreter's bits but deterministic from run to run.
 *
 * An id out of [0, V) never reads or writes outside the table: gather
 * leaves that row zero, scatter_add skips it, and the kernel stores 1 + the
 * id's flat position in *tf_err (any one of them when there are several),
 * which the runtime reads after the step and reports as the interpreter's
 * error. The built-ins the library kernels use beyond the generated
 * kernels' are atomicAdd(float *, float) and atomicAdd(double *, double).
 *
 * Everything here is reentrant: no global state. */
#ifndef TF_CODEGEN_CUDA_H
#define TF_CODEGEN_CUDA_H

#include "kernel.h"

typedef enum tf_cuda_shape {
    TF_CUDA_POINTWISE,     /* grid-stride loop, scalar loads and stores */
    TF_CUDA_POINTWISE_VEC, /* grid-stride loop over 16-byte vectors, scalar tail */
    TF_CUDA_ROW_REDUCE,    /* `group` threads (a multiple of 32) per outer index */
    TF_CUDA_COL_REDUCE,    /* a 32-wide tile of outer indices, `group` threads per column */
    TF_CUDA_ATTENTION,     /* flash attention: a block per tile of query (or key) rows, looping over the others */
} tf_cuda_shape;

typedef struct tf_cuda_kernel {
    char *src;             /* CUDA C++ source for NVRTC, NUL-terminated, malloc'd */
    char name[24];         /* entry point: "tf_" + 16 hex digits of hash */
    uint64_t hash;         /* FNV-1a 64 of src with the name blanked */
    tf_cuda_shape shape;
    unsigned grid;         /* suggested blocks; every kernel loops (grid-stride), so any grid >= 1 is correct */
    unsigned block;        /* threads per block (1-D), required: the code and __launch_bounds__ assume it */
    unsigned smem;         /* dynamic shared memory bytes, required at launch */
    unsigned align;        /* every buffer pointer must be aligned to this many bytes (16 with vectors) */
    unsigned vec;          /* elements per vector in the POINTWISE_VEC loop, else 1 */
    unsigned group;        /* threads per outer index (reductions), else 0 */
    int nparams;           /* kernel->nbufs, plus 1 with rng */
    bool rng;              /* last parameter: const unsigned long long *rng -> {seed, step} on the device */
    char name2[24];        /* "": one kernel; else a second entry point in src ("<name>_b": a split
                            * reduction's full-space stores, flash_attention_grad's dQ), launched right
                            * after the first with the same parameters, grid2 blocks of block2 threads
                            * and smem2 bytes of dynamic shared memory */
    unsigned grid2, block2, smem2;
    unsigned scratch;      /* > 0: a parameter after the buffers (before rng), void *tf_scratch, this many
                            * bytes of device memory zeroed once before the first launch (a split
                            * reduction's partials and counters; the kernel leaves it zeroed again) */
    bool epilogue;         /* a TF_K_LIBRARY kernel's epilogue: launch after the library call */
    bool wide_index;       /* 64-bit index arithmetic (a space or buffer of 2^30 elements or more) */
    bool library;          /* a library op's own kernel (tf_cuda_emit_library): its parameters are
                            * the op's result, then its operands that are not constants */
    bool clear_first;      /* library: zero the result's bytes before every launch (atomicAdd into it) */
    bool err;              /* library: last parameter unsigned long long *tf_err, zero before the
                            * launch; nonzero after it: 1 + the position of an id out of range */
    int parts;             /* > 1: a multi-tensor launch (tf_cuda_emit_multi) of this many
                            * consecutive kernels; parameters: the first's buffers, then the
                            * second's, ... (nparams in all) */
} tf_cuda_kernel;

/* Whether tf_cuda_emit emits k; when not, why (into why, if given). */
bool tf_cuda_supports(const tf_kernel *k, char *why, size_t n);
/* Whether this generator lowers the op's scalar expression (ops.def's
 * LOWER column, codegen/scalar.h) inside a kernel; if not, why. */
bool tf_cuda_lowers(int op, char *why, size_t n);

/* The kernel's source and launch geometry into *out (zeroed first).
 * TF_IR_ERR_RUNTIME with the reason when !tf_cuda_supports(k),
 * TF_IR_ERR_OOM when out of memory. */
tf_ir_status tf_cuda_emit(const tf_kernel *k, tf_cuda_kernel *out, tf_diag *d);
void tf_cuda_kernel_free(tf_cuda_kernel *ck);

/* Multi-tensor launches. How many of ks[0..n) from the first go into one
 * launch: the consecutive parts of one multi-tensor region (k->multi: an
 * optimizer's update chains, one kernel each) that tf_cuda_emit emits, draw
 * no dropout, are independent of each other (tf_kernels_independent) and
 * whose buffers fit 4 KiB of parameters; 1 when ks[0] is not such a part
 * or stands alone; 0 when n < 1. */
int tf_cuda_multi_span(const tf_kernel *ks, int n);
/* One kernel running ks[0..n), a whole multi span (n >= 2), in one launch:
 * each part a grid-stride loop as tf_cuda_emit makes it (vectors where
 * they apply, blocks of 256 threads) over its own range of blocks, sized to
 * its elements; parameters the parts' buffers in turn (the first's, the
 * second's, ...), each value once (tf_cuda_multi_params), typed as
 * tf_cuda_emit types them; grid the sum of the parts'. TF_IR_ERR_RUNTIME
 * when ks[0..n) is not one span. */
tf_ir_status tf_cuda_emit_multi(const tf_kernel *ks, int n, tf_cuda_kernel *out, tf_diag *d);
/* A multi-tensor launch's parameters: the parts' buffers in turn, a value
 * that several parts read (an optimizer's learning rate, bias corrections,
 * clipping coefficient: every part reads them) only where it first comes.
 * first[o], for each buffer o of the parts in turn (the sum of their
 * nbufs), is the buffer whose parameter it is (o itself where it comes
 * first); returns the number of parameters. Passing each once halves an
 * AdamW launch's parameters and cuts NVRTC's time on it by about a fifth. */
int tf_cuda_multi_params(const tf_kernel *ks, int n, int *first);

/* Whether tf_cuda_emit_library emits a kernel for k's library op (a
 * TF_K_LIBRARY kernel whose op is one of those above, with the operands
 * its kernel takes); if not, why. */
bool tf_cuda_library_supports(const tf_kernel *k, char *why, size_t n);
/* The library op's own kernel into *out (zeroed first), to launch before
 * the kernel's epilogue (tf_cuda_emit) if it has one. TF_IR_ERR_RUNTIME
 * with the reason when !tf_cuda_library_supports(k), TF_IR_ERR_OOM when out
 * of memory. An op whose work depends on the program's mode (flash
 * attention's dropout, drawn in train mode only, as the interpreter draws
 * it) is emitted for `mode` by tf_cuda_emit_library_mode; for train mode
 * by tf_cuda_emit_library (and so by tf_cuda_emit_plan). */
tf_ir_status tf_cuda_emit_library(const tf_kernel *k, tf_cuda_kernel *out, tf_diag *d);
tf_ir_status tf_cuda_emit_library_mode(const tf_kernel *k, tf_ir_mode mode, tf_cuda_kernel *out, tf_diag *d);

/* How a flash_attention(_grad) kernel's generated code computes (on tensor
 * cores, or scalar and why), with its tiles, into buf; false when it has no
 * generated kernel. */
bool tf_cuda_attention_kind(const tf_kernel *k, char *buf, size_t n);

/* Every kernel of a plan. kernels[i] belongs to p->kernels[i]; its src is
 * NULL where the kernel is not emitted (library ops without an epilogue,
 * views), and then why[i] says why. library[i] is the library op's own
 * kernel, src NULL where there is none (not a library kernel, or an op
 * that is not generated: lib_why[i] says why). nemitted counts kernels[]
 * emitted, nlibrary library[] emitted, nunique distinct sources of both:
 * what NVRTC compiles. */
typedef struct tf_cuda_program {
    tf_cuda_kernel *kernels;
    char (*why)[160];
    tf_cuda_kernel *library;
    char (*lib_why)[160];
    int nkernels;
    int nemitted;
    int nlibrary;
    int nunique;
} tf_cuda_program;

tf_ir_status tf_cuda_emit_plan(const tf_kernel_plan *p, tf_cuda_program *out, tf_diag *d);
void tf_cuda_program_free(tf_cuda_program *prog);

/* The text of one .cu file for --dump-kernels: a comment naming the kernel
 * IR kernel (its name, region when m is given, the library call it follows),
 * each parameter's buffer and the launch geometry, then ck->src unchanged
 * (what NVRTC compiles). malloc'd; NULL when out of memory. */
char *tf_cuda_dump(const tf_module *m, const tf_kernel *k, const tf_cuda_kernel *ck);

/* Dropout keeps element i when (h_i >> 11) >= this threshold, h_i the
 * 64-bit hash whose top 53 bits tf_rng_uniform scales to [0, 1): the
 * integer form of tf_rng_uniform(...) >= p, exact for every p. */
uint64_t tf_cuda_dropout_threshold(double p);

#endif
