#!/usr/bin/env bash
# On the lent GPU: after the convolution-algorithm change, GPU tests, then
# trainc's dataloader stage against its resident step and PyTorch's.
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh || exit 1
ctest --test-dir build -R "gpu|cuda" --output-on-failure > "$OUT/ctest.log" 2>&1; tail -3 "$OUT/ctest.log"
one() { build/trainc --config configs/dataloader.ini --set run.epochs=1 "$@" 2>&1 | tail -1; }
echo "trainc resident det: $(one --set data.resident=on --set run.eval=off --set perf.deterministic=on)"
echo "trainc resident: $(one --set data.resident=on --set run.eval=off)"
echo "trainc dataloader gpu: $(one --set data.transform_on=gpu)"
echo "trainc dataloader cpu: $(one --set data.transform_on=cpu)"
echo "trainc baseline 300 steps: $(build/trainc --config configs/baseline.ini --set run.max_steps=300 --set run.eval=off 2>&1 | tail -1)"
T="python3 tools/torch_reference.py --image-size 224 --batch 256 --epochs 1 --tf32 --no-sync"
echo "torch resident: $($T --loader lab --resident --name torch_resident 2>&1 | tail -1)"
echo "torch dataloader: $($T --loader lab --workers 8 --pinned --name torch_dataloader 2>&1 | tail -1)"
