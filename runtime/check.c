#include "runtime/check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_FATAL_HOOKS 8
static void (*fatal_hooks[MAX_FATAL_HOOKS])(void);
static int n_fatal_hooks;

void tc_on_fatal(void (*hook)(void)) {
    if (n_fatal_hooks < MAX_FATAL_HOOKS) fatal_hooks[n_fatal_hooks++] = hook;
}

void tc_fatal(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "trainc: error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (%s:%d)\n", file, line);
    /* Run the hooks once: a hook that fails itself must not loop back here. */
    int n = n_fatal_hooks;
    n_fatal_hooks = 0;
    for (int i = n - 1; i >= 0; i--) fatal_hooks[i]();
    exit(1);
}

const char *tc_cublas_status_string(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
    }
}
