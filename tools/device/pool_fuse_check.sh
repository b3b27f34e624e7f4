#!/usr/bin/env bash
# On the lent GPU: GPU tests after the fused pool+ReLU backward, the step alone
# per precision with fusion, and the final stage against PyTorch's eager step.
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh > /dev/null || exit 1
ctest --test-dir build -R "bias_relu|memory|gpu|cuda|amp" --output-on-failure 2>&1 | grep -E "CHECK failed|tests passed|Failed" | head
step() { build/trainc --config configs/dataloader.ini --quiet --set data.resident=on --set run.eval=off \
  --set run.max_steps=40 --set run.warmup_steps=10 "$@" 2>&1 | tail -1 | python3 -c \
  "import json,sys; s=json.loads(sys.stdin.read()); print(f\"{s['samples_per_s']:8.0f} samples/s {s['peak_mem_bytes']/2**30:6.2f} GiB\")" ; }
echo "step fp32 fused: $(step --set model.fuse=on)"
echo "step fp16 fused: $(step --set model.fuse=on --set precision.amp=fp16)"
echo "final step: $(build/trainc --config configs/final.ini --quiet --set data.resident=on --set run.eval=off --set run.max_steps=60 2>&1 | tail -1 | cut -c1-200)"
echo "final 1 epoch: $(build/trainc --config configs/final.ini --quiet --set run.epochs=1 2>&1 | tail -1 | cut -c1-300)"
echo "torch step 224 b256 amp eager: $(python3 tools/torch_reference.py --image-size 224 --batch 256 --epochs 1 --max-steps 60 --amp fp16 --tf32 --no-sync --loader lab --resident 2>&1 | tail -1 | cut -c1-200)"
