#!/usr/bin/env bash
# trainc's first run in one command: installs the missing Debian packages
# (when this user can), builds, gets CIFAR-10, then trains configs/final.ini on
# the GPU, or configs/cpu.ini on the CPU when no GPU is visible.
#   tools/start.sh [more trainc arguments...]     e.g. tools/start.sh --set run.epochs=1
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install_deps.sh
tools/build.sh
data=$(tools/get_data.sh) # "data.source=S data.path=P", or the instructions and exit 1
sets=()
for kv in $data; do sets+=(--set "$kv"); done

gpus=$(build/trainc --version | sed -n 's/^gpus: *\([0-9]*\).*/\1/p')
if [ "${gpus:-0}" -gt 0 ]; then
  config=configs/final.ini
else
  config=configs/cpu.ini
  why=$(build/trainc --version | sed -n 's/^gpus: *[0-9]* *(\(.*\))$/\1/p') # "gpus: 0 (why)"
  echo "start: no GPU to train on (${why:-unknown}): training $config on the CPU instead of configs/final.ini"
fi
echo "start: build/trainc --config $config ${sets[*]} $*"
exec build/trainc --config "$config" "${sets[@]}" "$@"
