#!/usr/bin/env bash
# On the lent GPU: the dataloader stage. GPU tests, the task 2.1 loader grid,
# trainc's dataloader stage (transform on cpu and gpu) against its own step fed
# from GPU-resident data, and PyTorch's dataloader stage, one epoch each.
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh || exit 1
ctest --test-dir build -R "gpu|cuda" --output-on-failure > "$OUT/ctest.log" 2>&1; tail -4 "$OUT/ctest.log"
grep -E "samples/s|GB/s" "$OUT/ctest.log" | head -8
build/trainc bench-loader --config configs/dataloader.ini --set data.flip=on --set data.crop_pad=4 --quiet \
  > "$OUT/bench_loader.txt" 2>&1; cat "$OUT/bench_loader.txt"
one() { build/trainc --config configs/dataloader.ini --set run.epochs=1 "$@" 2>&1 | tail -1; }
echo "trainc resident: $(one --set data.resident=on --set run.eval=off)"
echo "trainc dataloader cpu: $(one --set data.transform_on=cpu)"
echo "trainc dataloader gpu: $(one --set data.transform_on=gpu)"
echo "trainc resident: $(one --set data.resident=on --set run.eval=off)"
T="python3 tools/torch_reference.py --image-size 224 --batch 256 --epochs 1 --tf32 --no-sync"
echo "torch resident: $($T --loader lab --resident --name torch_resident 2>&1 | tail -1)"
echo "torch dataloader: $($T --loader lab --workers 8 --pinned --name torch_dataloader 2>&1 | tail -1)"
