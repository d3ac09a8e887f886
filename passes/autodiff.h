/* autodiff.h — what the gradient rules (grad_rules.c) see of the autodiff
 * pass. A rule receives the node and its result's gradient dy, builds core
 * ops through gb()/gb1()/gb2(), and hands each operand's contribution to
 * gr_contrib(), which sums it over broadcast axes down to the operand's shape
 * and adds it to what that operand already has (the first contribution is
 * written, later ones added: no zero fill). */
#ifndef TF_PASSES_AUTODIFF_H
#define TF_PASSES_AUTODIFF_H

#include "passes.h"

typedef struct tf_grad_ctx tf_grad_ctx;
typedef tf_ir_status (*tf_grad_fn)(tf_grad_ctx *g, const tf_node *n, tf_value *dy);

/* Does operand k of n need a gradient (it depends on a param)? */
bool gr_wants(const tf_grad_ctx *g, const tf_node *n, int k);
/* Add c (n's operand k's gradient, possibly broadcast) to that operand's. */
tf_ir_status gr_contrib(tf_grad_ctx *g, const tf_node *n, int k, tf_value *c);
/* Build a backward op named after n ("<n>.grad.<hint>"); NULL on error
 * (the diag holds it; later builders see NULL operands and return NULL). */
tf_value *gb(tf_grad_ctx *g, const tf_node *n, int op, const char *hint, tf_value **in, int nin,
             const tf_named_attr *attrs, int na);
tf_value *gb1(tf_grad_ctx *g, const tf_node *n, int op, const char *hint, tf_value *a);
tf_value *gb2(tf_grad_ctx *g, const tf_node *n, int op, const char *hint, tf_value *a, tf_value *b);
tf_value *gnum(tf_grad_ctx *g, double v);
tf_module *gr_module(tf_grad_ctx *g);
tf_diag *gr_diag(tf_grad_ctx *g);

/* The rule of each op (ops.def's GRAD column), NULL where none. */
tf_grad_fn tf_grad_rule(int op);
/* For an op without a rule: why it has none (ops.def's none_<why>); NULL for
 * an op with a rule, or one whose GRAD column names no known reason. */
const char *tf_grad_none_reason(int op);

#endif
