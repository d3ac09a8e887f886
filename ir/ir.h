/* ir.h — the tfuse IR: dtypes, shapes, attributes, values, nodes, modules.
 *
 * A module is a straight-line SSA graph: declarations (input/param/buffer),
 * one op per node with exactly one result, outputs, buffer updates and the
 * train block. Every object lives in the module's arena. This layer needs
 * nothing but libc; errors go into a tf_diag, never to stderr or exit().
 *
 * Shapes carry, per dimension, the index of the `dim` declaration it came
 * from (sym), so `input x : f32[B, 784]` still prints as `[B, 784]` after B
 * was resolved to 64, and a dump compiles again under another `--dim B=...`. */
#ifndef TF_IR_IR_H
#define TF_IR_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>

#include "alloc.h"
#include "arena.h"

/* ---- status and diagnostics ------------------------------------------- */

typedef enum tf_ir_status {
    TF_IR_OK = 0,
    TF_IR_ERR_SYNTAX,      /* lexer/parser */
    TF_IR_ERR_VERIFY,      /* types, shapes, SSA, attributes */
    TF_IR_ERR_LIMIT,       /* sizes beyond what tfuse accepts */
    TF_IR_ERR_OOM,
    TF_IR_ERR_RUNTIME,     /* interpreter: bad input data, missing binding */
    TF_IR_ERR_INTERNAL,
} tf_ir_status;

typedef struct tf_loc {
    const char *file;      /* arena-owned or static; never NULL when line > 0 */
    int line, col;         /* 1-based; line 0 = no location */
} tf_loc;

/* The first error wins; later ones are dropped so the message names the cause. */
typedef struct tf_diag {
    tf_ir_status status;
    char msg[6144];        /* room for a PATH_MAX path and the message */
} tf_diag;

