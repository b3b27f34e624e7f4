#!/usr/bin/env bash
# shellcheck disable=SC2086  # the command and option variables are split into words on purpose
# On the lent GPUs (one host, 2 or 4 GPUs): issue 7, data-parallel training, trainc under
# mpirun against PyTorch DDP (tools/torch_ddp.py), weak scaling (the per-GPU batch fixed).
#   simplenet-resident, simplenet-loader: configs/ddp.ini (SimpleNet at 224)
#   resnet18-resident, resnet18-loader:   configs/resnet18.ini with ddp.ini's [dist] keys
#     each through tools/scaling.py on 1, 2 (and 4 where 4 GPUs are visible) GPUs, with one
#     batch kept on the GPU (trainc data.resident=on, torch_ddp --data-on-gpu) and with the
#     real loader on CIFAR-10 (LOADER_EPOCHS epochs, evaluation off)
#   acc: configs/ddp.ini trained on 1 GPU and on 2 GPUs at the same global batch (the
#     config's train.batch on 1 GPU, half of it per GPU on 2), test accuracy (ACC_TORCH=1:
#     the same with PyTorch DDP)
# Usage (from the repository root; the build goes to build/, the data to .data/cifar10-jpg):
#   [OUT=/tmp/out] [PARTS="simplenet-resident resnet18-resident simplenet-loader resnet18-loader acc"] \
#   [GPUS=1,2,4] [ACC_SEEDS="0"] [R18_SETS="--set dist.bucket_mb=21"] bash tools/device/ddp_bench.sh
# Under $OUT: issue7.jsonl (every run's summary), issue7_scaling.csv (every scaling row),
# scaling_<part>.svg, issue7_logs.tar.gz (each run's log, scaling.py's tables; packed after
# each part). Run the parts in separate calls where one call has a time limit.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PARTS=${PARTS:-"simplenet-resident resnet18-resident simplenet-loader resnet18-loader acc"}
TRAINC=${TRAINC:-build/trainc}
DDP_CONFIG=${DDP_CONFIG:-configs/ddp.ini}
R18_CONFIG=${R18_CONFIG:-configs/resnet18.ini}
DATA=${DATA:-.data/cifar10-jpg}
STEPS=${STEPS:-200}                 # resident runs: timed steps
WARM=${WARM:-30}                    # resident runs: untimed steps first
RESIDENT_EPOCHS=${RESIDENT_EPOCHS:-100}  # resident runs: enough epochs that run.max_steps ends them
LOADER_EPOCHS=${LOADER_EPOCHS:-3}   # loader runs: epochs (evaluation off)
LOADER_WARM=${LOADER_WARM:-10}      # loader runs: untimed steps first
RUN_LIMIT=${RUN_LIMIT:-900}         # timeout of one scaling run, seconds
ACC_SEEDS=${ACC_SEEDS:-0}
ACC_EPOCHS=${ACC_EPOCHS:-}          # empty: the config's run.epochs
ACC_GLOBAL_BATCH=${ACC_GLOBAL_BATCH:-}   # empty: the config's train.batch
ACC_TORCH=${ACC_TORCH:-0}
ACC_LIMIT=${ACC_LIMIT:-2400}        # timeout of one accuracy run, seconds
MPI_ARGS=${MPI_ARGS:-}              # more mpirun options, for scaling.py's runs and the acc runs
LOGS=${LOGS:-/tmp/issue7_logs}
mkdir -p "$LOGS"
JSONL="$OUT/issue7.jsonl"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0 \
-x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x NVSHMEM_DISABLE_NVLS=1 -x NCCL_DEBUG=VERSION $MPI_ARGS"

OUT=$LOGS timeout 1800 bash tools/device/prepare.sh > "$LOGS/prepare.log" 2>&1 || { tail -30 "$LOGS/prepare.log"; exit 1; }
NGPU=$(timeout 30 nvidia-smi -L 2> /dev/null | grep -c '^GPU')
if [ -z "${GPUS:-}" ]; then
  GPUS=1
  [ "$NGPU" -ge 2 ] && GPUS=1,2
  [ "$NGPU" -ge 4 ] && GPUS=1,2,4
fi
echo "cards: $NGPU x $(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader | head -1); runs on $GPUS GPUs"
echo "mpirun: $(timeout 30 mpirun --version 2>&1 | head -1)"
echo "torch: $(timeout 120 python3 -c 'import torch; print(torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1 | tail -1)"
[ "$NGPU" -ge 2 ] || echo "warning: fewer than 2 GPUs visible: no scaling beyond 1 GPU"

