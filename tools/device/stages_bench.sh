#!/usr/bin/env bash
# On the lent GPU (one card), issues 4 and 5 with the NHWC stages: the step
# alone at 224 (batch 256) and 32x32 (batch 512) against PyTorch eager, with the
# host CPU time per step with and without the CUDA graph; the task 4.1 memory
# grid; the lab's table (trainc's five stages and PyTorch's, one epoch each).
# Everything goes to $OUT/log.txt; the table also as CSV and SVG.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
PART=${PART:-steps}  # steps: tests, steps alone, memory grid; lab: the lab's table
OUT=/tmp/prep timeout 300 bash tools/device/prepare.sh > /tmp/prepare.log 2>&1 || { tail -30 /tmp/prepare.log; exit 1; }
if [ "$PART" = steps ]; then
echo "== GPU tests touched by this change"
timeout 200 ctest --test-dir build -R "ops_cuda|ops_nhwc|bias_relu|train_memory|trainc_cli" --output-on-failure > /tmp/ctest.log 2>&1
grep -E "tests passed|Failed|CHECK failed" /tmp/ctest.log | head
# step TAG WARM EXTRA CONFIG [--set ...]: samples/s and the host CPU time per
# timed step (two runs, WARM + 200 and WARM + 200 + EXTRA steps: the
# difference leaves start-up out).
step() { local tag=$1; shift
  timeout 150 python3 - "$tag" "$@" <<'PY'
import json, resource, subprocess, sys
tag, warm, extra, args = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def once(steps):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(["build/trainc", *args, "--quiet", "--set", f"run.max_steps={steps}", "--set",
                        f"run.warmup_steps={warm}"], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    s = json.loads(p.stdout.strip().splitlines()[-1])
    return s, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
try:
    short, cpu_short = once(warm + 200)
    long, cpu_long = once(warm + 200 + extra)
    print(f"{tag:40s} {long['samples_per_s']:9.0f} samples/s  step {long['step_ms']:.3f} ms  host CPU "
          f"{(cpu_long - cpu_short) / extra * 1e3:.3f} ms/step  peak {long['peak_mem_bytes'] / 2**30:.2f} GiB")
except Exception as e:
    print(f"{tag:40s} failed: {e}")
PY
}
R="--set data.resident=on --set run.eval=off --set run.epochs=1000"
echo "== step alone"
step "32 final.ini graph" 100 1000 --config configs/final.ini $R --set data.image_size=32 --set train.batch=512
step "32 final.ini no graph" 100 1000 --config configs/final.ini $R --set data.image_size=32 --set train.batch=512 --set perf.cuda_graph=off
step "32 final.ini nchw bench" 100 1000 --config configs/final.ini $R --set data.image_size=32 --set train.batch=512 --set model.layout=nchw
step "32 final.ini nchw heuristics" 100 1000 --config configs/final.ini $R --set data.image_size=32 --set train.batch=512 --set model.layout=nchw --set perf.conv_benchmark=off
step "224 final.ini graph" 20 200 --config configs/final.ini $R
step "224 model.ini (fp32)" 20 100 --config configs/model.ini $R
T="python3 tools/torch_reference.py --epochs 8 --no-sync --resident --amp fp16"
for cl in "" "--channels-last"; do
  echo "torch eager 32 AMP $cl: $(timeout 150 $T --image-size 32 --batch 512 --max-steps 700 --warmup-steps 100 $cl 2>/dev/null | tail -1 | grep -o '"samples_per_s": [0-9.]*')"
done
echo "torch eager 224 AMP --channels-last: $(timeout 150 $T --image-size 224 --batch 256 --max-steps 80 --warmup-steps 20 --channels-last 2>/dev/null | tail -1 | grep -o '"samples_per_s": [0-9.]*')"
echo "== task 4.1: memory grid on model.ini"
timeout 200 python3 tools/bench_memory.py
fi
if [ "$PART" = lab ]; then
echo "== the lab's table"
TS="python3 tools/torch_reference.py --image-size 224 --epochs 1"
{
  timeout 120 $TS --batch 32 --loader lab --name baseline 2>/dev/null | tail -1
  timeout 90 $TS --batch 256 --tf32 --no-sync --loader lab --workers 8 --pinned --name dataloader 2>/dev/null | tail -1
  timeout 90 $TS --batch 256 --tf32 --no-sync --loader lab --workers 8 --pinned --channels-last --name channels_last 2>/dev/null | tail -1
  timeout 90 $TS --batch 256 --tf32 --no-sync --loader lab --workers 8 --pinned --channels-last --amp fp16 --name amp_channels_last 2>/dev/null | tail -1
} > "$OUT/torch_stages.jsonl"
cut -c1-220 "$OUT/torch_stages.jsonl"
timeout 240 python3 tools/lab_table.py --configs configs/baseline.ini,configs/dataloader.ini,configs/model.ini,configs/memory.ini,configs/final.ini \
  --set run.epochs=1 --set run.eval=off --torch-json "$OUT/torch_stages.jsonl" --csv "$OUT/lab_table.csv" --svg "$OUT/lab_table.svg"
fi
echo "done"
