#!/usr/bin/env bash
# A real single-node Slurm (with munge) on this machine, for tests and trying cluster=slurm.
#
# Usage: scripts/slurm_local.sh up|down|status|env
#   up      install Debian's slurmctld/slurmd/slurm-client/munge if missing (needs root),
#           start munged, slurmctld and slurmd by hand (no systemd), wait until the node
#           is idle, and write $SLURM_LOCAL_DIR/env.sh. Idempotent: "up" when up is fine.
#   down    stop slurmd and slurmctld (and munged if this script started it).
#   status  exit 0 and print the node state if the cluster answers, else exit 1.
#   env     print the lines of env.sh (source them, or `eval "$(scripts/slurm_local.sh env)"`).
#
# Every Slurm client (sbatch, squeue, submitit) needs SLURM_CONF exported, and submitit
# needs `sacct`: with no accounting daemon, $SLURM_LOCAL_DIR/bin/sacct (scripts/sacct_shim)
# answers its query from squeue/scontrol. env.sh sets both.
#
# Everything Slurm writes lives under $SLURM_LOCAL_DIR (default /tmp/rlharness-slurm);
# munge uses its standard system paths (/run/munge, /etc/munge/munge.key).
# Facts this follows: ../shared/ENVIRONMENT.md, section "Slurm".
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${SLURM_LOCAL_DIR:-/tmp/rlharness-slurm}
CONF=$DIR/etc/slurm.conf
ENV_FILE=$DIR/env.sh
UP_TIMEOUT_S=${SLURM_LOCAL_UP_TIMEOUT_S:-60}
NODE=$(hostname -s)

log() { echo "slurm_local: $*" >&2; }
die() { log "error: $*"; exit 2; }

have_slurm() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null; }

install_packages() {
  have_slurm && return 0
  [ "$(id -u)" = 0 ] || die "Slurm/munge are not installed and installing them needs root (apt-get install slurmctld slurmd slurm-client munge)"
  command -v apt-get >/dev/null || die "Slurm/munge are not installed and there is no apt-get to install them"
  log "installing slurmctld slurmd slurm-client munge"
  local pkgs="slurmctld slurmd slurm-client munge"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q --no-install-recommends $pkgs >"$DIR/apt.log" 2>&1; then
    apt-get update -q >>"$DIR/apt.log" 2>&1 || true
    apt-get install -y -q --no-install-recommends $pkgs >>"$DIR/apt.log" 2>&1 \
      || die "apt-get install $pkgs failed; see $DIR/apt.log"
  fi
  have_slurm || die "packages installed but slurmctld/slurmd/sbatch/munged are still not on PATH"
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  munge_ok && return 0
  [ "$(id -u)" = 0 ] || die "munged is not running and starting it needs root"
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge /etc/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged --force
  touch "$DIR/run/munged.started-by-us"
  for _ in $(seq 1 50); do munge_ok && return 0; sleep 0.1; done
  die "munged started but 'munge -n | unmunge' still fails; see /var/log/munge/munged.log"
}

write_conf() {
  local cpus mem_mb
  cpus=$(nproc)
  # RealMemory a bit under MemTotal, else slurmd registers the node as invalid.
  mem_mb=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
  cat >"$CONF.new" <<EOF
# Written by scripts/slurm_local.sh: single node on localhost, no accounting, no cgroups.
ClusterName=rlharness
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# Finished jobs stay visible to squeue/scontrol (the sacct shim reads them) this long.
MinJobAge=300
SchedulerType=sched/backfill
JobRequeue=1
SlurmctldPort=${SLURM_LOCAL_CTLD_PORT:-6817}
SlurmdPort=${SLURM_LOCAL_SLURMD_PORT:-6818}
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  mv "$CONF.new" "$CONF"
}

write_env() {
  install -d "$DIR/bin"
  install -m 0755 "$HERE/sacct_shim" "$DIR/bin/sacct"
  cat >"$ENV_FILE" <<EOF
export SLURM_CONF=$CONF
export PATH=$DIR/bin:\$PATH
EOF
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

node_state() { SLURM_CONF=$CONF timeout 10 sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1; }

cmd_up() {
  install -d "$DIR" "$DIR/etc" "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run" "$DIR/bin"
  install_packages
  start_munge
  write_env
  if pid_alive "$DIR/run/slurmctld.pid" && pid_alive "$DIR/run/slurmd.pid"; then
    log "already up"
  else
    [ "$(id -u)" = 0 ] || die "starting slurmctld/slurmd here needs root (SlurmUser=root, no cgroups)"
    write_conf
    pid_alive "$DIR/run/slurmctld.pid" || slurmctld -f "$CONF"
    pid_alive "$DIR/run/slurmd.pid" || slurmd -f "$CONF"
  fi
  local state="" deadline=$((SECONDS + UP_TIMEOUT_S))
  while [ $SECONDS -lt $deadline ]; do
    state=$(node_state || true)
    case "$state" in
      idle|mixed|allocated|completing) break ;;
      down*|drain*|fail*) SLURM_CONF=$CONF scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.5
  done
  case "$state" in
    idle|mixed|allocated|completing) ;;
    *) die "node $NODE is '${state:-not answering}' after ${UP_TIMEOUT_S}s; see $DIR/log/slurmctld.log and slurmd.log" ;;
  esac
  log "up: node $NODE $state; env in $ENV_FILE"
  cat "$ENV_FILE"
}

stop_pidfile() {
  local f=$1 name=$2
  pid_alive "$f" || { rm -f "$f"; return 0; }
  local pid
  pid=$(cat "$f")
  kill "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || { rm -f "$f"; return 0; }; sleep 0.1; done
  log "$name (pid $pid) did not stop in 10 s; sending SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
}

cmd_down() {
  stop_pidfile "$DIR/run/slurmd.pid" slurmd
  stop_pidfile "$DIR/run/slurmctld.pid" slurmctld
  if [ -e "$DIR/run/munged.started-by-us" ]; then
    stop_pidfile /run/munge/munged.pid munged
    rm -f "$DIR/run/munged.started-by-us"
  fi
  log "down"
}

cmd_status() {
  local state
  state=$(node_state || true)
  if [ -n "$state" ]; then
    echo "node $NODE: $state"
    SLURM_CONF=$CONF squeue 2>/dev/null || true
    return 0
  fi
  echo "not up (no answer from slurmctld with SLURM_CONF=$CONF)"
  return 1
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) [ -s "$ENV_FILE" ] || die "no $ENV_FILE: run '$0 up' first"; cat "$ENV_FILE" ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 64 ;;
esac
