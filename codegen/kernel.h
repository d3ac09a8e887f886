/* kernel.h — the kernel IR: what both emitters (llvm.c for the CPU,
 * cuda.c for NVRTC) lower, built from the module after fuse and memplan.
 *
 * One kernel per fused region or per op outside a region, in program order:
 *
 *   TF_K_ELEMENTWISE  an index space (the region's shape); loads with strides
 *                     over it (0 on broadcast axes), a scalar expression DAG,
 *                     stores of the values that leave the region;
 *   TF_K_REDUCTION    the same over an index space split into outer axes and
 *                     reduced axes (mask); a list of reductions evaluated in
 *                     order (a later one may read an earlier one's result,
 *                     as layernorm's variance reads its mean), expressions on
 *                     the full space or on the reduced one, and stores on
 *                     either;
 *   TF_K_LIBRARY      one op a library or a hand-written kernel runs as a
 *                     whole (matmul, conv, pooling, gather, concat),
 *                     with, for a gemm region, an elementwise epilogue over
 *                     its output;
 *   TF_K_VIEW         a reshape: no work, its result aliases its operand.
 *
 * A lone transpose, broadcast or slice is an elementwise copy kernel whose one
 * load carries the permuted, zero or stepped strides and the slice's offset.
 *
 * The index space is the region's shape with adjacent axes merged where
 * every load steps them as one row-major axis (reduced ones up to 4096
 * elements together; kernel.c merge_axes): a contiguous update of a [512, 512, 3, 3]
 * weight is one axis of 2.4 M elements, and flat indices are unchanged.
 *
 * Buffers are module values (inputs, params, buffers, results in the arena).
 * Expressions use the op table's scalar semantics: each expression has a
 * dtype and its value is rounded to it (to f32 when held wide, tf_node_wide),
 * exactly as the interpreter rounds each op, so evaluating the kernel IR (kernel_eval.c) reproduces the
 * interpreter bit for bit: the test of the whole lowering. */
#ifndef TF_CODEGEN_KERNEL_H
#define TF_CODEGEN_KERNEL_H

#include "ops.h"

typedef enum tf_kernel_kind { TF_K_ELEMENTWISE, TF_K_REDUCTION, TF_K_LIBRARY, TF_K_VIEW } tf_kernel_kind;

typedef enum tf_kexpr_kind {
    TF_KX_LOAD,    /* buf[offset + sum(index[i] * strides[i])]; transposes,
                    * broadcasts and slices are strides and an offset */
    TF_KX_CONST,   /* a number */
    TF_KX_OP,      /* a pointwise op of the table (or cast) over args */
    TF_KX_REDUCED, /* the result of reduction `red` at the current outer index */
    TF_KX_INDEX,   /* index[axis] along the index space (iota) */
} tf_kexpr_kind;

typedef struct tf_kexpr {
    tf_kexpr_kind kind;
    int op;                /* KX_OP: tf_op */
    tf_dt dtype;
    int nargs, args[3];    /* earlier expressions */
    int buf;               /* KX_LOAD: index into kernel->bufs */
    int64_t strides[TF_MAX_RANK];   /* KX_LOAD: per index-space axis, elements */
    int64_t offset;        /* KX_LOAD: elements */
    double value;          /* KX_CONST */
    int red;               /* KX_REDUCED */
    int axis;              /* KX_INDEX */
    bool reduced_domain;   /* depends only on outer axes (evaluated once per outer index);
                            * for dropout_mask, which draws by a flat index: that of
                            * the outer axes when set, else of the full space */
    const tf_node *node;   /* the op it comes from (names, locations) */
    bool wide;             /* an f16/bf16 value held at f32 (tf_node_wide): rounded to f32, not its dtype */
} tf_kexpr;

/* The dtype a value is rounded to: its own, or f32 when held wide. */
static inline tf_dt tf_kexpr_round(const tf_kexpr *x) { return x->wide ? TF_DT_F32 : x->dtype; }

typedef struct tf_kreduce {
    int op;                /* TF_OP_REDUCE_SUM / _MEAN / _MAX */
    int arg;               /* expression on the full space */
    tf_dt dtype;           /* result dtype */
    double count;          /* elements reduced (for mean) */
    bool wide;             /* held at f32 (tf_node_wide) */
} tf_kreduce;

static inline tf_dt tf_kreduce_round(const tf_kreduce *r) { return r->wide ? TF_DT_F32 : r->dtype; }

typedef struct tf_kstore {
    int buf;
    int expr;
    bool reduced_domain;   /* stored once per outer index */
} tf_kstore;

typedef struct tf_kbuf {
    const tf_value *value;
    bool written;
    bool disjoint;         /* its memory overlaps no other buffer of the kernel:
                            * distinct values, not views of one another, not
                            * overlapping in memplan's arena (in-place reuse);
                            * the emitters may then assume no aliasing */
} tf_kbuf;

