"""Bring up (or join) the Ray cluster a run uses: `connect_ray(cluster_conf)`.

- `cluster=local_ray`: an in-process local Ray with the configured CPUs and object
  store, no dashboard, session files in a private temp dir.
- `cluster=slurm`: one Ray cluster across the job's nodes. submitit runs the same
  callable once per node (tasks_per_node=1), so every node calls `connect_ray`:
  node 0 (SLURM_NODEID=0) starts the head (`ray start --head --block`) on its address,
  connects the driver and waits until all SLURM_NNODES nodes have joined, then
  returns and trains; every other node starts a worker pointed at the head and does
  not return: it serves until the head goes away, stops its Ray processes and exits
  the process with status 0 (so only node 0 trains).
  Node names come from `scontrol show hostnames $SLURM_JOB_NODELIST`; the head's GCS
  port is `cluster.ray_port`, or 20000 + job id mod 10000 when that is 0, so that
  every node computes the same address without a rendezvous file. Every node starts
  Ray with its own address (`--node-ip-address`, its name resolved) and a custom
  resource `rlh_node_<rank>` (`node_resource`), which placement uses to put engines
  and trainers on the nodes `cluster.engine_nodes` says. A worker whose Ray exits
  while the head is still there exits with an error naming the node.

Ray's daemons are started as our own child process groups and stopped by process
group at exit, never with a blanket `ray stop` (which would kill other users' Ray).
Unless the user set them: `RAY_AUTH_MODE=disabled` (else Ray writes a token under ~/.ray), and
`RAY_worker_niceness=0`: Ray starts its workers at nice +15 to spare its daemons, but
a run's actors (engines, trainers) are the run's work, and at +15 any other busy process on the
node starves them (a 2-step disagg run on 2 cores: 37 s alone, 648 s beside two spinning
processes, 71 s beside them with niceness 0; benchmarks/ray_worker_niceness.py). And no
workers are prestarted when the driver connects (`RAY_prestart_worker_first_driver=0`): none
of them would host an actor of the run (3 CPU-s saved per start, measured).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Optional

from rlharness.config.schema import ClusterConf, ConfigError, LocalRayClusterConf, SlurmClusterConf
from rlharness.core.run_dir import RunDir

log = logging.getLogger(__name__)

POLL_S = 0.5
HEAD_GONE_CHECKS = 3  # consecutive failed probes before a worker concludes the head is gone
STOP_TIMEOUT_S = 15.0
AGENT_REGISTER_TIMEOUT_MS = 120_000
# `ray start` gives up if its raylet has not registered within 30 s (not configurable): on a
# busy node it is tried again this many times in all.
START_ATTEMPTS = 5
STARTED_LINE = "Ray runtime started."


@dataclass(frozen=True)
class SlurmRayLayout:
    """Where the Ray cluster of one Slurm job lives; same on every node of the job."""

    job_id: str
    node_rank: int
    hostnames: list[str]
    head_ip: str
    node_ip: str
    port: int
    num_cpus: int
    num_gpus: int
    temp_dir: str
    object_store_memory_mb: int = 0

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    @property
    def is_head(self) -> bool:
        return self.node_rank == 0

    @property
    def node_name(self) -> str:
        return self.hostnames[self.node_rank]

    @property
    def head_agent_ports(self) -> tuple[int, int]:
        """The head's dashboard agent and runtime-env agent ports, GCS port + 1 and + 2: the other
        nodes start Ray once these answer (the head is then up; two Ray start-ups at once
        can time out on a small, busy node)."""
        return self.port + 1, self.port + 2

    def start_args(self) -> list[str]:
        """`ray start` arguments every node shares: its address, resources and ports."""
        # Fixed defaults (52365...) collide when two nodes share a host: free ones (fixed on the head).
        ports = {flag: free_port() for flag in AGENT_PORT_FLAGS}
        if self.is_head:
            ports["dashboard-agent-listen-port"], ports["runtime-env-agent-port"] = self.head_agent_ports
        return [f"--node-ip-address={self.node_ip}", f"--num-cpus={self.num_cpus}", f"--num-gpus={self.num_gpus}",
                f"--resources={json.dumps({node_resource(self.node_rank): NODE_RESOURCE_UNITS})}",
                f"--temp-dir={self.temp_dir}",
                *([f"--object-store-memory={self.object_store_memory_mb * 2**20}"] if self.object_store_memory_mb
                  else []),
                *[f"--{flag}={port}" for flag, port in ports.items()]]


# Set unless the user set them (module docstring). Ray's prestarted workers are plain ones: every
# actor of a run carries its own environment (thread counts) and needs a worker of its own.
RAY_ENV_DEFAULTS = {"RAY_AUTH_MODE": "disabled", "RAY_worker_niceness": "0",
                    "RAY_prestart_worker_first_driver": "0"}

# A custom resource per node: a bundle asking for one unit lands on that node.
NODE_RESOURCE_UNITS = 1000
AGENT_PORT_FLAGS = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
                    "metrics-export-port")


def node_resource(rank: int) -> str:
    return f"rlh_node_{rank}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def connect_ray(cluster: ClusterConf) -> None:
    """Make `ray` usable in this process for this cluster (see the module docstring).

    On a non-head Slurm node this serves as a Ray worker and exits the process.
    """
    for name, value in RAY_ENV_DEFAULTS.items():  # read by the daemons and workers this process starts
        os.environ.setdefault(name, value)
    import ray

    # Inside a Slurm job or not is checked first: an already-connected process is no excuse.
    layout = slurm_layout(cluster, os.environ) if isinstance(cluster, SlurmClusterConf) else None
    if ray.is_initialized():
        return
    if isinstance(cluster, LocalRayClusterConf):
        _init_local(cluster)
    elif layout is not None:
        if layout.is_head:
            start_head(layout, cluster.ray_timeout_s)
        else:
            serve_as_worker(layout, cluster.ray_timeout_s)
            raise SystemExit(0)
    else:
        raise ConfigError(f"cluster={cluster.name!r} has no Ray: use cluster=local_ray or cluster=slurm")


def _init_local(cluster: LocalRayClusterConf) -> None:
    import ray

    temp_dir = cluster.temp_dir or tempfile.mkdtemp(prefix="rlh-ray-")
    ray.init(num_cpus=cluster.num_cpus, object_store_memory=cluster.object_store_memory_mb * 2**20,
             _temp_dir=temp_dir, include_dashboard=False, log_to_driver=True)
    log.info("local Ray started: %d CPUs, session files in %s", cluster.num_cpus, temp_dir)


# ----------------------------------------------------------------------------- Slurm layout
def slurm_hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list ("gpu[01-03],cpu7") the way Slurm does."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                         timeout=30)
    if out.returncode != 0 or not out.stdout.split():
        raise RuntimeError(f"scontrol show hostnames {nodelist!r} failed: {out.stderr.strip()}")
    return out.stdout.split()


def derive_port(job_id: str, configured: int) -> int:
    return configured if configured else 20000 + int(job_id.split("_")[0]) % 10000


def slurm_layout(cluster: SlurmClusterConf, env: os._Environ | dict) -> SlurmRayLayout:
    """Read the job's node list, this node's rank and its resources from Slurm's env."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        raise ConfigError("cluster=slurm needs Ray to run inside a Slurm job, but SLURM_JOB_ID is not set "
                          "(submit with `python train.py -m cluster=slurm ...`, or use cluster=local_ray)")
    hostnames = slurm_hostnames(env["SLURM_JOB_NODELIST"])
    node_rank = int(env.get("SLURM_NODEID", "0"))
    cpus = int(env.get("SLURM_CPUS_PER_TASK") or env.get("SLURM_CPUS_ON_NODE") or cluster.cpus_per_task)
    return SlurmRayLayout(
        job_id=job_id, node_rank=node_rank, hostnames=hostnames,
        head_ip=_resolve(hostnames[0]), node_ip=_resolve(hostnames[node_rank]),
        port=derive_port(job_id, cluster.ray_port),
        # The GPUs Slurm gave this node (count-only GRES included), else what was asked for.
        num_cpus=cpus, num_gpus=int(env.get("SLURM_GPUS_ON_NODE") or cluster.gpus_per_node),
        object_store_memory_mb=cluster.object_store_memory_mb,
        # Short: Ray's unix socket paths must stay under ~107 characters.
        temp_dir=os.path.join(tempfile.gettempdir(), f"rlh-ray-{job_id}-{node_rank}"),
    )


