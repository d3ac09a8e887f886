/* scalar.h — the scalar expressions both code generators lower pointwise
 * ops from (ops.def's LOWER column), parsed once into small trees.
 *
 * An op's expression names its operands a, b, c and combines them with
 * numbers, the infix operators + - * / (and unary -), the comparisons
 * == != < <= > >= and these primitives:
 *
 *   abs exp log sqrt rsqrt tanh sin cos erf isfinite   one operand
 *   pow max min                                        two; max/min return NaN if either is NaN
 *   select(cond, x, y)                                 cond != 0 ? x : y
 *   dropout()                                          the op's random keep mask, scaled (its
 *                                                      operand gives only the shape)
 *
 * e.g. sigmoid is "1 / (1 + exp(-a))" and relu "max(a, 0)". Each code
 * generator implements every primitive once (codegen/llvm.c: `lower_llvm`,
 * codegen/cuda_expr.c: `lower_cuda`), so a new pointwise op made of these
 * primitives needs no edit in either; a new primitive is one entry in
 * scalar.c's table plus a case in each generator, and
 * tests/unit/test_op_table.c fails until both have it.
 *
 * Types: a generator evaluates the expression in the op's math type (its
 * operands' and result's dtypes promoted; a comparison's result does not
 * count) and rounds the root to the result dtype; a comparison yields a
 * boolean, and select's condition is read as one. */
#ifndef TF_CODEGEN_SCALAR_H
#define TF_CODEGEN_SCALAR_H

#include <stdbool.h>
#include <stddef.h>

typedef enum tf_sprim {
    TF_S_ARG,      /* operand `arg` (0 = a, 1 = b, 2 = c) */
    TF_S_CONST,    /* `value` */
    TF_S_NEG, TF_S_ADD, TF_S_SUB, TF_S_MUL, TF_S_DIV,
    TF_S_ABS, TF_S_EXP, TF_S_LOG, TF_S_SQRT, TF_S_RSQRT, TF_S_TANH, TF_S_SIN, TF_S_COS, TF_S_ERF,
    TF_S_POW, TF_S_MAX, TF_S_MIN,
    TF_S_EQ, TF_S_NE, TF_S_LT, TF_S_LE, TF_S_GT, TF_S_GE, TF_S_ISFINITE,
    TF_S_SELECT,
    TF_S_DROPOUT,
    TF_S_COUNT
} tf_sprim;

enum { TF_SEXPR_MAX = 24 };

typedef struct tf_snode {
    tf_sprim prim;
    int arg;           /* TF_S_ARG */
    double value;      /* TF_S_CONST */
    int kid[3];        /* indices of the operands' nodes (earlier in the array) */
} tf_snode;

/* A parsed expression: nodes in evaluation order, the last one the root. */
typedef struct tf_sexpr {
    int n;
    tf_snode node[TF_SEXPR_MAX];
    int nargs;         /* highest operand named + 1 */
} tf_sexpr;

/* The primitive's name in the language and its operand count. */
const char *tf_sprim_name(tf_sprim p);
int tf_sprim_arity(tf_sprim p);
/* Whether the primitive's value is a boolean (comparisons, isfinite). */
bool tf_sprim_boolout(tf_sprim p);

/* Parse text; false with a message naming the column on a syntax error. */
bool tf_sexpr_parse(const char *text, tf_sexpr *out, char *why, size_t n);

/* The op's lowering (parsed once, thread-safe), or NULL when it has none or
 * its text does not parse (then *why, if given, says so). */
const tf_sexpr *tf_scalar_lowering(int op, const char **why);

/* Whether a generator implementing the primitives `has` accepts can lower
 * the op's expression, given nargs operands (a kernel's TF_KX_OP gives its
 * operands; 3 asks about the op in general); if not, why (why may be NULL). */
bool tf_sexpr_lowerable(int op, int nargs, bool (*has)(tf_sprim), char *why, size_t n);

/* The expression in float64 on operand values (dropout() counts as 1: kept). */
double tf_sexpr_eval(const tf_sexpr *e, const double *args);

#endif
