/* ops.h — the op table's C face: enum, kinds, execution classes, flags and
 * per-op descriptors.
 *
 * Everything here is an expansion of ops.def. Passes, code generators and
 * backends ask about properties (tf_op_has(op, TF_OPF_LAYER),
 * tf_op_info_of(op)->kind, tf_op_exec_of(op)) rather than listing ops. */
#ifndef TF_IR_OPS_H
#define TF_IR_OPS_H

#include "ir.h"

typedef enum tf_op {
#define TF_OP(E, ...) TF_OP_##E,
#include "ops.def"
#undef TF_OP
    TF_OP_COUNT
} tf_op;

typedef enum tf_op_kind {
    TF_OPK_POINTWISE, TF_OPK_REDUCTION, TF_OPK_MATMUL, TF_OPK_CONV, TF_OPK_POOL,
    TF_OPK_LAYOUT, TF_OPK_GATHER, TF_OPK_NORM, TF_OPK_LOSS, TF_OPK_RNG, TF_OPK_GENERATOR, TF_OPK_COMM,
} tf_op_kind;

/* How a backend executes an op: ops.def's EXEC column, which says what each
 * value means. Everything that sorts ops into classes (the fuser, the kernel
 * builder, memplan, the code generators, the backends, `tfuse doctor`'s op
 * table) asks these, so that an op of an existing class is added in ops.def
 * and its own functions only. */
typedef enum tf_op_exec {
    TF_OPX_LAYER, TF_OPX_EXPR, TF_OPX_INDEX, TF_OPX_REDUCE, TF_OPX_VIEW, TF_OPX_BCAST, TF_OPX_COPY,
    TF_OPX_GEMM, TF_OPX_CONV,
    TF_OPX_POOL, TF_OPX_POOL_GRAD, TF_OPX_GATHER, TF_OPX_SCATTER, TF_OPX_CONCAT, TF_OPX_SLICE_GRAD, TF_OPX_ATTENTION,
    TF_OPX_COMM,
    TF_OPX_COUNT
} tf_op_exec;

enum {
    TF_OPF_LAYER       = 1 << 0,
    TF_OPF_BOOLOUT     = 1 << 1,
    TF_OPF_FLOATIN     = 1 << 2,
    TF_OPF_MODE        = 1 << 3,
    TF_OPF_COMMUTATIVE = 1 << 4,
    TF_OPF_AMP_QKV     = 1 << 5,
};

typedef enum tf_amp_policy { TF_AMP_ALLOW, TF_AMP_DENY, TF_AMP_FOLLOW } tf_amp_policy;

/* Interpreter tensors: every element is a double holding a value already
 * rounded to the tensor's dtype, so the oracle computes in float64 while
 * storage precision is still honoured. Row-major, contiguous. */
typedef struct tf_tensor {
    tf_dt dtype;
    int rank;
    int64_t dims[TF_MAX_RANK];
    int64_t numel;
    double *data;
} tf_tensor;

typedef enum tf_ir_mode { TF_IR_TRAIN, TF_IR_INFER } tf_ir_mode;

typedef struct tf_interp_ctx tf_interp_ctx;  /* interp.h */

typedef tf_ir_status (*tf_shape_fn)(tf_module *m, tf_node *n, tf_type *out, tf_diag *d);
typedef tf_ir_status (*tf_interp_fn)(tf_interp_ctx *ip, const tf_node *n,
                                     const tf_tensor *const *in, tf_tensor *out);
typedef double (*tf_scalar_fn)(double a, double b);

typedef struct tf_op_info {
    const char *name;
    int min_in, max_in;
    tf_op_kind kind;
    tf_op_exec exec;
    unsigned flags;
    const tf_attr_spec *attrs;
    int nattrs;
    tf_shape_fn shape;
    tf_interp_fn interp;
    tf_scalar_fn scalar;
    const char *lower;      /* the scalar expression code generators lower it from, or NULL */
    tf_amp_policy amp;
} tf_op_info;

extern const tf_op_info tf_op_table[TF_OP_COUNT];

static inline const tf_op_info *tf_op_info_of(int op) { return &tf_op_table[op]; }
static inline bool tf_op_has(int op, unsigned flag) { return (tf_op_table[op].flags & flag) != 0; }
static inline tf_op_exec tf_op_exec_of(int op) { return tf_op_table[op].exec; }
/* The class's name, as profiles and `tfuse doctor` print it ("pool", "gemm"). */
const char *tf_exec_name(tf_op_exec x);
/* Computed elementwise in a generated kernel: from its expression or its index. */
static inline bool tf_exec_elementwise(tf_op_exec x) { return x == TF_OPX_EXPR || x == TF_OPX_INDEX; }
/* A library call (GEMM, convolution) or an op with a kernel of its own: not
 * fused into generated kernels (kernel.c makes it a TF_K_LIBRARY kernel). */
