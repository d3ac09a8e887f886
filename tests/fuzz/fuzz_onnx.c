/* fuzz_onnx.c — libFuzzer target: the ONNX reader (frontend/onnx.c) over
 * the input bytes and, when it reads a model, the importer
 * (runtime/onnx_import.c) on what it read. A finding, besides the
 * sanitizers' reports: a reader failure whose message does not say the
 * byte where it went wrong, an import failure whose message does not name
 * the file, or an import that succeeds with a module that does not verify
 * (the importer verifies before it returns; this checks it says so). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_import.h"

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_onnx: %s: %s\n", what, detail);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[4096];
    tf_onnx_model m;
    if (tf_onnx_read(data, size, &m, err, sizeof err)) {
        if (strncmp(err, "byte ", 5) != 0) die("a read failure that says no byte", err);
        tf_onnx_free(&m);
        return 0;
    }
    tf_onnx_imported im;
    tf_onnx_dim_value dims[1] = {{"batch", 2}};
    if (tf_onnx_import_model(&m, "fuzz.onnx", dims, 1, &im, err, sizeof err)) {
        if (strncmp(err, "fuzz.onnx: ", 11) != 0) die("an import failure that does not name the file", err);
    } else {
        tf_diag d = {0};
        if (!im.m || tf_verify(im.m, &d)) die("an imported module that does not verify", d.msg);
        tf_onnx_import_free(&im);
    }
    tf_onnx_free(&m);
    return 0;
}
