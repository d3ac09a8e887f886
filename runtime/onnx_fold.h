/* onnx_fold.h — ONNX nodes whose inputs are all known at import,
 * evaluated there (runtime/onnx_fold.c): the shape and mask arithmetic
 * exporters write (ConstantOfShape, Equal, Where, Expand, Range,
 * GatherElements, And, ... on constants), so that what reaches tfuse is the
 * model's own computation on static shapes. */
#ifndef TF_RUNTIME_ONNX_FOLD_H
#define TF_RUNTIME_ONNX_FOLD_H

#include "../frontend/onnx.h"
#include "ir.h"

/* A constant: its elements row-major as doubles (exact for every integer
 * a shape holds and for each float type's values). */
typedef struct tf_onnx_cval {
    tf_dt dt;
    int rank;
    int64_t shape[TF_MAX_RANK];
    const double *c;
} tf_onnx_cval;

/* Memory for n elements of a result, owned by the caller's importer; NULL
 * (with the reason set by the callee) when there is none or n is too large. */
typedef double *(*tf_onnx_fold_alloc)(void *ctx, int64_t n);

/* Node n of opset `opset` on its constant inputs in[0..nin) (an entry with
 * c NULL: an optional input left out). 1: folded, its outputs in
 * out[0..nout) (nout <= 4); 0: the op is not one folded here (the importer
 * imports it as ops); -1: the node is wrong (why in err). */
int tf_onnx_fold(const tf_onnx_node *n, int64_t opset, const tf_onnx_cval *in, int nin, tf_onnx_cval *out, int *nout,
                 tf_onnx_fold_alloc alloc, void *actx, char *err, size_t nerr);

#endif
