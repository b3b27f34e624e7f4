# Sourced by the multi-GPU device scripts: everything they print goes to
# $OUT/log.txt too (at most 8 files come back from a call, so one log holds
# it all), Open MPI may run as root, NVLink multicast stays off, and trainc is
# built (tools/device/prepare.sh; its log in /tmp/prepare.log).
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
OUT=/tmp/prep timeout 300 bash tools/device/prepare.sh > /tmp/prepare.log 2>&1 || { tail -30 /tmp/prepare.log; exit 1; }
