/* CUPTI's activity records, loaded at run time (cupti_activity.h).
 *
 * CUPTI fills buffers we hand it in buffer_requested and gives them back in
 * buffer_completed, on its own thread while the run goes on, or on ours in
 * the final flush. The buffers are a pool allocated at open and reused; the
 * records are copied out into growing arrays of ours under a mutex (on
 * CUPTI's thread: the training thread allocates nothing for this). */
#include "runtime/cupti_activity.h"

#include <stdio.h>

static char why[256];

const char *gpu_activity_why(void) { return why; }

#if !TRAINC_CUDA || !TRAINC_HAVE_CUPTI

static int not_built(void) {
    snprintf(why, sizeof why, TRAINC_CUDA ? "CUPTI's headers were not found when trainc was built"
                                          : "CUDA not built (TRAINC_CUDA=OFF)");
    return -1;
}

int gpu_activity_open(void) { return not_built(); }
int gpu_activity_timestamp(uint64_t *ns) { return *ns = 0, not_built(); }
int gpu_activity_stream_id(cudaStream_t s, uint32_t *id) { return *id = 0, not_built(); }
int gpu_activity_flush(void) { return not_built(); }
const GpuActivity *gpu_activity_records(long *n) { return *n = 0, NULL; }
const GpuApiCall *gpu_activity_api_calls(long *n) { return *n = 0, NULL; }
long gpu_activity_dropped(void) { return 0; }
void gpu_activity_close(void) {}

#else

#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"

#ifndef TRAINC_CUPTI_LIBRARY
#define TRAINC_CUPTI_LIBRARY ""
#endif

enum { POOL_BUFFERS = 8, BUFFER_BYTES = 2 << 20, BUFFER_ALIGN = 8 };

/* CUPTI's functions, each resolved with dlsym and typed from <cupti.h>. */
#define CUPTI_FUNCTIONS(X)                                                                                     \
    X(cuptiGetVersion) X(cuptiGetResultString) X(cuptiActivityRegisterCallbacks) X(cuptiActivityEnable)       \
    X(cuptiActivityDisable) X(cuptiActivityFlushAll) X(cuptiActivityGetNextRecord)                            \
    X(cuptiActivityGetNumDroppedRecords) X(cuptiGetTimestamp) X(cuptiGetStreamIdEx) X(cuptiGetCallbackName)