tf_ir_status tf_diag_error(tf_diag *d, tf_ir_status st, const tf_loc *loc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void tf_diag_clear(tf_diag *d);

/* ---- dtypes ------------------------------------------------------------ */

#define TF_DTYPES(X) \
    /* enum   name    bytes float */ \
    X(F32,  "f32",  4, 1) \
    X(F16,  "f16",  2, 1) \
    X(BF16, "bf16", 2, 1) \
    X(F64,  "f64",  8, 1) \
    X(I64,  "i64",  8, 0) \
    X(I32,  "i32",  4, 0) \
    X(BOOL, "bool", 1, 0)

typedef enum tf_dt {
#define X(e, n, b, f) TF_DT_##e,
    TF_DTYPES(X)
#undef X
    TF_DT_COUNT
} tf_dt;

const char *tf_dtype_name(tf_dt t);
int  tf_dtype_bytes(tf_dt t);
bool tf_dtype_is_float(tf_dt t);
bool tf_dtype_from_name(const char *s, size_t n, tf_dt *out);
/* Round a value to what the dtype can hold (f32/f16/bf16 rounding to nearest
 * even, integers truncated toward zero, bool to 0/1). */
double tf_dtype_round(tf_dt t, double v);
/* Element i of an array of dtype t in storage form (f16/bf16 as their 16 bits,
 * bool as a byte), as a double; and v stored there, rounded to t. */
double tf_elem_load(tf_dt t, const void *base, int64_t i);
void tf_elem_store(tf_dt t, void *base, int64_t i, double v);

/* tfuse's own exp, expm1 and tanh (double in, double out), used by the op
 * table's scalar functions, hence by the interpreter, and spelled operation
 * for operation by the LLVM emitter, whose loops then vectorize them (a libm
 * call would not) and still store the interpreter's bits. exp: Cody-Waite
 * reduction by ln 2 and a degree-13 Taylor polynomial on |r| <= ln2/2, 2^n
 * applied in two halves (so subnormal results come out right); within 2 ulp
 * of the correctly rounded value. expm1: the same polynomial without its 1
 * for |x| < 0.3465, exp(x) - 1 beyond. tanh(x) = -t / (2 + t), t =
 * expm1(-2|x|), with x's sign. TF_EXP_COEFFS are 1/k! for k = 0..13. */
enum { TF_EXP_DEGREE = 13 };
extern const double tf_exp_coeffs[TF_EXP_DEGREE + 1];
#define TF_EXP_LOG2E 1.4426950408889634
#define TF_EXP_LN2_HI 0x1.62e42feep-1
#define TF_EXP_LN2_LO 0x1.a39ef35793c76p-33
#define TF_EXP_OVER 709.782712893384    /* above: +inf */
#define TF_EXP_UNDER -745.2             /* below: 0 */
#define TF_EXPM1_SMALL 0.3465
/* A growing text buffer: printf-style appends, malloc'd p (NUL-terminated
 * when not oom); after a failed allocation every append is a no-op and oom
 * stays set. The printer, the kernel IR's printer and the CUDA emitter
 * write through it. */
typedef struct tf_strbuf { char *p; size_t n, cap; bool oom; } tf_strbuf;
void tf_strbuf_printf(tf_strbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tf_strbuf_vprintf(tf_strbuf *s, const char *fmt, va_list ap);
/* p[0..n) appended as it is (no format: the fast way to add text). */
void tf_strbuf_append(tf_strbuf *s, const char *p, size_t n);

/* How every reduction adds up (interpreter, kernel_eval and both emitters
 * alike): in double, over TF_RED_LANES lanes; the element at row-major
 * position t of the reduced axes goes to lane t % 8, each lane in increasing
 * t, starting from 0 (sum, mean) or -inf (max); then the lanes combine as
 * ((l0 . l1) . (l2 . l3)) . ((l4 . l5) . (l6 . l7)). Eight independent
 * chains are what lets a CPU vectorize the sum without changing its bits,
 * and blocked sums are more accurate than one long chain. Max keeps the
 * first NaN it meets, and of equal values the earlier: tf_max_step. */
enum { TF_RED_LANES = 8 };
static inline double tf_max_step(double acc, double v) { return acc == acc && (v != v || v > acc) ? v : acc; }
double tf_lanes_sum(const double *lanes);
double tf_lanes_max(const double *lanes);
double tf_exp(double x);
double tf_expm1(double x);
double tf_tanh(double x);

/* ---- shapes and types ----------------------------------------------------- */

enum { TF_MAX_RANK = 8 };
/* One dimension may not exceed 2^40, a tensor 2^48 elements: beyond that a
 * model is a typo, and products stay far from int64 overflow. */
#define TF_MAX_DIM   ((int64_t)1 << 40)
#define TF_MAX_NUMEL ((int64_t)1 << 48)

typedef struct tf_dim {
    int64_t n;
    int32_t sym;           /* index into module->dims, or -1 */
} tf_dim;

typedef struct tf_type {
    tf_dt dtype;
    int rank;
    tf_dim dims[TF_MAX_RANK];
} tf_type;

int64_t tf_type_numel(const tf_type *t);
bool tf_type_same_shape(const tf_type *a, const tf_type *b);
bool tf_type_equal(const tf_type *a, const tf_type *b);   /* dtype + shape, syms ignored */

/* Placing tensors in a fused kernel's index space (fuse decides with these
 * which ops may share a kernel, the kernel builder where each reads). The
 * space has `rank` axes of sizes `dims`, those in `reduce_mask` reduced.
 * A placement gives, for each axis j of a tensor, the space axis it runs
 * along, or -1 where the tensor has size 1 there (broadcast).
 * tf_place_result: an op's result lies on the space itself (axis to axis,
 * size-1 axes broadcast, as a reduction kept with keepdims) or on the space
 * with the reduced axes dropped (onto the outer axes, in order); false for
 * any other shape. tf_place_operand: an operand of an op whose result lies
 * at res (rank rrank) aligns with the result from the right (NumPy), or from
 * the left with `leading` (one_hot's labels); false when the sizes do not
 * fit. A value computed in a kernel can be reused by a reader only where
 * both placements agree: reduce_sum(x[4,4], axes=[1]) lies on axis 0, and
 * add(x, it) reads it along axis 1. */
bool tf_place_result(int rank, const int64_t *dims, unsigned reduce_mask, const tf_type *t, int8_t *axis);
bool tf_place_operand(const int64_t *dims, const int8_t *res, int rrank, const tf_type *v, bool leading, int8_t *axis);

/* ---- attributes -------------------------------------------------------------- */

typedef enum tf_attr_kind {
    TF_ATTR_NONE = 0,
    TF_ATTR_INT,
    TF_ATTR_FLOAT,
    TF_ATTR_BOOL,
    TF_ATTR_STR,           /* also bare identifiers that name a choice: approx=tanh */
    TF_ATTR_INTS,          /* list of ints; a scalar is accepted and kept as scalar */
    TF_ATTR_DTYPE,
} tf_attr_kind;

typedef struct tf_ival {
    int64_t v;
    int32_t sym;           /* a dim name written in place of the number, or -1 */
} tf_ival;

typedef struct tf_attr {
    tf_attr_kind kind;
    bool set;              /* written by the user (printed); else the default */
    bool scalar;           /* TF_ATTR_INTS written as a single int */
    union {
        tf_ival i;
        double f;
        bool b;
        const char *s;
        tf_dt dt;
        struct { int n; tf_ival *v; } ints;
    } u;
} tf_attr;

/* Schema of one attribute. Defaults are text in the format's own syntax
 * ("0.1", "[]", "f32", "\"none\""), read by tf_attr_parse_default and then
 * coerced and checked exactly like a value the user wrote. */
typedef struct tf_attr_spec {
    const char *name;
    tf_attr_kind kind;
    const char *dflt;      /* NULL: required */
    double min, max;       /* inclusive range for INT/FLOAT/INTS elements (min>max: none) */
    const char *choices;   /* STR: '|'-separated allowed values, or NULL */
} tf_attr_spec;

/* ---- values and nodes ------------------------------------------------------- */

typedef enum tf_value_kind {
    TF_VAL_INPUT,
    TF_VAL_PARAM,
    TF_VAL_BUFFER,
    TF_VAL_NODE,           /* result of a node */
    TF_VAL_CONST,          /* a number written as an operand; rank 0 */
} tf_value_kind;

typedef struct tf_node tf_node;

/* A call-like value that is not an op: initializers (`= kaiming_uniform()`)
 * and the train block's optimizer and schedule. fn indexes the matching
 * function table of ops.h; attrs follow that function's schema. */
typedef struct tf_call {
    int fn;                 /* -1 if unset */
    int nattr;
    tf_attr *attrs;
    tf_loc loc;
} tf_call;
typedef tf_call tf_init;

typedef struct tf_value {
    const char *name;      /* NULL for constants */
    tf_value_kind kind;
    tf_type type;
    tf_node *def;          /* TF_VAL_NODE only */
    double cval;           /* TF_VAL_CONST only */
    tf_init init;          /* TF_VAL_PARAM / TF_VAL_BUFFER */
    int id;                /* dense index within the module, set by tf_module_renumber */
    int64_t offset;        /* memplan: byte offset in the arena; -1 = none (persistent, view, private) */
    struct tf_value *home; /* memplan: the param or buffer an update writes this value into in place
                            * (its storage is that state's; offset -1); NULL: none */
    bool zero_grad;        /* a param whose gradient is exactly zero: bias_drop's dropped bias, which the
                            * optimizer still sees (with a zero gradient, weight decay moves it, as in PyTorch) */
    bool once;             /* memplan, inference: computed from params, buffers and constants alone (a batch
                            * norm folded into a weight), so the same in every step until the state changes;
                            * its memory is its own for the whole step, and a target may compute it once */
    tf_loc loc;
} tf_value;

typedef struct tf_node {
    int op;                /* tf_op */
    int nin;
    tf_value **in;
    tf_value *out;
    tf_attr *attrs;        /* one per entry of the op's schema */
    bool annotated;        /* the source wrote `name : type = ...` */
    int region;            /* 1 + index into module->regions, 0 = none */
    bool backward;         /* built by autodiff (backward pass, optimizer):
                            * fuse keeps it apart from forward ops, whose
                            * results would otherwise live until the
                            * backward pass; printed `backward=true` */
    bool recompute;        /* a forward op computed again for the backward
                            * pass (checkpoint); printed `recompute=true`,
                            * never merged with its original by cse */
    tf_type annot;         /* that type, checked by the verifier */
    tf_loc loc;
} tf_node;

typedef struct tf_dim_decl {
    const char *name;
    int64_t value;
    tf_loc loc;
} tf_dim_decl;

typedef struct tf_output {
    const char *name;      /* the output's name (defaults to the value's) */
    tf_value *value;
    tf_loc loc;
} tf_output;

typedef struct tf_update {  /* state <- value after each step: buffers (batchnorm
                             * stats, optimizer moments) and, in a training
                             * step, params */
    tf_value *buffer;
    tf_value *value;
    tf_loc loc;
} tf_update;

/* ---- the train block ---------------------------------------------------------- */

typedef enum tf_ir_precision { TF_PREC_FP32, TF_PREC_FP16, TF_PREC_BF16 } tf_ir_precision;

typedef struct tf_train {
    bool present;
    tf_loc loc;
    tf_call optimizer;      /* fn indexes tf_optimizer_fns */
    tf_call schedule;       /* fn indexes tf_schedule_fns */
    bool has_precision, has_clip, has_accumulate;
    tf_ir_precision precision;
    double clip_grad_norm;  /* 0: off */
    int64_t accumulate;     /* >= 1 */
    const char **metrics;   /* `metrics = a, b`: scalar outputs logged beside the loss (tfuse train); arena */
    tf_loc *metric_locs;
    int nmetrics;
} tf_train;

/* ---- fused regions ----------------------------------------------------------------- */

/* A region groups consecutive nodes that run as one kernel. Nodes keep their
 * place in m->nodes (the interpreter runs them one by one, so a region never
 * changes what a module computes); a node's `region` field says where it
 * belongs. Values a region defines are private to it unless yielded: only
 * yielded values are materialized in memory. In the text format:
 *
 *   region fuse.2 kind=reduction {
 *     s.max : f32[B, 1] = reduce_max(x, axes=[-1], keepdims=true)
 *     ...
 *     yield s
 *   }                                                                        */
/* multi: independent pointwise chains of different shapes run by one
 * kernel (the optimizer's updates of every param: a multi-tensor apply). */
typedef enum tf_region_kind { TF_REGION_POINTWISE, TF_REGION_REDUCTION, TF_REGION_GEMM, TF_REGION_MULTI,
                              TF_REGION_KIND_COUNT } tf_region_kind;

typedef struct tf_region {
    const char *name;
    tf_region_kind kind;
    tf_value **yields;     /* arena */
    int nyields;
    tf_loc loc;
    bool wide;             /* `numerics=fast` (fuse, unless --numerics=exact): the f16/bf16 values
                            * the region keeps to itself are held at f32 (tf_node_wide) */
} tf_region;

const char *tf_region_kind_name(tf_region_kind k);

/* ---- module ------------------------------------------------------------------------ */

typedef struct tf_vec { void **items; int n, cap; } tf_vec;

typedef struct tf_module {
    tf_arena arena;
    const char *name;       /* `module NAME`, or NULL */
    const char *file;       /* source file for diagnostics */
    tf_dim_decl *dims; int ndims, cap_dims;
    tf_vec decls;           /* tf_value*: input/param/buffer in source order */
    tf_vec nodes;           /* tf_node*: topological (source) order */
    tf_output *outputs; int noutputs, cap_outputs;
    tf_update *updates; int nupdates, cap_updates;
    tf_train train;
    tf_region *regions; int nregions, cap_regions;
    struct {                /* memplan's result; valid while planned */
        bool planned;
        int64_t arena_bytes;      /* activations: one allocation, carved by offset */
        int64_t persistent_bytes; /* inputs, params, buffers */
        int reused;               /* results written in place over a dead operand */
        int updates_in_place;     /* update values written straight into their param or buffer (value->home) */
    } plan;
    int backward_start;     /* autodiff: index of the first backward node; 0 = none.
                             * Valid until a pass reorders nodes. */
    struct { tf_value **slots; int cap, count; } names;   /* name -> value hash */
    int next_id;
} tf_module;

tf_module *tf_module_create(const char *file);
void tf_module_free(tf_module *m);
tf_ir_status tf_vec_push(tf_module *m, tf_vec *v, void *item);
/* Make room for one more element in a malloc'd array (*items, *n, *cap). */
tf_ir_status tf_grow(void **items, int n, int *cap, size_t elem);
/* Append a dim, an output or a buffer update; OOM is the only failure. */
tf_ir_status tf_module_add_dim(tf_module *m, const char *name, int64_t value, tf_loc loc);
tf_ir_status tf_module_add_output(tf_module *m, const char *name, tf_value *v, tf_loc loc);
tf_ir_status tf_module_add_update(tf_module *m, tf_value *buffer, tf_value *value, tf_loc loc);
/* Declare a param/buffer/input (appended to decls; init `fn` with default
 * attributes). NULL on OOM or a taken name. */
tf_value *tf_module_add_decl(tf_module *m, const char *name, tf_value_kind kind, const tf_type *type, int init_fn);
/* Add a region (yields filled later); returns its 1-based id, 0 on OOM. */
int tf_module_add_region(tf_module *m, const char *name, tf_region_kind kind, tf_loc loc);
/* Forget every region: nodes stay, each runs on its own again. */
void tf_module_clear_regions(tf_module *m);
/* Fast 16-bit numerics (docs/numerics.md). In a region marked
 * numerics=fast, the value of a node is held at f32 precision, not rounded
 * to its f16/bf16 dtype, when the region keeps it to itself: the node is a
 * pointwise op other than cast, a reduction or a broadcast, and the region
 * does not yield it. It is rounded to its dtype only where it is stored (a
 * yield), as a kernel computes a chain in f32 and rounds on the store. An
 * explicit cast still rounds. A multi-tensor region never holds values wide.
 * The interpreter and every code generator round by this one rule. */
bool tf_node_wide(const tf_module *m, const tf_node *n);
/* Whether a region marked numerics=fast would hold any value wide: fuse
 * marks only regions where the mark changes something. */
bool tf_region_has_wide(const tf_module *m, int region);

/* Name lookups. Values are found through a hash table kept by
 * tf_module_add_name (the parser and tf_build register every name). */
tf_value *tf_module_find_value(const tf_module *m, const char *name);
tf_value *tf_module_find_valuen(const tf_module *m, const char *name, size_t len);
tf_ir_status tf_module_add_name(tf_module *m, tf_value *v);
void tf_module_remove_name(tf_module *m, const tf_value *v);
int tf_module_find_dim(const tf_module *m, const char *name, size_t len);

/* Builders for passes. tf_build appends a node to m->nodes, checks the given
 * attributes against the op's schema and fills the rest with defaults,
 * infers the result type and names the result uniquely from `hint`. Returns
 * NULL and fills d on error. A pass that rewrites in place takes the node
 * list out of the module, then re-appends or rebuilds node by node. */
typedef struct tf_named_attr { const char *name; tf_attr attr; } tf_named_attr;
tf_value *tf_build(tf_module *m, tf_diag *d, int op, tf_value **in, int nin,
                   const tf_named_attr *attrs, int nattrs, const char *hint, const tf_loc *loc);
tf_value *tf_const(tf_module *m, double v, tf_dt dt);
/* Attribute constructors for tf_build. */
tf_attr tf_attr_int(int64_t v);
/* A size in bytes as flags and settings write it: digits with an optional K,
 * M, G or T (1024-based), at least 1 and at most 2^62. */
bool tf_parse_bytes(const char *s, int64_t *out);
tf_attr tf_attr_float(double v);
tf_attr tf_attr_bool(bool v);
tf_attr tf_attr_str(const char *s);
tf_attr tf_attr_dtype(tf_dt t);
tf_attr tf_attr_ints(tf_module *m, const int64_t *v, int n);

/* For passes that map results to replacements as they sweep (repl[] indexed
 * by value id, NULL = kept; operands already redirected): point outputs and
 * updates at the replacements, drop the replaced nodes and their names, and
 * renumber. Linear in the module's size. */
void tf_module_commit_replacements(tf_module *m, tf_value *const *repl);
/* Replace every use of `from` (operands, outputs, updates) by `to`. */
void tf_module_replace_uses(tf_module *m, tf_value *from, tf_value *to);
/* Unique name derived from hint: hint, hint.1, hint.2, ... */
const char *tf_module_unique_name(tf_module *m, const char *hint);
void tf_module_renumber(tf_module *m);
/* Give dim k another value: every type and attribute that names it follows,
 * then the module is verified again (a shape rule may refuse the value). */
tf_ir_status tf_module_set_dim(tf_module *m, int k, int64_t value, tf_diag *d);

/* Copy of a whole module (new arena). NULL on OOM. Renumbers m. */
tf_module *tf_module_clone(tf_module *m);
/* Exchange two modules' contents (nothing points at a tf_module itself):
 * a pass driver that planned a copy adopts it. */
void tf_module_swap(tf_module *a, tf_module *b);
/* Append an existing node (from the module's own arena) to m->nodes. */
tf_ir_status tf_module_append_node(tf_module *m, tf_node *n);

/* Fill attrs[] of a node/call with defaults for every spec entry not set.
 * Parses default texts; returns non-OK only on an internal schema error. */
tf_ir_status tf_attrs_fill_defaults(tf_module *m, const tf_attr_spec *specs, int nspecs,
                                    tf_attr *attrs, tf_diag *d);
/* Parse a default text (trusted, from a schema) into *a. */
tf_ir_status tf_attr_parse_default(tf_module *m, const char *text, tf_attr *a);
/* Check a value against its spec (range, choices), reporting at loc. */
tf_ir_status tf_attr_check(const tf_attr_spec *spec, const tf_attr *a, const tf_loc *loc, tf_diag *d);
/* Convert a written value to the spec's kind (int -> float, ident -> str,
 * ident -> dtype, int -> ints). Reports a type mismatch at loc. */
tf_ir_status tf_attr_coerce(tf_module *m, const tf_attr_spec *spec, tf_attr *a,
                            const tf_loc *loc, tf_diag *d);

/* ---- verifier, printer ------------------------------------------------------------- */

/* Infer every node's result type and check SSA, arity, attributes, shapes,
 * annotations, outputs and updates. The first error is reported. */
tf_ir_status tf_verify(tf_module *m, tf_diag *d);
/* Infer the type of one node (its inputs already typed). */
tf_ir_status tf_infer_node(tf_module *m, tf_node *n, tf_diag *d);

/* Canonical text. Returns a malloc'd string (caller frees) or NULL on OOM. */
char *tf_print_module(const tf_module *m);
/* Text of one type, e.g. "f32[B, 784]". buf must hold 256 bytes. */
const char *tf_type_str(const tf_module *m, const tf_type *t, char buf[256]);

#endif
