#!/usr/bin/env bash
# Installs the Debian packages trainc builds with, where they are missing and
# this user can (root, or sudo without a password); otherwise prints the
# command to run. Exit 1 only when a package the build needs is missing.
#   tools/install_deps.sh          what the build and the tests need
#   tools/install_deps.sh --ci     also what CI alone uses (the fuzzers' clang, libFuzzer, symbolizer)
set -euo pipefail

required=(cmake pkg-config libstb-dev zlib1g-dev libcjson-dev)
# Without these trainc still builds: plain loops instead of BLAS, one process
# instead of MPI ranks.
optional=(libopenblas-dev libopenmpi-dev openmpi-bin)
[ "${1:-}" = --ci ] && optional+=(clang libclang-rt-dev llvm)

missing() {
  local pkg
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || echo "$pkg"; done
}

if ! command -v dpkg >/dev/null; then
  echo "install_deps: not a Debian-like system; install by hand: ${required[*]} (and optionally ${optional[*]})" >&2
  exit 0
fi
mapfile -t need < <(missing "${required[@]}" "${optional[@]}")
[ ${#need[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=(sudo -n); else sudo=(none); fi
fi
if [ "${sudo[0]:-}" != none ]; then
  echo "install_deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null; then
    exit 0
  fi
  echo "install_deps: apt-get failed" >&2
fi
mapfile -t need_required < <(missing "${required[@]}")
echo "install_deps: missing packages: ${need[*]}; install them with:" >&2
echo "    sudo apt-get install ${need[*]}" >&2
[ ${#need_required[@]} -eq 0 ] || exit 1
echo "install_deps: going on without them (slower CPU path, no MPI)" >&2
