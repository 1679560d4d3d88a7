#!/usr/bin/env bash
# A real Slurm (with munge) of one or more compute nodes on this one machine, for tests and
# trying cluster=slurm.
#
# Usage: scripts/slurm_local.sh up [--nodes N] [--gpus G] | down | status | env
#   up      install Debian's slurmctld/slurmd/slurm-client/munge if missing (needs root),
#           start munged, slurmctld (at 127.0.0.1) and one slurmd per node by hand (no
#           systemd), wait until every node is idle, and write $SLURM_LOCAL_DIR/env.sh.
#           Node i (1..N) is "rlh-node<i>" at 127.0.0.<i+1>, slurmd port 6817+i: its slurmd
#           runs in a UTS namespace of its own (so `hostname` in its jobs says rlh-node<i>)
#           and a mount namespace whose /etc/hosts also names every node (so a job can
#           resolve the other nodes; the machine's /etc/hosts is not touched). Addresses
#           are loopback ones (all of 127/8 reaches lo): no interface or route is created.
#           Each node advertises G GPUs as a count-only GRES (no device behind it), so GPU
#           requests are scheduled and shown by `scontrol show job`.
#           Idempotent: "up" with the same N when up is fine; another N restarts it.
#   down    cancel every job, stop every slurmd, slurmctld (and munged if this script
#           started it), end any process left in a node's namespace (a job's steps outlive
#           slurmd), so the namespaces go; remove $SLURM_LOCAL_DIR. Nothing up: a no-op.
#   status  exit 0 and print the node states if the cluster answers, else exit 1.
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
CTLD_PORT=${SLURM_LOCAL_CTLD_PORT:-6817}
NODE_PREFIX=rlh-node
NODES=1
GPUS=${SLURM_LOCAL_GPUS:-2}

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

node_name() { echo "$NODE_PREFIX$1"; }
node_addr() { echo "127.0.0.$(($1 + 1))"; }
node_list() { local i; for i in $(seq 1 "$NODES"); do printf '%s\n' "$(node_name "$i")"; done; }

write_conf() {
  local cpus mem_mb i gres_line=""
  cpus=$(nproc)
  # RealMemory a bit under MemTotal (else slurmd registers the node as invalid), shared out.
  mem_mb=$(awk -v n="$NODES" '/MemTotal/ {printf "%d", $2 / 1024 * 0.9 / n}' /proc/meminfo)
  if [ "$GPUS" -gt 0 ]; then gres_line="Gres=gpu:$GPUS"; fi
  cat >"$CONF.new" <<EOF
# Written by scripts/slurm_local.sh: $NODES node(s) on loopback addresses, no accounting, no cgroups.
ClusterName=rlharness
SlurmctldHost=$(hostname -s)(127.0.0.1)
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
# Finished jobs stay visible to squeue/scontrol (the sacct shim reads them) this long: an hour,
# so that a slow submitter on a loaded box still reads a job's final state, as sacct would.
MinJobAge=3600
SchedulerType=sched/backfill
JobRequeue=1
# A job asking for more than the partition has (nodes, GPUs per node) is refused at sbatch, not left pending forever.
EnforcePartLimits=ALL
GresTypes=gpu
SlurmctldPort=$CTLD_PORT
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
EOF
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") Port=$((CTLD_PORT + i)) CPUs=$cpus RealMemory=$mem_mb $gres_line State=UNKNOWN"
  done >>"$CONF.new"
  echo "PartitionName=debug Nodes=$(node_list | paste -sd,) Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$CONF.new"
  mv "$CONF.new" "$CONF"
  # Count-only GPUs: Slurm 22.05 drops a gres/gpu without File=, so each "GPU" is an empty
  # placeholder file under $DIR/dev (nothing opens it; no cgroup device rules here).
  install -d "$DIR/dev"
  : >"$DIR/etc/gres.conf"
  if [ "$GPUS" -gt 0 ]; then
    for i in $(seq 0 $((GPUS - 1))); do : >"$DIR/dev/gpu$i"; done
    echo "Name=gpu File=$DIR/dev/gpu[0-$((GPUS - 1))]" >"$DIR/etc/gres.conf"
  fi
  # The nodes' /etc/hosts (bind-mounted in their mount namespaces): the machine's, plus every node.
  { cat /etc/hosts; for i in $(seq 1 "$NODES"); do echo "$(node_addr "$i") $(node_name "$i")"; done; } >"$DIR/etc/hosts.new"
  mv "$DIR/etc/hosts.new" "$DIR/etc/hosts"
  echo "$NODES $GPUS" >"$DIR/etc/nodes"
}

