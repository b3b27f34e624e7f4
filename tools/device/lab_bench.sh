#!/usr/bin/env bash
# On the lent GPU: the lab's table (trainc's five stages, one epoch each, and
# the PyTorch reference's stages in the same call), then the step alone at
# 32x32 (launch-bound: graphs must show) against PyTorch eager.
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh > /dev/null || exit 1
T="python3 tools/torch_reference.py --image-size 224 --epochs 1"
{
  $T --batch 32 --loader lab --name baseline 2>&1 | tail -1
  $T --batch 256 --tf32 --no-sync --loader lab --workers 8 --pinned --name dataloader 2>&1 | tail -1
  $T --batch 256 --tf32 --no-sync --loader lab --workers 8 --pinned --channels-last --name channels_last 2>&1 | tail -1
  $T --batch 256 --tf32 --no-sync --loader lab --workers 8 --pinned --channels-last --amp fp16 --name amp_channels_last 2>&1 | tail -1
} > "$OUT/torch_stages.jsonl"
cat "$OUT/torch_stages.jsonl" | cut -c1-200
python3 tools/lab_table.py --configs configs/baseline.ini,configs/dataloader.ini,configs/model.ini,configs/memory.ini,configs/final.ini \
  --set run.epochs=1 --set run.eval=off --torch-json "$OUT/torch_stages.jsonl" --csv "$OUT/lab_table.csv" --svg "$OUT/lab_table.svg"
S="--quiet --set data.resident=on --set run.eval=off --set run.max_steps=300 --set run.warmup_steps=50 --set train.batch=512 --set data.image_size=32"
for g in off on; do
  echo "trainc step 32x32 b512 fp16 fused graph=$g: $(build/trainc --config configs/final.ini $S --set perf.cuda_graph=$g 2>&1 | tail -1 | cut -c1-260)"
done
echo "torch step 32x32 b512 amp eager: $(python3 tools/torch_reference.py --image-size 32 --batch 512 --epochs 1 --max-steps 300 --warmup-steps 50 --amp fp16 --tf32 --no-sync --loader gpu --resident 2>&1 | tail -1 | cut -c1-200)"
echo "torch step 224 b256 amp eager: $(python3 tools/torch_reference.py --image-size 224 --batch 256 --epochs 1 --max-steps 60 --amp fp16 --tf32 --no-sync --loader lab --resident 2>&1 | tail -1 | cut -c1-200)"
echo "trainc step 224 b256 final: $(build/trainc --config configs/final.ini --quiet --set data.resident=on --set run.eval=off --set run.max_steps=60 2>&1 | tail -1 | cut -c1-200)"
