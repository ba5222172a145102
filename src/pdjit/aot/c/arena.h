/* arena.h: the arena of a running instance, as runtime.c and model.c both see it. */
#ifndef PDJIT_ARENA_H
#define PDJIT_ARENA_H
#include <stddef.h>

#define PDJIT_FREE_SLOTS 256
typedef struct {
    char *base;
    size_t cap, used, need, heap_blocks;
    int nfree;
    char *free_at[PDJIT_FREE_SLOTS];
    size_t free_size[PDJIT_FREE_SLOTS];
} pdjit_arena;

#endif
