#!/usr/bin/env bash
# Configures build/ once (with CUDA when the toolkit is found, CPU-only
# otherwise) and builds what changed.
#   tools/build.sh [cmake -D options for the first configure...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build build -j"$(nproc)"
