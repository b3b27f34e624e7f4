#include "dist/grad_buckets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_check.h"
#include "dist/grad_buckets_gpu.h"
#include "runtime/check.h"
#include "runtime/gpu.h"
#include "runtime/log.h"

/* Buckets hold a multiple of this many elements (the last one cut, at the start of
 * the buffer, may hold fewer). */
#define BUCKET_ALIGN_ELEMENTS 256

static int is_float_dtype(DType t) { return t == DTYPE_F32 || t == DTYPE_F16 || t == DTYPE_BF16; }

static void check_arguments(const GradBuckets *b) {
    if (!is_float_dtype(b->dtype) || !is_float_dtype(b->comm_dtype))
        TC_FATAL("grad buckets: gradients %s sent as %s: both must be f32, f16 or bf16",
                 dtype_name(b->dtype), dtype_name(b->comm_dtype));
    if (b->n > 0 && !b->grads) TC_FATAL("grad buckets: %zu gradients but no buffer", b->n);
    if (!b->on_device && (b->dtype != DTYPE_F32 || b->comm_dtype != DTYPE_F32))
        TC_FATAL("grad buckets: on the host (no NCCL communicator) gradients must be f32 and sent "
                 "as f32, not %s sent as %s", dtype_name(b->dtype), dtype_name(b->comm_dtype));
    if (b->on_device && b->n > 0) GPU_ONLY(grad_buckets_gpu_check(b));
}

/* From the end of the buffer backwards, the order in which backward finishes them. */
static void add_bucket(GradBuckets *b, size_t first, size_t count) {
    b->buckets[b->n_buckets].first = first;
    b->buckets[b->n_buckets].count = count;
    b->n_buckets++;
}

/* From the end backwards, each bucket as large as bucket_bytes allows. With
 * boundaries (where the layers start; a layer's gradients all become final at
 * once), whole layers are merged into a bucket while they fit and a layer
 * larger than a bucket gets buckets of its own: no bucket holds the tail of a
 * layer that backward finishes later, so the pass's last bucket is only the
 * first layers. */
static void cut_buckets(GradBuckets *b, size_t bucket_bytes, const size_t *boundaries, int n_boundaries) {
    size_t per = bucket_bytes / dtype_size(b->comm_dtype);
    per = (per + BUCKET_ALIGN_ELEMENTS - 1) / BUCKET_ALIGN_ELEMENTS * BUCKET_ALIGN_ELEMENTS;
    if (per == 0) per = BUCKET_ALIGN_ELEMENTS;
    if (bucket_bytes == 0 || per > b->n) per = b->n;
    /* Pieces of large layers, plus at most one merged bucket per layer. */
    size_t cap = (b->n == 0 ? 0 : (b->n + per - 1) / per) + (size_t)n_boundaries + 1;
    b->buckets = calloc(cap, sizeof *b->buckets);
    if (!b->buckets) TC_FATAL("grad buckets: out of memory");
    b->n_buckets = 0;
    size_t merged_end = b->n, merged_first = b->n; /* the bucket being merged: [merged_first, merged_end) */
    for (int i = n_boundaries; i >= 0 && b->n > 0; i--) {
        size_t first = i > 0 ? boundaries[i - 1] : 0, end = i < n_boundaries ? boundaries[i] : b->n;
        if (first >= end) continue;
        if (end - first > per) {
            if (merged_first < merged_end) add_bucket(b, merged_first, merged_end - merged_first);
            for (size_t top = end; top > first;) {
                size_t bottom = top - first > per ? top - per : first;
                add_bucket(b, bottom, top - bottom);
                top = bottom;
            }
            merged_end = merged_first = first;
        } else if (merged_end - first > per) {
            if (merged_first < merged_end) add_bucket(b, merged_first, merged_end - merged_first);
            merged_end = end;
            merged_first = first;
        } else {
            merged_first = first;
        }
    }
    if (merged_first < merged_end) add_bucket(b, merged_first, merged_end - merged_first);
}

static double mib(double bytes) { return bytes / 1048576.0; }

static void log_volume(const GradBuckets *b) {
    if (b->dist->rank != 0) return;
    size_t largest = 0;
    for (int i = 0; i < b->n_buckets; i++)
        if (b->buckets[i].count * dtype_size(b->comm_dtype) > largest)
            largest = b->buckets[i].count * dtype_size(b->comm_dtype);
    log_info("grad buckets: %zu %s gradients sent as %s in %d buckets of up to %.3f MiB: "
             "%.3f MiB all-reduced per step, %.3f MiB sent by each of %d ranks (ring)",
             b->n, dtype_name(b->dtype), dtype_name(b->comm_dtype), b->n_buckets, mib(largest),
             mib(b->step_bytes), mib(grad_buckets_wire_bytes(b)), b->dist->world);
}

