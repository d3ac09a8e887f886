/* pool.h — the cpu target's thread pool: a fixed set of workers that split
 * one range of work at a time with the calling thread.
 *
 * tf_pool_run(pool, n, fn, arg) cuts [0, n) into one contiguous piece per
 * thread (the caller takes the first), runs fn(arg, lo, hi) on each and
 * returns when every piece is done. Pieces are static and contiguous: a
 * kernel's split axis is cut the same way every step, so each thread keeps
 * touching the same memory. One run at a time per pool (the executor runs
 * kernels in order); a pool of 1 thread runs everything on the caller. */
#ifndef TF_RUNTIME_CPU_POOL_H
#define TF_RUNTIME_CPU_POOL_H

#include <stdint.h>

typedef struct tf_pool tf_pool;
typedef void (*tf_pool_fn)(void *arg, int64_t lo, int64_t hi);

/* NULL on failure (out of memory, or no thread could be started). */
tf_pool *tf_pool_create(int nthreads);
void tf_pool_free(tf_pool *p);
int tf_pool_threads(const tf_pool *p);
void tf_pool_run(tf_pool *p, int64_t n, tf_pool_fn fn, void *arg);

/* The machine's online cores (at least 1). */
int tf_cpu_count(void);

#endif
