/* alloc.h — every allocation libtfuse makes goes through here, so that an
 * embedder's allocator (tf_context_create_with_allocator, modelled on Lua's
 * lua_Alloc) sees it.
 *
 * The allocator in use is per thread: a public API call sets its context's
 * for its duration (TF_ALLOC_SCOPE) and puts the previous one back on the
 * way out; outside any call, and on the worker threads tfuse starts (the
 * cpu target's pool, the data loader's gatherers), it is the C library's.
 * Each block remembers the allocator that made it, in a small header in
 * front of it, so tf_free and tf_realloc return it there whichever thread
 * or call frees it, and the allocator is told every block's size on
 * release, as Lua tells it.
 *
 * Not routed (they allocate for themselves): LLVM's C++ objects, OpenBLAS's
 * buffers, the CUDA libraries, and stdio's (open_memstream) buffers. Memory
 * handed to a caller who free()s it (tf_model_print's text, ...) comes from
 * the C library, as tfuse.h promises.
 *
 * Failure is NULL, as from malloc; callers turn it into TF_ERR_OOM. */
#ifndef TF_IR_ALLOC_H
#define TF_IR_ALLOC_H

#include <stddef.h>

/* ptr == NULL: allocate nsize bytes. nsize == 0: free ptr (osize bytes).
 * Otherwise: resize ptr from osize to nsize bytes. NULL on failure (a free
 * returns NULL and cannot fail). */
typedef void *(*tf_alloc_fn)(void *ud, void *ptr, size_t osize, size_t nsize);

typedef struct tf_allocator {
    tf_alloc_fn fn;   /* NULL: the C library */
    void *ud;
} tf_allocator;

/* Make a the calling thread's allocator; returns the one it replaces. */
tf_allocator tf_alloc_swap(tf_allocator a);
tf_allocator tf_alloc_current(void);

void *tf_malloc(size_t n);
void *tf_calloc(size_t n, size_t size);
void *tf_realloc(void *p, size_t n);
void  tf_free(void *p);
char *tf_strdup(const char *s);
/* align (a power of two) -aligned blocks, released with tf_free_aligned. */
void *tf_malloc_aligned(size_t align, size_t n);
/* The same, zeroed (as tf_calloc: with the C library's allocator a large
 * block's pages are the kernel's zero pages, not written until used). */
void *tf_calloc_aligned(size_t align, size_t n);
void  tf_free_aligned(void *p);
/* The C library's own, named so that they stand out where they are meant:
 * memory a caller free()s, and stdio's buffers. tf_libc_copy: n bytes of p. */
void *tf_libc_malloc(size_t n);
void  tf_libc_free(void *p);
void *tf_libc_copy(const void *p, size_t n);

/* Within the enclosing block, allocations use `alloc` (a tf_allocator);
 * the previous allocator is restored however the block is left. */
static inline void tf_alloc_scope_end(tf_allocator *prev) { tf_alloc_swap(*prev); }
#define TF_ALLOC_SCOPE(alloc) \
    tf_allocator tf_alloc_prev_ __attribute__((cleanup(tf_alloc_scope_end), unused)) = tf_alloc_swap(alloc)

#endif
