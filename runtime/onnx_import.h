/* onnx_import.h — an ONNX model as a tfuse module (issue 32; docs/onnx.md).
 *
 * The graph's inputs become `input`s (a dim_param a named dim), its float
 * initializers `param`s (batch norm's running statistics `buffer`s) whose
 * values the import returns as tensors to save beside the text, integer
 * initializers and Constant/Shape results constants folded where an op
 * takes them as attributes (Reshape's shape, Slice's starts, ...), each
 * node the tfuse ops that compute it, and the graph's outputs `output`s.
 * A node tfuse cannot express is an error naming the node, its op, the
 * opset and what would be needed. Locations: the file and the node's
 * position in the graph (line = node number, from 1). */
#ifndef TF_RUNTIME_ONNX_IMPORT_H
#define TF_RUNTIME_ONNX_IMPORT_H

#include "../frontend/onnx.h"
#include "ir.h"
#include "tensorio.h"

typedef struct tf_onnx_dim_value {
    const char *name;   /* a dim_param, sanitized as the module names it */
    int64_t value;
} tf_onnx_dim_value;

typedef struct tf_onnx_imported {
    tf_module *m;
    tio_tensor *params;   /* the params' and buffers' values, by their names in m */
    size_t nparams;
} tf_onnx_imported;

/* Import the model read from path (external data is found beside it).
 * dims: values for the model's named dims (a dim_param's default is 1).
 * 0, or -1 with err ("PATH: node N 'NAME' (OP, opset V): why"). *out is
 * safe to free either way. */
int tf_onnx_import_model(const tf_onnx_model *om, const char *path, const tf_onnx_dim_value *dims, int ndims,
                         tf_onnx_imported *out, char *err, size_t nerr);
void tf_onnx_import_free(tf_onnx_imported *im);

#endif
