#!/usr/bin/env bash
# On a lent 2-GPU machine, issue 7's figures in two calls on the same warm
# machine (the second reuses the first's build):
#   PHASE=resident: ResNet-18's bucket size picked among R18_BUCKETS (the
#     fastest 2-GPU step, a batch kept on each GPU), then weak scaling with a
#     batch kept on each GPU, SimpleNet-224 and ResNet-18-32, trainc against
#     PyTorch DDP (tools/device/ddp_bench.sh)
#   PHASE=loader: the same with the real loader (3 epochs), then configs/ddp.ini
#     trained on 1 and 2 GPUs at the same global batch (3 epochs), test accuracy
source tools/device/mpi_session.sh
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0"
R="--quiet --set data.resident=on --set run.eval=off --set run.epochs=100 --set run.warmup_steps=20 --set run.max_steps=220"
N="--config configs/resnet18.ini --set dist.allreduce_dtype=auto"
step_ms() { timeout 90 $MPI -np 2 build/trainc $N "$@" $R 2>/dev/null | tail -1 | \
  python3 -c "import json,sys; print(json.loads(sys.stdin.read())['step_ms'])" 2>/dev/null || echo 999; }
if [ "${PHASE:-resident}" = resident ]; then
  best=; best_ms=999
  for mb in ${R18_BUCKETS-16 21 25}; do  # R18_BUCKETS="": no search, resnet18.ini's own
    ms=$(step_ms --set dist.bucket_mb="$mb")
    echo "resnet18 2 GPUs, bucket $mb MiB: step $ms ms"
    if python3 -c "import sys; sys.exit(0 if float('$ms') < float('$best_ms') else 1)"; then best=$mb; best_ms=$ms; fi
  done
  rm -f /tmp/r18_bucket
  [ -n "$best" ] && echo "resnet18: bucket $best MiB" && echo "$best" > /tmp/r18_bucket
  PARTS="simplenet-resident resnet18-resident"
else
  PARTS="simplenet-loader resnet18-loader acc"
fi
R18_SETS="$([ -f /tmp/r18_bucket ] && echo "--set dist.bucket_mb=$(cat /tmp/r18_bucket)")" PARTS=$PARTS \
  STEPS=200 WARM=30 LOADER_EPOCHS=3 RUN_LIMIT=150 ACC_EPOCHS=3 ACC_LIMIT=200 GPUS=1,2 \
  bash tools/device/ddp_bench.sh
rm -f "$OUT"/scaling_*.svg  # at most 8 files come back; the tables are in the log
