/* cuda_emit.h — what the CUDA emitter's files share (private to codegen/;
 * the public interface is cuda.h). The files:
 *
 *   cuda.c         the entry points (tf_cuda_supports, tf_cuda_emit, the
 *                  plan, the .cu dump), the fused pointwise kernel, the
 *                  per-kernel state (em), the helpers every source starts
 *                  with and the naming of a source by its hash;
 *   cuda_expr.c    text: lines, dtypes, literals and conversions, which
 *                  expressions a body needs and how it indexes, and the
 *                  lowering of scalar expressions (lower_cuda), loads and
 *                  stores;
 *   cuda_reduce.c  reduction kernels: a schedule (the launch geometry and
 *                  strategy, no text), then the text from it;
 *   cuda_multi.c   multi-tensor launches (an optimizer's update chains);
 *   cuda_lib.c     library ops' own kernels (pooling and its gradients,
 *                  gather, scatter_add, concat, slice_grad);
 *   cuda_attention.c  flash_attention and flash_attention_grad's tiled
 *                  kernels (cuda_lib.c hands them over).
 *
 * Every name here is hidden: nothing outside libtfuse links to it. */
#ifndef TF_CODEGEN_CUDA_EMIT_H
#define TF_CODEGEN_CUDA_EMIT_H

#include "cuda.h"

#pragma GCC visibility push(hidden)

/* ---- text (cuda_expr.c) ---------------------------------------------------- */

typedef tf_strbuf sb;

/* A line at indentation depth (4 spaces a level). */
void cu_line(sb *s, int depth, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- dtypes (cuda_expr.c) -------------------------------------------------- */

/* The C type a buffer of dtype t stores: float, __half, ..., unsigned char for bool. */
const char *cu_storage_type(tf_dt t);
/* The C type a value of dtype t lives in: f16/bf16 in a float. */
const char *cu_value_type(tf_dt t);
/* Whether t computes in float (f32, f16, bf16). */
bool cu_is_f32ish(tf_dt t);
/* code (a value of dtype `from`) as a value of dtype `to`, rounded to it. */
void cu_conv(tf_dt from, tf_dt to, const char *code, char *out, size_t n);
/* A literal of dtype t's value type (v already rounded to t). */
void cu_literal(tf_dt t, double v, char *out, size_t n);

/* ---- the kernel being emitted ---------------------------------------------- */

typedef enum mode { M_FLAT, M_VEC, M_AXES } mode;   /* how a body indexes: flat i, vectors + flat i, axes */

typedef struct em {
    const tf_kernel *k;
    sb s;
    int64_t row[TF_MAX_RANK];   /* row-major strides of the index space */
    int64_t numel;
    bool *written;              /* per buffer: this kernel stores it */
    bool *contig;               /* per expression: a load whose strides are the space's */
    unsigned char *mark;        /* per expression: needed by the current roots */
    bool f16, bf16, vec, rng, wide;
    mode md;
    sb second;                  /* a split reduction's second kernel (its full-space stores), empty when none */
    unsigned grid2, block2;
    const char *bid, *nblocks;  /* pointwise: this block's index and the blocks sharing the work
                                 * (blockIdx.x, gridDim.x; a multi-tensor part's own range) */
    unsigned block;             /* pointwise: threads per block when fixed (a multi-tensor part), 0: chosen */
    const char *count;          /* pointwise: the parameter holding the element count (a multi-tensor part, so that
                                 * parts alike but for their sizes are one function), NULL: the count as a literal */
} em;

/* Which expressions a set of marks selects. */
typedef enum sel { SEL_ALL, SEL_OUTER, SEL_INNER } sel;

/* A kernel's launch, as the body that decides it leaves it. */
typedef struct geom { tf_cuda_shape shape; unsigned grid, block, smem, vec, group, align, scratch; } geom;

/* What emitting kernel k needs to know first; false when out of memory (cuda.c). */
bool cu_em_init(em *e, const tf_kernel *k);

/* ---- which expressions, indexed how (cuda_expr.c) --------------------------- */

/* Mark expression i and everything it reads (a dropout mask reads only the index). */
void cu_mark_from(em *e, int i);
/* Clear every mark. */
void cu_mark_clear(em *e);
/* The axes of extent > 1, as a mask. */
unsigned cu_all_axes(const tf_kernel *k);
/* The axes (of extent > 1) that the selected expressions index with in mode md; *flat whether they use i. */
unsigned cu_axes_used(const em *e, sel which, mode md, bool *flat);
/* const tf_idx iA = ...; for the axes in `axes`, from `var`, the row-major flat index over the axes in `group`. */
void cu_def_axes(em *e, int depth, unsigned axes, unsigned group, const char *var);
/* The sum of iA * stride over the axes of extent > 1 with a stride ("0" when none). */
void cu_offset_code(const tf_kernel *k, const int64_t *strides, char *out, size_t n);

/* ---- expressions and stores (cuda_expr.c) ----------------------------------- */

/* const T eN = ...; for every selected expression, in the kernel IR's order. */
void cu_emit_selected(em *e, int depth, sel which);
/* The store of st's expression into its buffer at index `at`, converted to the buffer's dtype. */
void cu_emit_store(em *e, int depth, const tf_kstore *st, const char *at);
/* Before the loops: one key per marked dropout mask (seed, step, salt mixed). */
void cu_emit_dropout_keys(em *e, int depth);

/* ---- kernels (cuda.c, cuda_reduce.c) ---------------------------------------- */

/* Blocks for `work` items at per_block a block: 1 to the grid limit (the kernels loop past it). */
unsigned cu_blocks_for(int64_t work, unsigned per_block);
/* The widest element of the kernel's buffers, in bytes: the alignment scalar accesses need. */
unsigned cu_widest(const tf_kernel *k);
/* A pointwise kernel's body into e->s and its launch into *g (cuda.c). */
void cu_emit_pointwise(em *e, geom *g);
/* A reduction kernel's body into e->s (a second kernel's into e->second) and its launch into *g (cuda_reduce.c). */
void cu_emit_reduction(em *e, geom *g);

/* ---- the whole source (cuda.c) ---------------------------------------------- */

/* The entry point's name until the hash is known; as long as the name. */
extern const char cu_placeholder[];
/* tf_max, tf_min, tf_relu, tf_isfinite, the saturating conversions: every source has them. */
extern const char cu_helpers_common[];
/* tf_mix64, tf_dropout_key, tf_dropout_keep: the interpreter's dropout draw in 64-bit integers. */
extern const char cu_helpers_rng[];
/* tf_vec, the 16-byte vector (vectorized pointwise loops). */
extern const char cu_helpers_vec[];
/* tf_rh: a float rounded to f16. */
extern const char cu_helpers_f16[];
/* tf_rb: a float rounded to bf16. */
extern const char cu_helpers_bf16[];
/* The parameter list of kernel k: one pointer per buffer, named <prefix>b<i>, appended to params. */
void cu_buffer_params(sb *params, const tf_kernel *k, const bool *written, const char *prefix);
/* Hash src (n bytes), name out by it, put the name in place of the placeholder; out->src takes src. */
void cu_name_source(tf_cuda_kernel *out, char *src, size_t n);

/* ---- flash attention (cuda_attention.c) -------------------------------------- */

/* Whether cu_emit_attention emits k's flash_attention(_grad); if not, why. */
bool cu_attention_supports(const tf_kernel *k, char *why, size_t n);
/* Its kernels into *out (zeroed first); dropout is drawn when train. */
tf_ir_status cu_emit_attention(const tf_kernel *k, bool train, tf_cuda_kernel *out, tf_diag *d);

#pragma GCC visibility pop

#endif