static inline bool tf_exec_library(tf_op_exec x) { return x >= TF_OPX_GEMM; }
/* A library op whose kernel tfuse writes itself (pooling, gather, scatter,
 * concat, slice_grad), rather than calling a BLAS or convolution library. */
static inline bool tf_exec_own_kernel(tf_op_exec x) { return x >= TF_OPX_POOL; }
/* A gather or scatter: reads row ids (checked against the table's rows). */
static inline bool tf_exec_indexed(tf_op_exec x) { return x == TF_OPX_GATHER || x == TF_OPX_SCATTER; }
/* Whether node n's result is a view of its operand's storage (a reshape of
 * a computed value; a constant's reshape is folded into a constant). */
bool tf_node_is_view(const tf_node *n);
/* The value whose storage v's lives in: v itself, or through views the
 * value they view. */
const tf_value *tf_value_storage(const tf_value *v);
/* An attention op's geometry and attributes (attention, flash_attention,
 * flash_attention_grad; ir/attention.c says what they compute): q [B, H,
 * Tq, D], k [B, Hk, Tk, D], v [B, Hk, Tk, Dv]; query head h reads key/value
 * head h / (H / Hk). */
typedef struct tf_attn_geom {
    int64_t B, H, Hk, Tq, Tk, D, Dv;
    double scale;          /* resolved: attention's unset scale is 1/sqrt(D) */
    double dropout;        /* p on the probabilities, in train mode; 0: none */
    uint64_t salt;         /* dropout's stream */
    bool causal;           /* key j visible to query i only when j <= i */
    bool lse;              /* flash_attention: the result's last column is the row's log-sum-exp */
    int mask;              /* the mask's operand index, or -1 */
    bool mask_bool;        /* true: which keys are visible; false: added to the scores */
    int64_t mstride[4];    /* the mask's element strides over [B, H, Tq, Tk], 0 where it broadcasts */
} tf_attn_geom;
void tf_attn_geom_of(const tf_node *n, tf_attn_geom *g);

/* -1 if no op has that name. */
int tf_op_lookup(const char *name, size_t len);
/* Index of attribute `name` in the op's schema, -1 if none. */
int tf_op_attr_index(int op, const char *name);
static inline const tf_attr *tf_node_attr(const tf_node *n, int idx) { return &n->attrs[idx]; }
/* Convenience getters by name for code outside the table (passes, kernels). */
int64_t tf_node_int(const tf_node *n, const char *name);
double tf_node_float(const tf_node *n, const char *name);
bool tf_node_bool(const tf_node *n, const char *name);
const char *tf_node_str(const tf_node *n, const char *name);
const tf_attr *tf_node_attr_named(const tf_node *n, const char *name);

/* An INTS attribute given as one value or [h, w] (stride, padding, kernel):
 * the two spatial values; [] (or absent) gives d0, d1. */
void tf_node_pair(const tf_node *n, const char *name, int64_t d0, int64_t d1, int64_t v[2]);

/* Python slicing bounds on an axis of length len: negative start/end count
 * from the end, then both are clamped to [0, len]; hi may be NULL. */
void tf_slice_bounds(int64_t len, int64_t start, int64_t end, int64_t *lo, int64_t *hi);

/* Normalize an axis (negative counts from the end) against a rank; false if
 * out of range. */
bool tf_axis_norm(int64_t axis, int rank, int *out);

/* cost.c: an estimate of the floating-point operations a node computes (two
 * per multiply-add; an element of a pointwise, layout, gather or reduction op
 * counts one, a reshape none), from its op's kind and its types. The _heavy
 * variant counts matmuls and convolutions only (0 for the rest). */
int64_t tf_node_flops(const tf_node *n);
int64_t tf_node_flops_heavy(const tf_node *n);

/* ---- initializers and train-block functions (also tables) ---- */

typedef struct tf_fn_info {       /* a call-like thing that is not an op */
    const char *name;
    const tf_attr_spec *attrs;
    int nattrs;
} tf_fn_info;

enum { TF_INIT_ZEROS, TF_INIT_ONES, TF_INIT_CONST, TF_INIT_NORMAL, TF_INIT_UNIFORM,
       TF_INIT_KAIMING_UNIFORM, TF_INIT_XAVIER_UNIFORM, TF_INIT_COUNT };
enum { TF_OPT_SGD, TF_OPT_ADAM, TF_OPT_ADAMW, TF_OPT_LAMB, TF_OPT_COUNT };
enum { TF_SCHED_CONSTANT, TF_SCHED_STEP, TF_SCHED_COSINE, TF_SCHED_ONECYCLE, TF_SCHED_COUNT };

extern const tf_fn_info tf_init_fns[TF_INIT_COUNT];
extern const tf_fn_info tf_optimizer_fns[TF_OPT_COUNT];
extern const tf_fn_info tf_schedule_fns[TF_SCHED_COUNT];
int tf_fn_lookup(const tf_fn_info *fns, int n, const char *name, size_t len);
double tf_call_float(const tf_fn_info *fns, const tf_call *c, const char *name);

#endif
