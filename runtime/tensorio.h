/* tensorio.h — read and write NumPy .npy and .safetensors files.
 *
 * Depends only on libc plus POSIX (open, pread, fsync, rename,
 * open_memstream, dirname). Readers never load a file whole: they read the
 * preamble and the header (each bounded by its limit and by the file's size
 * from fstat), check what the header describes against the file size, and
 * only then allocate and read exactly that data. So a reader allocates no
 * more than the header justifies and a file that is larger than its header
 * says is an error, never silently accepted. Every failure returns a non-OK status and fills `err` with
 * "PATH: what was expected, what was found" (parse errors also give the
 * byte offset in the file); nothing leaks on any path.
 *
 * Decisions:
 *  - Limits: tensors over 2^40 bytes give TIO_ERR_LIMIT for both formats, as
 *    do rank > 8, a .npy header over 1 MiB and a safetensors header over
 *    100 MB.
 *    Element and byte counts are checked for 64-bit overflow (TIO_ERR_FORMAT);
 *    a shape with a zero dimension is an empty tensor.
 *  - Data in memory is row-major (C order) little-endian; the host must be
 *    little-endian (checked at compile time where the compiler says).
 *  - bool data is normalized to 0/1 on read, so it is safe to read as _Bool.
 *  - On success `data` is never NULL (a 1-byte allocation for empty tensors).
 *    On failure the outputs are zeroed, so freeing them is harmless.
 *
 * .npy:
 *  - Versions 1.0, 2.0 and 3.0 are read; 1.0 is written. The header is parsed
 *    as a Python literal (dict, tuple, list, quoted string without escapes,
 *    integer, True/False; any Python whitespace; trailing commas) and must be
 *    a dict with exactly the keys 'descr', 'fortran_order' and 'shape', in any
 *    order. Unknown or duplicate keys are rejected. `(5)` is not a tuple and
 *    is rejected with a hint; `(5,)` is. A Python 2 `L` suffix on dims is
 *    accepted (very old NumPy wrote it).
 *  - descr: <f4 <f2 <f8 <i8 <i4 <i2 and |i1 |u1 |b1. '>' is byte-swapped on
 *    read, '=' is the host's (little-endian) order, '<' and '>' are also
 *    accepted on 1-byte types, '|' is rejected on multi-byte types.
 *    Structured and other dtypes are rejected.
 *  - fortran_order True is accepted and transposed to C order on read.
 *  - The file must end where the data ends: trailing bytes are an error that
 *    says how many there are and where the data should have ended (NumPy
 *    never writes any; numpy.load would ignore them, hiding damage).
 *  - bf16 has no NumPy dtype: writing it is TIO_ERR_ARG (use safetensors).
 *  - Writing produces NumPy's exact bytes: "{'descr': '<f4', 'fortran_order':
 *    False, 'shape': (2, 3), }" padded with spaces and a final '\n' so that
 *    the data starts at a multiple of 64.
 *
 * .safetensors:
 *  - 8-byte little-endian header length N (<= 100 MB, <= file size - 8), then
 *    N bytes of UTF-8 JSON read by a small strict parser: objects, arrays,
 *    strings with escapes (\uXXXX and surrogate pairs), integers; no floats,
 *    true/false/null, duplicate keys or trailing commas; nesting <= 64.
 *  - Tensors are returned in header order. "__metadata__" must be an object
 *    of strings and is otherwise skipped. Each tensor object has exactly
 *    dtype, shape and data_offsets; names must be non-empty, unique, NUL-free.
 *  - data_offsets must lie in the data area, span numel * dtype size, and not
 *    overlap another tensor (empty tensors overlap nothing). The non-empty
 *    tensors must tile the data area exactly, as the safetensors library
 *    requires: a gap between two tensors, or bytes after the last one, is an
 *    error naming the bytes (and the tensor after the gap).
 *  - Writing keeps the caller's tensor order (the format does not require
 *    sorting), packs the data contiguously in that order, and pads the header
 *    with spaces so the data area starts at a multiple of 8. The metadata
 *    argument must be a JSON object of string values; it is validated with
 *    the reader's parser and embedded as given.
 *
 * Writes are atomic: the bytes go to PATH.tmp.PID in the same directory,
 * which is fsynced and renamed over PATH, then the directory is fsynced
 * (best-effort). On failure the temporary file is removed and PATH is left
 * as it was. */
#ifndef TIO_TENSORIO_H
#define TIO_TENSORIO_H

#include <stddef.h>
#include <stdint.h>