pack() {
  timeout 60 python3 - "$LOGS" "$OUT/issue7_scaling.csv" <<'PY'
import csv, glob, os, sys
rows, head = [], None
for p in sorted(glob.glob(os.path.join(sys.argv[1], "scaling_*.csv"))):
    with open(p, newline="") as f:
        r = list(csv.reader(f))
    if r:
        head = head or r[0]
        rows += r[1:]
if head:
    with open(sys.argv[2], "w", newline="") as f:
        csv.writer(f).writerows([head] + rows)
PY
  timeout 120 tar czf "$OUT/issue7_logs.tar.gz" -C "$LOGS" . 2> /dev/null
}

# cfgtool CONFIG QUERY [ARG]: from `trainc --print-config`; QUERY is one of
#   val KEY            the effective value of section.key
#   dist-sets          --set k=v for each [dist] key the config sets
#   torch-args MODEL   tools/torch_ddp.py options matching the config (batch, amp, layout, dist, optim, aug)
cfgtool() {
  local cfg=$1; shift
  if ! timeout 60 "$TRAINC" --config "$cfg" --print-config > "$LOGS/print_config.txt" 2> "$LOGS/print_config.err"; then
    echo "cfgtool: $TRAINC --config $cfg --print-config failed: $(tail -1 "$LOGS/print_config.err")" >&2
    return 1
  fi
  timeout 60 python3 - "$LOGS/print_config.txt" "$@" <<'PY'
import sys
path, query, args = sys.argv[1], sys.argv[2], sys.argv[3:]
vals, src, sec = {}, {}, None
for line in open(path):
    line = line.rstrip("\n")
    if line.startswith("[") and line.endswith("]"):
        sec = line[1:-1]
        continue
    if not line.strip() or line.lstrip().startswith("#") or "=" not in line or sec is None:
        continue
    k, v = line.split("=", 1)
    v, _, where = v.rpartition("  # ") if "  # " in v else (v, "", "")
    vals[f"{sec}.{k.strip()}"], src[f"{sec}.{k.strip()}"] = v.strip(), where.strip()
on = lambda k: vals.get(k, "off") in ("on", "true", "1", "yes")
if query == "val":
    print(vals.get(args[0], ""))
elif query == "dist-sets":
    print(" ".join(f"--set {k}={v}" for k, v in vals.items() if k.startswith("dist.") and src.get(k) != "default"
                   and v and " " not in v))
elif query == "torch-args":
    dt = {"fp32": "fp32", "float": "fp32", "float32": "fp32", "f32": "fp32", "fp16": "fp16", "half": "fp16",
          "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16"}
    a = [f"--model {args[0]}", f"--image-size {vals.get('data.image_size', '32')}",
         f"--batch {vals.get('train.batch', '256')}", f"--amp {vals.get('precision.amp', 'off')}",
         f"--lr {vals.get('optim.lr', '0.01')}", f"--momentum {vals.get('optim.momentum', '0.9')}",
         f"--weight-decay {vals.get('optim.weight_decay', '0')}", f"--crop-pad {vals.get('data.crop_pad', '0')}"]
    a.append("--channels-last" if vals.get("model.layout") == "nhwc" else "--no-channels-last")
    a.append("--tf32" if on("precision.tf32") else "--no-tf32")
    a.append("--nesterov" if on("optim.nesterov") else "--no-nesterov")
    a.append("--flip" if on("data.flip") else "--no-flip")
    # PyTorch keeps DDP's own 25 MiB buckets (what its users get): trainc's
    # layer-cut buckets are a design choice of trainc's, not a setting to copy.
    if vals.get("dist.allreduce_dtype") in dt:
        a.append(f"--allreduce-dtype {dt[vals['dist.allreduce_dtype']]}")
    print(" ".join(a))
else:
    sys.exit(f"cfgtool: unknown query {query}")
PY
}