write_env() {
  install -d "$DIR/bin"
  install -m 0755 "$HERE/sacct_shim" "$DIR/bin/sacct"
  cat >"$ENV_FILE" <<EOF
export SLURM_CONF=$CONF
export PATH=$DIR/bin:\$PATH
EOF
}

# A pid file's process is alive and is the daemon named (a stale file's pid may be another process now).
pid_alive() {
  [ -s "$1" ] || return 1
  local pid comm
  pid=$(cat "$1")
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [ "$comm" = "${2:-$comm}" ]
}
slurmd_pidfile() { echo "$DIR/run/slurmd-$(node_name "$1").pid"; }

# One slurmd in new UTS and mount namespaces: hostname = node name, /etc/hosts = ours.
start_slurmd() {
  local name
  name=$(node_name "$1")
  install -d "$DIR/spool/$name"
  # SLURM_CONF too: slurmd looks for gres.conf next to it, not next to -f.
  SLURM_CONF=$CONF unshare --uts --mount --propagation private sh -c \
    "hostname '$name' && mount --bind '$DIR/etc/hosts' /etc/hosts && exec slurmd -f '$CONF'" \
    || die "starting slurmd for $name failed; see $DIR/log/slurmd-$name.log"
  # The node's UTS namespace, by inode: `down` ends whatever still runs in it (a job's steps).
  local pidfile
  pidfile=$(slurmd_pidfile "$1")
  for _ in $(seq 1 50); do pid_alive "$pidfile" slurmd && break; sleep 0.1; done
  pid_alive "$pidfile" slurmd || die "slurmd for $name exited at start: $(grep -h 'fatal\|error' "$DIR/log/slurmd-$name.log" | tail -1)"
  readlink "/proc/$(cat "$pidfile")/ns/uts" >"$DIR/run/ns-$name"
}

states() { SLURM_CONF=$CONF timeout 10 sinfo -h -N -o '%N %T' 2>/dev/null; }

all_up() {
  local out
  out=$(states) || return 1
  [ "$(echo "$out" | grep -cE ' (idle|mixed|allocated|completing)$')" -eq "$NODES" ]
}

cmd_up() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) NODES=${2:-}; shift 2 || shift ;;
      --gpus) GPUS=${2:-}; shift 2 || shift ;;
      *) die "unknown option '$1' (allowed: --nodes N, --gpus G)" ;;
    esac
  done
  [[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 200 ] \
    || die "--nodes '$NODES': must be 1..200 (node i gets address 127.0.0.<i+1>)"
  [[ "$GPUS" =~ ^[0-9]+$ ]] || die "--gpus '$GPUS': must be a count >= 0"
  install -d "$DIR" "$DIR/etc" "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run" "$DIR/bin"
  install_packages
  start_munge
  write_env
  local running=0 i
  pid_alive "$DIR/run/slurmctld.pid" slurmctld && running=1
  if [ $running = 1 ] && [ "$(cat "$DIR/etc/nodes" 2>/dev/null)" != "$NODES $GPUS" ]; then
    log "up as '$(cat "$DIR/etc/nodes" 2>/dev/null)' (nodes gpus), asked for '$NODES $GPUS': restarting"
    stop_daemons
    running=0
  fi
  if [ $running = 1 ] && all_up; then
    log "already up"
  else
    [ "$(id -u)" = 0 ] || die "starting slurmctld/slurmd here needs root (SlurmUser=root, no cgroups, unshare for the nodes' namespaces)"
    command -v unshare >/dev/null || die "unshare (util-linux) is missing: it gives each node its own hostname"
    [ $running = 1 ] || write_conf
    # -c: a fresh controller state (the node set may have changed since the last run).
    pid_alive "$DIR/run/slurmctld.pid" slurmctld || slurmctld -c -f "$CONF"
    sleep 0.5
    pid_alive "$DIR/run/slurmctld.pid" slurmctld \
      || die "slurmctld exited at start: $(grep -h 'fatal' "$DIR/log/slurmctld.log" | tail -1)"
    for i in $(seq 1 "$NODES"); do
      pid_alive "$(slurmd_pidfile "$i")" slurmd || start_slurmd "$i"
    done
  fi
  local deadline=$((SECONDS + UP_TIMEOUT_S)) node state
  while [ $SECONDS -lt $deadline ]; do
    all_up && break
    pid_alive "$DIR/run/slurmctld.pid" slurmctld \
      || die "slurmctld exited: $(grep -h 'fatal' "$DIR/log/slurmctld.log" | tail -1)"
    states | while read -r node state; do
      case "$state" in
        down*|drain*|fail*) SLURM_CONF=$CONF scontrol update nodename="$node" state=resume 2>/dev/null || true ;;
      esac
    done || true  # no answer yet
    sleep 0.5
  done
  all_up || die "nodes not all idle after ${UP_TIMEOUT_S}s: $(states | xargs); see $DIR/log/slurmctld.log and slurmd-*.log"
  log "up: $(states | xargs) ($GPUS GPU(s) per node); env in $ENV_FILE"
  cat "$ENV_FILE"
}