void grad_buckets_init(GradBuckets *b, Dist *d, void *grads, DType dtype, size_t n,
                       size_t bucket_bytes, DType comm_dtype) {
    grad_buckets_init_layers(b, d, grads, dtype, n, bucket_bytes, comm_dtype, NULL, 0);
}

void grad_buckets_init_layers(GradBuckets *b, Dist *d, void *grads, DType dtype, size_t n,
                              size_t bucket_bytes, DType comm_dtype, const size_t *boundaries,
                              int n_boundaries) {
    memset(b, 0, sizeof *b);
    b->dist = d;
    b->grads = grads;
    b->dtype = dtype;
    b->comm_dtype = comm_dtype;
    b->n = n;
    if (d->world == 1) return;
    b->on_device = d->nccl != NULL;
    check_arguments(b);
    for (int i = 0; i < n_boundaries; i++)
        if ((i > 0 && boundaries[i] <= boundaries[i - 1]) || boundaries[i] > n)
            TC_FATAL("grad buckets: layer boundaries must rise within the %zu gradients (%zu at %d)", n,
                     boundaries[i], i);
    cut_buckets(b, bucket_bytes, boundaries, n_boundaries);
    b->step_bytes = n * dtype_size(comm_dtype);
    if (b->on_device) {
        GPU_ONLY(grad_buckets_gpu_init(b));
        log_volume(b);
    }
}

void grad_buckets_begin(GradBuckets *b) {
    b->launched = 0;
    b->pass_bytes = 0;
    b->peer_launches = 0;
    b->flag_reduced = 0;
    b->in_pass = 1;
}

/* Buckets [from, to) on the host, at once: sum over the ranks, divided by the world. */
static void reduce_host(GradBuckets *b, int from, int to) {
    const size_t piece = (size_t)1 << 30; /* MPI counts are ints */
    float world = (float)b->dist->world;
    for (int i = from; i < to; i++) {
        float *g = (float *)b->grads + b->buckets[i].first;
        size_t count = b->buckets[i].count;
        for (size_t at = 0; at < count; at += piece)
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, g + at, (int)(count - at < piece ? count - at : piece), MPI_FLOAT,
                                    MPI_SUM, MPI_COMM_WORLD));
        for (size_t j = 0; j < count; j++) g[j] /= world;
    }
}

static void launch(GradBuckets *b, int to, cudaStream_t compute) {
    int from = b->launched;
    if (to <= from) return;
    gpu_range_push("allreduce");
    if (b->on_device) GPU_ONLY(grad_buckets_gpu_launch(b, from, to, compute));
    else reduce_host(b, from, to);
    gpu_range_pop();
    for (int i = from; i < to; i++) b->pass_bytes += b->buckets[i].count * dtype_size(b->comm_dtype);
    b->launched = to;
}

static void check_in_pass(const GradBuckets *b, const char *call) {
    if (!b->in_pass)
        TC_FATAL("rank %d: %s outside a backward pass: call grad_buckets_begin first", b->dist->rank,
                 call);
}

void grad_buckets_ready(GradBuckets *b, size_t first_ready, cudaStream_t compute) {
    if (b->dist->world == 1) return;
    check_in_pass(b, "grad_buckets_ready");
    if (first_ready > b->n)
        TC_FATAL("rank %d: grad_buckets_ready(%zu) past the %zu gradients", b->dist->rank,
                 first_ready, b->n);
    int to = b->launched;
    while (to < b->n_buckets && b->buckets[to].first >= first_ready) to++;
    launch(b, to, compute);
}

void grad_buckets_finish(GradBuckets *b, cudaStream_t compute) {
    if (b->dist->world == 1) return;
    check_in_pass(b, "grad_buckets_finish");
    launch(b, b->n_buckets, compute);
    b->in_pass = 0;
    if (b->on_device) GPU_ONLY(grad_buckets_gpu_finish(b, compute));
}

void grad_buckets_free(GradBuckets *b) {
    if (b->on_device) GPU_ONLY(grad_buckets_gpu_free(b));
    free(b->buckets);
    memset(b, 0, sizeof *b);
}

double grad_buckets_wire_bytes(const GradBuckets *b) {
    int world = b->dist ? b->dist->world : 1;
    return 2.0 * (world - 1) / world * (double)b->step_bytes;
}
