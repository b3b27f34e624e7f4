#!/usr/bin/env bash
# Builds if needed and runs the tests; tests that need a GPU (or MPI, or CUDA
# in a CPU-only build) say why they skipped.
#   tools/test.sh [ctest options...]      e.g. tools/test.sh -R test_config
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
ctest --test-dir build --output-on-failure "$@"
