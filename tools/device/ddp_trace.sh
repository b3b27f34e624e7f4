#!/usr/bin/env bash
# On a lent 2-GPU machine: where the data-parallel step loses its time. Builds,
# tests, traces every kernel (tools/device/kernel_trace.c, CUPTI) of SimpleNet-224 and
# ResNet-18-32 on 1 and 2 GPUs (a batch kept on each GPU) and prints each
# rank's per-step compute, exposed-communication and idle time
# (trace_summary.py); then times untraced variants: copy engines or NCCL,
# bucket sizes. First the multi-GPU tests (TESTS=0: none; TEST_PATTERN: others).
source tools/device/mpi_session.sh
bash tools/device/kernel_trace_build.sh
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0"
R="--quiet --set data.resident=on --set run.eval=off --set run.epochs=100 --set run.warmup_steps=20"
one() { local tag=$1 np=$2 env=$3; shift 3
  printf '%-46s %s\n' "$tag" "$(timeout 90 $MPI -np "$np" $env build/trainc "$@" $R 2>/tmp/one.err | tail -1 | \
    python3 -c "import json,sys; s=json.loads(sys.stdin.read()); print(f\"{s['samples_per_s']:9.0f} samples/s step {s['step_ms']:.3f} ms\")" 2>/dev/null || { echo failed; tail -3 /tmp/one.err; })"; }
traced() { local tag=$1 np=$2; shift 2
  local dir=/tmp/trace_$tag; rm -rf "$dir"; mkdir -p "$dir"
  one "$tag (traced)" "$np" "-x CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so -x KERNEL_TRACE_DIR=$dir" "$@" --set run.max_steps=120
  python3 tools/device/trace_summary.py "$dir" --skip 40 --top ${TOP:-10}; }
S="--config configs/ddp.ini"
N="--config configs/resnet18.ini --set dist.allreduce_dtype=auto"
if [ "${TESTS:-1}" = 1 ]; then
  echo "== tests"
  timeout 240 ctest --test-dir build -R "${TEST_PATTERN:-dist_gpu|ddp}" --output-on-failure > /tmp/ctest.log 2>&1
  grep -E "tests passed|Failed|\*\*\*|CHECK failed|Skipped" /tmp/ctest.log | head -30
fi
echo "== traces"
traced simplenet1 1 $S
traced simplenet2 2 $S
traced resnet1 1 $N
traced resnet2_b4 2 $N --set dist.bucket_mb=4
echo "== variants (220 steps)"
R="$R --set run.max_steps=220"
one "simplenet 1 GPU" 1 "" $S
one "simplenet 2 GPUs, copy engines" 2 "" $S --set dist.copy_engine=on
one "simplenet 2 GPUs, NCCL" 2 "" $S --set dist.copy_engine=off
one "simplenet 2 GPUs, copy engines, bucket 100" 2 "" $S --set dist.copy_engine=on --set dist.bucket_mb=100
one "resnet18 1 GPU" 1 "" $N
for mb in 2 4 8 25; do one "resnet18 2 GPUs, copy engines, bucket $mb" 2 "" $N --set dist.copy_engine=on --set dist.bucket_mb=$mb; done
for mb in 4 25; do one "resnet18 2 GPUs, NCCL, bucket $mb" 2 "" $N --set dist.copy_engine=off --set dist.bucket_mb=$mb; done
one "simplenet 1 GPU (again)" 1 "" $S
one "resnet18 1 GPU (again)" 1 "" $N
echo done
