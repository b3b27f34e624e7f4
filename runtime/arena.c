#include "runtime/arena.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/check.h"
#include "runtime/gpu.h"

static size_t align_up(size_t n) { return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

static void fail_device_oom(size_t bytes, const char *what, const char *error) {
    size_t free_b = 0, total_b = 0;
    gpu_memory_info(&free_b, &total_b);
    TC_FATAL("out of GPU memory: allocating %.1f MiB for %s failed (%s); %.1f MiB free of %.1f MiB. "
             "Try a smaller train.batch, precision.amp = fp16, memory.checkpoint = blocks or "
             "memory.accumulate = k",
             bytes / 1048576.0, what, error, free_b / 1048576.0, total_b / 1048576.0);
}

void arena_init(Arena *a, DeviceKind device, size_t capacity) {
    memset(a, 0, sizeof *a);
    a->device = device;
    a->capacity = align_up(capacity);
    if (a->capacity == 0) return;
    if (device == DEVICE_CUDA) {
        const char *error = NULL;
        a->base = gpu_try_malloc(a->capacity, &error);
        if (!a->base) fail_device_oom(a->capacity, "the device arena", error);
    } else {
        /* Where the kernel overcommits, a huge malloc succeeds and the process is
         * killed later, when the pages are touched: refuse what RAM cannot hold. */
        double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        if (ram > 0 && (double)a->capacity > ram)
            TC_FATAL("out of host memory: the host arena needs %.1f MiB, more than the %.1f MiB of RAM. "
                     "Try a smaller train.batch or memory.accumulate = k", a->capacity / 1048576.0, ram / 1048576.0);
        a->base = aligned_alloc(ARENA_ALIGN, a->capacity);
        if (!a->base) TC_FATAL("out of host memory: allocating %.1f MiB for the host arena failed",
                               a->capacity / 1048576.0);
    }
}

void arena_init_counting(Arena *a, DeviceKind device) {
    memset(a, 0, sizeof *a);
    a->device = device;
    a->counting = 1;
    a->capacity = (size_t)-1;
}

void *arena_alloc(Arena *a, size_t bytes, const char *what) {
    static char counting_dummy[ARENA_ALIGN];
    size_t need = align_up(bytes);
    if (need > a->capacity - a->used) {
        if (a->device == DEVICE_CUDA) fail_device_oom(need, what, "out of memory");
        TC_FATAL("host arena exhausted: %s needs %zu bytes, %zu of %zu used", what, need, a->used,
                 a->capacity);
    }
    void *p = a->counting ? (void *)counting_dummy : (void *)(a->base + a->used);
    a->used += need;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

size_t arena_mark(const Arena *a) { return a->used; }
void arena_rollback(Arena *a, size_t mark) { a->used = mark; }

void arena_free(Arena *a) {
    if (a->base) {
        if (a->device == DEVICE_CUDA) gpu_free(a->base);
        else free(a->base);
    }
    memset(a, 0, sizeof *a);
}

void *host_alloc(size_t bytes, int pinned, const char *what) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    if (pinned) {
        const char *error = NULL;
        p = gpu_try_host_alloc(bytes, &error);
        if (!p)
            TC_FATAL("cudaHostAlloc of %.1f MiB pinned memory for %s failed: %s (set data.pinned = off "
                     "to use pageable memory)", bytes / 1048576.0, what, error);
    } else {
        p = malloc(bytes);
        if (!p) TC_FATAL("out of host memory allocating %.1f MiB for %s", bytes / 1048576.0, what);
    }
    return p;
}

void host_free(void *p, int pinned) {
    if (!p) return;
    if (pinned) gpu_host_free(p);
    else free(p);
}
