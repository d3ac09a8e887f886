/* alloc.c — see alloc.h. A block is [header | user bytes]; the header (32
 * bytes, keeping the user's pointer 16-aligned like malloc's) records the
 * size and the allocator that made it. */
#include "alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct hdr {
    size_t n;
    tf_alloc_fn fn;
    void *ud;
    size_t pad;
} hdr;

_Static_assert(sizeof(hdr) % 16 == 0, "the header keeps 16-byte alignment");

static _Thread_local tf_allocator current;

tf_allocator tf_alloc_swap(tf_allocator a)
{
    tf_allocator prev = current;
    current = a;
    return prev;
}

tf_allocator tf_alloc_current(void) { return current; }

static void *raw(tf_alloc_fn fn, void *ud, void *p, size_t on, size_t nn)
{
    if (fn) return fn(ud, p, on, nn);
    if (!nn) {
        free(p);
        return NULL;
    }
    return realloc(p, nn);
}

void *tf_malloc(size_t n)
{
    if (n > SIZE_MAX - sizeof(hdr)) return NULL;
    hdr *h = raw(current.fn, current.ud, NULL, 0, sizeof(hdr) + (n ? n : 1));
    if (!h) return NULL;
    *h = (hdr){n, current.fn, current.ud, 0};
    return h + 1;
}

void *tf_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    size_t bytes = n * size;
    if (current.fn) {
        void *p = tf_malloc(bytes);
        if (p) memset(p, 0, bytes);
        return p;
    }
    /* the C library's calloc: a large block comes from the kernel already zero and is not written
     * here (the cpu target's activation arena: hundreds of MB, faulted in when first used) */
    if (bytes > SIZE_MAX - sizeof(hdr)) return NULL;
    hdr *h = calloc(1, sizeof(hdr) + (bytes ? bytes : 1));
    if (!h) return NULL;
    *h = (hdr){bytes, NULL, NULL, 0};
    return h + 1;
}

void *tf_realloc(void *p, size_t n)
{
    if (!p) return tf_malloc(n);
    if (n > SIZE_MAX - sizeof(hdr)) return NULL;
    hdr *h = (hdr *)p - 1, keep = *h;
    hdr *q = raw(keep.fn, keep.ud, h, sizeof(hdr) + (keep.n ? keep.n : 1), sizeof(hdr) + (n ? n : 1));
    if (!q) return NULL;   /* the old block is untouched */
    q->n = n;
    return q + 1;
}

void tf_free(void *p)
{
    if (!p) return;
    hdr *h = (hdr *)p - 1;
    raw(h->fn, h->ud, h, sizeof(hdr) + (h->n ? h->n : 1), 0);
}

char *tf_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = tf_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void *tf_malloc_aligned(size_t align, size_t n)
{
    if (n > SIZE_MAX - align - sizeof(void *)) return NULL;
    char *base = tf_malloc(n + align + sizeof(void *));
    if (!base) return NULL;
    uintptr_t at = ((uintptr_t)(base + sizeof(void *)) + align - 1) & ~(uintptr_t)(align - 1);
    ((void **)at)[-1] = base;
    return (void *)at;
}

void *tf_calloc_aligned(size_t align, size_t n)
{
    if (n > SIZE_MAX - align - sizeof(void *)) return NULL;
    char *base = tf_calloc(1, n + align + sizeof(void *));
    if (!base) return NULL;
    uintptr_t at = ((uintptr_t)(base + sizeof(void *)) + align - 1) & ~(uintptr_t)(align - 1);
    ((void **)at)[-1] = base;
    return (void *)at;
}

void tf_free_aligned(void *p)
{
    if (p) tf_free(((void **)p)[-1]);
}

void *tf_libc_malloc(size_t n) { return malloc(n ? n : 1); }
void tf_libc_free(void *p) { free(p); }

void *tf_libc_copy(const void *p, size_t n)
{
    void *d = malloc(n ? n : 1);
    if (d && n) memcpy(d, p, n);
    return d;
}
