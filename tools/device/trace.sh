#!/usr/bin/env bash
# shellcheck disable=SC2086  # MPI_ARGS and SUMMARY are split into words on purpose
# Where a trainc run's GPU time goes, on a lent GPU machine (after building:
# tools/device/prepare.sh).
#
#   bash tools/device/trace.sh [TRAINC OPTIONS...]      (default: --config configs/ddp.ini)
#
# Measures:
#   the kernel trace: builds the CUPTI tracer tools/device/kernel_trace.c into
#     /tmp/libkernel_trace.so, runs build/trainc with the given options under it on NP
#     GPUs (mpirun -np NP when NP > 1) and prints tools/device/trace_summary.py's table:
#     per rank and steady step, the step period, compute, communication, exposed
#     communication and idle time, the kernels that took the most time. By default
#     the step alone (one batch kept on each GPU, evaluation off, WARM untimed steps,
#     STEPS steps in all); LOADER=1: EPOCHS epochs with the real loader instead.
#   NCU=1: instead an Nsight Compute capture of the run filtered by the NVTX ranges of
#     the training step (forward/, backward/, optimizer/; CUDA graphs off so that the
#     kernels launch one by one): launch statistics of NCU_COUNT kernels after NCU_SKIP.
# Parameters (environment):
#   NP=n             GPUs (default 1)
#   STEPS, WARM      steps in all and untimed steps of the step-alone run (default 120, 20)
#   LOADER=1, EPOCHS (default 3): the real loader
#   SUMMARY          trace_summary.py options (default "--skip 40 --top 10"), e.g.
#                    "--periods 10" (the mean step period of every 10 steps), "--slow 6",
#                    "--gaps 3" (idle gaps of the busiest stream)
#   MPI_ARGS         more mpirun options
#   TRACE_DIR        where the per-process CSVs go (default /tmp/trace_np$NP; they stay there)
#   NCU=1, NCU_SKIP (200), NCU_COUNT (6)
#   OUT, LOGS, BUILD_LIMIT: see prepare.sh
# The tracer alone, on any CUDA program:
#   CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_DIR=dir PROGRAM ...
#   (under mpirun: -x for each), then python3 tools/device/trace_summary.py dir
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
[[ "${NP:-1}" =~ ^[1-9][0-9]*$ ]] || { echo "trace.sh: NP=$NP is not a positive number" >&2; exit 2; }
for n in STEPS WARM EPOCHS NCU_SKIP NCU_COUNT; do
  v=${!n:-1}
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "trace.sh: $n=$v is not a number" >&2; exit 2; }
done
[ $# -gt 0 ] || set -- --config configs/ddp.ini
case $1 in -*) ;; *) echo "trace.sh: '$1' is not a trainc option (e.g. --config configs/ddp.ini)" >&2; exit 2 ;; esac
[ "${DRY_RUN:-0}" = 1 ] && { echo "trace.sh: would trace build/trainc $*"; exit 0; }
# shellcheck source=tools/device/prepare.sh
source tools/device/prepare.sh
NP=${NP:-1}
MPI=""
[ "$NP" -gt 1 ] && MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0 ${MPI_ARGS:-} -np $NP"
if [ "${LOADER:-0}" = 1 ]; then
  RUN=(--quiet --set run.eval=off --set run.epochs="${EPOCHS:-3}" --set run.warmup_steps="${WARM:-10}")
else
  RUN=(--quiet --set data.resident=on --set run.eval=off --set run.epochs=100 --set run.warmup_steps="${WARM:-20}"
       --set run.max_steps="${STEPS:-120}")
fi

if [ "${NCU:-0}" = 1 ]; then
  echo "== ncu with NVTX ranges (graphs off: kernels launched one by one): build/trainc $*"
  timeout 300 ncu --nvtx --nvtx-include "forward/" --nvtx-include "backward/" --nvtx-include "optimizer/" \
    --launch-skip "${NCU_SKIP:-200}" --launch-count "${NCU_COUNT:-6}" --section LaunchStats --print-nvtx-rename none \
    build/trainc "$@" "${RUN[@]}" --set perf.cuda_graph=off > "$LOGS/ncu.log" 2>&1
  echo "ncu exit $?"
  grep -E "NVTX|forward|backward|optimizer|==PROF==|Kernel|kernel|void " "$LOGS/ncu.log" | head -40
  pack_logs
  exit 0
fi

CUDA=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
gcc -O2 -shared -fPIC -I"$CUDA/include" -I"$CUDA/extras/CUPTI/include" tools/device/kernel_trace.c \
  -L"$CUDA/lib64" -L"$CUDA/extras/CUPTI/lib64" -lcupti \
  -Wl,-rpath,"$CUDA/lib64:$CUDA/extras/CUPTI/lib64" -o /tmp/libkernel_trace.so \
  || { echo "trace.sh: building tools/device/kernel_trace.c failed"; exit 1; }
dir=${TRACE_DIR:-/tmp/trace_np$NP}
rm -rf "$dir" && mkdir -p "$dir"
echo "== build/trainc $* on $NP GPU(s), traced into $dir"
if [ -n "$MPI" ]; then
  timeout 300 $MPI -x CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so -x KERNEL_TRACE_DIR="$dir" \
    build/trainc "$@" "${RUN[@]}" > "$LOGS/traced.out" 2> "$LOGS/traced.err"
else
  CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_DIR="$dir" timeout 300 \
    build/trainc "$@" "${RUN[@]}" > "$LOGS/traced.out" 2> "$LOGS/traced.err"
fi
echo "trainc exit $?: $(tail -1 "$LOGS/traced.out" | cut -c1-300)"
python3 tools/device/trace_summary.py "$dir" ${SUMMARY:---skip 40 --top 10}
pack_logs
