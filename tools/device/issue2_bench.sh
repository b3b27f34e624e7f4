#!/usr/bin/env bash
# On the lent GPU: the lab's baseline stage, trainc and PyTorch, 3 epochs on
# the real CIFAR-10 at 224x224; then SimpleNet-32 accuracy, 2 seeds each.
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh || exit 1
ctest --test-dir build -R "gpu|cuda" --output-on-failure > "$OUT/ctest.log" 2>&1; tail -3 "$OUT/ctest.log"
build/trainc --config configs/baseline.ini > "$OUT/trainc_baseline.log" 2>&1
echo "trainc baseline: $(tail -1 $OUT/trainc_baseline.log)"
python3 tools/torch_reference.py --image-size 224 --batch 32 --epochs 3 --loader lab --name torch_baseline \
  > "$OUT/torch_baseline.log" 2>&1
echo "torch baseline: $(tail -1 $OUT/torch_baseline.log)"
for seed in 0 1; do
  build/trainc --config configs/simplenet32.ini --set run.seed=$seed --set run.log_every=1000 \
    > "$OUT/trainc32_s$seed.log" 2>&1; echo "trainc32 seed $seed: $(tail -1 $OUT/trainc32_s$seed.log)"
  python3 tools/torch_reference.py --image-size 32 --batch 128 --epochs 15 --lr 0.05 --weight-decay 5e-4 \
    --flip --crop-pad 4 --loader gpu --no-sync --seed $seed --name torch32 > "$OUT/torch32_s$seed.log" 2>&1
  echo "torch32 seed $seed: $(tail -1 $OUT/torch32_s$seed.log)"
done
