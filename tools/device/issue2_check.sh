#!/usr/bin/env bash
# On the lent GPU: build, GPU tests, a GPU smoke run, and SimpleNet-32 accuracy
# (trainc and the PyTorch reference, 2 seeds each). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh || exit 1
ctest --test-dir build -E test_train_cpu --output-on-failure > "$OUT/ctest.log" 2>&1
grep -E "tests passed|Failed|Passed|Skipped|\*\*\*" "$OUT/ctest.log" | tail -20
build/trainc --config configs/baseline.ini --set run.max_steps=300 --set run.log_every=100 --set run.eval=off \
  > "$OUT/smoke.log" 2>&1; tail -5 "$OUT/smoke.log"
for seed in 0 1; do
  build/trainc --config configs/simplenet32.ini --set run.seed=$seed --set run.log_every=1000 \
    > "$OUT/trainc32_s$seed.log" 2>&1; echo "trainc32 seed $seed: $(tail -1 $OUT/trainc32_s$seed.log)"
  python3 tools/torch_reference.py --image-size 32 --batch 128 --epochs 15 --lr 0.05 --weight-decay 5e-4 \
    --flip --crop-pad 4 --loader gpu --no-sync --seed $seed --name torch32 > "$OUT/torch32_s$seed.log" 2>&1
  echo "torch32 seed $seed: $(tail -1 $OUT/torch32_s$seed.log)"
done
