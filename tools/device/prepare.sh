#!/usr/bin/env bash
# The set-up of a lent GPU machine, on both sides of a device call.
#
#   bash tools/device/prepare.sh carry     here, before the call: unpacks the Debian
#       packages the GPU machine lacks (stb_image, libcjson, zlib's headers, libjpeg-turbo) into .deps/
#       and copies CIFAR-10 into .data/ (both git-ignored); name .deps and .data (and
#       .base, when BASE is used) in the call's carry.
#   bash tools/device/prepare.sh           there: prints the cards, unpacks CIFAR-10,
#       builds this tree into build/ (Release) and, with BASE=dir, that tree into
#       build-base/. test.sh and bench.sh source it first, which also sends
#       everything they print to $OUT/log.txt, lets Open MPI run as root and keeps
#       NVLink multicast off.
#
# Parameters (environment):
#   OUT=dir    what comes back from the call (default /tmp/out): log.txt, logs.tar.gz
#   LOGS=dir   build and run logs, packed into $OUT/logs.tar.gz by pack_logs (default /tmp/trainc_logs)
#   BASE=dir   a second tree built beside, for before/after in the same call, e.g.
#              here: rm -rf .base && mkdir .base && git archive HEAD~1 | tar x -C .base
#   BUILD_LIMIT=s  seconds each build may take (default 900)
#   NO_BUILD=1 use the builds already there (scripts started side by side after one build)
#   BUILD_TARGETS="trainc"  build only these targets (default all: the tests too)
#   CMAKE_ARGS="-DTRAINC_WITH_NVJPEG=OFF"  more options for the first configure
#   TORCHINDUCTOR_CACHE_DIR=dir  torch.compile's cache (default build/torchinductor, kept while
#              the machine stays warm)

carry_packages() {
  set -euo pipefail
  cd "$(dirname "${BASH_SOURCE[0]}")/../.."
  local tmp p
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download libstb-dev libstb0 libcjson-dev libcjson1 zlib1g-dev libjpeg62-turbo-dev \
    libjpeg62-turbo > /dev/null 2>&1)
  rm -rf .deps && mkdir -p .deps/stb .deps/cjson .deps/zlib .deps/jpeg
  for p in libstb-dev libstb0; do dpkg -x "$tmp/${p}_"*.deb .deps/stb; done
  for p in libcjson-dev libcjson1; do dpkg -x "$tmp/${p}_"*.deb .deps/cjson; done
  dpkg -x "$tmp/zlib1g-dev_"*.deb .deps/zlib
  for p in libjpeg62-turbo-dev libjpeg62-turbo; do dpkg -x "$tmp/${p}_"*.deb .deps/jpeg; done
  rm -rf "$tmp"
  mkdir -p .data
  [ -f .data/cifar10-jpg.tar.gz ] || cp ../shared/data/cifar10-jpg.tar.gz .data/
  du -sh .deps .data/cifar10-jpg.tar.gz
}

# build_tree SRC BUILD_DIR: a Release build with the carried packages; the error lines on failure.
build_tree() {
  local deps=$PWD/.deps name
  name=$(basename "$2")
  timeout "${BUILD_LIMIT:-900}" cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DSTB_ROOT="$deps/stb" \
    -DCJSON_ROOT="$deps/cjson" -DZLIB_ROOT="$deps/zlib/usr" -DLIBJPEG_ROOT="$deps/jpeg" ${CMAKE_ARGS:-} \
    > "$LOGS/cmake-$name.log" 2>&1 || { tail -20 "$LOGS/cmake-$name.log"; return 1; }
  timeout "${BUILD_LIMIT:-900}" cmake --build "$2" -j"$(nproc)" --target ${BUILD_TARGETS:-all} > "$LOGS/build-$name.log" 2>&1 \
    || { grep -E "error|Error" "$LOGS/build-$name.log" | head -40; return 1; }
}

pack_logs() { timeout 120 tar czf "$OUT/logs.tar.gz" -C "$LOGS" . 2> /dev/null; }

prepare_machine() {
  export OUT=${OUT:-/tmp/out} LOGS=${LOGS:-/tmp/trainc_logs}
  mkdir -p "$OUT" "$LOGS"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  # torch.compile's cache (its autotuning timings, its kernels) in build/, which a warm machine
  # keeps between calls (an ignored folder of another name was not kept): a max-autotune compile
  # cut off by one call's time limit goes on from its finished autotunings in the next call.
  export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/build/torchinductor}
  timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  [ -d .data/cifar10-jpg ] || { [ -f .data/cifar10-jpg.tar.gz ] && tar xzf .data/cifar10-jpg.tar.gz -C .data; }
  if [ "${NO_BUILD:-0}" != 1 ]; then
    build_tree . build || return 1
  fi
  [ -x build/trainc ] || { echo "prepare.sh: no build/trainc (NO_BUILD=1 needs an earlier build)"; return 1; }
  echo "built: $(build/trainc --version | tr '\n' ';')"
  if [ -n "${BASE:-}" ]; then
    [ -f "$BASE/CMakeLists.txt" ] || { echo "prepare.sh: BASE=$BASE holds no source tree"; return 1; }
    if [ "${NO_BUILD:-0}" != 1 ]; then
      build_tree "$BASE" build-base || return 1
    fi
    [ -x build-base/trainc ] || { echo "prepare.sh: no build-base/trainc"; return 1; }
    echo "built BASE: $(build-base/trainc --version | tr '\n' ';')"
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run, not sourced
  case "${1:-}" in
  carry) carry_packages ;;
  "") set -uo pipefail; prepare_machine ;;
  *) echo "prepare.sh: unknown argument '$1' (carry, or none on the GPU machine)" >&2; exit 2 ;;
  esac
else  # sourced by test.sh, bench.sh
  set -uo pipefail
  export OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/log.txt") 2>&1
  prepare_machine || exit 1
fi
