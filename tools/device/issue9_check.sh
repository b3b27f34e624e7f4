#!/usr/bin/env bash
# On the lent GPU: every GPU test, then resume and NaN checks on the GPU, a
# SIGTERM in the middle of a final.ini run resumed with --resume latest, and
# the final stage's speed after the always-on finite check.
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh > /dev/null || exit 1
ctest --test-dir build -E train_cpu --output-on-failure > "$OUT/ctest.log" 2>&1
grep -E "CHECK failed|error:|tests passed|Failed" "$OUT/ctest.log" | head -20
crc() { tail -1 | grep -o '"params_crc": [0-9]*'; }
S="--quiet --set run.eval=off --set data.image_size=32 --set train.batch=128 --set perf.deterministic=on --set perf.conv_benchmark=off"
for extra in "" "--set precision.amp=fp16 --set perf.cuda_graph=on --set model.fuse=on"; do
  rm -rf ck; a=$(build/trainc --config configs/dataloader.ini $S $extra --set run.max_steps=300 2>&1 | crc)
  build/trainc --config configs/dataloader.ini $S $extra --set run.max_steps=150 --set run.checkpoint_every=150 --set run.checkpoint_dir=ck > /dev/null 2>&1
  b=$(build/trainc --config configs/dataloader.ini $S $extra --set run.max_steps=300 --set run.checkpoint_dir=ck --resume latest 2>&1 | crc)
  echo "resume [$extra]: straight $a resumed $b"
done
for amp in off fp16; do
  a=$(build/trainc --config configs/dataloader.ini $S --set precision.amp=$amp --set run.max_steps=3 2>&1 | tail -1 | grep -o '"params_crc": [0-9]*')
  b=$(build/trainc --config configs/dataloader.ini $S --set precision.amp=$amp --set run.max_steps=4 --set run.inject_nan_step=4 2>&1 | tail -1 | grep -oE '"(params_crc|skipped_steps|loss_scale)": [0-9.e+]*' | tr '\n' ' ')
  echo "nan amp=$amp: 3 steps $a; 4 steps with NaN at 4: $b"
done
rm -rf ckf; build/trainc --config configs/final.ini --quiet --set run.epochs=2 --set run.eval=off --set run.checkpoint_dir=ckf > "$OUT/sig.out" 2> "$OUT/sig.err" & pid=$!
sleep 9; kill -TERM $pid; wait $pid; echo "SIGTERM exit $?: $(grep -o 'stopped by.*' $OUT/sig.err | cut -c1-160)"
echo "resumed: $(build/trainc --config configs/final.ini --quiet --set run.epochs=2 --set run.eval=off --set run.checkpoint_dir=ckf --resume latest 2>&1 | tail -1 | cut -c1-200)"
echo "final 1 epoch: $(build/trainc --config configs/final.ini --quiet --set run.epochs=1 --set run.eval=off 2>&1 | tail -1 | cut -c1-200)"
