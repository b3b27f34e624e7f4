#!/usr/bin/env bash
# On the lent GPU (one card): build, the GPU tests of the ResNet and
# data-parallel work, then issue 6's step benchmarks (tools/device/issue6_bench.sh
# PARTS="step r50") and trainc's ResNet-18 step under each speed switch.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=/tmp/prep timeout 900 bash tools/device/prepare.sh > "$OUT/prepare.log" 2>&1 || { tail -30 "$OUT/prepare.log"; exit 1; }
echo "== GPU tests"
(cd build && timeout 420 ctest -j3 --output-on-failure \
  -R "resnet|ops_|train_memory|train_step_gpu|ddp|dist_gpu" > "$OUT/ctest.log" 2>&1)
grep -E "tests passed|Passed|Failed|\*\*\*" "$OUT/ctest.log" | head -30
grep -E "CHECK failed|resnet18|residual" "$OUT/ctest.log" | head -40
echo "== trainc ResNet-18 step, batch 512, each switch"
step() {
  local label=$1; shift
  timeout 240 build/trainc --config configs/resnet18.ini --quiet --set data.resident=on --set run.eval=off \
    --set run.max_steps=250 --set run.warmup_steps=50 "$@" 2> "$OUT/step_$label.err" | tail -1 |
    python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(f'$label: {d[\"samples_per_s\"]:,.0f} samples/s, step {d[\"step_ms\"]:.2f} ms, peak {d[\"peak_mem_bytes\"]/2**30:.2f} GiB')" ||
    { echo "$label: failed"; tail -3 "$OUT/step_$label.err"; }
}
step final
step nchw --set model.layout=nchw
step no_fuse --set model.fuse=off
step no_graph --set perf.cuda_graph=off
step fp32 --set precision.amp=off --set precision.tf32=on
step heuristics --set perf.conv_benchmark=off
echo "== issue 6 step benchmarks"
PARTS="step r50" LOGS=/tmp/issue6_logs timeout 400 bash tools/device/issue6_bench.sh 2>&1 | grep -v "^$" | tail -20