stop_pidfile() {
  local f=$1 name=$2 comm=$3
  pid_alive "$f" "$comm" || { rm -f "$f"; return 0; }
  local pid
  pid=$(cat "$f")
  kill "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || { rm -f "$f"; return 0; }; sleep 0.1; done
  log "$name (pid $pid) did not stop in 10 s; sending SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
}

# PIDs of the processes in the nodes' UTS namespaces (recorded at start): job steps, their children.
node_ns_pids() {
  local want f p
  want=$(cat "$DIR"/run/ns-* 2>/dev/null | sort -u) || true
  [ -n "$want" ] || return 0
  for f in /proc/[0-9]*/ns/uts; do
    p=${f#/proc/}; p=${p%%/*}
    if echo "$want" | grep -qxF "$(readlink "$f" 2>/dev/null)"; then echo "$p"; fi
  done
}

stop_daemons() {
  local f pids
  # Jobs first: slurmstepd and a job's processes outlive slurmd. Cancel them while the controller answers.
  if pid_alive "$DIR/run/slurmctld.pid" slurmctld; then
    SLURM_CONF=$CONF timeout 10 scancel --full --quiet --partition=debug 2>/dev/null || true
    for _ in $(seq 1 100); do
      [ -z "$(SLURM_CONF=$CONF timeout 10 squeue -h -t running,completing,suspended 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  for f in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmd.pid"; do
    if [ -e "$f" ]; then stop_pidfile "$f" "slurmd ($(basename "$f" .pid))" slurmd; fi
  done
  stop_pidfile "$DIR/run/slurmctld.pid" slurmctld slurmctld
  # Whatever still runs in a node's namespace is a leftover of a job: end it (the namespace goes with it).
  pids=$(node_ns_pids)
  if [ -n "$pids" ]; then
    log "ending $(echo "$pids" | wc -w) leftover process(es) in the nodes' namespaces"
    kill $pids 2>/dev/null || true
    for _ in $(seq 1 50); do pids=$(node_ns_pids); [ -z "$pids" ] && break; sleep 0.2; done
    if [ -n "$pids" ]; then kill -9 $pids 2>/dev/null || true; fi
  fi
  rm -f "$DIR"/run/ns-*
}

cmd_down() {
  stop_daemons
  if [ -e "$DIR/run/munged.started-by-us" ]; then
    stop_pidfile /run/munge/munged.pid munged munged
    rm -f "$DIR/run/munged.started-by-us"
  fi
  # Everything else it made lives under $DIR (the namespaces ended with their processes).
  case "$DIR" in /tmp/?*|/var/tmp/?*|"$HOME"/?*) rm -rf "$DIR" ;; *) log "left $DIR in place (not under /tmp)" ;; esac
  log "down"
}

cmd_status() {
  local out
  out=$(states || true)
  if [ -n "$out" ]; then
    echo "$out"
    SLURM_CONF=$CONF squeue 2>/dev/null || true
    return 0
  fi
  echo "not up (no answer from slurmctld with SLURM_CONF=$CONF)"
  return 1
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) [ -s "$ENV_FILE" ] || die "no $ENV_FILE: run '$0 up' first"; cat "$ENV_FILE" ;;
  *) echo "usage: $0 up [--nodes N] [--gpus G] | down | status | env" >&2; exit 64 ;;
esac
