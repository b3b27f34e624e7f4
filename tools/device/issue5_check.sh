#!/usr/bin/env bash
# On the lent GPU: GPU tests, then the step alone (batch kept on the GPU, 224,
# batch 256) per precision / layout / fusion, and short stage runs.
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh > /dev/null || exit 1
ctest --test-dir build -R "gpu|cuda|amp|memory|nhwc|bias_relu" --output-on-failure > "$OUT/ctest.log" 2>&1
grep -E "CHECK failed|error:|tests passed|Failed" "$OUT/ctest.log" | head -30
step() { build/trainc --config configs/dataloader.ini --quiet --set data.resident=on --set run.eval=off \
  --set run.max_steps=40 --set run.warmup_steps=10 "$@" 2>&1 | tail -1 | python3 -c \
  "import json,sys; s=json.loads(sys.stdin.read()); print(f\"{s['samples_per_s']:8.0f} samples/s {s['peak_mem_bytes']/2**30:6.2f} GiB\")" ; }
for amp in off fp16; do for layout in nchw nhwc; do
  echo "step amp=$amp $layout fused: $(step --set precision.amp=$amp --set model.layout=$layout --set model.fuse=on)"
done; done
echo "step fp16 nchw fused bench graph: $(step --set precision.amp=fp16 --set model.fuse=on --set perf.conv_benchmark=on --set perf.cuda_graph=on)"
echo "step fp16 nhwc fused bench graph: $(step --set precision.amp=fp16 --set model.layout=nhwc --set model.fuse=on --set perf.conv_benchmark=on --set perf.cuda_graph=on)"
for c in model memory final; do
  echo "$c: $(build/trainc --config configs/$c.ini --set run.max_steps=80 --set run.eval=off 2>&1 | tail -1)"
done
