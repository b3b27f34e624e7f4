#!/usr/bin/env bash
# One call on a 4-GPU host: build; then, one GPU each at the same time, the
# ResNet-18 recipe's accuracy runs (trainc and PyTorch, 2 seeds), the step
# benchmarks with torch.compile max-autotune, and the ResNet GPU tests; then the
# data-parallel tests and weak scaling on 1, 2 and 4 GPUs (SimpleNet-224 from
# configs/ddp.ini and ResNet-18, one batch kept on each GPU), trainc against
# PyTorch DDP. Outputs under $OUT.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T0=$SECONDS
OUT=/tmp/prep timeout 300 bash tools/device/prepare.sh > "$OUT/prepare.log" 2>&1 || { tail -30 "$OUT/prepare.log"; exit 1; }
nvidia-smi -L; echo "built at $((SECONDS - T0)) s"
L=/tmp/logs; mkdir -p $L
ACC="--set model.fuse=off --set run.epochs=30"
( CUDA_VISIBLE_DEVICES=0 timeout 220 build/trainc --config configs/resnet18.ini --quiet $ACC --set run.seed=0 > $L/acc_trainc_s0.log 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 timeout 220 build/trainc --config configs/resnet18.ini --quiet $ACC --set run.seed=1 > $L/acc_trainc_s1.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=3; T="python3 tools/torch_resnet.py --mode train --data .data/cifar10-jpg --model resnet18 \
--image-size 32 --epochs 30 --batch 512 --lr 0.2 --momentum 0.9 --nesterov --weight-decay 5e-4 --no-decay-bn-bias \
--schedule cosine --warmup-epochs 2 --label-smoothing 0 --flip --crop-pad 4 --amp fp16 --channels-last"
  timeout 120 $T --seed 0 > $L/acc_torch_s0.log 2>&1; timeout 110 $T --seed 1 > $L/acc_torch_s1.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=2; T18="python3 tools/torch_resnet.py --mode step --model resnet18 --image-size 32 --batch 512 --amp fp16 --warmup-steps 50 --steps 300 --channels-last"
  timeout 60 build/trainc --config configs/resnet18.ini --quiet --set data.resident=on --set run.eval=off \
    --set run.max_steps=350 --set run.warmup_steps=50 > $L/step_trainc.log 2>&1
  timeout 60 $T18 > $L/step_torch_eager.log 2>&1
  timeout 170 $T18 --compile max-autotune --compile-timeout 150 > $L/step_torch_compile.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=0; sleep 60; cd build && timeout 150 ctest -R "test_resnet" --output-on-failure > $L/ctest_resnet.log 2>&1 ) &
wait
echo "== phase 1 done at $((SECONDS - T0)) s"
summ() { for f in "$@"; do printf '%s: ' "$(basename "$f" .log)"; tail -1 "$f" | python3 -c "
import json,sys
try:
  d=json.loads(sys.stdin.read()); print(f\"{d.get('samples_per_s') or 0:,.0f} samples/s, acc {d.get('test_acc')}, epoch_s {d.get('epoch_s')}, step_ms {d.get('step_ms')} {d.get('error','')}\")
except Exception as e: print('no summary')"; done; }
summ $L/acc_*.log $L/step_*.log
grep -E "resnet18|residual|CHECK|layer [0-9]+|tests passed" $L/ctest_resnet.log | head -30
echo "== data-parallel tests"
(cd build && timeout 90 ctest -R "ddp|dist_gpu" --output-on-failure > $L/ctest_ddp.log 2>&1)
grep -E "weights equal|CHECK|Passed|Failed|Skipped|checks" $L/ctest_ddp.log | head -20
echo "== scaling at $((SECONDS - T0)) s"
PARTS="simplenet-resident resnet18-resident" GPUS=1,2,4 STEPS=100 WARM=20 RUN_LIMIT=60 LOGS=/tmp/issue7_logs \
  R18_CONFIG=configs/resnet18.ini timeout $((590 - (SECONDS - T0))) bash tools/device/ddp_bench.sh 2>&1 | tail -40
tar czf $OUT/x4_logs.tar.gz -C /tmp logs issue7_logs 2>/dev/null
echo "end at $((SECONDS - T0)) s"
