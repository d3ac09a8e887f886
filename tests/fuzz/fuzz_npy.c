/* fuzz_npy.c — libFuzzer target: the .npy reader (runtime/tensorio.c) over
 * the input bytes, through tio_npy_read_mem (the same parser tio_npy_read
 * runs over a file). A finding, besides the sanitizers' reports: a failure
 * without a message naming the file, a status other than FORMAT, LIMIT or
 * OOM, or an accepted array that breaks the reader's promises (nbytes is
 * the shape's size; data non-NULL; bool elements 0 or 1; the input's size
 * is exactly header + data). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorio.h"

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_npy: %s: %s\n", what, detail);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    tio_tensor t;
    tio_status st = tio_npy_read_mem("fuzz.npy", data, size, &t, err, sizeof err);
    if (st) {
        if (st != TIO_ERR_FORMAT && st != TIO_ERR_LIMIT && st != TIO_ERR_OOM) die("unexpected status", err);
        if (strncmp(err, "fuzz.npy: ", 10) != 0) die("message does not name the file", err);
        if (t.data || t.name) die("outputs not zeroed on failure", err);
        return 0;
    }
    uint64_t n = tio_dtype_size(t.dtype);
    for (int i = 0; i < t.rank; i++) n *= (uint64_t)t.shape[i];
    if (!t.data || t.name || n != t.nbytes || t.nbytes > size || t.rank < 0 || t.rank > TIO_MAX_RANK)
        die("accepted array breaks the reader's promises", "");
    for (size_t i = 0; t.dtype == TIO_BOOL && i < t.nbytes; i++)
        if (((const uint8_t *)t.data)[i] > 1) die("bool element other than 0 or 1", "");
    tio_tensor_free(&t);
    return 0;
}