#define DECLARE_POINTER(f) static __typeof__(&f) p_##f;
CUPTI_FUNCTIONS(DECLARE_POINTER)
#define RESOLVE(f)                                                                                             \
    if (!(p_##f = (__typeof__(&f))dlsym(lib, #f))) return fail("%s has no %s", g.path, #f);

static const CUpti_ActivityKind kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMCPY2,
    CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
};
enum { N_KINDS = sizeof kinds / sizeof *kinds };

static struct {
    void *lib;
    const char *path;                /* lib's */
    int loaded;                      /* lib's functions resolved, its version checked */
    pthread_mutex_t lock;
    uint8_t *pool[POOL_BUFFERS];
    int n_free;                      /* free_list[0..n_free) are free */
    uint8_t *free_list[POOL_BUFFERS];
    GpuActivity *act;
    long n_act, cap_act;
    GpuApiCall *api;
    long n_api, cap_api;
    char **names;                    /* interned: an open-addressed table */
    long n_names, cap_names;
    long dropped;
    int enabled;                     /* how many of kinds[] are enabled */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return -1;
}

static int cupti_failed(const char *call, CUptiResult r) {
    const char *s = NULL;
    if (!strncmp(call, "p_", 2)) call += 2; /* our pointer's name: CUPTI's function's */
    if (!p_cuptiGetResultString || p_cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "unknown error";
    return fail("%s: %s (CUPTI error %d)", call, s, (int)r);
}
#define CUPTI_TRY(call)                                                                                        \
    do {                                                                                                       \
        CUptiResult r_ = (call);                                                                               \
        if (r_ != CUPTI_SUCCESS) return cupti_failed(#call, r_);                                               \
    } while (0)

/* ---- records --------------------------------------------------------------------- */

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static void grow_names(void) {
    long cap = g.cap_names ? 2 * g.cap_names : 256;
    char **table = calloc((size_t)cap, sizeof *table);
    if (!table) TC_FATAL("out of host memory: CUPTI's kernel names");
    for (long i = 0; i < g.cap_names; i++) {
        if (!g.names[i]) continue;
        long j = (long)(hash_name(g.names[i]) & (uint64_t)(cap - 1));
        while (table[j]) j = (j + 1) & (cap - 1);
        table[j] = g.names[i];
    }
    free(g.names);
    g.names = table;
    g.cap_names = cap;
}

/* One copy of each name, kept until close: equal names get equal pointers. */
static const char *intern(const char *name) {
    if (!name) name = "?";
    if (2 * (g.n_names + 1) > g.cap_names) grow_names();
    long j = (long)(hash_name(name) & (uint64_t)(g.cap_names - 1));
    for (; g.names[j]; j = (j + 1) & (g.cap_names - 1))
        if (!strcmp(g.names[j], name)) return g.names[j];
    if (!(g.names[j] = strdup(name))) TC_FATAL("out of host memory: CUPTI's kernel names");
    g.n_names++;
    return g.names[j];
}

static GpuActivity *new_activity(void) {
    if (g.n_act == g.cap_act) {
        g.cap_act = g.cap_act ? 2 * g.cap_act : 4096;
        if (!(g.act = realloc(g.act, (size_t)g.cap_act * sizeof *g.act))) TC_FATAL("out of host memory: CUPTI records");
    }
    return &g.act[g.n_act++];
}

static uint8_t copy_kind(uint8_t cupti_kind) {
    switch (cupti_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return GPU_COPY_H2D;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return GPU_COPY_D2H;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return GPU_COPY_D2D;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return GPU_COPY_PEER;
    default: return GPU_COPY_OTHER;
    }
}

static GpuApiClass runtime_class(CUpti_CallbackId cbid) {
    switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyPeerAsync_v4000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000: return GPU_API_LAUNCH;
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaThreadSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_ptds_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset_ptds_v7000: return GPU_API_SYNC;
    default: return GPU_API_OTHER;
    }
}

static GpuApiClass driver_class(CUpti_CallbackId cbid) {
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz: return GPU_API_LAUNCH;
    default: return GPU_API_OTHER;
    }
}

/* Driver records are kept only for launches: those are what NCCL's own
 * kernels are launched by (the runtime's calls enter the driver too, giving
 * a driver record for nearly every runtime one). */
static void add_api_call(const CUpti_ActivityAPI *rec, int driver) {
    GpuApiClass c = driver ? driver_class(rec->cbid) : runtime_class(rec->cbid);
    if (driver && c != GPU_API_LAUNCH) return;
    if (g.n_api == g.cap_api) {
        g.cap_api = g.cap_api ? 2 * g.cap_api : 8192;
        if (!(g.api = realloc(g.api, (size_t)g.cap_api * sizeof *g.api))) TC_FATAL("out of host memory: CUPTI records");
    }
    const char *name = NULL;
    CUpti_CallbackDomain domain = driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
    if (p_cuptiGetCallbackName(domain, rec->cbid, &name) != CUPTI_SUCCESS || !name) name = driver ? "cu?" : "cuda?";
    g.api[g.n_api++] = (GpuApiCall){.start = rec->start, .end = rec->end, .name = intern(name),
                                    .correlation = rec->correlationId, .driver = (uint8_t)driver,
                                    .api_class = (uint8_t)c};
}

static void add_record(const CUpti_Activity *rec) {
    switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        *new_activity() = (GpuActivity){k->start, k->end, 0, intern(k->name), k->streamId, k->correlationId,
                                        GPU_ACT_KERNEL, 0};
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
        *new_activity() = (GpuActivity){m->start, m->end, m->bytes, NULL, m->streamId, m->correlationId, GPU_ACT_COPY,
                           copy_kind(m->copyKind)};
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY2: {
        const CUpti_ActivityMemcpyPtoP4 *m = (const CUpti_ActivityMemcpyPtoP4 *)rec;
        *new_activity() = (GpuActivity){m->start, m->end, m->bytes, NULL, m->streamId, m->correlationId, GPU_ACT_COPY,
                           GPU_COPY_PEER};
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
        *new_activity() = (GpuActivity){m->start, m->end, m->bytes, NULL, m->streamId, m->correlationId,
                                        GPU_ACT_MEMSET, 0};
        break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME: add_api_call((const CUpti_ActivityAPI *)rec, 0); break;
    case CUPTI_ACTIVITY_KIND_DRIVER: add_api_call((const CUpti_ActivityAPI *)rec, 1); break;
    default: break;
    }
}

/* ---- CUPTI's buffer callbacks ------------------------------------------------------- */

/* An empty pool gives CUPTI no buffer: it drops records, and counts them. */
static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    pthread_mutex_lock(&g.lock);
    *buffer = g.n_free ? g.free_list[--g.n_free] : NULL;
    pthread_mutex_unlock(&g.lock);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    CUpti_Activity *rec = NULL;
    size_t dropped = 0;
    pthread_mutex_lock(&g.lock);
    while (valid && p_cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) add_record(rec);
    if (p_cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) g.dropped += (long)dropped;
    if (buffer) g.free_list[g.n_free++] = buffer;
    pthread_mutex_unlock(&g.lock);
}

