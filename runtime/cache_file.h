/* cache_file.h — what tfuse's disk caches share: the cpu target's compiled
 * kernels (cpu/cpu_objects.c), the cuda target's cubins (cuda/jit.c), its
 * cuBLASLt and cuDNN algorithm choices (cuda/blas.c, cuda/dnn.c) and
 * cuda-emu's compiled kernels (cuda/emu.c) all live under one directory,
 * $TFUSE_CACHE_DIR (default ~/.cache/tfuse), are named by an FNV-1a hash,
 * and are written to a temporary name and renamed, so that concurrent
 * sessions and interrupted writes never leave a torn file. Nothing here
 * knows CUDA.
 *
 * The bound. The three parts (cpu/, cuda/, cuda-emu/) share one size bound,
 * TFUSE_CACHE_MAX bytes (a number, or one with K, M, G or T: powers of
 * 1024), 2 GiB by default: about 100,000 cpu kernels or 20,000 cubins, more
 * than any one model has, small next to a disk. What counts:
 *   - an entry is a regular file or a symbolic link directly inside a part
 *     (cuda-emu's per-kernel links count as entries of their own); its size
 *     is its lstat size. Directories (cuda-emu/include) are never entries
 *     and never removed.
 *   - a work file is any file whose name holds ".tmp." (tf_write_atomic's
 *     temporary files, cuda-emu's translation units, logs and objects being
 *     compiled): never counted, never removed while younger than
 *     TF_CACHE_STALE_S (30 minutes, far longer than any write or compile
 *     takes); older ones are the leftovers of killed processes and go at
 *     the next eviction.
 *   - a symbolic link whose target is gone goes at the next eviction.
 * Recency is an entry's mtime: writing it sets it, and every hit sets it to
 * now again (tf_cache_touch: a link and its target), so the entry removed
 * first is the one least recently used, not the oldest written.
 *
 * Eviction is amortized: a hit costs one utimensat and no directory walk.
 * Each write (tf_cache_added) adds its bytes to a running total kept in
 * ROOT/usage under an exclusive flock; only when that total passes the
 * bound are the parts walked, the least recently used entries removed (by
 * mtime, oldest first) until the total is 90% of the bound (so that the
 * next walk is a tenth of the bound of writes away), and the true total
 * written back. The total is also recounted when the file is missing,
 * unreadable, or a day old (files removed or added by hand). The lock
 * makes one process at a time walk and evict; removing a file another
 * process removed first (ENOENT) is not an error, and a reader that opened
 * an entry keeps reading it after it is unlinked. A cache outside the root
 * (blas.c's and dnn.c's cache_dir, set by tests) is not bounded. */
#ifndef TF_RUNTIME_CACHE_FILE_H
#define TF_RUNTIME_CACHE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TF_FNV_BASIS 0xcbf29ce484222325ull
/* FNV-1a 64 of p[0..n) continuing from h (TF_FNV_BASIS to start). */
uint64_t tf_fnv1a(uint64_t h, const void *p, size_t n);

/* A checksum of p[0..n) for large data (packages: params, object code):
 * four independent FNV-1a-style lanes over little-endian 64-bit words, the
 * tail bytes and the length folded in; a few times faster than tf_fnv1a's
 * byte at a time. Any change to one word changes its lane (multiplying by
 * an odd number is a bijection), so a flipped bit always shows. Not for
 * adversaries. */
uint64_t tf_hash64(const void *p, size_t n);

/* v as 8 little-endian bytes at p, and back (the caches' and packages'
 * binary headers). */
void tf_le64_put(unsigned char *p, uint64_t v);
uint64_t tf_le64_get(const unsigned char *p);

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

/* ---- the bound and eviction (see the top of this file) ---- */

#define TF_CACHE_DEFAULT_MAX ((uint64_t)2 << 30)   /* 2 GiB */
#define TF_CACHE_STALE_S (30 * 60)                 /* a work file older than this is a leftover */
enum { TF_CACHE_NPARTS = 3 };
/* The parts, in the order every per-part array below has them:
 * "cpu", "cuda", "cuda-emu". */
extern const char *const tf_cache_parts[TF_CACHE_NPARTS];

/* $TFUSE_CACHE_DIR, else ~/.cache/tfuse, into out (not created); false
 * when there is neither. */
bool tf_cache_root(char *out, size_t n);

/* "2G", "512M", "64K", "1000000" (K, M, G, T: powers of 1024, either case)
 * into bytes; false for anything else, 0 and overflow included. */
bool tf_cache_parse_size(const char *s, uint64_t *out);

/* The bound: TFUSE_CACHE_MAX when set and well formed, else the default.
 * false when TFUSE_CACHE_MAX is set but malformed, with the reason in
 * why[n] (*out is then the default, which eviction uses). *from (may be
 * NULL): "default" or "env". */
bool tf_cache_max(uint64_t *out, const char **from, char *why, size_t n);

/* A hit: the entry at path becomes the most recently used (its mtime, and
 * its target's when it is a symbolic link, set to now). */
void tf_cache_touch(const char *path);

/* An entry of `bytes` now at path (renamed into place): counted in the
 * root's running total and, when that may pass the bound, the least
 * recently used entries evicted. A path outside the root's parts is left
 * alone. */
void tf_cache_added(const char *path, uint64_t bytes);

/* tf_write_atomic without its fsync, then tf_cache_added: how a cache
 * writes an entry. Not flushed to disk: every reader checks an entry
 * whole (a checksum over it: cpu objects, cubins, tf_record_read), so
 * what a crash tears is a miss, compiled and written again; and a cold
 * start writes dozens of entries, at one fsync each (milliseconds each,
 * far more on a busy or network disk) on the way to its first step. */
bool tf_cache_put(const char *path, const void *data, size_t n, const void *tag);

/* Entries and bytes per part (tf_cache_parts' order). */
typedef struct tf_cache_usage {
    int64_t entries[TF_CACHE_NPARTS], bytes[TF_CACHE_NPARTS];
} tf_cache_usage;

/* What root holds, counted now; nothing is removed. false when root
 * cannot be read at all (a missing part counts as empty). */
bool tf_cache_count(const char *root, tf_cache_usage *u);

/* Under the lock: stale work files and dangling links removed, then the
 * least recently used entries until the total is at most `target` when it
 * is above `bound`. *left (may be NULL): what stays. false when the lock
 * file cannot be made. */
bool tf_cache_evict(const char *root, uint64_t bound, uint64_t target, tf_cache_usage *left);

/* Under the lock: every entry of part `part` (NULL: of all parts) and the
 * stale work files removed; *removed: what went. Work files of live writers
 * and directories stay. false when part is not a part's name. */
bool tf_cache_clear(const char *root, const char *part, tf_cache_usage *removed);

#endif
