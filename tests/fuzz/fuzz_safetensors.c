/* fuzz_safetensors.c — libFuzzer target: the .safetensors reader
 * (runtime/tensorio.c) over the input bytes, through
 * tio_safetensors_read_mem with the metadata wanted (the same parser
 * tio_safetensors_read_meta runs over a file). A finding, besides the
 * sanitizers' reports: a failure without a message naming the file, a
 * status other than FORMAT, LIMIT or OOM, or accepted tensors that break
 * the reader's promises (names non-empty; nbytes is the shape's size; the
 * data adds up to exactly the file's data area, so never more than the
 * input; metadata, when present, a JSON object). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorio.h"

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_safetensors: %s: %s\n", what, detail);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512], *meta = NULL;
    tio_tensor *ts = NULL;
    size_t n = 0;
    tio_status st = tio_safetensors_read_mem("fuzz.safetensors", data, size, &ts, &n, &meta, err, sizeof err);
    if (st) {
        if (st != TIO_ERR_FORMAT && st != TIO_ERR_LIMIT && st != TIO_ERR_OOM) die("unexpected status", err);
        if (strncmp(err, "fuzz.safetensors: ", 18) != 0) die("message does not name the file", err);
        if (ts || n || meta) die("outputs not cleared on failure", err);
        return 0;
    }
    uint64_t total = 0, hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | data[i];
    for (size_t k = 0; k < n; k++) {
        uint64_t e = tio_dtype_size(ts[k].dtype);
        for (int i = 0; i < ts[k].rank; i++) e *= (uint64_t)ts[k].shape[i];
        if (!ts[k].name || !ts[k].name[0] || !ts[k].data || e != ts[k].nbytes)
            die("accepted tensor breaks the reader's promises", ts[k].name ? ts[k].name : "(no name)");
        total += ts[k].nbytes;
    }
    if (total != size - 8 - hl) die("tensors do not add up to the data area", "");
    if (meta && (meta[0] != '{' || meta[strlen(meta) - 1] != '}')) die("metadata is not an object", meta);
    free(meta);
    tio_tensors_free(ts, n);
    return 0;
}