/* ---- the interface ------------------------------------------------------------------ */

static int load(void) {
    if (g.loaded) return 0;
    const char *paths[] = {TRAINC_CUPTI_LIBRARY, "libcupti.so"};
    char errors[2][160] = {"", ""};
    for (int i = 0; i < 2 && !g.lib; i++) { /* (a load that failed later keeps its g.lib) */
        if (!*paths[i]) continue;
        g.path = paths[i];
        g.lib = dlopen(g.path, RTLD_NOW | RTLD_LOCAL);
        const char *e = g.lib ? NULL : dlerror();
        snprintf(errors[i], sizeof errors[i], "%s", e ? e : "");
    }
    if (!g.lib)
        return fail("libcupti not loaded (%s%s%s)", errors[0], *errors[0] ? "; " : "", errors[1]);
    void *lib = g.lib;
    CUPTI_FUNCTIONS(RESOLVE)
    uint32_t version = 0;
    CUPTI_TRY(p_cuptiGetVersion(&version));
    /* The records' layout is the library's: it must be the one <cupti.h> describes. */
    if (version != CUPTI_API_VERSION)
        return fail("%s is CUPTI API version %u, trainc was built against %u", g.path, version, CUPTI_API_VERSION);
    g.loaded = 1;
    return 0;
}

int gpu_activity_open(void) {
    if (g.enabled) return fail("CUPTI activity is already open");
    if (load() != 0) return -1;
    for (int i = 0; i < POOL_BUFFERS; i++) {
        if (!g.pool[i] && !(g.pool[i] = aligned_alloc(BUFFER_ALIGN, BUFFER_BYTES)))
            return fail("out of host memory: CUPTI's buffers");
        g.free_list[i] = g.pool[i];
    }
    g.n_free = POOL_BUFFERS;
    CUPTI_TRY(p_cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    for (; g.enabled < N_KINDS; g.enabled++) {
        CUptiResult r = p_cuptiActivityEnable(kinds[g.enabled]);
        char call[64];
        snprintf(call, sizeof call, "cuptiActivityEnable(activity kind %d)", (int)kinds[g.enabled]);
        if (r != CUPTI_SUCCESS) return cupti_failed(call, r);
    }
    return 0;
}

int gpu_activity_timestamp(uint64_t *ns) {
    *ns = 0;
    if (!g.enabled) return fail("CUPTI activity is not open");
    CUPTI_TRY(p_cuptiGetTimestamp(ns));
    return 0;
}

int gpu_activity_stream_id(cudaStream_t s, uint32_t *id) {
    *id = 0;
    if (!g.enabled) return fail("CUPTI activity is not open");
    CUPTI_TRY(p_cuptiGetStreamIdEx(NULL, (CUstream)s, 0, id));
    return 0;
}

int gpu_activity_flush(void) {
    if (!g.enabled) return fail("CUPTI activity is not open");
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return fail("cudaDeviceSynchronize before CUPTI's flush: %s", cudaGetErrorString(e));
    for (; g.enabled > 0; g.enabled--) CUPTI_TRY(p_cuptiActivityDisable(kinds[g.enabled - 1]));
    CUPTI_TRY(p_cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    return 0;
}

const GpuActivity *gpu_activity_records(long *n) {
    *n = g.n_act;
    return g.act;
}

const GpuApiCall *gpu_activity_api_calls(long *n) {
    *n = g.n_api;
    return g.api;
}

long gpu_activity_dropped(void) { return g.dropped; }

void gpu_activity_close(void) {
    if (g.enabled) gpu_activity_flush();
    pthread_mutex_lock(&g.lock);
    /* A buffer CUPTI still holds (a flush that failed) is left to it. */
    if (g.n_free == POOL_BUFFERS)
        for (int i = 0; i < POOL_BUFFERS; i++) free(g.pool[i]), g.pool[i] = NULL;
    g.n_free = 0;
    for (long i = 0; i < g.cap_names; i++) free(g.names[i]);
    free(g.names), free(g.act), free(g.api);
    g.names = NULL, g.act = NULL, g.api = NULL;
    g.n_names = g.cap_names = g.n_act = g.cap_act = g.n_api = g.cap_api = g.dropped = 0;
    pthread_mutex_unlock(&g.lock);
}

#endif
