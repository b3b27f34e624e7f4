#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2046  # option variables and $(on NP) are split into words on purpose
# Benchmarks on a lent GPU machine: trainc against the PyTorch references on the same
# card, and with BASE=dir a second tree's build run beside (before/after in one call).
#
#   bash tools/device/bench.sh WHAT [WHAT ...]
#
# WHAT (run in the order given):
#   lab      the lab's table: trainc's five stages (configs/baseline.ini ... final.ini) and
#            PyTorch's four (tools/torch_reference.py), one epoch each at 224, through
#            tools/lab_table.py ($OUT/lab_table.csv, .svg; BASE: lab_table_base.*)
#   step     the training step alone (one batch kept on each GPU): samples/s, step ms, peak
#            memory (HOST_CPU=1: also the host CPU time per step), trainc (and BASE's,
#            interleaved ROUNDS times) and the PyTorch reference. CASES, from:
#              simplenet-32        configs/final.ini at 32x32, batch 512   (torch_reference.py)
#              simplenet-224       configs/final.ini, 224, batch 256       (torch_reference.py)
#              resnet18-32         configs/resnet18.ini, batch 512, AMP    (torch_resnet.py --mode step)
#              simplenet-224-fp32  configs/model.ini (fp32, no graph)      (no PyTorch run)
#              resnet50-224        ResNet-50, ImageNet stem, synthetic     (torch_resnet.py --mode step)
#              vgg-32              configs/vgg.ini, batch 512, AMP         (torch_net.py --mode step)
#              mobilenetv2-32      configs/mobilenetv2.ini, batch 512, AMP (torch_net.py --mode step)
#              ddp                 configs/ddp.ini (SimpleNet-224)         (torch_ddp.py)
#            default: the first four (the step-alone figures compared before and after a change).
#            With NP > 1 every run is under mpirun and the PyTorch side is tools/torch_ddp.py.
#   resnet   step with CASES="resnet18-32 resnet50-224" (COMPILE default max-autotune), then
#            acc with CONFIG=configs/resnet18.ini: issue 6's ResNet comparison
#   acc      test accuracy of a full training run on CIFAR-10: CONFIG (configs/resnet18.ini),
#            SEEDS ("0 1"), EPOCHS (the config's), on each of GPUS ("1"; "1,2": the same
#            global batch, ACC_BATCH or the config's train.batch, split over the GPUs); PyTorch beside:
#            resnet18.ini on 1 GPU runs tools/torch_resnet.py --mode train with the same
#            recipe, vgg.ini and mobilenetv2.ini (the same recipe) tools/torch_net.py --mode train,
#            any other tools/torch_ddp.py --eval with the config's settings
#   loader   epochs with the real loader: CONFIG (configs/ddp.ini), EPOCHS (3), evaluation off,
#            WARM (10) untimed steps, on NP GPUs; trainc (and BASE's), torch_ddp.py --data
#   scaling  weak scaling through tools/scaling.py on GPUS (default 1,2[,4], what is visible):
#            PARTS from simplenet-resident resnet18-resident simplenet-loader resnet18-loader
#            (default the two resident ones): configs/ddp.ini, and configs/resnet18.ini with
#            ddp.ini's [dist] keys (R18_SETS: more --set for it), trainc against PyTorch DDP;
#            BASE: BASE's trainc in a second table ($OUT/scaling.csv, scaling_*.svg); EACH_CARD=1:
#            each series' 1-GPU run on each card alone too, and the efficiency against their sum
#   memory   the memory grid: tools/bench_memory.py on configs/model.ini (batches x precision)
#   phases   the phase breakdown of one epoch of CONFIG (configs/final.ini), trainc and BASE's
#   export   train each of EXPORT_CONFIGS (configs/final.ini configs/resnet18.ini; EPOCHS: the
#            configs' unless set), then trainc eval (the inference path) beside the run's own
#            accuracy, trainc export, tools/torch_load_safetensors.py's PyTorch accuracy, and on
#            32x32 configs trainc predict --device cuda against onnxruntime on PREDICT_IMAGES (64)
#            test images saved as PNG
#   profile  `trainc profile` of each of STAGES (default the lab's five configs) over steps
#            PROFILE_STEPS (11:30) with its trace ($OUT/profile/<stage>.txt, .json), the same
#            window unprofiled (the profiler's overhead), then tools/device/ncu_check.py on the
#            trace of CHECK (configs/final.ini; CHECK=none: no ncu); GRAPH=1: `--graph` (the step
#            replayed from its CUDA graph, no op timed), the unprofiled window with the graph too,
#            and no ncu; NP > 1: every run under mpirun (the trace holds every rank), no ncu
#   stream   the streaming image pipeline on an ImageNet-like folder that tools/make_image_set.py makes from
#            CIFAR-10 ($STREAM_ROOT, default /tmp/imnet: STREAM_IMAGES training images, default 40000, sides
#            250-500, JPEG quality 90): trainc bench-loader (each way of decoding, the pipeline alone);
#            ResNet-50 at 224 (configs/imagenet_final.ini, STREAM_SETS more trainc options) for STREAM_STEPS
#            steps on one resident batch, with data.decode = gpu and with = cpu; the host's peak memory with
#            data.decode = gpu on that set and on one ten times as large (hard links, $STREAM_ROOT-x10); and
#            PyTorch's tools/torch_stream.py loader (16 workers) and GPU decode on the same folder;
#            STREAM_MEMORY=0: no ten-times set
#   infer    inference throughput (images/s) and latency (p50, p99 ms) at each of INFER_BATCHES
#            (1,32,256): `trainc bench-infer` (and BASE's, as impl=trainc-base) against
#            tools/torch_infer.py --mode graph and, unless COMPILE=none, --mode compile, for each
#            of INFER_CASES (default all three):
#              resnet18-32     configs/resnet18.ini                       (--model resnet18 --image-size 32)
#              simplenet-224   configs/final.ini                          (--model simplenet --image-size 224)
#              resnet50-224    resnet18.ini with model.name=resnet50 at 224 (--model resnet50 --image-size 224)
#            the lines in $OUT/infer.txt, their table (tools/infer_table.py) in $OUT/infer.md
#
# Parameters (environment):
#   NP=n          GPUs per run of step and loader (default 1; > 1: mpirun -np n)
#   BASE=dir      a second tree, built into build-base/ (tools/device/prepare.sh) and run beside
#   TORCH=0       no PyTorch runs;  TORCH_ARGS: more options for each PyTorch run (e.g. --no-channels-last)
#   ROUNDS=n      step, loader: trainc (and BASE) runs interleaved n times (default 2)
#   CASES         step's cases (above);  WARM, STEPS: override each case's untimed and timed steps
#   SETS          more trainc options for every run (e.g. "--set perf.cuda_graph=off")
#   SWEEP=key=v1,v2,...  step, loader: every case once per value of that trainc key
#                 (e.g. dist.bucket_mb=4,25,256 or model.layout=nchw,nhwc)
#   MPI_ARGS      more mpirun options (e.g. "-x NCCL_MAX_NCHANNELS=4")
#   TRANSPORT=socket  NCCL's socket transport, as between nodes without InfiniBand: mpirun -x
#                 NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 (PyTorch's runs too), trainc with
#                 dist.copy_engine=off, and scaling's runs with NCCL_DEBUG=INFO (its transport column)
#   TAG=name      scaling: appended to the experiments' names (two scaling runs in one $OUT)
#   HOST_CPU=1    step: a second run of each trainc case with twice the timed steps; the host
#                 CPU time per step is the difference of the two runs' CPU times over the extra steps
#   COMPILE="default max-autotune"  step: the ResNet, VGG and MobileNetV2 cases and simplenet-224
#                 (tools/torch_resnet.py --mode step --model simplenet) under torch.compile too;
#                 COMPILE_TIMEOUT=s (default 1500; a compile cut off goes on from its cache in the
#                 next call on the same warm machine: prepare.sh); infer: the modes of its compile runs
#                 (default max-autotune; none: no compile run), each run limited to COMPILE_TIMEOUT
#   CONFIG, SEEDS, EPOCHS, GPUS, PARTS, R18_SETS, DATA (.data/cifar10-jpg),
#   INFER_CASES, INFER_BATCHES: as above
#   RUN_LIMIT=s   timeout of one run (default 900);  ACC_LIMIT=s of one accuracy run (default 2400)
#   DRY_RUN=1     check the arguments and stop
#   OUT, LOGS, BUILD_LIMIT: see prepare.sh. Every run's summary line goes to $OUT/bench.jsonl
#   with its tag, its log to $LOGS/<tag>.log; a table of all runs ends the output.
# A device call may run 10 minutes: give one call a few benchmarks (e.g. step, then lab);
# the next call on the same warm machine reuses the builds. Several at once on a multi-GPU
# host: after one build (bash tools/device/prepare.sh), one bench.sh per GPU in the background,
# each with NO_BUILD=1, CUDA_VISIBLE_DEVICES=k and its own OUT and LOGS.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1

