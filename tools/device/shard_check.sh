#!/usr/bin/env bash
# On a lent 2-GPU machine: dist.shard_optimizer. The data-parallel tests
# (test_ddp_train, test_dist_gpu), then SimpleNet-224 and ResNet-18-32 steps
# with a batch kept on each GPU: 1 GPU (each of the two alone), and 2 GPUs with
# the optimizer sharded and not, interleaved ROUNDS times (one warm machine,
# the same build). TESTS=0: no tests; TRACE=1: then a kernel trace of
# SimpleNet-224 on 1 and 2 GPUs (trace_summary.py, the SLOW slowest steps).
source tools/device/mpi_session.sh
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE=0"
R="--quiet --set data.resident=on --set run.eval=off --set run.epochs=100 --set run.warmup_steps=30 --set run.max_steps=230"
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${CTEST_LIMIT:-300} ctest --test-dir build -R "test_ddp_train|test_dist_gpu" --output-on-failure \
    > "$OUT/ctest.log" 2>&1
  echo "ctest exit $?"
  grep -E "Test +#|tests passed|tests failed" "$OUT/ctest.log"
fi
summary() { python3 -c "import json,sys; s=json.loads(sys.stdin.read().strip().splitlines()[-1]); print('%.3f ms/step %.0f samples/s' % (s['step_ms'], s['samples_per_s']))" 2>/dev/null || echo failed; }
for round in $(seq 1 "${ROUNDS:-2}"); do
  for cfg in configs/ddp.ini configs/resnet18.ini; do
    for gpu in 0 1; do
      echo "$cfg 1 GPU (GPU $gpu): $(CUDA_VISIBLE_DEVICES=$gpu timeout 90 build/trainc --config $cfg $R 2>/dev/null | summary)"
    done
    for shard in off on; do
      echo "$cfg 2 GPUs shard $shard: $(timeout 90 $MPI -np 2 build/trainc --config $cfg $R \
        --set dist.shard_optimizer=$shard 2>>"$OUT/runs.err" | summary)"
    done
  done
done
if [ "${TRACE:-0}" = 1 ]; then
  bash tools/device/kernel_trace_build.sh
  for np in 1 2; do
    dir=/tmp/trace_simplenet$np; rm -rf "$dir"; mkdir -p "$dir"
    timeout 120 $MPI -np $np -x CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so -x KERNEL_TRACE_DIR=$dir \
      build/trainc --config configs/ddp.ini $R --set run.max_steps=120 > /dev/null 2>>"$OUT/runs.err"
    echo "== simplenet $np GPU(s), traced"
    python3 tools/device/trace_summary.py "$dir" --skip 40 --top ${TOP:-14} --slow ${SLOW:-6}
  done
fi
