#!/usr/bin/env bash
# Builds the CUPTI kernel tracer (tools/device/kernel_trace.c) as
# /tmp/libkernel_trace.so. A run is traced with
#   CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_DIR=dir
# (under mpirun: -x for each), and tools/device/trace_summary.py reads dir.
CUDA=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
gcc -O2 -shared -fPIC -I"$CUDA/include" -I"$CUDA/extras/CUPTI/include" tools/device/kernel_trace.c \
  -L"$CUDA/lib64" -L"$CUDA/extras/CUPTI/lib64" -lcupti \
  -Wl,-rpath,"$CUDA/lib64:$CUDA/extras/CUPTI/lib64" -o /tmp/libkernel_trace.so || echo "kernel_trace: build failed"
