#!/usr/bin/env bash
# On the lent GPU: the dataloader stage with larger convolution workspaces.
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh > /dev/null || exit 1
ctest --test-dir build -R "gpu|cuda" > "$OUT/ctest.log" 2>&1; tail -3 "$OUT/ctest.log"
one() { build/trainc --config configs/dataloader.ini --set run.epochs=1 "$@" 2>&1 | tail -1; }
for ws in 1024 4096 16384; do
  echo "trainc resident ws=$ws: $(one --set data.resident=on --set run.eval=off --set perf.conv_workspace_mb=$ws)"
done
echo "trainc resident det ws=4096: $(one --set data.resident=on --set run.eval=off --set perf.deterministic=on)"
echo "trainc dataloader gpu: $(one --set data.transform_on=gpu)"
echo "trainc dataloader cpu: $(one --set data.transform_on=cpu)"
echo "trainc resident: $(one --set data.resident=on --set run.eval=off)"
