#!/usr/bin/env bash
# On a lent 2-GPU machine: the data-parallel step's overhead by bucket size,
# NCCL channel count, graph node priority and with no graph (trainc, a batch
# kept on each GPU), SimpleNet-224 and ResNet-18-32, then PyTorch DDP at its
# defaults in the same call.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=/tmp/prep timeout 300 bash tools/device/prepare.sh > /tmp/prepare.log 2>&1 || { tail -30 /tmp/prepare.log; exit 1; }
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0"
R="--quiet --set data.resident=on --set run.eval=off --set run.epochs=100 --set run.max_steps=220 --set run.warmup_steps=20"
one() { local tag=$1 np=$2 env=$3; shift 3
  printf '%-44s %s\n' "$tag" "$(timeout 60 $MPI -np "$np" $env build/trainc "$@" $R 2>/dev/null | tail -1 | \
    python3 -c "import json,sys; s=json.loads(sys.stdin.read()); print(f\"{s['samples_per_s']:9.0f} samples/s step {s['step_ms']:.3f} ms\")" 2>/dev/null || echo failed)"; }
C="--config configs/ddp.ini"
one "simplenet 1 GPU" 1 "" $C
for mb in 4 25 256; do one "simplenet 2 GPUs bucket $mb" 2 "" $C --set dist.bucket_mb=$mb; done
for mb in 25 256; do one "simplenet 2 GPUs bucket $mb, 4 NCCL channels" 2 "-x NCCL_MAX_NCHANNELS=4" $C --set dist.bucket_mb=$mb; done
one "simplenet 2 GPUs bucket 256, 2 NCCL channels" 2 "-x NCCL_MAX_NCHANNELS=2" $C --set dist.bucket_mb=256
one "simplenet 2 GPUs bucket 25, graph node priority" 2 "" $C --set perf.graph_node_priority=on
one "simplenet 1 GPU, no graph" 1 "" $C --set perf.cuda_graph=off
one "simplenet 2 GPUs bucket 25, no graph" 2 "" $C --set perf.cuda_graph=off
C="--config configs/resnet18.ini --set dist.allreduce_dtype=auto"
one "resnet18 1 GPU" 1 "" $C
for mb in 4 25; do one "resnet18 2 GPUs bucket $mb" 2 "" $C --set dist.bucket_mb=$mb; done
one "resnet18 2 GPUs bucket 25, 4 NCCL channels" 2 "-x NCCL_MAX_NCHANNELS=4" $C --set dist.bucket_mb=25
one "resnet18 2 GPUs bucket 25, graph node priority" 2 "" $C --set dist.bucket_mb=25 --set perf.graph_node_priority=on
T="tools/torch_ddp.py --data-on-gpu --warmup-steps 20 --steps 200 --amp fp16 --channels-last"
for np in 1 2; do
  echo "torch simplenet $np: $(timeout 60 $MPI -np $np python3 $T --model simplenet --image-size 224 --batch 256 --tf32 2>/dev/null | grep -o '"samples_per_s": [0-9.]*' | tail -1)"
  echo "torch resnet18 $np: $(timeout 60 $MPI -np $np python3 $T --model resnet18 --image-size 32 --batch 512 --lr 0.2 --weight-decay 5e-4 --nesterov 2>/dev/null | grep -o '"samples_per_s": [0-9.]*' | tail -1)"
done
echo done
