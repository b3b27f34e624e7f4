#!/usr/bin/env bash
# A one-node Slurm on this machine, from Debian's slurm-wlm and munge: the
# controller and the node daemon on this host, MPI through PMIx, so that
# `srun -n 2 trainc ...` runs here as on a cluster (tests/test_slurm.c).
# CI starts it before the tests and stops it after them.
#   tools/slurm_local.sh start    write /etc/slurm/slurm.conf (unless one not
#                                 ours is there), start munged, slurmctld and
#                                 slurmd, wait until the node takes jobs
#   tools/slurm_local.sh stop     end the daemons this script started
# Needs root. State and logs: $SLURM_LOCAL_DIR (default /tmp/trainc-slurm).
set -euo pipefail
state=${SLURM_LOCAL_DIR:-/tmp/trainc-slurm}
conf=/etc/slurm/slurm.conf
mark="# written by trainc's tools/slurm_local.sh"

fail() { echo "slurm_local: $*" >&2; exit 1; }

write_conf() {
  local host
  host=$(hostname)
  [ ! -f "$conf" ] || grep -qF "$mark" "$conf" || fail "$conf is not ours: not touching it"
  mkdir -p /etc/slurm "$state/ctld" "$state/slurmd" "$state/log"
  cat > "$conf" <<CONF
$mark
ClusterName=trainc-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=pmix
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/slurmd
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
NodeName=$host CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
}

start() {
  [ "$(id -u)" = 0 ] || fail "needs root"
  command -v slurmctld > /dev/null && command -v munged > /dev/null ||
    fail "slurm-wlm and munge are not installed (tools/install_deps.sh --ci installs them)"
  write_conf
  mkdir -p /run/munge
  chown munge:munge /run/munge
  if ! pgrep -x munged > /dev/null; then
    runuser -u munge -- munged --force
    touch "$state/started-munged"
  fi
  slurmctld
  slurmd
  for _ in $(seq 60); do
    case $(sinfo -h -o %t 2> /dev/null) in idle*|mix*|alloc*) echo "slurm_local: up ($(hostname), $(nproc) CPUs)"; return 0 ;; esac
    sleep 0.5
  done
  tail -n 5 "$state"/log/*.log >&2 || true
  fail "the node did not come up in 30 s (logs in $state/log)"
}

stop() {
  [ -f "$state/slurmd.pid" ] && kill "$(cat "$state/slurmd.pid")" 2> /dev/null || true
  [ -f "$state/slurmctld.pid" ] && kill "$(cat "$state/slurmctld.pid")" 2> /dev/null || true
  [ -f "$state/started-munged" ] && pkill -x munged || true
  rm -f "$state/started-munged"
  for _ in $(seq 50); do
    pgrep -x slurmctld > /dev/null || pgrep -x slurmd > /dev/null || break
    sleep 0.2
  done
  echo "slurm_local: stopped"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*) fail "usage: tools/slurm_local.sh start|stop" ;;
esac