ALL_CASES="simplenet-32 simplenet-224 resnet18-32 simplenet-224-fp32 resnet50-224 vgg-32 mobilenetv2-32 ddp"
ALL_PARTS="simplenet-resident resnet18-resident simplenet-loader resnet18-loader"
ALL_INFER_CASES="resnet18-32 simplenet-224 resnet50-224"
WHATS="lab step resnet acc loader scaling memory phases profile infer export stream"
usage() { echo "usage: bash tools/device/bench.sh WHAT... ($WHATS); see its head comment" >&2; exit 2; }
[ $# -ge 1 ] || usage
for what in "$@"; do
  [[ " $WHATS " == *" $what "* ]] || { echo "bench.sh: unknown benchmark '$what' ($WHATS)" >&2; exit 2; }
done
for c in ${INFER_CASES:-}; do
  [[ " $ALL_INFER_CASES " == *" $c "* ]] || { echo "bench.sh: unknown case '$c' in INFER_CASES ($ALL_INFER_CASES)" >&2; exit 2; }
done
if [ -n "${INFER_BATCHES:-}" ] && [[ ! "$INFER_BATCHES" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]]; then
  echo "bench.sh: INFER_BATCHES=$INFER_BATCHES is not a list like 1,32,256" >&2; exit 2
fi
for c in ${CASES:-}; do
  [[ " $ALL_CASES " == *" $c "* ]] || { echo "bench.sh: unknown case '$c' in CASES ($ALL_CASES)" >&2; exit 2; }
done
for p in ${PARTS:-}; do
  [[ " $ALL_PARTS " == *" $p "* ]] || { echo "bench.sh: unknown part '$p' in PARTS ($ALL_PARTS)" >&2; exit 2; }
done
if [ -n "${SWEEP:-}" ] && [[ ! "$SWEEP" =~ ^[a-z_]+\.[a-z_0-9]+=[^,]+(,[^,]+)*$ ]]; then
  echo "bench.sh: SWEEP=$SWEEP is not section.key=v1,v2,..." >&2; exit 2
fi
for n in NP ROUNDS; do
  v=${!n:-1}
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: $n=$v is not a positive number" >&2; exit 2; }
done
[ -z "${BASE:-}" ] || [ -d "$BASE" ] || { echo "bench.sh: BASE=$BASE is not a folder" >&2; exit 2; }
[ "${DRY_RUN:-0}" = 1 ] && { echo "bench.sh: would run: $*"; exit 0; }

# shellcheck source=tools/device/prepare.sh
source tools/device/prepare.sh
NP=${NP:-1} ROUNDS=${ROUNDS:-2} TORCH=${TORCH:-1} RUN_LIMIT=${RUN_LIMIT:-900}
DATA=${DATA:-.data/cifar10-jpg}
JSONL="$OUT/bench.jsonl"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0 \
-x TORCH_SYMM_MEM_DISABLE_MULTICAST=1 -x NVSHMEM_DISABLE_NVLS=1 ${MPI_ARGS:-}"
TRAINCS="new:build/trainc"
[ -n "${BASE:-}" ] && TRAINCS="base:build-base/trainc $TRAINCS"
echo "torch: $(timeout 120 python3 -c 'import torch; print(torch.__version__, "cuDNN", torch.backends.cudnn.version())' 2>&1 | tail -1)"

# on NP: the mpirun prefix for NP processes (none for 1)
on() { [ "$1" -gt 1 ] && echo "$MPIRUN -np $1"; }

# measure TAG LIMIT [--extra N] CMD...: CMD under `timeout LIMIT`, its output in $LOGS/TAG.log; its
# summary (rank 0's last JSON line with samples_per_s) appended to $JSONL with tag, rc, wall_s,
# and one line printed. --extra N (trainc only): run again with N more steps, and report the
# host CPU time per step of the difference.
measure() {
  timeout -k 30 $(($2 * 2 + 120)) python3 - "$JSONL" "$LOGS" "$@" <<'PY'
import json, resource, subprocess, sys, time
sys.path.insert(0, "tools")
from scaling import parse_summary
jsonl, logs, tag, limit, cmd = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
extra = 0
if cmd[:1] == ["--extra"]:
    extra, cmd = int(cmd[1]), cmd[2:]
def once(argv, log):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    with open(log, "w") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        try:
            rc = subprocess.run(["timeout", "-k", "30", str(limit), *argv], stdout=f, stderr=subprocess.STDOUT).returncode
        except OSError as e:
            f.write(f"{e}\n")
            rc = 127
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return rc, time.time() - t0, cpu, open(log, errors="replace").read()
rc, wall, cpu, text = once(cmd, f"{logs}/{tag}.log")
s = parse_summary(text) or {}
if extra and s:
    steps = [a.split("=", 1)[1] for a in cmd if a.startswith("run.max_steps=")]
    longer = cmd + ["--set", f"run.max_steps={int(steps[-1]) + extra}"]
    rc2, _, cpu2, text2 = once(longer, f"{logs}/{tag}.long.log")
    s2 = parse_summary(text2)
    if s2:
        s = dict(s2, host_cpu_ms_per_step=(cpu2 - cpu) / extra * 1e3)
why = {124: "timed out", 137: "killed (timeout)"}.get(rc, f"exit {rc}")
with open(jsonl, "a") as f:
    f.write(json.dumps({"tag": tag, "rc": rc, "wall_s": round(wall), **s}) + "\n")
if not s:
    tail = [l for l in text.splitlines() if l.strip() and not l.startswith("---")][-2:]
    print(f"{tag}: FAILED ({why}, {wall:.0f} s): {' | '.join(tail)[:300]}", flush=True)
    sys.exit(0)
def g(k, spec, scale=1):
    v = s.get(k)
    return "-" if v is None else format(v * scale, spec)
more = f", host CPU {g('host_cpu_ms_per_step', '.3f')} ms/step" if "host_cpu_ms_per_step" in s else ""
more += f", acc {g('test_acc', '.2f', 100)}%" if s.get("test_acc") is not None else ""
more += f", epoch {g('epoch_s', '.2f')} s" if s.get("epoch_s") is not None else ""
more += f", compile {s['compile_s']:.0f} s" if s.get("compile_s") else ""
more += f", error: {s['error'][:160]}" if s.get("error") else ""
more += "" if rc == 0 else f" ({why})"
print(f"{tag}: {g('samples_per_s', ',.0f')} samples/s, step {g('step_ms', '.3f')} ms, peak "
      f"{g('peak_mem_bytes', '.2f', 2**-30)} GiB, {wall:.0f} s{more}", flush=True)
PY
}

# cfgtool CONFIG QUERY [ARG]: from `trainc --print-config`; QUERY is one of
#   val KEY            the effective value of section.key
#   dist-sets          --set k=v for each [dist] key the config sets
#   torch-args MODEL   tools/torch_ddp.py options matching the config (batch, amp, layout, optim, aug, dist)
cfgtool() {
  local cfg=$1; shift
  if ! timeout 60 build/trainc --config "$cfg" --print-config > "$LOGS/print_config.txt" 2> "$LOGS/print_config.err"; then
    echo "cfgtool: build/trainc --config $cfg --print-config failed: $(tail -1 "$LOGS/print_config.err")" >&2
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

# torch_model CONFIG: the tools/torch_ddp.py --model for the config's model.name
torch_model() { case $(cfgtool "$1" val model.name) in resnet*) cfgtool "$1" val model.name ;; *) echo simplenet ;; esac; }

