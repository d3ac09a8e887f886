/* onnx_entry.c — the library's ways in to an ONNX file (include/tfuse.h):
 * tf_onnx_import (the model as text, its weights as safetensors) and
 * tf_onnx_load_model (a model whose initial values are its initializers,
 * what tf_model_parse_file gives for an .onnx path). The file is read whole
 * (under protobuf's 2 GiB; larger models keep their weights in external
 * data), decoded by frontend/onnx.c and imported by onnx_import.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "alloc.h"
#include "onnx_import.h"
#include "runtime.h"

/* ---- the public entry (include/tfuse.h) ---- */

/* The model at onnx_path as text (*ir_text, malloc'd) and its params' values: into the safetensors file params_path
 * when given, else moved into *init when given. */
static tf_status import_file(tf_context_t *ctx, const char *onnx_path, const tf_dim_override *dims, size_t ndims, char **ir_text,
                             const char *params_path, tf_init_state **init)
{
    *ir_text = NULL;
    FILE *f = fopen(onnx_path, "rb");
    if (!f) return tf_set_error(ctx, TF_ERR_IO, "%s: error: cannot open: %s", onnx_path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return tf_set_error(ctx, TF_ERR_IO, "%s: error: not a regular file", onnx_path);
    }
    /* protobuf's own limit: a message is under 2 GiB (larger models keep their weights in external data files) */
    if ((uint64_t)st.st_size >= ((uint64_t)1 << 31)) {
        fclose(f);
        return tf_set_error(ctx, TF_ERR_LIMIT, "%s: error: %lld bytes: an ONNX file is under 2 GiB (protobuf's limit); a larger model "
                            "keeps its weights in external data files", onnx_path, (long long)st.st_size);
    }
    size_t n = (size_t)st.st_size;
    unsigned char *buf = tf_malloc(n ? n : 1);
    if (!buf) {
        fclose(f);
        return tf_set_error(ctx, TF_ERR_OOM, "%s: error: out of memory reading the file", onnx_path);
    }
    size_t got = fread(buf, 1, n, f);
    bool bad = ferror(f) || got != n;
    fclose(f);
    if (bad) {
        tf_free(buf);
        return tf_set_error(ctx, TF_ERR_IO, "%s: error: read failed", onnx_path);
    }
    tf_onnx_model om;
    char err[4096];
    tf_status rc = TF_OK;
    if (tf_onnx_read(buf, n, &om, err, sizeof err)) {
        rc = tf_set_error(ctx, TF_ERR_FORMAT, "%s: error: not a valid ONNX model: %s", onnx_path, err);
    } else {
        tf_onnx_dim_value *dv = ndims ? tf_calloc(ndims, sizeof *dv) : NULL;
        for (size_t i = 0; dv && i < ndims; i++) dv[i] = (tf_onnx_dim_value){dims[i].name, dims[i].value};
        tf_onnx_imported im;
        if (ndims && !dv) rc = tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
        else if (tf_onnx_import_model(&om, onnx_path, dv, (int)ndims, &im, err, sizeof err))
            rc = tf_set_error(ctx, TF_ERR_UNSUPPORTED, "%s", err);
        else {
            for (size_t i = 0; !rc && i < ndims; i++)
                if (tf_module_find_dim(im.m, dims[i].name, strlen(dims[i].name)) < 0)
                    rc = tf_set_error(ctx, TF_ERR_INVALID_ARG, "%s: error: --dim %s: the model has no dim of that name (its inputs' "
                                      "dim_params, as tfuse names them, are its dims)", onnx_path, dims[i].name);
            char *printed = rc ? NULL : tf_print_module(im.m), *text = printed ? tf_libc_copy(printed, strlen(printed) + 1) : NULL;   /* the caller's free() */
            tf_free(printed);
            if (!text && !rc) rc = tf_set_error(ctx, TF_ERR_OOM, "error: out of memory printing the module");
            char meta[128];
            snprintf(meta, sizeof meta, "{\"format\":\"tfuse-onnx-import-1\"}");
            if (!rc && params_path &&
                tio_safetensors_write(params_path, im.params, im.nparams, meta, err, sizeof err))
                rc = tf_set_error(ctx, TF_ERR_IO, "%s: error: %s", params_path, err);
            if (!rc && init) {   /* the tensors move: the import's list keeps none */
                tf_init_state *is = tf_calloc(1, sizeof *is);
                char *src = is ? tf_malloc(strlen(onnx_path) + 1) : NULL;
                if (!src) {
                    tf_free(is);
                    rc = tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
                } else {
                    memcpy(src, onnx_path, strlen(onnx_path) + 1);
                    *is = (tf_init_state){1, src, im.params, im.nparams};
                    im.params = NULL, im.nparams = 0;
                    *init = is;
                }
            }
            if (!rc) *ir_text = text;
            else free(text);
            tf_onnx_import_free(&im);
        }
        tf_free(dv);
    }
    tf_onnx_free(&om);
    tf_free(buf);
    return rc;
}

tf_status tf_onnx_import(tf_context_t *ctx, const char *onnx_path, const tf_dim_override *dims, size_t ndims, char **ir_text,
                         const char *params_path)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !onnx_path || !ir_text) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    return import_file(ctx, onnx_path, dims, ndims, ir_text, params_path, NULL);
}

tf_status tf_onnx_load_model(tf_context_t *ctx, const char *path, const tf_dim_override *dims, size_t ndims, tf_model_t **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    char *text = NULL;
    tf_init_state *init = NULL;
    tf_status st = import_file(ctx, path, dims, ndims, &text, NULL, &init);
    if (!st) st = tf_model_parse_string(ctx, path, text, strlen(text), dims, ndims, out);
    if (!st) (*out)->init = init;
    else tf_init_state_release(init);
    free(text);
    return st;
}
