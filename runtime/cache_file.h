/* cache_file.h — what tfuse's disk caches share: the cpu target's compiled
 * kernels (backend_cpu.c), the cuda target's cubins (cuda/jit.c), its
 * cuBLASLt and cuDNN algorithm choices (cuda/blas.c, cuda/dnn.c) and
 * cuda-emu's compiled kernels (cuda/emu.c) all live under one directory,
 * $TFUSE_CACHE_DIR (default ~/.cache/tfuse), are named by an FNV-1a hash,
 * and are written to a temporary name and renamed, so that concurrent
 * sessions and interrupted writes never leave a torn file. Nothing here
 * knows CUDA. */
#ifndef TF_RUNTIME_CACHE_FILE_H
#define TF_RUNTIME_CACHE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TF_FNV_BASIS 0xcbf29ce484222325ull
/* FNV-1a 64 of p[0..n) continuing from h (TF_FNV_BASIS to start). */
uint64_t tf_fnv1a(uint64_t h, const void *p, size_t n);

/* mkdir -p; true when dir exists afterwards. */
bool tf_make_dirs(const char *dir);

/* $TFUSE_CACHE_DIR/sub, else ~/.cache/tfuse/sub, made if need be, into
 * out; false when there is no such directory and none can be made. */
bool tf_cache_subdir(const char *sub, char *out, size_t n);

/* The directory of a cache the caller may redirect: `dir` when given ("":
 * no cache, false), made if need be; else tf_cache_subdir(sub). */
bool tf_cache_dir_or(const char *dir, const char *sub, char *out, size_t n);

/* text (NULL: "") into out with line breaks made spaces: a one-line field
 * of a cache key. */
void tf_cache_key_field(const char *text, char *out, size_t n);

/* data into path atomically: a temporary file beside it (named with the
 * pid and tag), flushed to disk, then renamed over path. false (and
 * nothing left behind) when any step fails. */
bool tf_write_atomic(const char *path, const void *data, size_t n, const void *tag);

/* A keyed text record (the algorithm caches): `header`, "key: KEY\n", the
 * body, then "sum: " and the FNV-1a of everything before it. Reading it
 * back copies the body into body[n] when the file is whole (its sum
 * matches), carries this header and exactly this key; false otherwise. */
bool tf_record_write(const char *path, const char *header, const char *key, const char *body, const void *tag);
bool tf_record_read(const char *path, const char *header, const char *key, char *body, size_t n);

#endif
