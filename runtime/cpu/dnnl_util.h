/* dnnl_util.h — what conv_dnnl.c and gemm_dnnl.c share inside a build with
 * oneDNN (include it after <oneapi/dnnl/dnnl.h>, under TFUSE_HAVE_ONEDNN):
 * the process's one CPU engine and two small wrappers. */
#ifndef TF_RUNTIME_CPU_DNNL_UTIL_H
#define TF_RUNTIME_CPU_DNNL_UTIL_H

#include <stdbool.h>
#include <stddef.h>

/* The CPU engine, made once; NULL when oneDNN could not make it (*why, if
 * given, says why). */
dnnl_engine_t tf_dnnl_engine(const char **why);
/* st == dnnl_success; else "oneDNN refused it: WHAT: STATUS" into why. */
bool tf_dnnl_ok(dnnl_status_t st, const char *what, char *why, size_t n);
/* Run a primitive on s and wait for it. */
bool tf_dnnl_exec(dnnl_primitive_t p, dnnl_stream_t s, int nargs, const dnnl_exec_arg_t *args);

/* A blocked layout as oneDNN's tags spell it ("ab", "BA16b64a" as
 * "ba16b64a"), or "opaque". */
void tf_dnnl_layout_str(const dnnl_memory_desc_t *md, char *out, size_t n);

#endif
