/* onnx.h — ONNX models read without a protobuf library (issue 32).
 *
 * onnx.c decodes protobuf's wire format for the part of onnx.proto tfuse
 * needs: ModelProto's ir_version, opset_import and graph; GraphProto's
 * nodes, initializers, inputs, outputs and value_info; NodeProto,
 * AttributeProto, TensorProto (raw_data, the typed fields packed or not,
 * external data), ValueInfoProto's tensor types and shapes. Field numbers
 * are those of onnx.proto. Everything else is skipped by its wire type.
 *
 * The reader trusts nothing in the file: every length is checked against
 * the bytes left in its message, every count is bounded by the bytes that
 * hold it before anything is allocated, nesting is bounded, and an error
 * says where (the byte offset and the field path) and what was wrong.
 * Strings and raw data point into the buffer, which must outlive the model. */
#ifndef TF_FRONTEND_ONNX_H
#define TF_FRONTEND_ONNX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { TF_ONNX_MAX_RANK = 8 };

/* TensorProto.DataType (onnx.proto) */
enum {
    TF_ONNX_FLOAT = 1, TF_ONNX_UINT8 = 2, TF_ONNX_INT8 = 3, TF_ONNX_UINT16 = 4, TF_ONNX_INT16 = 5, TF_ONNX_INT32 = 6,
    TF_ONNX_INT64 = 7, TF_ONNX_STRING = 8, TF_ONNX_BOOL = 9, TF_ONNX_FLOAT16 = 10, TF_ONNX_DOUBLE = 11, TF_ONNX_UINT32 = 12,
    TF_ONNX_UINT64 = 13, TF_ONNX_BFLOAT16 = 16,
};
/* AttributeProto.AttributeType */
enum {
    TF_ONNX_ATTR_FLOAT = 1, TF_ONNX_ATTR_INT = 2, TF_ONNX_ATTR_STRING = 3, TF_ONNX_ATTR_TENSOR = 4, TF_ONNX_ATTR_GRAPH = 5,
    TF_ONNX_ATTR_FLOATS = 6, TF_ONNX_ATTR_INTS = 7, TF_ONNX_ATTR_STRINGS = 8,
};

typedef struct tf_onnx_str {
    const char *p;
    size_t n;
} tf_onnx_str;

typedef struct tf_onnx_tensor {
    tf_onnx_str name;
    int32_t data_type;
    int rank;
    int64_t dims[TF_ONNX_MAX_RANK];
    tf_onnx_str raw;             /* raw_data (little-endian), when present */
    /* a typed field instead (float_data, int32_data, int64_data, double_data, uint64_data): decoded
     * into vals, nvals elements of val_bytes (4 or 8) each */
    void *vals;
    int64_t nvals;
    int val_bytes;
    bool external;               /* data_location EXTERNAL: location, offset and length say where */
    tf_onnx_str location;
    int64_t offset, length;      /* length -1: to the end of the file */
} tf_onnx_tensor;

typedef struct tf_onnx_attr {
    tf_onnx_str name;
    int32_t type;
    float f;
    int64_t i;
    tf_onnx_str s;
    tf_onnx_tensor *t;
    float *floats;
    int64_t *ints;
    tf_onnx_str *strings;
    int nfloats, nints, nstrings;
    bool has_graph;              /* a subgraph (If, Loop, Scan): read no further */
} tf_onnx_attr;

typedef struct tf_onnx_node {
    tf_onnx_str op_type, domain, name;
    tf_onnx_str *in, *out;       /* an empty input name: an optional input left out */
    int nin, nout;
    tf_onnx_attr *attrs;
    int nattrs;
    size_t at;                   /* the NodeProto's byte offset in the file */
} tf_onnx_node;

typedef struct tf_onnx_dim {
    int64_t value;               /* -1: unknown (a dim_param, or neither) */
    tf_onnx_str param;
} tf_onnx_dim;

typedef struct tf_onnx_value {
    tf_onnx_str name;
    int32_t elem_type;           /* 0: not a tensor type, or none given */
    bool has_shape;
    int rank;
    tf_onnx_dim dims[TF_ONNX_MAX_RANK];
} tf_onnx_value;

typedef struct tf_onnx_graph {
    tf_onnx_str name;
    tf_onnx_node *nodes;
    tf_onnx_tensor *inits;
    tf_onnx_value *inputs, *outputs, *infos;
    int nnodes, ninits, ninputs, noutputs, ninfos;
} tf_onnx_graph;

typedef struct tf_onnx_opset {
    tf_onnx_str domain;          /* "" or "ai.onnx": the default domain */
    int64_t version;
} tf_onnx_opset;

typedef struct tf_onnx_model {
    int64_t ir_version;
    tf_onnx_str producer, producer_version;
    tf_onnx_opset *opsets;
    int nopsets;
    bool has_graph;
    tf_onnx_graph graph;
    void *arena;                 /* every allocation of the model, freed together */
} tf_onnx_model;

/* Decode a ModelProto of n bytes at buf (which must outlive *out). 0, or
 * -1 with err: "byte OFFSET: FIELD.PATH: what is wrong". *out is always
 * safe to free. */
int tf_onnx_read(const void *buf, size_t n, tf_onnx_model *out, char *err, size_t nerr);
void tf_onnx_free(tf_onnx_model *m);

/* The opset version of the default domain, 0 when the model imports none. */
int64_t tf_onnx_opset_version(const tf_onnx_model *m);
/* s equals the C string z. */
bool tf_onnx_is(tf_onnx_str s, const char *z);
/* Bytes per element of an ONNX data type tfuse reads, 0 for the others. */
int tf_onnx_type_bytes(int32_t data_type);
const char *tf_onnx_type_name(int32_t data_type);

#endif
