#!/usr/bin/env bash
# The tests on a lent GPU machine (after building: tools/device/prepare.sh).
#
#   bash tools/device/test.sh [PATTERN]
#
# Measures:
#   ctest on the GPU: every test, or those whose name matches PATTERN (ctest -R), e.g.
#     "dist_gpu|ddp" (the data-parallel tests, 2 GPUs or more; the _4 ones 4), "ops_cuda|ops_nhwc", "resnet".
#     The pass/fail lines are printed; the whole output is in $LOGS/ctest.log.
# Parameters (environment):
#   CTEST_LIMIT=s   seconds for ctest (default 420)
#   VERBOSE=1       ctest -V: passing tests' output kept too (e.g. test_resnet's fused-kernel
#                   diagnostics), and GREP=regex prints its matching lines
#   SWEEP=N         then the CPU suite over N TRAINC_TEST_SEED values (from index SEED_FIRST, default 1)
#                   x OPENBLAS_NUM_THREADS=1,2, the GPU hidden (tools/seed_sweep.py, all cores);
#                   SWEEP_TESTS=regex: only those tests; SWEEP_LIMIT=s (default 480)
#   RESUME=1        then SIGTERM in the middle of a deterministic configs/final.ini run and
#                   --resume latest, against the uninterrupted run (the parameters' CRC must match)
#   TESTS=0         no ctest (only SWEEP or RESUME)
#   DRY_RUN=1       check the arguments and stop
#   OUT, LOGS, BUILD_LIMIT: see prepare.sh
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
PATTERN=${1:-}
[ $# -le 1 ] || { echo "test.sh: one PATTERN at most (got $#: $*)" >&2; exit 2; }
[[ "${SWEEP:-0}" =~ ^[0-9]+$ ]] || { echo "test.sh: SWEEP=$SWEEP is not a number of seeds" >&2; exit 2; }
[ "${DRY_RUN:-0}" = 1 ] && { echo "test.sh: would run ctest${PATTERN:+ -R $PATTERN}"; exit 0; }
# shellcheck source=tools/device/prepare.sh
source tools/device/prepare.sh

if [ "${TESTS:-1}" = 1 ]; then
  echo "== ctest on the GPU${PATTERN:+: -R $PATTERN}"
  timeout "${CTEST_LIMIT:-420}" ctest --test-dir build ${PATTERN:+-R "$PATTERN"} --output-on-failure \
    ${VERBOSE:+-V} > "$LOGS/ctest.log" 2>&1
  echo "ctest exit $? (124: timed out)"
  grep -E "Test +#|tests passed|tests failed|CHECK failed" "$LOGS/ctest.log" | head -200
  [ -z "${GREP:-}" ] || grep -E "$GREP" "$LOGS/ctest.log" | head -60
fi

if [ "${SWEEP:-0}" -gt 0 ]; then
  echo "== CPU suite over $SWEEP seeds x OPENBLAS_NUM_THREADS=1,2, GPU hidden"
  CUDA_VISIBLE_DEVICES='' timeout "${SWEEP_LIMIT:-480}" python3 tools/seed_sweep.py --build build --seeds "$SWEEP" \
    --first "${SEED_FIRST:-1}" --threads 1,2 --jobs "$(nproc)" -R "${SWEEP_TESTS:-.}" > "$LOGS/sweep.log" 2>&1
  echo "sweep exit $?"
  grep -vE "^ {4}" "$LOGS/sweep.log" | tail -40
fi

if [ "${RESUME:-0}" = 1 ]; then
  echo "== SIGTERM and --resume latest, configs/final.ini, deterministic"
  crc() { tail -1 | grep -o '"params_crc": [0-9]*'; }
  S=(--config configs/final.ini --set run.eval=off --set run.epochs=1 --set run.max_steps=150
     --set perf.deterministic=on --set perf.conv_benchmark=off)
  whole=$(timeout 120 build/trainc "${S[@]}" --quiet 2>&1 | crc)
  rm -rf /tmp/resume_ck
  # not under timeout: it would pass the signal on a second time
  build/trainc "${S[@]}" --set run.checkpoint_dir=/tmp/resume_ck > "$LOGS/sigterm.out" 2> "$LOGS/sigterm.err" &
  pid=$!
  for _ in $(seq 1 300); do sleep 0.1; grep -q "step 50/" "$LOGS/sigterm.err" 2> /dev/null && break; done
  kill -TERM "$pid"; wait "$pid"
  echo "SIGTERM exit $?: $(grep -o 'stopped by.*' "$LOGS/sigterm.err" | cut -c1-200)"
  resumed=$(timeout 120 build/trainc "${S[@]}" --quiet --set run.checkpoint_dir=/tmp/resume_ck --resume latest 2>&1 | crc)
  echo "uninterrupted $whole; stopped and resumed $resumed: $([ -n "$whole" ] && [ "$whole" = "$resumed" ] && echo same || echo DIFFERENT)"
fi
pack_logs
echo "done"
