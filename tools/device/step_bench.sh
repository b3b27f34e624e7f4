#!/usr/bin/env bash
# On the lent GPU (one card): the GPU tests; the training step alone (a batch
# kept on the GPU) by precision, layout and algorithm choice at 224 (batch 256)
# and 32x32 (batch 512) beside PyTorch eager; peak memory of the memory stage
# by workspace limit; per-kernel times (ncu) of the AMP steps. Everything goes
# to $OUT/log.txt, the kernel lists to $OUT/ncu_*.txt.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
exec > >(tee -a "$LOG") 2>&1
OUT=/tmp/prep timeout 300 bash tools/device/prepare.sh > /tmp/prepare.log 2>&1 || { tail -30 /tmp/prepare.log; exit 1; }
echo "== GPU tests (single card)"
timeout 300 ctest --test-dir build -j4 -E "dist|ddp" --output-on-failure > /tmp/ctest.log 2>&1
grep -E "tests passed|Failed|\*\*\*|CHECK failed|CHECK_NEAR failed" /tmp/ctest.log | head -20
grep -E "bias_relu_pool|fused|nhwc.*grid" /tmp/ctest.log | head -12
# One run's summary: samples/s, step, peak, phases, and the conv algorithms it chose.
run() { local tag=$1; shift
  timeout 120 build/trainc "$@" > /tmp/run.json 2> /tmp/run.err
  python3 - "$tag" <<'PY'
import json, re, sys
try:
    s = json.loads(open("/tmp/run.json").read().strip().splitlines()[-1])
    p = {k: round(v, 3) for k, v in s["phase_ms"].items() if isinstance(v, (int, float))}
    algos = re.findall(r"conv \S+ k\d+: cuDNN algorithms forward (\d+), backward data (\d+), backward filter (\d+)",
                       open("/tmp/run.err").read())
    print(f"{sys.argv[1]:44s} {s['samples_per_s']:9.0f} samples/s  step {s['step_ms']:7.3f} ms  peak "
          f"{s['peak_mem_bytes']/2**30:6.2f} GiB  algos {'/'.join(''.join(a) for a in algos)}  {p}")
except Exception as e:
    print(f"{sys.argv[1]:44s} failed: {e}; " + " | ".join(open("/tmp/run.err").read().strip().splitlines()[-3:]))
PY
}
S224="--config configs/model.ini --set data.resident=on --set run.eval=off --set run.max_steps=60 --set run.warmup_steps=15"
echo "== SimpleNet 224, batch 256, step alone (model.ini: fused)"
for amp in off fp16; do for layout in nchw nhwc; do for bench in off on; do
  run "224 amp=$amp $layout bench=$bench" $S224 --set precision.amp=$amp --set model.layout=$layout --set perf.conv_benchmark=$bench
done; done; done
run "224 amp=fp16 nhwc bench=on graph" $S224 --set precision.amp=fp16 --set model.layout=nhwc --set perf.conv_benchmark=on --set perf.cuda_graph=on
run "224 amp=off nchw unfused" $S224 --set model.fuse=off
T="python3 tools/torch_reference.py --epochs 1 --no-sync --resident --amp fp16 --channels-last"
echo "torch eager 224 AMP channels-last: $(timeout 150 $T --image-size 224 --batch 256 --max-steps 60 --warmup-steps 15 2>/dev/null | tail -1 | grep -o '"samples_per_s": [0-9.]*')"
echo "== memory, 224 batch 256 step alone"
M="--set data.resident=on --set run.eval=off --set run.max_steps=30 --set run.warmup_steps=10"
run "fp32 model.ini" --config configs/model.ini $M
run "fp32 dataloader.ini (unfused)" --config configs/dataloader.ini $M
for ws in 4096 1024 256 64; do for layout in nchw nhwc; do
  run "memory.ini ws=$ws $layout" --config configs/memory.ini $M --set perf.conv_workspace_mb=$ws --set model.layout=$layout
done; done
echo "== SimpleNet 32x32, batch 512, AMP fp16, fused, step alone"
S32="--config configs/final.ini --set data.image_size=32 --set train.batch=512 --set data.resident=on --set run.eval=off --set run.max_steps=1100 --set run.warmup_steps=100"
for layout in nhwc nchw; do for g in on off; do for b in off on; do
  run "32 $layout graph=$g bench=$b" $S32 --set perf.cuda_graph=$g --set perf.conv_benchmark=$b --set model.layout=$layout
done; done; done
run "32 nhwc graph=on bench=on again" $S32 --set perf.cuda_graph=on --set perf.conv_benchmark=on --set model.layout=nhwc
T32="python3 tools/torch_reference.py --image-size 32 --batch 512 --epochs 1 --max-steps 600 --warmup-steps 100 --no-sync --resident --amp fp16"
echo "torch eager 32 NCHW: $(timeout 120 $T32 2>/dev/null | tail -1 | grep -o '"samples_per_s": [0-9.]*')"
echo "torch eager 32 channels-last: $(timeout 120 $T32 --channels-last 2>/dev/null | tail -1 | grep -o '"samples_per_s": [0-9.]*')"
kernels() { python3 - "$1" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10 and not r[0].startswith("{")]
head, rows = rows[0], rows[1:]
ki, vi, ui = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}
for r in rows:
    print(f"{float(r[vi].replace(',', '')) * scale.get(r[ui], 1):10.1f} us  {r[ki][:120]}")
PY
}
NCU="ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv"
echo "== ncu"
timeout 120 $NCU -c 160 build/trainc $S224 --quiet --set precision.amp=fp16 --set model.layout=nhwc --set run.max_steps=2 --set run.warmup_steps=0 > /tmp/ncu224.csv 2>/dev/null
kernels /tmp/ncu224.csv > "$OUT/ncu_224_fp16_nhwc.txt"; wc -l < "$OUT/ncu_224_fp16_nhwc.txt"
timeout 120 $NCU -c 160 build/trainc $S224 --quiet --set model.layout=nhwc --set run.max_steps=2 --set run.warmup_steps=0 > /tmp/ncu224f.csv 2>/dev/null
kernels /tmp/ncu224f.csv > "$OUT/ncu_224_fp32_nhwc.txt"; wc -l < "$OUT/ncu_224_fp32_nhwc.txt"
timeout 120 $NCU -c 300 build/trainc $S32 --quiet --set perf.cuda_graph=off --set model.layout=nhwc --set run.max_steps=4 --set run.warmup_steps=0 > /tmp/ncu32.csv 2>/dev/null
kernels /tmp/ncu32.csv > "$OUT/ncu_32_fp16_nhwc.txt"; wc -l < "$OUT/ncu_32_fp16_nhwc.txt"
cp /tmp/ctest.log "$OUT/ctest.log"
echo "done"