def _resolve(hostname: str) -> str:
    try:
        return socket.gethostbyname(hostname)
    except OSError as exc:
        raise RuntimeError(f"Slurm node {hostname!r} does not resolve to an address ({exc}); Ray needs "
                           f"every node's name to resolve on every node") from exc


# ----------------------------------------------------------------------------- processes
def _ray_start(args: list[str], log_path: str) -> subprocess.Popen:
    """`ray start --block ...` in its own process group, so we can stop exactly it."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    cmd = [ray_bin if os.path.exists(ray_bin) else "ray", "start", "--block", "--disable-usage-stats",
           *args]
    log.info("starting: %s", " ".join(cmd))
    # No 30 s drain on SIGTERM (meant for Ray Serve on Kubernetes): the job is over. The
    # raylet waits for its dashboard agent (a Python process) to start; on a busy node that
    # takes longer than Ray's default allows.
    env = {"RAY_agent_register_timeout_ms": str(AGENT_REGISTER_TIMEOUT_MS),
           "RAY_raylet_start_wait_time_s": str(AGENT_REGISTER_TIMEOUT_MS // 1000), **RAY_ENV_DEFAULTS, **os.environ,
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    with open(log_path, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _ray_start_retried(args: list[str], log_path: str, what: str, timeout_s: float) -> subprocess.Popen:
    """`_ray_start` until it prints that Ray started (at most START_ATTEMPTS tries, `timeout_s` each)."""
    for attempt in range(1, START_ATTEMPTS + 1):
        offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        proc = _ray_start(args, log_path)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and not _log_has(log_path, offset, STARTED_LINE):
            if time.monotonic() > deadline:
                stop_process_group(proc)
                raise TimeoutError(f"{what}: `ray start` not up after {timeout_s:g} s (cluster.ray_timeout_s); "
                                   f"see {log_path}")
            time.sleep(POLL_S)
        if proc.poll() is None:
            return proc
        log.warning("%s: `ray start` exited with status %s (attempt %d of %d); see %s", what, proc.returncode,
                    attempt, START_ATTEMPTS, log_path)
    raise RuntimeError(f"{what}: `ray start` failed {START_ATTEMPTS} times; see {log_path}")


def _log_has(path: str, offset: int, text: str) -> bool:
    with open(path, "rb") as f:
        f.seek(offset)
        return text.encode() in f.read()


def stop_process_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # `ray start --block` stops its daemons on SIGTERM
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT_S)
    except ProcessLookupError:
        pass


def port_open(host: str, port: int, timeout_s: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _wait(what: str, ready, timeout_s: float, proc: Optional[subprocess.Popen], log_path: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: `ray start` exited with status {proc.returncode}; see {log_path}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout_s:g} s (cluster.ray_timeout_s); see {log_path}")
        time.sleep(POLL_S)


def start_head(layout: SlurmRayLayout, timeout_s: float) -> None:
    """Start the head on this node, connect the driver, wait for every node to join."""
    import ray

    os.makedirs(layout.temp_dir, exist_ok=True)
    log_path = os.path.join(layout.temp_dir, "ray-start.log")
    proc = _ray_start_retried(["--head", f"--port={layout.port}", "--include-dashboard=false",
                               *layout.start_args()], log_path, f"Ray head {layout.address}", timeout_s)

    def shutdown() -> None:
        if ray.is_initialized():
            ray.shutdown()
        stop_process_group(proc)

    atexit.register(shutdown)
    _wait(f"Ray head {layout.address}", lambda: port_open(layout.head_ip, layout.port), timeout_s, proc,
          log_path)
    # The driver attaches to this node's raylet (another node may share this host's IPs).
    ray.init(address=layout.address, _node_ip_address=layout.node_ip, log_to_driver=True)
    want = len(layout.hostnames)
    _wait(f"Ray cluster of {want} node(s) {layout.hostnames}", lambda: alive_nodes() >= want, timeout_s,
          proc, log_path)
    log.info("Ray cluster up: head %s, %d node(s), %s", layout.address, want, ray.cluster_resources())


def serve_worker_node(cluster: SlurmClusterConf, run_uses_ray: bool, run_dir: Optional[str] = None) -> dict[str, Any]:
    """What node k > 0 of a multi-node job does in `launcher.run`: serve Ray, then return
    normally (submitit then records a result for this node's task, as Hydra's launcher expects).

    With `run_dir`, a head that goes away before node 0 marked the run ended there
    (`mark_run_ended`) raises `RayHeadLost`: node 0 died without a word of its own."""
    layout = slurm_layout(cluster, os.environ)
    if run_uses_ray:
        ended = (lambda: os.path.exists(run_ended_marker(run_dir, layout.job_id))) if run_dir else None
        serve_as_worker(layout, cluster.ray_timeout_s, head_ended=ended, run_dir=run_dir)
    else:
        log.info("node %d (%s): this run does not use Ray; only node 0 works", layout.node_rank, layout.node_name)
    return {"ray_worker_node": layout.node_rank}


def run_ended_marker(run_dir: str, job_id: str) -> str:
    """The file node 0 writes into the (shared) run directory once its run has ended, well or not."""
    return str(RunDir(run_dir).run_ended(job_id))


def mark_run_ended(run_dir: str, job_id: str, ended: bool) -> None:
    """Node 0: remove the marker when its run starts (a requeued job keeps its id), write it at the end."""
    path = run_ended_marker(run_dir, job_id)
    if ended:
        with open(path, "w") as f:
            f.write(f"{time.time():.3f}\n")
    elif os.path.exists(path):
        os.remove(path)


def alive_nodes() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node["Alive"])


class RayNodeDied(RuntimeError):
    """This worker node's Ray exited while the head was still up."""


