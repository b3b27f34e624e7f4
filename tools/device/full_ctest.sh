#!/usr/bin/env bash
# On a lent GPU machine (2 GPUs run the multi-GPU tests too): build, then the
# README's test command, every test, on the GPU.
source tools/device/mpi_session.sh
timeout ${CTEST_LIMIT:-420} ctest --test-dir build --output-on-failure > "$OUT/ctest.log" 2>&1
echo "ctest exit $?"
grep -E "Test +#|tests passed|tests failed" "$OUT/ctest.log"
