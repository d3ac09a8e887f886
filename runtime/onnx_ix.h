/* onnx_ix.h — the ONNX importer's own (runtime/onnx_import.c, and the ops
 * runtime/onnx_layers.c imports): an ONNX value as the import holds it, the
 * importer's state, and the helpers every op's import builds with. Not for
 * other files. */
#ifndef TF_RUNTIME_ONNX_IX_H
#define TF_RUNTIME_ONNX_IX_H

#include "onnx_import.h"

enum { MAX_CONST = 1 << 20 };   /* elements of a constant folded at import */

typedef struct ival {
    tf_value *v;                 /* the tfuse value, once made */
    tf_dt dt;
    int rank;
    int64_t shape[TF_MAX_RANK];
    const tf_onnx_tensor *init;  /* an initializer, not yet read */
    double *c;                   /* a constant's elements (row-major), NULL: not known */
    bool stat;                   /* batch norm's running mean or variance: a buffer */
    bool weight;                 /* a graph initializer: a param when floating (a Constant's tensor is a buffer) */
} ival;

typedef struct entry {
    tf_onnx_str name;
    ival x;
} entry;

typedef struct importer {
    const tf_onnx_model *om;
    const char *path;
    char dir[4096];              /* external data's directory */
    tf_module *m;
    entry *env;
    int nenv, capenv;
    tio_tensor *params;
    size_t nparams, capparams;
    const tf_onnx_dim_value *dims;
    int ndims;
    int64_t opset;
    const tf_onnx_node *node;    /* the node being imported, for messages */
    int node_index;
    char *err;
    size_t nerr;
    bool failed;
    double **owned;              /* constants' arrays */
    int nowned, capowned;
} importer;

/* messages: the node's "PATH: node N 'NAME' (OP, opset V): " and the reason; -1 */
int ox_fail(importer *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double *ox_own(importer *im, int64_t n);               /* a constant's n elements, owned by the importer */
int64_t ox_numel(const ival *x);
bool ox_is_float(tf_dt t);
const double *ox_const_of(importer *im, ival *x);     /* its elements, or NULL: not known at import */
tf_value *ox_val(importer *im, ival *x, const char *hint);   /* as a tfuse value (a constant: a number or a buffer) */
/* building: tf_build with the node's location (NULL, with the reason set, on failure) */
tf_value *ox_op(importer *im, int o, tf_value **in, int nin, const tf_named_attr *a, int na);
tf_value *ox_op1(importer *im, int o, tf_value *a);
tf_value *ox_op2(importer *im, int o, tf_value *a, tf_value *b);
tf_value *ox_num(importer *im, double v, tf_dt dt);
tf_value *ox_reshape(importer *im, tf_value *x, const int64_t *shape, int rank);
int ox_set_out(importer *im, int k, tf_value *v);     /* output k of the node is v */
int ox_set_const(importer *im, int k, tf_dt dt, const int64_t *shape, int rank, double *c);
/* the node's inputs (NULL: left out; ox_need fails then) and attributes */
ival *ox_input(importer *im, int i);
ival *ox_need(importer *im, int i);
tf_value *ox_in_val(importer *im, int i);
const tf_onnx_attr *ox_attr(const importer *im, const char *name);
int64_t ox_attr_i(const importer *im, const char *name, int64_t dflt);
double ox_attr_f(const importer *im, const char *name, double dflt);
bool ox_attr_s(const importer *im, const char *name, const char *value);
int ox_ints_of(importer *im, const char *aname, int k, int64_t *out, int *n, int cap);   /* an INTS attribute or input k */
int ox_norm_axis(importer *im, int64_t axis, int rank, int64_t *out);

/* the ops of runtime/onnx_layers.c (onnx_import.c's table names them) */
int ox_layernorm(importer *im, int arg);
int ox_attention(importer *im, int arg);
int ox_rmsnorm(importer *im, int arg);
int ox_tile(importer *im, int arg);
int ox_expand(importer *im, int arg);
int ox_gather(importer *im, int arg);
int ox_slice(importer *im, int arg);
int ox_pad(importer *im, int arg);
int ox_split(importer *im, int arg);

#endif