typedef struct tf_kernel {
    char name[64];         /* k<N>_<first op>, for profiles and dumps */
    tf_kernel_kind kind;
    int rank;
    int64_t dims[TF_MAX_RANK];
    unsigned reduce_mask;  /* TF_K_REDUCTION */
    const tf_node *lib;    /* TF_K_LIBRARY / TF_K_VIEW: the op */
    int region;            /* the region it comes from, 0 for a lone op */
    bool multi;            /* an elementwise part of a multi-tensor region (one per update
                            * chain); the cuda target launches consecutive independent
                            * parts as one kernel (tf_cuda_multi_span) */
    tf_kbuf *bufs; int nbufs;
    tf_kexpr *exprs; int nexprs;
    tf_kreduce *reds; int nreds;
    tf_kstore *stores; int nstores;
} tf_kernel;

typedef struct tf_kernel_plan {
    tf_kernel *kernels;
    int nkernels;
} tf_kernel_plan;

/* Build the kernels of a module (after fuse; any module works: without
 * regions every op is its own kernel). */
tf_ir_status tf_kernels_build(const tf_module *m, tf_kernel_plan *out, tf_diag *d);
void tf_kernels_free(tf_kernel_plan *p);
/* The axis a backend splits the kernel's outermost loop nest along (over
 * threads, or over blocks): an axis of every elementwise kernel, an outer
 * axis of a reduction; the first with at least 16 iterations, else the
 * longest; -1 when there is none (rank 0, or a reduction over every axis). */
int tf_kernel_split_axis(const tf_kernel *k);

/* The program's kernels, as compile --stats, bench and --dump-kernels
 * count them: one per region (a multi-tensor region is one, however many
 * update chains it has), one per op outside a region, none for a view. */
int tf_kernels_count(const tf_kernel_plan *p);

/* The least memory traffic one run of kernel k needs, in bytes: what it
 * moves when no byte is fetched twice, the numerator of a bandwidth figure
 * (`tfuse bench --profile`'s GB/s and its ratio to a copy's bandwidth).
 * Each written buffer is written once, whole. A buffer read by loads counts
 * the elements those loads touch: per distinct load (strides and offset),
 * the index space's extent along the axes it steps (a broadcast axis reads
 * one element), summed and capped at the buffer's size. A library op's
 * operands are read whole, but for a gather-kind op (gather, embedding,
 * scatter_add) each counts at most as many elements as the op's result, as
 * only those rows are touched. A view moves nothing. For a GEMM or a
 * convolution this is a lower bound: tiling rereads operands. */
int64_t tf_kernel_bytes(const tf_kernel *k);

/* Whether two kernels may run at once: neither writes memory the other
 * reads or writes (values, their views, and memplan's arena placement). */
bool tf_kernels_independent(const tf_kernel *a, const tf_kernel *b);

/* k over the channel-blocked index space [N, C / B, S, B] in place of its
 * own, whose elements (row-major) are the NCHW tensor's [N, C, S] (S = H *
 * W): the buffers marked in blocked (one flag per k->bufs) are in the
 * layout (n, c / B, s, c % B), as oneDNN's nChw16c is for B = 16, and are
 * read and written there; the others are read where they are (an NCHW
 * image, a per-channel bias, a scalar). Its stores then write blocked
 * buffers by their flat index, which is the blocked layout's offset, so
 * every stored buffer must be blocked. An elementwise kernel, or a library
 * kernel's epilogue; no iota or dropout (both see the flat index), and
 * each of k's axes must be a run of whole n, c, s axes. 1 when it made out
 * (freed with tf_kernel_free), 0 when k is not such a kernel, -1 when out
 * of memory (out untouched either way). */
int tf_kernel_blocked(const tf_kernel *k, const bool *blocked, int64_t N, int64_t C, int64_t S, int64_t B, tf_kernel *out);
void tf_kernel_free(tf_kernel *k);

/* The reductions a kernel can hold (sum, mean, max): the ones both code
 * generators fold in their reduction loops. */
bool tf_kernel_reduction_ok(int op);
/* Whether a core op becomes a TF_KX_OP expression in kernels: the ops the
 * code generators lower from ops.def's scalar expression (iota becomes an
 * index, not an op). */
bool tf_kernel_op_is_expr(int op);

/* A text that equal kernels share and different ones do not: kind, space,
 * split axis, buffer dtypes, expressions (with dropout's p and salt),
 * reductions and stores; not the name or the buffers' values. Compiled
 * code is cached under it. malloc'd; NULL when out of memory. */
char *tf_kernel_key(const tf_kernel *k);

/* Text of every kernel, for --dump-kernels; malloc'd. */
char *tf_kernels_print(const tf_module *m, const tf_kernel_plan *p);

/* Run the kernels on the interpreter's tensors of ip (reference semantics:
 * the emitters must agree with this). */
tf_ir_status tf_kernels_eval(const tf_kernel_plan *p, tf_interp_ctx *ip, tf_diag *d);

/* What generated CPU code calls in the runtime, by the name it calls it
 * (llvm.c's "tf_jit_dropout_uniform": the dropout draw, as kernel_eval.c
 * draws it); NULL for any other name. The shape of objload.h's resolver:
 * ctx is unused. */
void *tf_kernel_runtime_symbol(const char *name, void *ctx);

#endif
