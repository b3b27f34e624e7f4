#!/usr/bin/env bash
# On the lent GPU machine: unpack CIFAR-10 and build trainc with the carried
# Debian packages in .deps/ (tools/device/carry_deps.sh).
# Here, before the call:  mkdir -p .data && cp ../shared/data/cifar10-jpg.tar.gz .data/
set -euo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
[ -d .data/cifar10-jpg ] || tar xzf .data/cifar10-jpg.tar.gz -C .data
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTB_ROOT="$PWD/.deps/stb" -DCJSON_ROOT="$PWD/.deps/cjson" \
  -DZLIB_ROOT="$PWD/.deps/zlib/usr" > "$OUT/cmake.log" 2>&1 \
  || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build -j"$(nproc)" > "$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
echo "built"
