/* One allocation per arena, made once before training: every buffer handed out
 * keeps its address for the whole run (CUDA graphs need that), and the arena's
 * high-water mark is the run's peak memory. A counting arena hands out no
 * memory and only adds up sizes, so a model can be sized before it is built. */
#ifndef TRAINC_ARENA_H
#define TRAINC_ARENA_H

#include <stddef.h>

#include "runtime/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ARENA_ALIGN 256

typedef struct {
    DeviceKind device;
    char *base;      /* NULL in a counting arena */
    size_t capacity;
    size_t used;
    size_t peak;
    int counting;
} Arena;

/* Fails with the out-of-memory message (what, bytes, free memory, what to try). */
void arena_init(Arena *a, DeviceKind device, size_t capacity);
void arena_init_counting(Arena *a, DeviceKind device);
/* Aligned to ARENA_ALIGN; 'what' names the buffer in error messages. In a
 * counting arena the returned pointer must not be dereferenced. */
void *arena_alloc(Arena *a, size_t bytes, const char *what);
/* Scratch use: remember 'used' and roll back to it. */
size_t arena_mark(const Arena *a);
void arena_rollback(Arena *a, size_t mark);
void arena_free(Arena *a);

/* Host memory outside arenas: pinned (cudaHostAlloc) or pageable (malloc). */
void *host_alloc(size_t bytes, int pinned, const char *what);
void host_free(void *p, int pinned);

#ifdef __cplusplus
}
#endif
#endif
