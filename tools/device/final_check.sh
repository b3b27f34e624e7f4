#!/usr/bin/env bash
# On the lent GPU: every GPU test; monitoring, breakdown and find-batch on the
# GPU; the memory stage with a smaller workspace; the card's matrix rate; the
# host CPU time per step with and without CUDA graphs (32x32, batch 512).
set -uo pipefail
OUT=${OUT:-out}
bash tools/device/prepare.sh > /dev/null || exit 1
ctest --test-dir build -E train_cpu --output-on-failure > "$OUT/ctest.log" 2>&1
grep -E "CHECK failed|error:|tests passed|Failed" "$OUT/ctest.log" | head -20
for c in baseline dataloader final; do
  build/trainc --config configs/$c.ini --set run.max_steps=120 --set run.eval=off --set run.log_every=40 \
    --set run.metrics_file=$OUT/metrics_$c.jsonl 2>&1 | grep -E "phases" | tail -1
done
python3 tools/plot_run.py $OUT/metrics_dataloader.jsonl -o $OUT/run_plot.svg && grep -c gpu_sample $OUT/metrics_dataloader.jsonl
build/trainc --config configs/dataloader.ini --quiet --set run.max_steps=400 --set run.eval=off --set monitor.prometheus_port=9400 > /dev/null 2>&1 & pp=$!
sleep 8; python3 -c "import urllib.request;print(''.join(l for l in urllib.request.urlopen('http://127.0.0.1:9400/metrics',timeout=3).read().decode().splitlines(True) if l.startswith('trainc_')))"; kill -TERM $pp; wait $pp
build/trainc find-batch --config configs/final.ini --set train.batch=64 --max-batch 2048 2>&1 | tail -12
build/trainc --config configs/baseline.ini --quiet --set train.batch=1000000 --set run.eval=off 2>&1 | tail -2; echo "exit ${PIPESTATUS[0]}"
echo "memory ws2048: $(build/trainc --config configs/memory.ini --quiet --set data.resident=on --set run.eval=off --set run.max_steps=40 --set run.warmup_steps=10 --set perf.conv_workspace_mb=2048 2>&1 | tail -1 | grep -oE '"(samples_per_s|peak_mem_bytes)": [0-9.e+]*' | tr '\n' ' ')"
python3 -c "
import torch,time
a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16); b=torch.randn_like(a)
for _ in range(3): a@b
torch.cuda.synchronize(); t=time.perf_counter()
for _ in range(20): a@b
torch.cuda.synchronize(); print('bf16 matmul TFLOP/s', 20*2*8192**3/(time.perf_counter()-t)/1e12)"
S="--quiet --set data.resident=on --set run.eval=off --set train.batch=512 --set data.image_size=32 --set run.epochs=100"
for g in off on; do
  for n in 1000 2000; do
    TIMEFORMAT="graph=$g steps=$n user=%U sys=%S wall=%R"
    { time build/trainc --config configs/final.ini $S --set perf.cuda_graph=$g --set run.max_steps=$n > /dev/null 2>&1; } 2>> "$OUT/cpu.txt"
  done
done
grep graph= "$OUT/cpu.txt"
