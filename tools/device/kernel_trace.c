/* A kernel tracer for the lent GPU machines, where Nsight Systems cannot make
 * a report: loaded by the CUDA driver into any CUDA program through
 *   CUDA_INJECTION64_PATH=/path/libkernel_trace.so KERNEL_TRACE_DIR=dir prog
 * it records every kernel and copy (graph nodes included) with CUPTI's activity
 * API and writes dir/kernels.<pid>.csv: start_ns,end_ns,device,stream,name
 * (a copy's name: "memcpy <kind> <n> bytes" or "memcpy peer <n> bytes").
 * tools/device/trace_summary.py reads them; tools/device/trace.sh builds, runs
 * and summarises in one go. Build by hand:
 *   gcc -O2 -shared -fPIC -I$CUDA/include tools/device/kernel_trace.c \
 *       -L$CUDA/lib64 -lcupti -o libkernel_trace.so */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define TRACE_BUFFER_BYTES (16u << 20)

static FILE *trace_file;

#define CUPTI_OK(call)                                                                            \
    do {                                                                                          \
        CUptiResult r_ = (call);                                                                  \
        if (r_ != CUPTI_SUCCESS) {                                                                \
            const char *s_ = "?";                                                                 \
            cuptiGetResultString(r_, &s_);                                                        \
            fprintf(stderr, "kernel_trace: %s failed at %s:%d: %s\n", #call, __FILE__, __LINE__, \
                    s_);                                                                          \
        }                                                                                         \
    } while (0)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, TRACE_BUFFER_BYTES);
    *size = *buffer ? TRACE_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS && trace_file) {
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)record;
            fprintf(trace_file, "%llu,%llu,%u,%u,%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->deviceId, k->streamId, k->name);
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)record;
            fprintf(trace_file, "%llu,%llu,%u,%u,memcpy %u %llu bytes\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->deviceId, m->streamId, (unsigned)m->copyKind,
                    (unsigned long long)m->bytes);
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY2) {
            const CUpti_ActivityMemcpyPtoP4 *m = (const CUpti_ActivityMemcpyPtoP4 *)record;
            fprintf(trace_file, "%llu,%llu,%u,%u,memcpy peer %llu bytes\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->deviceId, m->streamId, (unsigned long long)m->bytes);
        }
    }
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped);
    if (dropped) fprintf(stderr, "kernel_trace: %zu records dropped\n", dropped);
    free(buffer);
}

static void flush_at_exit(void) {
    CUPTI_OK(cuptiActivityFlushAll(1));
    if (trace_file) fclose(trace_file);
    trace_file = NULL;
}

int InitializeInjection(void) {
    const char *dir = getenv("KERNEL_TRACE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/kernels.%d.csv", dir ? dir : ".", (int)getpid());
    trace_file = fopen(path, "w");
    if (!trace_file) {
        fprintf(stderr, "kernel_trace: cannot write %s\n", path);
        return 0;
    }
    fprintf(trace_file, "start_ns,end_ns,device,stream,name\n");
    CUPTI_OK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2));
    atexit(flush_at_exit);
    return 1;
}
