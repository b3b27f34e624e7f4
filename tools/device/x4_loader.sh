#!/usr/bin/env bash
# One call on a 4-GPU host: weak scaling with the real loader (CIFAR-10 JPEGs
# decoded, transformed on the GPU) on 1, 2 and 4 GPUs, SimpleNet-224
# (configs/ddp.ini) and ResNet-18 (configs/resnet18.ini), trainc against
# PyTorch DDP; then configs/ddp.ini on 1 GPU and on 2 GPUs at the same global
# batch, test accuracy.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$SECONDS
PARTS="simplenet-loader resnet18-loader acc" GPUS=1,2,4 LOADER_EPOCHS=3 LOADER_WARM=5 RUN_LIMIT=120 \
  ACC_EPOCHS=3 ACC_LIMIT=150 LOGS=/tmp/issue7_logs timeout 580 bash tools/device/issue7_bench.sh 2>&1 | tail -45
echo "end at $((SECONDS - T0)) s"
