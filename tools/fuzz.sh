#!/usr/bin/env bash
# Fuzzes the readers of files trainc is given (INI configs with includes and
# --set, image folders, CIFAR-10 batches, checkpoints, WebDataset shards, safetensors files, the
# checkpoint's meta and tensors JSON, net files) with clang's libFuzzer
# under AddressSanitizer and UndefinedBehaviorSanitizer, each for
# SECONDS_PER_TARGET (default 15).
#   tools/fuzz.sh [SECONDS_PER_TARGET]
# Everything stays in build-fuzz/ (git-ignored): the build of tests/fuzz/,
# seeds/ (made afresh each run by fuzz_seeds), corpus/<target>/ (what the
# fuzzer found interesting; it grows from run to run), logs/<target>.log and
# crashes/<target>-* (inputs that failed). Exits non-zero when any target
# failed, after printing its report, its input and the command that replays it.
# FUZZ_SEED=n fixes libFuzzer's random seed (CI: 1, so that a clean checkout
# tries the same inputs each time); unset, each run draws its own.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-15}
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: tools/fuzz.sh [SECONDS_PER_TARGET]  (a whole number of seconds, not '$seconds')" >&2
  exit 2
fi
out=$PWD/build-fuzz

cmake -S tests/fuzz -B "$out" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$out" -j2 >/dev/null
rm -rf "$out/seeds" "$out/tmp"
mkdir -p "$out/tmp" "$out/crashes" "$out/logs"
"$out/fuzz_seeds" "$out/seeds"
mkdir -p "$out/seeds/netfile" && cp nets/*.net "$out/seeds/netfile/" # the shipped nets

# The targets' scratch files go under build-fuzz/tmp, removed at the end.
export TMPDIR=$out/tmp
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
symbolizer=$(command -v llvm-symbolizer || ls /usr/lib/llvm-*/bin/llvm-symbolizer 2>/dev/null | tail -1 || true)
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH=$symbolizer UBSAN_SYMBOLIZER_PATH=$symbolizer

# CIFAR inputs need room for a few 3073-byte records.
declare -A max_len=([config]=4096 [image_folder]=4096 [cifar]=16384 [checkpoint]=4096 [shards]=16384
  [safetensors]=4096 [ckpt_json]=4096 [netfile]=8192)

# Prints a failed target's report, the input's bytes and how to replay it.
report_failure() {
  local target=$1 log=$2
  echo "---- fuzz_$target failed; the end of $log:"
  tail -n 60 "$log"
  local unit
  unit=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
  if [ -n "$unit" ] && [ -f "$unit" ]; then
    echo "---- the input ($(wc -c <"$unit") bytes, first 512 in hex): $unit"
    head -c 512 "$unit" | od -An -tx1 -v
    echo "---- replay: FUZZ_VERBOSE=1 TMPDIR=/tmp $out/fuzz_$target $unit"
  fi
}

failed=()
for target in config image_folder cifar checkpoint shards safetensors ckpt_json netfile; do
  mkdir -p "$out/corpus/$target"
  log=$out/logs/$target.log
  extra=()
  [ "$target" = config ] && extra+=(-dict="$out/seeds/config.dict")
  [ "$target" = netfile ] && extra+=(-dict=tests/fuzz/netfile.dict)
  [ -n "${FUZZ_SEED:-}" ] && extra+=(-seed="$FUZZ_SEED")
  if "$out/fuzz_$target" "$out/corpus/$target" "$out/seeds/$target" -max_total_time="$seconds" \
      -max_len="${max_len[$target]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/crashes/$target-" "${extra[@]}" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    corpus=$(ls "$out/corpus/$target" | wc -l)
    echo "fuzz_$target: no findings in ${seconds} s ($runs inputs, corpus $corpus)"
  else
    failed+=("$target")
    report_failure "$target" "$log"
  fi
done
rm -rf "$out/tmp"

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found problems in: ${failed[*]} (inputs in $out/crashes/)" >&2
  exit 1
fi