# scale PART CONFIG "TRAINC --set OPTIONS" "TORCH_DDP ARGS": tools/scaling.py over $GPUS
scale() {
  local part=$1 cfg=$2 sets=$3 targs=$4 n
  n=$(echo "$GPUS" | tr ',' '\n' | grep -c .)
  echo "== $part: $cfg $sets | torch_ddp.py $targs"
  timeout -k 60 $((2 * n * (RUN_LIMIT + 60) + 120)) python3 tools/scaling.py --gpus "$GPUS" --config "$cfg" \
    --trainc "$TRAINC" $sets --torch="$targs" --mpi-args="$MPI_ARGS" --timeout "$RUN_LIMIT" --label "$part" \
    --csv "$LOGS/scaling_$part.csv" --svg "$OUT/scaling_$part.svg" --jsonl "$JSONL" --log-dir "$LOGS" \
    > "$LOGS/scaling_$part.txt" 2>&1
  local rc=$?
  sed -n '/^weak scaling/,$p' "$LOGS/scaling_$part.txt"
  grep -E "^  failed|warning|note:" "$LOGS/scaling_$part.txt" | head -8
  [ $rc -eq 0 ] || echo "$part: scaling.py exit $rc (124: timed out); see scaling_$part.txt in the logs"
}

# run TAG LIMIT CMD...: CMD under `timeout LIMIT`, output to $LOGS/TAG.log; one line printed and
# the summary (rank 0's) appended to $JSONL with tag, rc, wall_s.
run() {
  local tag=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "$ $*" > "$LOGS/$tag.log"
  timeout -k 30 "$limit" "$@" >> "$LOGS/$tag.log" 2>&1
  local rc=$?
  timeout 60 python3 - "$tag" "$rc" "$((SECONDS - t0))" "$LOGS/$tag.log" "$JSONL" <<'PY'
import json, sys
sys.path.insert(0, "tools")
from scaling import parse_summary
tag, rc, secs, log, jsonl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
text = open(log, errors="replace").read()
s = parse_summary(text) or {}
why = {124: "timed out", 137: "killed (timeout)"}.get(rc, f"exit {rc}")
with open(jsonl, "a") as f:
    f.write(json.dumps({"tag": tag, "rc": rc, "wall_s": secs, **s}) + "\n")
if not s:
    tail = [l for l in text.splitlines() if l.strip() and not l.startswith("---")][-2:]
    print(f"{tag}: FAILED ({why}, {secs} s): {' | '.join(tail)[:300]}", flush=True)
else:
    acc = s.get("test_acc")
    sps = s.get("samples_per_s")
    print(f"{tag}: test accuracy {'-' if acc is None else f'{100 * acc:.2f}%'}, "
          f"{'-' if sps is None else f'{sps:,.0f}'} samples/s, final loss {s.get('final_loss')}, "
          f"{secs} s{'' if rc == 0 else f' ({why})'}", flush=True)
PY
}

have_config() { [ -f "$1" ] || { echo "$part: $1 is missing, skipped"; return 1; }; }