class RayHeadLost(RuntimeError):
    """The head (node 0: the driver and the training actors) went away before its run ended."""


def serve_as_worker(layout: SlurmRayLayout, timeout_s: float, head_ended=None, run_dir: Optional[str] = None) -> None:
    """Join the head's cluster and serve until the head goes away.

    Raises `RayNodeDied` if this node's Ray exits first (its processes were killed):
    the job step fails with the node's name instead of exiting 0. Raises `RayHeadLost`
    if the head goes away and `head_ended()` says node 0's run had not ended (node 0
    itself may die without a message: Ray ends a driver whose node's object store is
    gone at once).
    """
    os.makedirs(layout.temp_dir, exist_ok=True)
    log_path = os.path.join(layout.temp_dir, "ray-start.log")
    _wait(f"Ray head {layout.address} and its agents (from node {layout.node_rank})",
          lambda: all(port_open(layout.head_ip, p) for p in (layout.port, *layout.head_agent_ports)), timeout_s,
          None, log_path)
    proc = _ray_start_retried([f"--address={layout.address}", *layout.start_args()], log_path,
                              f"Ray on node {layout.node_name} ({layout.node_ip})", timeout_s)
    log.info("node %d (%s, %s) joined Ray head %s", layout.node_rank, layout.node_name, layout.node_ip,
             layout.address)
    try:
        failures = 0
        while failures < HEAD_GONE_CHECKS and proc.poll() is None:
            failures = 0 if port_open(layout.head_ip, layout.port) else failures + 1
            time.sleep(2 * POLL_S)
        status = proc.poll()
    finally:
        stop_process_group(proc)
    if status is not None and port_open(layout.head_ip, layout.port):
        message = (f"Ray on node {layout.node_name} ({layout.node_ip}, node {layout.node_rank} of job "
                   f"{layout.job_id}) exited with status {status} while the head was up; see {log_path}")
        log.error(message)
        raise RayNodeDied(message)
    if head_ended is not None and not _ended_within(head_ended, HEAD_END_GRACE_S):
        from rlharness.core.checkpoint import latest_checkpoint

        found = latest_checkpoint(run_dir) if run_dir else None
        message = (f"the Ray head on node {layout.hostnames[0]} ({layout.head_ip}, node 0 of job {layout.job_id}) "
                   f"went away before its run ended: that node or its Ray processes died (it runs the driver and "
                   f"the training actors). " + (f"The last complete checkpoint is {found[1]}: run the same command "
                                                f"again (resume=auto) or resume={run_dir}" if found else
                                                "No complete checkpoint was saved"))
        log.error(message)
        raise RayHeadLost(message)
    log.info("node %d: Ray head %s is gone; worker stopped", layout.node_rank, layout.address)


# The head stops Ray after node 0 wrote its run-ended marker; on a shared file system the
# file can show up on another node a little later.
HEAD_END_GRACE_S = 10.0


def _ended_within(ended, grace_s: float) -> bool:
    deadline = time.monotonic() + grace_s
    while not ended():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True