/* The first seven must stay in this order (other code indexes by them). */
typedef enum tio_dtype {
    TIO_F32, TIO_F16, TIO_BF16, TIO_F64, TIO_I64, TIO_I32, TIO_BOOL,
    TIO_U8, TIO_I8, TIO_I16
} tio_dtype;

enum { TIO_MAX_RANK = 8 };

typedef struct tio_tensor {
    char *name;          /* malloc'd; NULL for npy */
    tio_dtype dtype;
    int rank;
    int64_t shape[TIO_MAX_RANK];
    void *data;          /* malloc'd, row-major contiguous, native little-endian */
    size_t nbytes;
} tio_tensor;

typedef enum tio_status {
    TIO_OK = 0, TIO_ERR_IO, TIO_ERR_FORMAT, TIO_ERR_OOM, TIO_ERR_LIMIT, TIO_ERR_ARG
} tio_status;

/* err: caller buffer of errlen bytes receiving "PATH: what was expected,
 * what was found" (may be NULL / 0). It is set to "" on success. */
tio_status tio_npy_read(const char *path, tio_tensor *out, char *err, size_t errlen);
tio_status tio_npy_write(const char *path, const tio_tensor *t, char *err, size_t errlen);
/* On success *out is a malloc'd array of *n tensors (NULL when *n == 0);
 * release it with tio_tensors_free(*out, *n). */
tio_status tio_safetensors_read(const char *path, tio_tensor **out, size_t *n,
                                char *err, size_t errlen);
/* The same, and *meta receives the "__metadata__" object as compact JSON
 * (from the C library's malloc: free() it)
 * text ({"key":"value",...}, keys in file order), malloc'd, or NULL when the
 * file has none (meta may be NULL: not wanted). NULL on failure. */
tio_status tio_safetensors_read_meta(const char *path, tio_tensor **out, size_t *n, char **meta,
                                     char *err, size_t errlen);
tio_status tio_safetensors_write(const char *path, const tio_tensor *ts, size_t n,
                                 const char *metadata_json_object_or_NULL,
                                 char *err, size_t errlen);
/* What tio_safetensors_write writes before the tensors' bytes (the 8-byte
 * length and the JSON header, padded to 8), for a caller that lays out the
 * data itself: *hdr is from the C library's malloc (free() it), *hlen its
 * bytes; the tensors' nbytes follow in order. ts[i].data is not read (but,
 * as for the writer, it must not be NULL when nbytes > 0). */
tio_status tio_safetensors_header(const tio_tensor *ts, size_t n, const char *metadata_json_object_or_NULL,
                                  char **hdr, size_t *hlen, char *err, size_t errlen);

/* The same readers over a caller's buffer of len bytes (the fuzz targets
 * use these); `name` stands for the path in messages. */
tio_status tio_npy_read_mem(const char *name, const void *data, size_t len, tio_tensor *out, char *err,
                            size_t errlen);
tio_status tio_safetensors_read_mem(const char *name, const void *data, size_t len, tio_tensor **out, size_t *n,
                                    char **meta, char *err, size_t errlen);
/* tio_safetensors_read_mem's checks without its copies: each tensor's data
 * points into `data` (which must outlive them; read-only), so a caller
 * that copies the tensors somewhere anyway (a package's initial state into
 * a session) copies them once. A view cannot normalize bool data: a byte
 * other than 0 or 1 is TIO_ERR_FORMAT. Release with tio_views_free (the
 * names and the array). */
tio_status tio_safetensors_view_mem(const char *name, const void *data, size_t len, tio_tensor **out, size_t *n,
                                    char *err, size_t errlen);

/* Metadata objects (what "__metadata__" holds: an object of strings).
 * get: *value = the decoded value of `key` (malloc'd), NULL when absent.
 * set: *out = json (NULL: {}) with key = value, compact, malloc'd; a key
 * already there keeps its place, a new one goes last. Text that is not such
 * an object is TIO_ERR_FORMAT, a key or value that is not UTF-8 TIO_ERR_ARG. */
tio_status tio_meta_get(const char *json, const char *key, char **value, char *err, size_t errlen);
tio_status tio_meta_set(const char *json, const char *key, const char *value, char **out, char *err, size_t errlen);

void tio_tensor_free(tio_tensor *t);              /* frees name and data, not t */
void tio_tensors_free(tio_tensor *ts, size_t n);  /* frees each and the array */
void tio_views_free(tio_tensor *ts, size_t n);    /* tio_safetensors_view_mem's: the names and the array */
size_t tio_dtype_size(tio_dtype t);               /* 0 for an invalid dtype */
const char *tio_dtype_name(tio_dtype t);          /* "f32", ...; "?" if invalid */

#endif
