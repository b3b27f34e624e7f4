#!/usr/bin/env bash
# On the lent GPU: GPU tests after the AMP, checkpointing, accumulation and
# graph work, and short runs of each stage config.
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh || exit 1
ctest --test-dir build -R "gpu|cuda|amp|memory" --output-on-failure > "$OUT/ctest.log" 2>&1
grep -E "CHECK failed|error|tests passed|Failed|checks" "$OUT/ctest.log" | head -40
for c in dataloader memory final; do
  echo "$c: $(build/trainc --config configs/$c.ini --set run.max_steps=60 --set run.eval=off 2>&1 | tail -1)"
done
echo "simplenet32 fp16 graph: $(build/trainc --config configs/simplenet32.ini --set precision.amp=fp16 --set perf.cuda_graph=on --set run.epochs=1 2>&1 | tail -1)"
