#!/usr/bin/env bash
# shellcheck disable=SC2086  # the command variables are split into words on purpose
# On the lent GPU (one card): issue 6, ResNet, trainc against PyTorch.
#   step:    ResNet-18 at 32x32, batch 512, AMP fp16, the training step alone: trainc
#            (one batch kept on the GPU) vs PyTorch eager (NCHW and channels-last)
#   compile: the same step under torch.compile (modes $COMPILE_MODES, channels-last)
#   r50:  ResNet-50 at 224 (ImageNet stem), synthetic data, the step alone, trainc vs PyTorch
#   acc:  the 30-epoch recipe on CIFAR-10 (configs/resnet18.ini; tools/torch_resnet.py
#         --mode train with the same settings), seeds $SEEDS, trainc then PyTorch
# Usage (from the repository root; the build goes to build/, the data to .data/cifar10-jpg):
#   [OUT=/tmp/out] [PARTS="step compile r50 acc"] [EPOCHS=30] [SEEDS="0 1"] \
#   bash tools/device/resnet_bench.sh
# Each run's summary line (tagged) goes to $OUT/issue6.jsonl, its whole log to
# $LOGS/<tag>.log, packed after each part into $OUT/issue6_logs.tar.gz (few files under
# $OUT: the lent machine returns at most 8); a compact line per run and a table at the end
# go to stdout. Where one call has a time limit, run the parts in separate calls: step takes
# a few minutes, compile as long as max-autotune compiles (minutes; COMPILE_TIMEOUT bounds
# it and the run then reports null samples/s with the time it gave up at), r50 a few
# minutes, acc 2 x SEEDS x (EPOCHS x epoch time + a minute of start-up).
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PARTS=${PARTS:-"step compile r50 acc"}
STEPS=${STEPS:-300}               # timed steps of the step benchmarks
WARM=${WARM:-50}                  # untimed steps before them
R18_BATCH=${R18_BATCH:-512}
R50_BATCH=${R50_BATCH:-256}
R50_STEPS=${R50_STEPS:-100}
R50_WARM=${R50_WARM:-20}
COMPILE_MODES=${COMPILE_MODES:-"max-autotune"}   # torch.compile modes to time ("default max-autotune" for both)
COMPILE_TIMEOUT=${COMPILE_TIMEOUT:-1500}         # seconds torch_resnet.py gives the compile + warm-up
EPOCHS=${EPOCHS:-30}
SEEDS=${SEEDS:-"0 1"}
STEP_LIMIT=${STEP_LIMIT:-600}                    # timeout of an uncompiled step run, seconds
ACC_LIMIT=${ACC_LIMIT:-$((EPOCHS * 60 + 600))}   # timeout of one accuracy run, seconds
DATA=${DATA:-.data/cifar10-jpg}
LOGS=${LOGS:-/tmp/issue6_logs}
mkdir -p "$LOGS"
JSONL="$OUT/issue6.jsonl"

# ---------------------------------------------------------------------------
# The trainc commands: adjust them here (or set the variables) if keys change.
# run.max_steps counts the warm-up steps too; run.warmup_steps are left out of samples_per_s.
TRAINC_R18_STEP=${TRAINC_R18_STEP:-"build/trainc --config configs/resnet18.ini --quiet --set data.resident=on \
--set run.eval=off --set train.batch=$R18_BATCH --set run.max_steps=$((WARM + STEPS)) --set run.warmup_steps=$WARM"}
TRAINC_R50_STEP=${TRAINC_R50_STEP:-"build/trainc --config configs/resnet18.ini --quiet --set model.name=resnet50 \
--set data.image_size=224 --set data.source=synthetic --set data.resident=on --set run.eval=off \
--set train.batch=$R50_BATCH --set run.max_steps=$((R50_WARM + R50_STEPS)) --set run.warmup_steps=$R50_WARM"}
TRAINC_R18_TRAIN=${TRAINC_R18_TRAIN:-"build/trainc --config configs/resnet18.ini --quiet --set run.epochs=$EPOCHS \
--set data.path=$DATA"}   # + --set run.seed=SEED
# The PyTorch recipe, the same as configs/resnet18.ini says (decay_bn_bias = off there).
TORCH_R18_TRAIN=${TORCH_R18_TRAIN:-"python3 tools/torch_resnet.py --mode train --data $DATA --model resnet18 \
--image-size 32 --epochs $EPOCHS --batch $R18_BATCH --lr 0.2 --momentum 0.9 --nesterov --weight-decay 5e-4 \
--no-decay-bn-bias --schedule cosine --warmup-epochs 2 --label-smoothing 0 --flip --crop-pad 4 --amp fp16 \
--channels-last"}   # + --seed SEED
# The PyTorch step benchmarks (tools/torch_resnet.py --mode step: one random batch on the GPU).
T18="python3 tools/torch_resnet.py --mode step --model resnet18 --image-size 32 --batch $R18_BATCH --amp fp16 \
--warmup-steps $WARM --steps $STEPS"
T50="python3 tools/torch_resnet.py --mode step --model resnet50 --image-size 224 --batch $R50_BATCH --amp fp16 \
--warmup-steps $R50_WARM --steps $R50_STEPS"
# ---------------------------------------------------------------------------

