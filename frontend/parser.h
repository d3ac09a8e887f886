/* parser.h — text format -> tf_module.
 *
 * tf_parse reads a whole module, then verifies it (types, shapes, SSA), so a
 * module it returns is well-formed. `dims` override `dim` declarations by
 * name before any shape is computed; naming a dim the module lacks is an
 * error. The first error is reported as "file:line:col: error: ...". */
#ifndef TF_FRONTEND_PARSER_H
#define TF_FRONTEND_PARSER_H

#include "ir.h"

typedef struct tf_dim_set { const char *name; int64_t value; } tf_dim_set;

/* Largest source accepted: a model description is text a person writes or a
 * dump; beyond this it is not one. */
#define TF_MAX_SOURCE_BYTES ((size_t)64 << 20)

/* Every word the grammar gives a meaning to, besides op, attribute,
 * initializer, optimizer, schedule, dtype and region-kind names (which come
 * from their tables): the statement keywords first (TF_PARSER_NKEYWORDS of
 * them; they cannot name a value), then train-block keys, precisions and
 * literals. The fuzz dictionary is generated from this and the tables. */
#define TF_PARSER_NKEYWORDS 10
extern const char *const tf_parser_words[];
extern const int tf_parser_nwords;

tf_ir_status tf_parse(const char *file, const char *src, size_t len, const tf_dim_set *dims, int ndims,
                      tf_module **out, tf_diag *d);

#endif
