#!/usr/bin/env bash
# On a lent GPU machine: build, then any of
#   tests   every test on the GPU (ctest)
#   sweep   the CPU suite over SEEDS TRAINC_TEST_SEED values (from index SEED_FIRST) and OPENBLAS_NUM_THREADS=1,2,
#           the GPU hidden (tools/seed_sweep.py, all cores)
#   speed   the training step alone (batch on the GPU), this tree against the tree in
#           $BASE (e.g. `git archive HEAD~1 | tar x -C .base`), interleaved A B A B
# Usage: PARTS="tests speed" BASE=.base bash tools/device/verify.sh
# Here, before the call: tools/device/carry_deps.sh (the Debian packages the GPU machine lacks).
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
PARTS=${PARTS:-tests}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

build() { # build SRC_DIR BUILD_DIR
  local deps=$PWD/.deps
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DSTB_ROOT="$deps/stb" -DCJSON_ROOT="$deps/cjson" \
    -DZLIB_ROOT="$deps/zlib/usr" > "$OUT/cmake-$(basename "$2").log" 2>&1 || { tail -20 "$OUT/cmake-$(basename "$2").log"; return 1; }
  cmake --build "$2" -j"$(nproc)" > "$OUT/build-$(basename "$2").log" 2>&1 \
    || { grep -E "error" "$OUT/build-$(basename "$2").log" | head -20; return 1; }
}
[ -d .data/cifar10-jpg ] || { [ -f .data/cifar10-jpg.tar.gz ] && tar xzf .data/cifar10-jpg.tar.gz -C .data; }
build . build || exit 1
echo "built; $(build/trainc --version | tr '\n' ';')"

if [[ " $PARTS " == *" tests "* ]]; then
  echo "== every test on the GPU"
  timeout ${CTEST_LIMIT:-420} ctest --test-dir build --output-on-failure > "$OUT/ctest.log" 2>&1
  echo "ctest exit $?"
  grep -E "Test +#|tests passed|tests failed" "$OUT/ctest.log"
fi

if [[ " $PARTS " == *" sweep "* ]]; then
  echo "== CPU suite over ${SEEDS:-20} seeds x OPENBLAS_NUM_THREADS=1,2, GPU hidden"
  CUDA_VISIBLE_DEVICES= timeout ${SWEEP_LIMIT:-480} python3 tools/seed_sweep.py --build build --seeds "${SEEDS:-20}" --first "${SEED_FIRST:-1}" \
    --threads 1,2 --jobs "$(nproc)" -R "${SWEEP_TESTS:-.}" > "$OUT/sweep.log" 2>&1
  echo "sweep exit $?"
  grep -vE "^ {4}" "$OUT/sweep.log" | tail -40
fi

if [[ " $PARTS " == *" speed "* ]]; then
  echo "== step alone: $BASE (base) against this tree (new), samples/s"
  build "$BASE" build-base || exit 1
  R="--set data.resident=on --set run.eval=off --set run.epochs=1000 --quiet"
  cases=("simplenet-32 final|--config configs/final.ini $R --set data.image_size=32 --set train.batch=512|100|1000"
         "simplenet-224 final|--config configs/final.ini $R|20|200"
         "resnet18-32|--config configs/resnet18.ini $R|50|600"
         "simplenet-224 model (fp32, no graph)|--config configs/model.ini $R|20|100")
  sps() { "$1"/trainc $2 --set run.warmup_steps="$3" --set run.max_steps=$(($3 + $4)) 2>/dev/null | tail -1 \
          | python3 -c 'import json,sys; print(round(json.loads(sys.stdin.read())["samples_per_s"]))' 2>/dev/null || echo failed; }
  for c in "${cases[@]}"; do
    IFS='|' read -r name args warm steps <<< "$c"
    line="$name:"
    for round in 1 2; do
      line+=" base $(sps build-base "$args" "$warm" "$steps") new $(sps build "$args" "$warm" "$steps")"
    done
    echo "$line"
  done
fi
echo done
