#include "runtime/version.h"

#include "runtime/cuda_api.h"

/* CMake passes both to this file alone (CMakeLists.txt); a build without it says so. */
#ifndef TRAINC_VERSION
#define TRAINC_VERSION "unknown"
#endif
#ifndef TRAINC_GIT_COMMIT
#define TRAINC_GIT_COMMIT "unknown"
#endif

const char *trainc_version(void) { return TRAINC_VERSION; }

const char *trainc_git_commit(void) { return TRAINC_GIT_COMMIT; }

#if TRAINC_CUDA

/* CUDA writes versions as 1000 x major + 10 x minor: 12080 is 12.8. */
static void print_cuda_version(FILE *f, const char *what, cudaError_t rc, int v) {
    if (rc != cudaSuccess) fprintf(f, "%s: unknown (%s)", what, cudaGetErrorString(rc));
    else if (v == 0) fprintf(f, "%s: none (no NVIDIA driver found)", what);
    else fprintf(f, "%s: %d.%d", what, v / 1000, v % 1000 / 10);
}

/* cuDNN 9 and NCCL 2.9 on write 10000 x major + 100 x minor + patch; older
 * releases 1000 x major + 100 x minor + patch. */
static void print_library_version(FILE *f, const char *what, long v, long new_scheme_from) {
    long major_unit = v >= new_scheme_from ? 10000 : 1000;
    fprintf(f, "%s: %ld.%ld.%ld", what, v / major_unit, v % major_unit / 100, v % 100);
}

static void print_libraries(FILE *f) {
    int runtime = 0, driver = 0;
    cudaError_t rc_runtime = cudaRuntimeGetVersion(&runtime);
    cudaError_t rc_driver = cudaDriverGetVersion(&driver);
    print_cuda_version(f, "CUDA runtime", rc_runtime, runtime);
    fprintf(f, " (built with %d.%d)\n", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    print_cuda_version(f, "CUDA driver", rc_driver, driver);
    fputc('\n', f);
    print_library_version(f, "cuDNN", (long)cudnnGetVersion(), 90000);
    fprintf(f, " (built with %d.%d.%d)\n", CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
    int nccl = 0;
    ncclResult_t rc = ncclGetVersion(&nccl);
    if (rc != ncclSuccess) fprintf(f, "NCCL: unknown (%s)", ncclGetErrorString(rc));
    else print_library_version(f, "NCCL", nccl, 20900);
    fprintf(f, " (built with %d.%d.%d)\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}

/* "gpus: 2 (NVIDIA H100 80GB HBM3, ...)" or "gpus: 0 (why)": tools/start.sh reads it. */
static void print_gpus(FILE *f) {
    int n = 0, driver = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        int no_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
        fprintf(f, "gpus: 0 (%s)\n", no_driver ? "no NVIDIA driver found" : cudaGetErrorString(rc));
        return;
    }
    fprintf(f, "gpus: %d", n);
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) fprintf(f, "%s%s", i ? ", " : " (", prop.name);
    }
    fputs(n ? ")\n" : "\n", f);
}

#else

static void print_libraries(FILE *f) { fprintf(f, "CUDA: not built with CUDA (TRAINC_CUDA=0)\n"); }

static void print_gpus(FILE *f) { fprintf(f, "gpus: 0 (not built with CUDA)\n"); }

#endif

void trainc_print_version(FILE *f) {
    fprintf(f, "trainc %s (git commit %s)\n", trainc_version(), trainc_git_commit());
    print_libraries(f);
    print_gpus(f);
}
