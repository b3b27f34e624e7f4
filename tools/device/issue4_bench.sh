#!/usr/bin/env bash
# On the lent GPU: the memory stage. Step rates with benchmarked algorithms,
# the task 4.1 grid, the dataloader stage against PyTorch's, and SimpleNet-32
# accuracy in fp32, fp16 and bf16 (2 seeds each).
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh > /dev/null || exit 1
step() { build/trainc --config configs/dataloader.ini --quiet --set data.resident=on --set run.eval=off \
  --set run.max_steps=40 --set run.warmup_steps=10 "$@" 2>&1 | tail -1 | python3 -c \
  "import json,sys; s=json.loads(sys.stdin.read()); print(f\"{s['samples_per_s']:8.0f} samples/s {s['peak_mem_bytes']/2**30:6.2f} GiB\")" ; }
echo "step fp32 nchw bench: $(step --set perf.conv_benchmark=on)"
echo "step fp32 nchw bench ws1024: $(step --set perf.conv_benchmark=on --set perf.conv_workspace_mb=1024)"
for ws in 4096 1024 256; do
  echo "step fp16 nchw bench ws$ws: $(step --set perf.conv_benchmark=on --set precision.amp=fp16 --set perf.conv_workspace_mb=$ws)"
  echo "step fp16 nchw bench ckpt ws$ws: $(step --set perf.conv_benchmark=on --set precision.amp=fp16 --set memory.checkpoint=blocks --set perf.conv_workspace_mb=$ws)"
done
echo "trainc dataloader bench: $(build/trainc --config configs/dataloader.ini --set run.epochs=1 --set perf.conv_benchmark=on 2>&1 | tail -1)"
echo "torch dataloader: $(python3 tools/torch_reference.py --image-size 224 --batch 256 --epochs 1 --tf32 --no-sync --loader lab --workers 8 --pinned --name torch_dataloader 2>&1 | tail -1)"
python3 tools/bench_memory.py --precisions off,fp16 --set perf.conv_benchmark=on > "$OUT/bench_memory.txt" 2>&1; cat "$OUT/bench_memory.txt"
for amp in off fp16 bf16; do for seed in 0 1; do
  echo "simplenet32 amp=$amp seed=$seed: $(build/trainc --config configs/simplenet32.ini --set precision.amp=$amp --set run.seed=$seed --quiet 2>&1 | tail -1)"
done; done
