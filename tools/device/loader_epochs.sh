#!/usr/bin/env bash
# On a lent 2-GPU machine: where the steps of SimpleNet-224 with the real loader
# (configs/ddp.ini, EPOCHS epochs, evaluation off, WARM untimed steps) are slow,
# on 1 and 2 GPUs: the kernel trace's mean step period of every 10 steps
# (trace_summary.py --periods), then issue 7's weak-scaling comparison with
# PyTorch DDP for that part alone (ddp_bench.sh simplenet-loader).
source tools/device/mpi_session.sh
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0"
L="--quiet --set run.eval=off --set run.epochs=${EPOCHS:-3} --set run.warmup_steps=${WARM:-10}"
bash tools/device/kernel_trace_build.sh
for np in 1 2; do
  dir=/tmp/trace_epochs_$np; rm -rf "$dir"; mkdir -p "$dir"
  timeout 120 $MPI -np $np -x CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so -x KERNEL_TRACE_DIR=$dir \
    build/trainc --config configs/ddp.ini $L 2>>"$OUT/runs.err" | tail -1
  python3 tools/device/trace_summary.py "$dir" --periods 10
done
PARTS=simplenet-loader LOADER_EPOCHS=${BENCH_EPOCHS:-5} RUN_LIMIT=150 GPUS=1,2 bash tools/device/ddp_bench.sh
rm -f "$OUT"/scaling_*.svg