for part in $PARTS; do
  case $part in
  simplenet-resident)
    have_config "$DDP_CONFIG" || continue
    targs=$(cfgtool "$DDP_CONFIG" torch-args simplenet) || continue
    scale "$part" "$DDP_CONFIG" "--set data.resident=on --set run.eval=off --set run.epochs=$RESIDENT_EPOCHS \
--set run.max_steps=$((WARM + STEPS)) --set run.warmup_steps=$WARM" "$targs --data-on-gpu --warmup-steps $WARM --steps $STEPS"
    ;;
  simplenet-loader)
    have_config "$DDP_CONFIG" || continue
    targs=$(cfgtool "$DDP_CONFIG" torch-args simplenet) || continue
    scale "$part" "$DDP_CONFIG" "--set data.path=$DATA --set run.eval=off --set run.epochs=$LOADER_EPOCHS \
--set run.warmup_steps=$LOADER_WARM" "$targs --data $DATA --epochs $LOADER_EPOCHS --warmup-steps $LOADER_WARM"
    ;;
  resnet18-resident | resnet18-loader)
    { have_config "$DDP_CONFIG" && have_config "$R18_CONFIG"; } || continue
    dsets=$(cfgtool "$DDP_CONFIG" dist-sets) || continue
    # ... but the [dist] keys resnet18.ini sets itself, and R18_SETS, win
    dsets="$dsets $(cfgtool "$R18_CONFIG" dist-sets) ${R18_SETS:-}"
    # the [dist] keys of ddp.ini, and the torch side's DDP options from them
    dtorch=$(cfgtool "$DDP_CONFIG" torch-args simplenet | grep -oE -- "--(bucket-mb|allreduce-dtype) [^ ]+" | tr '\n' ' ')
    targs=$(cfgtool "$R18_CONFIG" torch-args resnet18) || continue
    targs="$targs $dtorch"
    if [ "$part" = resnet18-resident ]; then
      scale "$part" "$R18_CONFIG" "$dsets --set data.resident=on --set run.eval=off --set run.epochs=$RESIDENT_EPOCHS \
--set run.max_steps=$((WARM + STEPS)) --set run.warmup_steps=$WARM" \
        "$targs --data-on-gpu --warmup-steps $WARM --steps $STEPS"
    else
      scale "$part" "$R18_CONFIG" "$dsets --set data.path=$DATA --set run.eval=off --set run.epochs=$LOADER_EPOCHS \
--set run.warmup_steps=$LOADER_WARM" "$targs --data $DATA --epochs $LOADER_EPOCHS --warmup-steps $LOADER_WARM"
    fi
    ;;
  acc)
    have_config "$DDP_CONFIG" || continue
    g=${ACC_GLOBAL_BATCH:-$(cfgtool "$DDP_CONFIG" val train.batch)}
    [ -n "$g" ] || { echo "acc: no train.batch"; continue; }
    [ $((g % 2)) -eq 0 ] || echo "acc: global batch $g is odd: 2 GPUs get $((g / 2)) each"
    epochs=${ACC_EPOCHS:-$(cfgtool "$DDP_CONFIG" val run.epochs)}
    echo "== acc: $DDP_CONFIG, global batch $g, $epochs epochs: 1 GPU x $g against 2 GPUs x $((g / 2))"
    for seed in $ACC_SEEDS; do
      S="--config $DDP_CONFIG --quiet --set data.path=$DATA --set run.seed=$seed --set run.epochs=$epochs"
      run "acc_trainc_1gpu_s$seed" "$ACC_LIMIT" "$TRAINC" $S --set train.batch=$g
      [ "$NGPU" -ge 2 ] && run "acc_trainc_2gpu_s$seed" "$ACC_LIMIT" $MPIRUN -np 2 "$TRAINC" $S --set train.batch=$((g / 2))
      if [ "$ACC_TORCH" = 1 ]; then
        targs=$(cfgtool "$DDP_CONFIG" torch-args simplenet | sed -E 's/--batch [0-9]+//')
        T="tools/torch_ddp.py $targs --data $DATA --epochs $epochs --eval --seed $seed"
        run "acc_torch_1gpu_s$seed" "$ACC_LIMIT" python3 $T --batch $g
        [ "$NGPU" -ge 2 ] && run "acc_torch_2gpu_s$seed" "$ACC_LIMIT" $MPIRUN -np 2 python3 $T --batch $((g / 2))
      fi
    done
    ;;
  *) echo "unknown part $part (simplenet-resident simplenet-loader resnet18-resident resnet18-loader acc)" ;;
  esac
  pack
done

echo
echo "summary:"
timeout 60 python3 - "$OUT/issue7_scaling.csv" "$JSONL" <<'PY'
import csv, json, sys
try:
    rows = list(csv.DictReader(open(sys.argv[1], newline="")))
except OSError:
    rows = []
f = lambda v, spec, k=1: "-" if v in (None, "") else format(float(v) * k, spec)
if rows:
    print(f"{'experiment':<20} {'series':<8} {'GPUs':>4} {'epoch s':>8} {'samples/s':>10} {'per GPU':>9} "
          f"{'speedup':>8} {'eff %':>6}  status")
    for r in rows:
        print(f"{r['label']:<20} {r['series']:<8} {r['gpus']:>4} {f(r['epoch_s'], '.2f'):>8} "
              f"{f(r['samples_per_s'], ',.0f'):>10} {f(r['per_gpu_samples_per_s'], ',.0f'):>9} "
              f"{f(r['speedup'], '.2f'):>8} {f(r['efficiency'], '.1f', 100):>6}  {r['status']}")
    print(f"NCCL: {rows[0].get('nccl') or 'unknown'}")
try:
    recs = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
except OSError:
    recs = []
accs = {}
for r in recs:
    if str(r.get("tag", "")).startswith("acc_"):
        accs[r["tag"]] = r
for tag, r in accs.items():
    a = r.get("test_acc")
    print(f"{tag:<24} test accuracy {'-' if a is None else f'{100 * a:.2f}%'}  epochs {r.get('epochs')}  "
          f"samples/s {f(r.get('samples_per_s'), ',.0f')}  rc {r['rc']}")
PY
