/* arena.c — see arena.h. */
#include "arena.h"
#include "alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct tf_arena_block {
    tf_arena_block *next;
    size_t cap;
    _Alignas(16) unsigned char data[];
};

enum { TF_ARENA_MIN_BLOCK = 64 * 1024 };

void tf_arena_init(tf_arena *a) { memset(a, 0, sizeof *a); }

void tf_arena_release(tf_arena *a)
{
    tf_arena_block *b = a->head;
    while (b) {
        tf_arena_block *next = b->next;
        tf_free(b);
        b = next;
    }
    a->head = NULL;
    a->used = a->cap = a->total = 0;
}

void *tf_arena_alloc(tf_arena *a, size_t size)
{
    if (size > SIZE_MAX / 2) return NULL;
    size = (size + 15u) & ~(size_t)15u;
    if (size == 0) size = 16;
    if (a->limit && a->total + size > a->limit) return NULL;
    if (!a->head || a->cap - a->used < size) {
        size_t cap = size > TF_ARENA_MIN_BLOCK ? size : TF_ARENA_MIN_BLOCK;
        tf_arena_block *b = tf_malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->cap = cap;
        a->head = b;
        a->used = 0;
        a->cap = cap;
    }
    void *p = a->head->data + a->used;
    a->used += size;
    a->total += size;
    memset(p, 0, size);
    return p;
}

void *tf_arena_array(tf_arena *a, size_t n, size_t elem)
{
    if (elem && n > SIZE_MAX / 4 / elem) return NULL;
    return tf_arena_alloc(a, n * elem);
}

char *tf_arena_strndup(tf_arena *a, const char *s, size_t n)
{
    char *p = tf_arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *tf_arena_strdup(tf_arena *a, const char *s) { return tf_arena_strndup(a, s, strlen(s)); }
