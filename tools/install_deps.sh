#!/usr/bin/env bash
# Installs the Debian packages trainc builds with, where they are missing and
# this user can (root, or sudo without a password); otherwise prints the
# command to run. Exit 1 only when a package the build needs is missing.
#   tools/install_deps.sh          what the build and the tests need
#   tools/install_deps.sh --ci     also what CI alone uses (the fuzzers' clang, libFuzzer, symbolizer;
#                                  pip and PyPI's tensorboard; Slurm and munge; Chromium)
set -euo pipefail
ci=0
[ "${1:-}" = --ci ] && ci=1

required=(cmake pkg-config libstb-dev zlib1g-dev libcjson-dev libjpeg62-turbo-dev)
# Without these trainc still builds: plain loops instead of BLAS, one process
# instead of MPI ranks.
optional=(libopenblas-dev libopenmpi-dev openmpi-bin)
# CI also starts a one-node Slurm for test_slurm (tools/slurm_local.sh).
[ $ci = 1 ] && optional+=(clang libclang-rt-dev llvm python3-pip slurm-wlm munge)
# CI opens trainc profile --html's page in headless Chromium (test_profile_html; it skips without it).
[ $ci = 1 ] && optional+=(chromium)

# CI only: test_tensorboard_py reads run.tensorboard_dir's event files with
# TensorBoard's own reader, the one check of the writer that is not trainc's
# code; no Debian 12 package has it, so pip installs it (quietly, for the user
# where the system Python refuses: PEP 668). Without it that test skips.
install_tensorboard() {
  python3 -c 'import tensorboard' 2>/dev/null && return 0
  echo "install_deps: pip install tensorboard"
  python3 -m pip install --quiet --disable-pip-version-check tensorboard 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages tensorboard ||
    echo "install_deps: pip could not install tensorboard: test_tensorboard_py will skip" >&2
}
# On every way out, after apt-get: the steps below exit early.
[ $ci = 1 ] && trap install_tensorboard EXIT

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
