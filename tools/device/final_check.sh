#!/usr/bin/env bash
# On the lent GPU (one card): the GPU tests of gradient clipping and ResNet,
# and trainc find-batch on ResNet-18 (then an impossible batch: the
# out-of-memory message, a non-zero exit).
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=/tmp/prep timeout 300 bash tools/device/prepare.sh > "$OUT/prepare.log" 2>&1 || { tail -30 "$OUT/prepare.log"; exit 1; }
(cd build && timeout 150 ctest -j3 -R "clip|resnet" --output-on-failure > "$OUT/ctest.log" 2>&1)
grep -E "Test +#|CHECK failed|tests passed|step [0-9], batch|loss [0-9]" "$OUT/ctest.log" | head -30
echo "== find-batch, ResNet-18"
timeout 150 build/trainc find-batch --config configs/resnet18.ini --max-batch 16384 --set run.eval=off 2>&1 | tail -14
echo "== batch 1,000,000 at 224 (ResNet-18, ImageNet stem)"
timeout 60 build/trainc --config configs/resnet18.ini --quiet --set data.image_size=224 --set train.batch=1000000 \
  --set data.source=synthetic --set run.eval=off 2>&1 | tail -2 | cut -c1-400; echo "exit ${PIPESTATUS[0]}"
