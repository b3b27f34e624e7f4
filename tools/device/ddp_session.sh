#!/usr/bin/env bash
# On a lent 2-GPU machine, in one call: the multi-GPU tests (synchronized
# batch norm and data-parallel training on the GPU included), then issue 7's
# runs (tools/device/issue7_bench.sh) sized to fit a short device budget: three
# loader epochs per scaling run (resnet18.ini warms up for two), 150 timed
# resident steps, 3-epoch accuracy runs.
source tools/device/mpi_session.sh
echo "== multi-GPU tests"
timeout 150 ctest --test-dir build -R "dist|ddp" --output-on-failure > /tmp/ctest_dist.log 2>&1
grep -E "tests passed|Failed|CHECK failed" /tmp/ctest_dist.log | head
grep -iE "sync.?bn|synchronized" /tmp/ctest_dist.log | head -6
PARTS=${PARTS:-"simplenet-resident resnet18-resident simplenet-loader resnet18-loader acc"} \
  STEPS=150 WARM=20 LOADER_EPOCHS=3 RUN_LIMIT=150 ACC_EPOCHS=3 GPUS=1,2 bash tools/device/issue7_bench.sh
rm -f "$OUT"/scaling_*.svg  # at most 8 files come back; the tables are in the log
