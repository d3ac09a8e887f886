/* arena.h — bump allocator that owns every IR object of a module.
 *
 * A module's nodes, values, names and attribute lists live in one arena and
 * are freed together (QBE frees its pool per function the same way). Nothing
 * allocated here is freed on its own. Allocation failure returns NULL; callers
 * turn that into TF_ERR_OOM, never abort. */
#ifndef TF_IR_ARENA_H
#define TF_IR_ARENA_H

#include <stddef.h>

typedef struct tf_arena_block tf_arena_block;

typedef struct tf_arena {
    tf_arena_block *head;   /* newest block first */
    size_t used;            /* bytes handed out from head */
    size_t cap;             /* bytes usable in head */
    size_t total;           /* bytes handed out over the arena's life */
    size_t limit;           /* 0: none; else allocation fails past it */
} tf_arena;

void  tf_arena_init(tf_arena *a);
void  tf_arena_release(tf_arena *a);
void *tf_arena_alloc(tf_arena *a, size_t size);          /* zeroed, 16-aligned */
void *tf_arena_array(tf_arena *a, size_t n, size_t elem);  /* overflow-checked */
char *tf_arena_strndup(tf_arena *a, const char *s, size_t n);
char *tf_arena_strdup(tf_arena *a, const char *s);

#endif