# sweep_sets: one line per value of SWEEP ("--set key=value"), or one empty line
sweep_sets() {
  if [ -z "${SWEEP:-}" ]; then echo; return; fi
  local v
  for v in $(echo "${SWEEP#*=}" | tr ',' ' '); do echo "--set ${SWEEP%%=*}=$v"; done
}
sweep_tag() { [ -z "$1" ] && return; echo "_${1#--set }" | tr '=./' '-__'; }

# case_def NAME: sets ARGS (trainc), W and S (untimed, timed steps), T1 (the 1-GPU PyTorch
# command, "" for none), TC (the step under torch.compile, COMPILE's modes; "" for none) and TN
# (tools/torch_ddp.py options for NP > 1).
case_def() {
  local ref="python3 tools/torch_reference.py --no-sync --resident --amp fp16 --channels-last"
  local res="python3 tools/torch_resnet.py --mode step --amp fp16 --channels-last"
  local net="python3 tools/torch_net.py --trainc build/trainc --mode step --amp fp16 --channels-last"
  local ddp="--data-on-gpu --amp fp16 --channels-last"
  TC=""
  case $1 in
  simplenet-32)
    ARGS="--config configs/final.ini --set data.image_size=32 --set train.batch=512"; W=100 S=1000
    T1="$ref --image-size 32 --batch 512 --epochs 8 --warmup-steps 100 --max-steps 700"
    TN="--model simplenet --image-size 32 --batch 512 --tf32 $ddp" ;;
  simplenet-224)
    ARGS="--config configs/final.ini"; W=20 S=200
    T1="$ref --image-size 224 --batch 256 --epochs 8 --warmup-steps 20 --max-steps 80"
    TC="$res --model simplenet --image-size 224 --batch 256 --warmup-steps 20 --steps 200"
    TN="--model simplenet --image-size 224 --batch 256 --tf32 $ddp" ;;
  resnet18-32)
    ARGS="--config configs/resnet18.ini --set train.batch=512"; W=50 S=600
    T1="$res --model resnet18 --image-size 32 --batch 512 --warmup-steps 50 --steps 300"; TC=$T1
    TN="--model resnet18 --image-size 32 --batch 512 --lr 0.2 --weight-decay 5e-4 --nesterov $ddp" ;;
  simplenet-224-fp32)
    ARGS="--config configs/model.ini"; W=20 S=100; T1="" TN="" ;;
  resnet50-224)
    ARGS="--config configs/resnet18.ini --set model.name=resnet50 --set data.image_size=224 \
--set data.source=synthetic --set train.batch=256"; W=20 S=100
    T1="$res --model resnet50 --image-size 224 --batch 256 --warmup-steps 20 --steps 100"; TC=$T1
    TN="--model resnet50 --image-size 224 --batch 256 $ddp" ;;
  vgg-32|mobilenetv2-32)
    ARGS="--config configs/${1%-32}.ini --set train.batch=512"; W=50 S=600
    T1="$net --model ${1%-32} --image-size 32 --batch 512 --warmup-steps 50 --steps 300"; TC=$T1
    TN="" ;;
  ddp)
    ARGS="--config configs/ddp.ini"; W=20 S=200
    T1="$ref --image-size 224 --batch 256 --epochs 8 --warmup-steps 20 --max-steps 80"
    TN="--model simplenet --image-size 224 --batch 256 --tf32 $ddp" ;;
  esac
  W=${WARM:-$W} S=${STEPS:-$S}
}

