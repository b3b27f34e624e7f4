#!/usr/bin/env bash
# On the lent GPU (one card): the ResNet GPU test with its fused-kernel
# diagnostics; SIGTERM in the middle of a deterministic final.ini run resumed
# with --resume latest against the uninterrupted run; an ncu capture of the
# final stage filtered by NVTX ranges; the final stage's phase breakdown.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=/tmp/prep timeout 300 bash tools/device/prepare.sh > "$OUT/prepare.log" 2>&1 || { tail -30 "$OUT/prepare.log"; exit 1; }
echo "== test_resnet"
timeout 150 build/test_resnet > "$OUT/test_resnet.log" 2>&1
grep -E "resnet18|residual|CHECK|checks" "$OUT/test_resnet.log" | head -30
echo "== SIGTERM and resume, final.ini, deterministic"
crc() { tail -1 | grep -o '"params_crc": [0-9]*'; }
S="--config configs/final.ini --quiet --set run.eval=off --set run.epochs=1 --set run.max_steps=150 --set perf.deterministic=on --set perf.conv_benchmark=off"
a=$(timeout 120 build/trainc $S 2>&1 | crc)
# (not under timeout: it would pass the signal on a second time)
rm -rf ckf; build/trainc ${S/--quiet/} --set run.checkpoint_dir=ckf > "$OUT/sig.out" 2> "$OUT/sig.err" & pid=$!
for i in $(seq 1 300); do sleep 0.1; grep -q "step 50/" "$OUT/sig.err" 2>/dev/null && break; done
kill -TERM $pid; wait $pid; echo "SIGTERM exit $?: $(grep -o 'stopped by.*' "$OUT/sig.err" | cut -c1-200)"
b=$(timeout 120 build/trainc $S --set run.checkpoint_dir=ckf --resume latest 2>&1 | crc)
echo "uninterrupted $a; stopped and resumed $b"
echo "== ResNet-18 step, batch 512, AMP: trainc, PyTorch eager, torch.compile max-autotune (same card)"
T18="python3 tools/torch_resnet.py --mode step --model resnet18 --image-size 32 --batch 512 --amp fp16 --warmup-steps 50 --steps 300 --channels-last"
one() { tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(f'{d.get(\"samples_per_s\") or 0:,.0f} samples/s', d.get('error', ''), d.get('compile_s', ''))" 2>/dev/null || echo failed; }
echo "trainc: $(timeout 60 build/trainc --config configs/resnet18.ini --quiet --set data.resident=on --set run.eval=off --set run.max_steps=350 --set run.warmup_steps=50 2>/dev/null | one)"
echo "torch eager: $(timeout 60 $T18 2>/dev/null | one)"
echo "torch compile max-autotune: $(timeout 330 $T18 --compile max-autotune --compile-timeout 300 2>"$OUT/compile.err" | one)"
echo "trainc again: $(timeout 60 build/trainc --config configs/resnet18.ini --quiet --set data.resident=on --set run.eval=off --set run.max_steps=350 --set run.warmup_steps=50 2>/dev/null | one)"
echo "== phases of the final stage (1 epoch)"
timeout 120 build/trainc --config configs/final.ini --set run.epochs=1 --set run.eval=off 2>&1 | grep -E "phases|samples/s" | tail -2 | cut -c1-600
echo "== ncu with NVTX ranges (graphs off: kernels launched one by one)"
timeout 150 ncu --nvtx --nvtx-include "forward/" --nvtx-include "backward/" --nvtx-include "optimizer/" \
  --launch-skip 200 --launch-count 6 --section LaunchStats --print-nvtx-rename none \
  build/trainc --config configs/final.ini --quiet --set perf.cuda_graph=off --set run.max_steps=12 --set run.eval=off \
  --set run.warmup_steps=0 > "$OUT/ncu.log" 2>&1
grep -E "NVTX|forward|backward|optimizer|==PROF==|Kernel|kernel|void " "$OUT/ncu.log" | head -40