OUT=$LOGS timeout 1800 bash tools/device/prepare.sh > "$LOGS/prepare.log" 2>&1 || { tail -30 "$LOGS/prepare.log"; exit 1; }
echo "card: $(timeout 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
echo "torch: $(timeout 120 python3 -c 'import torch; print(torch.__version__, "cuDNN", torch.backends.cudnn.version())' 2>&1 | tail -1)"

pack() { timeout 120 tar czf "$OUT/issue6_logs.tar.gz" -C "$LOGS" . 2> /dev/null; }
# run TAG LIMIT CMD...: runs CMD under `timeout LIMIT`, output to $LOGS/TAG.log; prints one line
# and appends the run's summary (with tag, rc, wall_s) to $JSONL.
run() {
  local tag=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "$ $*" > "$LOGS/$tag.log"
  timeout -k 30 "$limit" "$@" >> "$LOGS/$tag.log" 2>&1
  local rc=$?
  timeout 60 python3 - "$tag" "$rc" "$((SECONDS - t0))" "$LOGS/$tag.log" "$JSONL" <<'PY'
import json, sys
tag, rc, secs, log, jsonl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
s = None
for line in reversed(open(log, errors="replace").read().splitlines()):
    line = line.strip()
    if line.startswith("{"):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and "samples_per_s" in d:
            s = d
            break
why = {124: "timed out", 137: "killed (timeout)"}.get(rc, f"exit {rc}")
if s is None:
    tail = [l for l in open(log, errors="replace").read().splitlines() if l.strip()][-2:]
    print(f"{tag}: FAILED ({why}, {secs} s): {' | '.join(tail)[:300]}", flush=True)
    s = {}
rec = {"tag": tag, "rc": rc, "wall_s": secs, **s}
with open(jsonl, "a") as f:
    f.write(json.dumps(rec) + "\n")
if s:
    def g(k, f, scale=1):
        v = s.get(k)
        return "-" if v is None else format(v * scale, f)
    extra = f" compile {s['compile_s']:.0f} s" if s.get("compile_s") else ""
    extra += f" error: {s['error'][:160]}" if s.get("error") else ""
    extra += "" if rc == 0 else f" ({why})"
    print(f"{tag}: {g('samples_per_s', ',.0f')} samples/s, step {g('step_ms', '.2f')} ms, "
          f"epoch {g('epoch_s', '.2f')} s, acc {g('test_acc', '.2f', 100)}%, peak "
          f"{g('peak_mem_bytes', '.2f', 2**-30)} GiB, {secs} s{extra}", flush=True)
PY
}

for part in $PARTS; do
  case $part in
  step)
    run r18_step_trainc "$STEP_LIMIT" $TRAINC_R18_STEP
    run r18_step_torch_eager_nchw "$STEP_LIMIT" $T18 --name torch_r18_eager_nchw
    run r18_step_torch_eager_cl "$STEP_LIMIT" $T18 --channels-last --name torch_r18_eager_cl
    ;;
  compile)
    for mode in $COMPILE_MODES; do
      run "r18_step_torch_compile_${mode}_cl" $((COMPILE_TIMEOUT + 300)) $T18 --channels-last --compile "$mode" \
        --compile-timeout "$COMPILE_TIMEOUT" --name "torch_r18_compile_${mode}_cl"
    done
    ;;
  r50)
    run r50_step_trainc "$STEP_LIMIT" $TRAINC_R50_STEP
    run r50_step_torch_eager_cl "$STEP_LIMIT" $T50 --channels-last --name torch_r50_eager_cl
    run r50_step_torch_eager_nchw "$STEP_LIMIT" $T50 --name torch_r50_eager_nchw
    ;;
  acc)
    [ -d "$DATA/train" ] || { echo "acc: no data at $DATA"; continue; }
    for seed in $SEEDS; do
      run "r18_acc_trainc_s$seed" "$ACC_LIMIT" $TRAINC_R18_TRAIN --set run.seed="$seed"
      run "r18_acc_torch_s$seed" "$ACC_LIMIT" $TORCH_R18_TRAIN --seed "$seed" --name "torch_r18_s$seed"
    done
    ;;
  *) echo "unknown part $part (step, compile, r50, acc)" ;;
  esac
  pack
done

echo
echo "summary ($JSONL):"
timeout 60 python3 - "$JSONL" <<'PY'
import collections, json, statistics, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    sys.exit("no runs recorded")
last = collections.OrderedDict((r["tag"], r) for r in rows)  # the newest record of each tag
print(f"{'run':<40} {'samples/s':>10} {'step ms':>8} {'acc %':>7} {'peak GiB':>9}")
for tag, r in last.items():
    sps, ms, acc, peak = (r.get(k) for k in ("samples_per_s", "step_ms", "test_acc", "peak_mem_bytes"))
    print(f"{tag:<40} {'-' if sps is None else f'{sps:,.0f}':>10} {'-' if ms is None else f'{ms:.2f}':>8} "
          f"{'-' if acc is None else f'{100 * acc:.2f}':>7} {'-' if peak is None else f'{peak / 2**30:.2f}':>9}")
for who in ("trainc", "torch"):
    accs = [r["test_acc"] for t, r in last.items() if t.startswith(f"r18_acc_{who}_") and r.get("test_acc") is not None]
    if accs:
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        print(f"ResNet-18 accuracy {who}: mean {100 * statistics.mean(accs):.2f}% (sd {100 * sd:.2f}, "
              f"{len(accs)} seeds: {', '.join(f'{100 * a:.2f}' for a in accs)})")
PY