bench_step() {
  local cases=${1:-${CASES:-simplenet-32 simplenet-224 resnet18-32 simplenet-224-fp32}} c sets tag round who bin extra mode
  local R="--quiet --set data.resident=on --set run.eval=off --set run.epochs=1000"
  echo "== step alone on $NP GPU(s): $cases${SWEEP:+ (SWEEP $SWEEP)}"
  for round in $(seq 1 "$ROUNDS"); do
    for c in $cases; do
      case_def "$c"
      extra=""; [ "${HOST_CPU:-0}" = 1 ] && extra="--extra $S"
      while read -r sets; do
        tag="step_${c}$(sweep_tag "$sets")_np${NP}"
        for who in $TRAINCS; do
          bin=${who#*:}
          measure "${tag}_${who%%:*}_r$round" "$RUN_LIMIT" $extra $(on "$NP") "$bin" $ARGS $R $SETS_ALL $sets \
            --set run.warmup_steps="$W" --set run.max_steps=$((W + S))
        done
      done < <(sweep_sets)
    done
  done
  [ "$TORCH" = 1 ] || return 0
  for c in $cases; do
    case_def "$c"
    if [ "$NP" -gt 1 ]; then
      [ -n "$TN" ] && measure "step_${c}_np${NP}_torch_ddp" "$RUN_LIMIT" $(on "$NP") python3 tools/torch_ddp.py $TN \
        --warmup-steps "$W" --steps "$S" ${TORCH_ARGS:-}
      continue
    fi
    [ -n "$T1" ] || continue
    measure "step_${c}_torch" "$RUN_LIMIT" $T1 ${TORCH_ARGS:-}
    [ -n "$TC" ] || continue
    for mode in ${COMPILE:-}; do
      measure "step_${c}_torch_compile_$mode" $((${COMPILE_TIMEOUT:-1500} + 300)) $TC --compile "$mode" \
        --compile-timeout "${COMPILE_TIMEOUT:-1500}" ${TORCH_ARGS:-}
    done
  done
}

bench_acc() {
  local cfg=${CONFIG:-configs/resnet18.ini} g epochs seed np who bin model targs script
  g=${ACC_BATCH:-$(cfgtool "$cfg" val train.batch)}
  [ -n "$g" ] || { echo "acc: no train.batch in $cfg"; return; }
  epochs=${EPOCHS:-$(cfgtool "$cfg" val run.epochs)}
  [ -d "$DATA/train" ] || { echo "acc: no data at $DATA"; return; }
  echo "== acc: $cfg, global batch $g, $epochs epochs, GPUs ${GPUS:-1}, seeds ${SEEDS:-0 1}"
  for seed in ${SEEDS:-0 1}; do
    for np in $(echo "${GPUS:-1}" | tr ',' ' '); do
      [ $((g % np)) -eq 0 ] || echo "acc: global batch $g does not split over $np GPUs: $((g / np)) each"
      for who in $TRAINCS; do
        bin=${who#*:}
        measure "acc_$(basename "$cfg" .ini)_np${np}_s${seed}_${who%%:*}" "${ACC_LIMIT:-2400}" $(on "$np") "$bin" \
          --config "$cfg" --quiet --set data.path="$DATA" --set run.seed="$seed" --set run.epochs="$epochs" \
          --set train.batch=$((g / np)) $SETS_ALL
      done
      [ "$TORCH" = 1 ] || continue
      model=$(basename "$cfg" .ini)
      if [[ " resnet18 vgg mobilenetv2 " == *" $model "* ]] && [ "$np" = 1 ]; then
        # the recipe of configs/resnet18.ini (its optim.decay_bn_bias = off), which vgg.ini and mobilenetv2.ini
        # share: their nets through tools/torch_net.py
        script="tools/torch_resnet.py"; [ "$model" = resnet18 ] || script="tools/torch_net.py --trainc build/trainc"
        measure "acc_${model}_np1_s${seed}_torch" "${ACC_LIMIT:-2400}" python3 $script --mode train \
          --data "$DATA" --model "$model" --image-size 32 --epochs "$epochs" --batch "$g" --lr 0.2 --momentum 0.9 \
          --nesterov --weight-decay 5e-4 --no-decay-bn-bias --schedule cosine --warmup-epochs 2 \
          --label-smoothing 0 --flip --crop-pad 4 --amp fp16 --channels-last --seed "$seed" ${TORCH_ARGS:-}
      else
        model=$(torch_model "$cfg") || continue
        targs=$(cfgtool "$cfg" torch-args "$model" | sed -E 's/--batch [0-9]+//')
        measure "acc_$(basename "$cfg" .ini)_np${np}_s${seed}_torch" "${ACC_LIMIT:-2400}" $(on "$np") python3 \
          tools/torch_ddp.py $targs --data "$DATA" --epochs "$epochs" --eval --seed "$seed" --batch $((g / np)) \
          ${TORCH_ARGS:-}
      fi
    done
  done
}

bench_loader() {
  local cfg=${CONFIG:-configs/ddp.ini} epochs=${EPOCHS:-3} warm=${WARM:-10} round sets who bin model targs
  echo "== loader: $cfg, $epochs epochs, $NP GPU(s)${SWEEP:+ (SWEEP $SWEEP)}"
  for round in $(seq 1 "$ROUNDS"); do
    while read -r sets; do
      for who in $TRAINCS; do
        bin=${who#*:}
        measure "loader_$(basename "$cfg" .ini)$(sweep_tag "$sets")_np${NP}_${who%%:*}_r$round" "$RUN_LIMIT" \
          $(on "$NP") "$bin" --config "$cfg" --quiet --set data.path="$DATA" --set run.eval=off \
          --set run.epochs="$epochs" --set run.warmup_steps="$warm" $SETS_ALL $sets
      done
    done < <(sweep_sets)
  done
  [ "$TORCH" = 1 ] || return 0
  model=$(torch_model "$cfg") && targs=$(cfgtool "$cfg" torch-args "$model") || return 0
  measure "loader_$(basename "$cfg" .ini)_np${NP}_torch_ddp" "$RUN_LIMIT" $(on "$NP") python3 tools/torch_ddp.py \
    $targs --data "$DATA" --epochs "$epochs" --warmup-steps "$warm" ${TORCH_ARGS:-}
}

bench_scaling() {
  local ngpu gpus part cfg sets targs dsets dtorch who bin tag torch_opt n
  local steps=${STEPS:-200} warm=${WARM:-30} epochs=${EPOCHS:-3}
  ngpu=$(timeout 30 nvidia-smi -L 2> /dev/null | grep -c '^GPU')
  gpus=${GPUS:-1$([ "$ngpu" -ge 2 ] && echo ,2)$([ "$ngpu" -ge 4 ] && echo ,4)}
  n=$(echo "$gpus" | tr ',' '\n' | grep -c .)
  [ "${EACH_CARD:-0}" = 1 ] && n=$((n + $(echo "$gpus" | tr ',' '\n' | sort -n | tail -1)))
  echo "== scaling on $gpus GPUs ($ngpu visible); mpirun: $(timeout 30 mpirun --version 2>&1 | head -1)"
  for part in ${PARTS:-simplenet-resident resnet18-resident}; do
    cfg=configs/ddp.ini dsets=""
    if [[ "$part" == resnet18-* ]]; then
      cfg=configs/resnet18.ini
      # ddp.ini's [dist] keys, but those resnet18.ini sets itself, and R18_SETS, win
      dsets="$(cfgtool configs/ddp.ini dist-sets) $(cfgtool "$cfg" dist-sets) ${R18_SETS:-}"
      dtorch=$(cfgtool configs/ddp.ini torch-args simplenet | grep -oE -- "--(bucket-mb|allreduce-dtype) [^ ]+" | tr '\n' ' ')
      targs="$(cfgtool "$cfg" torch-args resnet18) $dtorch"
    else
      targs=$(cfgtool "$cfg" torch-args simplenet)
    fi
    if [[ "$part" == *-resident ]]; then
      sets="--set data.resident=on --set run.eval=off --set run.epochs=100 --set run.max_steps=$((warm + steps)) \
--set run.warmup_steps=$warm"
      targs="$targs --data-on-gpu --warmup-steps $warm --steps $steps"
    else
      sets="--set data.path=$DATA --set run.eval=off --set run.epochs=$epochs --set run.warmup_steps=10"
      targs="$targs --data $DATA --epochs $epochs --warmup-steps 10"
    fi
    for who in $TRAINCS; do
      bin=${who#*:} tag="${part}${TAG:+_$TAG}_${who%%:*}" torch_opt=()
      [ "$TORCH" = 1 ] && [ "${who%%:*}" = new ] && torch_opt=(--torch="$targs ${TORCH_ARGS:-}")
      echo "-- $tag: $cfg $dsets $sets"
      timeout -k 60 $((2 * n * (RUN_LIMIT + 60) + 120)) python3 tools/scaling.py --gpus "$gpus" --config "$cfg" \
        --trainc "$bin" $dsets $sets $SETS_ALL "${torch_opt[@]}" --mpi-args="${MPI_ARGS:-}" --nccl-debug "$NCCL_DEBUG_RUNS" \
        --timeout "$RUN_LIMIT" $([ "${EACH_CARD:-0}" = 1 ] && echo --each-card) \
        --label "$tag" --csv "$LOGS/scaling_$tag.csv" --svg "$OUT/scaling_$tag.svg" --jsonl "$JSONL" \
        --log-dir "$LOGS" > "$LOGS/scaling_$tag.txt" 2>&1
      echo "scaling.py exit $? (124: timed out)"
      sed -n '/^weak scaling/,$p' "$LOGS/scaling_$tag.txt"
      grep -E "^  failed|warning|note:" "$LOGS/scaling_$tag.txt" | head -8
    done
  done
  python3 - "$LOGS" "$OUT/scaling.csv" <<'PY'
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
}

bench_lab() {
  local TS="python3 tools/torch_reference.py --image-size 224 --epochs 1" who bin suffix
  echo "== the lab's table"
  if [ "$TORCH" = 1 ]; then
    {
      timeout 300 $TS --batch 32 --loader lab --name baseline ${TORCH_ARGS:-} 2> /dev/null | tail -1
      timeout 300 $TS --batch 256 --tf32 --no-sync --loader lab --workers 8 --pinned --name dataloader \
        ${TORCH_ARGS:-} 2> /dev/null | tail -1
      timeout 300 $TS --batch 256 --tf32 --no-sync --loader lab --workers 8 --pinned --channels-last \
        --name channels_last ${TORCH_ARGS:-} 2> /dev/null | tail -1
      timeout 300 $TS --batch 256 --tf32 --no-sync --loader lab --workers 8 --pinned --channels-last --amp fp16 \
        --name amp_channels_last ${TORCH_ARGS:-} 2> /dev/null | tail -1
    } > "$OUT/torch_stages.jsonl"
    cut -c1-220 "$OUT/torch_stages.jsonl"
  fi
  for who in $TRAINCS; do
    bin=${who#*:} suffix=$([ "${who%%:*}" = base ] && echo _base)
    echo "-- ${who%%:*}: $bin"
    timeout 600 python3 tools/lab_table.py --trainc "$bin" \
      --configs configs/baseline.ini,configs/dataloader.ini,configs/model.ini,configs/memory.ini,configs/final.ini \
      --set run.epochs=1 --set run.eval=off $SETS_ALL \
      $([ "$TORCH" = 1 ] && [ -s "$OUT/torch_stages.jsonl" ] && echo "--torch-json $OUT/torch_stages.jsonl") \
      --csv "$OUT/lab_table$suffix.csv" --svg "$OUT/lab_table$suffix.svg"
  done
}

bench_phases() {
  local cfg=${CONFIG:-configs/final.ini} who
  echo "== phases of one epoch of $cfg"
  for who in $TRAINCS; do
    echo "-- ${who%%:*}: $(timeout 300 "${who#*:}" --config "$cfg" --set run.epochs=1 --set run.eval=off $SETS_ALL 2>&1 \
      | grep -E "phases|samples/s|error" | tail -2 | cut -c1-600)"
  done
}

bench_profile() {
  local steps=${PROFILE_STEPS:-11:30} dir=$OUT/profile cfg name check=${CHECK:-configs/final.ini} graph=off
  [ "${GRAPH:-0}" = 1 ] && graph=on check=none
  [ "$NP" -gt 1 ] && check=none
  local stages=${STAGES:-configs/baseline.ini configs/dataloader.ini configs/model.ini configs/memory.ini configs/final.ini}
  mkdir -p "$dir"
  for cfg in $stages; do
    name=$(basename "$cfg" .ini)
    echo "== trainc profile --config $cfg --steps $steps"
    timeout "$RUN_LIMIT" $(on "$NP") build/trainc profile --config "$cfg" --steps "$steps" --trace "$dir/$name.json" $SETS_ALL \
      $([ "$graph" = on ] && echo --graph) \
      > "$dir/$name.txt" 2> "$dir/$name.err" || echo "profile of $cfg failed: $(tail -2 "$dir/$name.err")"
    sed -n '/^== kernels/,$p' "$dir/$name.txt" | cut -c1-400
    measure "unprofiled_$name" "$RUN_LIMIT" $(on "$NP") build/trainc --config "$cfg" --quiet --set "run.max_steps=${steps#*:}" \
      --set "run.warmup_steps=$((${steps%:*} - 1))" --set run.epochs=100000 --set run.eval=off \
      --set run.checkpoint_every=0 --set perf.cuda_graph=$graph $SETS_ALL
    python3 - "$dir/$name.txt" "$JSONL" "$name" <<'PY'
import json, sys
prof = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
plain = [json.loads(l) for l in open(sys.argv[2]) if l.strip() and json.loads(l).get("tag") == "unprofiled_" + sys.argv[3]]
if prof and plain and plain[-1].get("step_ms"):
    a, b = prof[-1]["step_ms"], plain[-1]["step_ms"]
    print(f"overhead: profiled step {a:.4f} ms, unprofiled {b:.4f} ms: {100 * (a / b - 1):+.1f}%")
PY
  done
  if [ "$check" != none ]; then
    name=$(basename "$check" .ini)
    [ -s "$dir/$name.json" ] || timeout "$RUN_LIMIT" build/trainc profile --config "$check" --steps "$steps" \
      --trace "$dir/$name.json" $SETS_ALL > "$dir/$name.txt" 2> "$dir/$name.err"
    timeout "$RUN_LIMIT" python3 tools/device/ncu_check.py --trainc build/trainc --config "$check" \
      --trace "$dir/$name.json" --report "$dir/$name.txt" $SETS_ALL 2>&1 | tee "$dir/ncu_check_$name.txt" | cut -c1-300
  fi
}

# infer_run TAG LIMIT CMD...: CMD under `timeout LIMIT`, its output in $LOGS/TAG.log; its
# `infer ` lines printed and appended to $OUT/infer.txt (impl=trainc renamed IMPL_AS if set).
infer_run() {
  local tag=$1 limit=$2 rc lines
  shift 2
  { echo "$ $*"; timeout -k 30 "$limit" "$@"; } > "$LOGS/$tag.log" 2>&1
  rc=$?
  lines=$(grep '^infer ' "$LOGS/$tag.log" | sed "s/ impl=trainc / impl=${IMPL_AS:-trainc} /")
  [ -n "$lines" ] && echo "$lines" | tee -a "$OUT/infer.txt"
  case $rc in 0) return ;; 124 | 137) rc="timed out after $limit s" ;; *) rc="exit $rc" ;; esac
  echo "$tag: FAILED ($rc): $(grep -v '^infer ' "$LOGS/$tag.log" | tail -2 | tr '\n' ' ' | cut -c1-300)"
}

bench_infer() {
  local batches=${INFER_BATCHES:-1,32,256} c cfg model size who mode
  echo "== inference at batches $batches: ${INFER_CASES:-$ALL_INFER_CASES}"
  for c in ${INFER_CASES:-$ALL_INFER_CASES}; do
    model=${c%-*} size=${c##*-} cfg="--config configs/resnet18.ini"
    case $c in
    simplenet-224) cfg="--config configs/final.ini" ;;
    resnet50-224) cfg="$cfg --set model.name=resnet50 --set data.image_size=224" ;;
    esac
    for who in $TRAINCS; do
      IMPL_AS=$([ "${who%%:*}" = base ] && echo trainc-base) infer_run "infer_${c}_${who%%:*}" "$RUN_LIMIT" \
        "${who#*:}" bench-infer $cfg $SETS_ALL --batch "$batches"
    done
    [ "$TORCH" = 1 ] || continue
    infer_run "infer_${c}_torch_graph" "$RUN_LIMIT" python3 tools/torch_infer.py --model "$model" --image-size "$size" \
      --batch "$batches" --mode graph ${TORCH_ARGS:-}
    for mode in ${COMPILE-max-autotune}; do
      [ "$mode" = none ] && continue
      infer_run "infer_${c}_torch_compile_$mode" "${COMPILE_TIMEOUT:-1500}" python3 tools/torch_infer.py \
        --model "$model" --image-size "$size" --batch "$batches" --mode compile --compile-mode "$mode" ${TORCH_ARGS:-}
    done
  done
  [ -s "$OUT/infer.txt" ] && python3 tools/infer_table.py "$OUT/infer.txt" | tee "$OUT/infer.md"
}

# export: train each of EXPORT_CONFIGS, then the checkpoint through trainc eval (the inference path)
# beside the run's own end-of-epoch accuracy, trainc export, PyTorch's accuracy from the export,
# and (32x32 configs) trainc predict on the GPU against onnxruntime on PREDICT_IMAGES test images.
bench_export() {
  local cfg name d steps ck images args
  for cfg in ${EXPORT_CONFIGS:-configs/final.ini configs/resnet18.ini}; do
    name=$(basename "$cfg" .ini) d="$LOGS/export_$name"
    mkdir -p "$d"
    steps=$((50000 / $(cfgtool "$cfg" val train.batch)))
    echo "== export: $cfg${EPOCHS:+, $EPOCHS epochs}, a checkpoint every $steps steps"
    measure "export_${name}_train" "$RUN_LIMIT" build/trainc --config "$cfg" ${EPOCHS:+--set run.epochs=$EPOCHS} $SETS_ALL \
      --set run.checkpoint_every=$steps --set "run.checkpoint_dir=$d/ck"
    ck=$(ls "$d"/ck/ckpt-*.trc 2>/dev/null | sort | tail -1)
    [ -n "$ck" ] || { echo "export: $cfg wrote no checkpoint"; continue; }
    timeout 600 build/trainc eval --checkpoint "$ck" --config "$cfg" $SETS_ALL > "$d/eval.txt" 2>&1
    grep -E "top-1|top-5|loss|inference path" "$d/eval.txt"; tail -1 "$d/eval.txt"
    timeout 300 build/trainc export --checkpoint "$ck" --format safetensors --out "$d/model.safetensors" || continue
    args=""
    if [ "$(cfgtool "$cfg" val data.image_size)" = 32 ]; then
      # PNG copies of test images: both sides decode them to the same pixels (JPEG decoders differ)
      mkdir -p "$d/png"
      find "$DATA/test" -name '*.jpg' | sort | head -"${PREDICT_IMAGES:-64}" | python3 -c "
import os, sys
from PIL import Image
for i, p in enumerate(sys.stdin.read().split()):
    Image.open(p).convert('RGB').save(os.path.join('$d/png', f'{i:03d}.png'))"
      images=$(ls "$d"/png/*.png)
      # shellcheck disable=SC2086
      timeout 300 build/trainc predict --device cuda --json --checkpoint "$ck" $images > "$d/predict.jsonl" 2> "$d/predict.err"
      # shellcheck disable=SC2086
      timeout 300 build/trainc predict --device cpu --json --checkpoint "$ck" $images > "$d/predict_cpu.jsonl" 2>&1
      echo "predict: $(wc -l < "$d/predict.jsonl") images on the GPU, $(head -c 300 "$d/predict.jsonl")"
      args="--onnx $d/model.onnx --predict-json $d/predict.jsonl $d/predict_cpu.jsonl"
    fi
    # shellcheck disable=SC2086
    [ "$TORCH" = 1 ] && timeout 900 python3 tools/torch_load_safetensors.py "$d/model.safetensors" --data "$DATA" $args 2>&1 | grep '^{'
  done
}

bench_stream() {
  local root=${STREAM_ROOT:-/tmp/imnet} n=${STREAM_IMAGES:-40000} steps=${STREAM_STEPS:-120} warm=40
  local cfg="--config configs/imagenet_final.ini --set data.path=$root --set run.eval=off ${STREAM_SETS:-}"
  echo "== stream: $n ImageNet-like images in $root"
  if [ ! -d "$root" ]; then
    timeout 300 python3 tools/make_image_set.py --src "$DATA" --out "$root" --train "$n" --test 1000 \
      > "$LOGS/make_image_set.log" 2>&1; tail -1 "$LOGS/make_image_set.log"
  fi
  timeout 240 build/trainc bench-loader $cfg --quiet 2>&1 | tee "$LOGS/stream_bench_loader.log" | grep -v "^\["
  local run="$cfg --set run.warmup_steps=$warm --set run.max_steps=$((warm + steps)) --set run.log_every=1000"
  measure stream_resident 300 build/trainc $run --set data.resident=on --set data.decode=cpu
  measure stream_gpu_decode 300 build/trainc $run --set data.decode=gpu
  measure stream_cpu_decode 300 build/trainc $run --set data.decode=cpu
  grep -h "data.decode\|data: " "$LOGS"/stream_gpu_decode.log "$LOGS"/stream_cpu_decode.log | cut -c1-240
  if [ "${STREAM_MEMORY:-1}" = 1 ] && [ ! -d "$root-x10" ]; then
    timeout 200 python3 tools/make_image_set.py --src "$DATA" --out "$root-x10" --train "$n" --test 100 --links 10 \
      > "$LOGS/make_image_set_x10.log" 2>&1; tail -1 "$LOGS/make_image_set_x10.log"
  fi
  [ "${STREAM_MEMORY:-1}" = 1 ] && measure stream_memory_x10 300 build/trainc $run --set data.decode=gpu \
    --set data.path="$root-x10"
  python3 - "$JSONL" <<'PY'
import json, sys
rows = {r["tag"]: r for r in map(json.loads, open(sys.argv[1])) if r.get("tag", "").startswith("stream_")}
for tag in ("stream_gpu_decode", "stream_cpu_decode", "stream_memory_x10"):
    r = rows.get(tag, {})
    print(f"{tag}: host peak RSS {r.get('host_peak_rss_bytes', 0) / 2**30:.2f} GiB, data wait "
          f"{100 * (r.get('data_wait_frac') or 0):.1f}%, decode {r.get('data_decode')}")
PY
  [ "$TORCH" = 1 ] || return
  timeout 200 python3 tools/torch_stream.py --mode loader --root "$root" --batches 60 > "$LOGS/torch_loader.json" \
    2> "$LOGS/torch_loader.log"; echo "torch loader: $(tail -1 "$LOGS/torch_loader.json")"
  timeout 200 python3 tools/torch_stream.py --mode decode --root "$root" > "$LOGS/torch_decode.json" \
    2> "$LOGS/torch_decode.log"; echo "torch decode: $(tail -1 "$LOGS/torch_decode.json")"
}

summary() {
  echo
  echo "== summary ($JSONL)"
  python3 - "$JSONL" <<'PY'
import collections, json, re, statistics, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    sys.exit("no runs recorded")
groups = collections.OrderedDict()
for r in rows:  # rounds of one run (_rN) side by side; scaling.py's rows have their own table
    if "tag" in r:
        groups.setdefault(re.sub(r"_r\d+$", "", r["tag"]), []).append(r)
print(f"{'run':<52} {'samples/s (each round)':>28} {'mean':>10} {'step ms':>8} {'acc %':>7} {'peak GiB':>9}")
for tag, rs in groups.items():
    sps = [r.get("samples_per_s") for r in rs]
    ok = [v for v in sps if v]
    last = rs[-1]
    each = " ".join("-" if v is None else f"{v:,.0f}" for v in sps)
    mean = f"{statistics.mean(ok):,.0f}" if ok else "-"
    ms, acc, peak = last.get("step_ms"), last.get("test_acc"), last.get("peak_mem_bytes")
    print(f"{tag:<52} {each:>28} {mean:>10} {'-' if ms is None else f'{ms:.3f}':>8} "
          f"{'-' if acc is None else f'{100 * acc:.2f}':>7} {'-' if peak is None else f'{peak / 2**30:.2f}':>9}")
PY
}

SETS_ALL=${SETS:-}
NCCL_DEBUG_RUNS=VERSION
case "${TRANSPORT:-nccl}" in
  nccl) ;;
  socket)
    MPIRUN="$MPIRUN -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1"
    MPI_ARGS="${MPI_ARGS:-} -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1"
    SETS_ALL="$SETS_ALL --set dist.copy_engine=off" NCCL_DEBUG_RUNS=INFO ;;
  *) echo "bench.sh: TRANSPORT=$TRANSPORT is not nccl or socket" >&2; exit 2 ;;
esac
for what in "$@"; do
  case $what in
  lab) bench_lab ;;
  step) bench_step ;;
  resnet) COMPILE=${COMPILE-max-autotune} bench_step "resnet18-32 resnet50-224"; CONFIG=configs/resnet18.ini bench_acc ;;
  acc) bench_acc ;;
  loader) bench_loader ;;
  scaling) bench_scaling ;;
  memory) echo "== memory grid"; timeout 600 python3 tools/bench_memory.py $SETS_ALL ;;
  phases) bench_phases ;;
  profile) bench_profile ;;
  infer) bench_infer ;;
  export) bench_export ;;
  stream) bench_stream ;;
  esac
  pack_logs
done
summary
pack_logs
echo "done"
