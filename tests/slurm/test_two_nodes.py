"""train.py mode=disagg across the two nodes of the local Slurm (scripts/slurm_local.sh up --nodes 2):
engines on one node, the trainer on the other, weights crossing between them; the same
synchronous run on two nodes and on one (cluster=local_ray) training identically; a requeued
(preempted) two-node job resuming from its run directory; and a worker node whose Ray dies
mid-run, stopping the run with an error naming the node and leaving a resumable checkpoint.

Each node is a slurmd in its own UTS namespace (hostname rlh-node<i>) at 127.0.0.<i+1>, with
two count-only GPUs. The model is the tiny one on CPU; actors ask for fractions of the
two real cores (cluster.engine_cpus / trainer_cpus)."""

from __future__ import annotations

import json
import pickle
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from rlharness.core.run_dir import DONE, RunDir
from tests.helpers import HANG_S, CliProcess, run_cli, start_cli, wait_until
from rlharness.core.fault_points import signal_at

from .test_train_on_slurm import _job_id, _slurm, _steps, start_requeued_job_soon

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

MAX_STALENESS = 1
BATCH, K = 4, 4
TWO_NODE_CLUSTER = ["cluster=slurm", "cluster.nodes=2", "cluster.gpus_per_node=1", "cluster.cpus_per_task=1",
                    "cluster.mem_gb=2", "cluster.engine_cpus=0.5", "cluster.trainer_cpus=0.5",
                    "cluster.object_store_memory_mb=200", f"cluster.ray_timeout_s={HANG_S}"]
TWO_NODES = [*TWO_NODE_CLUSTER, "mode=disagg", "strategy=async", f"max_staleness={MAX_STALENESS}",
             "strategy.over_sample_threshold=0.5", "strategy.enable_partial_rollout=true", f"batch_size={BATCH}",
             f"sampler.prompt_repeat_k={K}",
             "eval_every=0", "eval.num_prompts=8", "logger=none", "save_every=2"]
# Bounds only a hang reaches: a whole run; the first checkpoints (Slurm, two Ray nodes, actors: minutes
# on a busy 2-core box); a Slurm state change.
RUN_TIMEOUT_S = HANG_S
START_TIMEOUT_S = HANG_S


def _train(sweep: Path, *overrides: str, env: dict | None = None) -> CliProcess:
    return start_cli(["-m", *TWO_NODES, *overrides, f"hydra.sweep.dir={sweep}"], cwd=sweep.parent, merge_stderr=True,
                     env=env)


def _finish(proc: CliProcess, timeout_s: float = RUN_TIMEOUT_S) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        _stop(proc)
    return out


def _stop(proc: CliProcess, sweep: Path | None = None) -> None:
    """The submitting process, and (a test that failed early) its Slurm job, which would go on without it."""
    if proc.poll() is None:
        proc.kill()
    if sweep is not None:
        for run in sweep.glob("*/.hydra/hydra.yaml"):
            try:
                subprocess.run(["scancel", _job_id(run.parent.parent)], capture_output=True, timeout=HANG_S)
            except (OSError, TypeError, KeyError, subprocess.TimeoutExpired):
                pass


def wait_job_id(run_dir: Path, timeout_s: float = START_TIMEOUT_S) -> str:
    """The Slurm job id, once the job has written its Hydra config (both nodes write it: retry)."""
    found: list[str] = []

    def ready() -> bool:
        try:
            found.append(_job_id(run_dir))
            return True
        except (OSError, TypeError, KeyError):
            return False

    wait_until(ready, "the job to start", timeout_s)
    return found[-1]


def placements(run_dir: Path) -> dict[str, tuple[str, str]]:
    """actor name -> (hostname, address), as each actor reported it ("placed X on H (A)" log lines)."""
    found = re.findall(r"placed (\S+) on (\S+) \((\S+)\)", RunDir(run_dir).log().read_text())
    return {name: (host, addr) for name, host, addr in found}


def check_ledger(run_dir: Path, total_steps: int) -> None:
    """Staleness bound per sample; every group trained once, none lost (the ledger and dropped.jsonl)."""
    trained = [json.loads(line) for f in sorted(RunDir(run_dir).rollouts.glob("step_*.jsonl"))
               for line in f.read_text().splitlines() if line.strip()]
    dropped_file = RunDir(run_dir).dropped
    dropped = [json.loads(x) for x in dropped_file.read_text().splitlines()] if dropped_file.exists() else []
    assert {r["train_step"] for r in trained} == set(range(1, total_steps + 1))
    for r in trained:
        assert r["status"] == "completed"
        assert 0 <= r["train_step"] - r["min_policy_version"] - 1 <= MAX_STALENESS, r
    groups = {r["group_id"]: (r["epoch"], r["prompt_index"]) for r in trained}
    repeated = {k: n for k, n in Counter(groups.values()).items() if n > 1}
    assert not repeated, f"prompts trained more than once: {repeated}"
    assert len(groups) == BATCH * total_steps
    assert not set(groups) & {r.get("group_id") for r in dropped}
    assert set(Counter(r["group_id"] for r in trained).values()) == {K}


def ray_processes(job_id: str, node_rank: int | None = None) -> list[int]:
    """PIDs of the Ray processes this job started (their session dirs are /tmp/rlh-ray-<job>-<rank>)."""
    pattern = f"rlh-ray-{job_id}-" + ("" if node_rank is None else f"{node_rank}([^0-9]|$)")
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def assert_nothing_left(job_id: str) -> None:
    wait_until(lambda: not ray_processes(job_id), f"job {job_id}'s Ray processes to stop")


@pytest.mark.timeout(START_TIMEOUT_S + 3 * HANG_S + RUN_TIMEOUT_S)
def test_disagg_run_across_two_nodes_requeued_resumes_from_its_run_dir(slurm_env, tmp_path):
    """One two-node job (a bring-up costs minutes on 2 cores, so one run checks both): where Ray
    and the actors are, every step's weights reaching the engine node, and a requeue (preemption)
    that resumes from the run directory; staleness bound and no prompt lost or repeated across it."""
    total = 10
    sweep = tmp_path / "sweep"
    run_dir = sweep / "0"
    # The driver stops itself (SIGSTOP) once checkpoint 4 is saved, so the requeue finds it mid-run on any
    # machine (left going it could end first); the requeued attempt resumes from 4 and never saves it again.
    proc = _train(sweep, f"total_steps={total}", "seed=6", env=signal_at(signal.SIGSTOP, "checkpoint_saved", 4))
    try:
        wait_until(lambda: (RunDir(run_dir).checkpoint(4) / DONE).exists(), "a checkpoint at step 4", START_TIMEOUT_S)
        job_id = wait_job_id(run_dir)
        job = _slurm("scontrol", "show", "job", job_id)
        assert "NumNodes=2" in job and "NodeList=rlh-node[1-2]" in job, job
        assert re.search(r"TresPerNode=\S*gpu:1", job), job  # the GPUs the launcher asked for
        # Preemption by hand: Slurm stops both nodes' tasks and queues the same job again.
        _slurm("scontrol", "requeue", job_id)
        wait_until(lambda: "Restarts=1" in _slurm("scontrol", "show", "job", job_id), "the requeue")
        wait_until(lambda: not ray_processes(job_id), "the first attempt's Ray to stop")
        start_requeued_job_soon(job_id)
        out = _finish(proc)
    finally:
        _stop(proc, sweep)
    assert proc.returncode == 0, out[-4000:]
    log = RunDir(run_dir).log().read_text()
    # Ray spans both nodes and sees their GPUs; engines on node 2, the trainer on node 1 (both attempts).
    assert re.search(r"Ray cluster up: head 127\.0\.0\.2:\d+, 2 node\(s\), .*'GPU': 2\.0", log), log[-3000:]
    found = re.findall(r"placed (engine0|torch-rank0) on (\S+) \((\S+)\)", log)
    assert sorted(set(found)) == [("engine0", "rlh-node2", "127.0.0.3"),
                                  ("torch-rank0", "rlh-node1", "127.0.0.2")], found
    resumed = re.findall(r"resumed from \S*checkpoints/step_(\d+)", log)
    assert resumed and int(resumed[-1]) >= 4, "the requeued job did not resume"
    steps = [s for s in _steps(run_dir) if s > 0]
    assert sorted(set(steps)) == list(range(1, total + 1))
    # Steps after the checkpoint ran twice (once per attempt): the ledger holds the last attempt's.
    check_ledger(run_dir, total)
    rows = [json.loads(line) for line in RunDir(run_dir).metrics.read_text().splitlines()]
    for r in (r for r in rows if r["step"] > 0):  # both attempts' rows
        assert r["staleness/max"] <= MAX_STALENESS
        assert r["perf/engine_version"] == r["step"]  # every step's weights crossed to the engine node
    assert (RunDir(run_dir).checkpoint(total) / DONE).exists()
    assert_nothing_left(job_id)


def _kill_node_mid_run(sweep: Path, seed: int, node_rank: int) -> tuple[str, str]:
    """Start a long two-node run, SIGKILL every Ray process of node `node_rank` once step 2 is
    saved, and wait for the run to fail and its job to end: (the submitter's output, job id)."""
    run_dir = sweep / "0"
    # total_steps: far more than it gets to (the node dies first). requeue_grace_s=0: no requeue here, so
    # the submitter takes the job's first FAILED state as final (node 0 dies without a result file).
    proc = _train(sweep, "total_steps=2000", f"seed={seed}", "cluster.requeue_grace_s=0")
    try:
        wait_until(lambda: (RunDir(run_dir).checkpoint(2) / DONE).exists(), "a checkpoint at step 2", START_TIMEOUT_S)
        job_id = wait_job_id(run_dir)
        victims = ray_processes(job_id, node_rank=node_rank)
        assert victims, f"no Ray processes on node {node_rank + 1}"
        subprocess.run(["kill", "-9", *map(str, victims)], check=False)
        out = _finish(proc)
        # The surviving node ends the job on its own (the submitter may stop before).
        wait_until(lambda: "JobState=RUNNING" not in _slurm("scontrol", "show", "job", job_id), f"job {job_id} to end")
    finally:
        _stop(proc, sweep)
    assert proc.returncode != 0, out[-3000:]
    return out, job_id


@pytest.mark.timeout(START_TIMEOUT_S + 2 * RUN_TIMEOUT_S + 3 * HANG_S)
def test_worker_node_dying_stops_the_run_naming_it_and_it_resumes(slurm_env, tmp_path):
    sweep = tmp_path / "sweep"
    run_dir = sweep / "0"
    out, job_id = _kill_node_mid_run(sweep, seed=7, node_rank=1)  # node 2's raylet, workers, engine
    # The submitter reports whichever node's error came first; both name node 2.
    assert re.search(r"(Ray on node|its Ray node) rlh-node2 \(127\.0\.0\.3", out), out[-4000:]
    log = RunDir(run_dir).log().read_text()
    assert re.search(r"Ray on node rlh-node2 \(127\.0\.0\.3, node 1 of job \d+\) exited", log), log[-4000:]
    assert re.search(r"run failed: .*engine engine0: its Ray node rlh-node2 \(127\.0\.0\.3\) died and it "
                     r"did not restart on another node", log), log[-4000:]
    assert_nothing_left(job_id)
    saved = sorted(int(p.name.split("_")[1]) for p in RunDir(run_dir).checkpoints.glob("step_*")
                   if (p / "DONE").exists())
    assert saved, "no complete checkpoint left"
    # The same command, run again, resumes from that checkpoint (resume=auto) and finishes.
    total = saved[-1] + 2
    again = _train(sweep, f"total_steps={total}", "seed=7")
    try:
        out = _finish(again)
    finally:
        _stop(again, sweep)
    assert again.returncode == 0, out[-4000:]
    log = RunDir(run_dir).log().read_text()
    assert re.search(rf"resumed from \S*checkpoints/step_{saved[-1]:08d}", log)
    for f in RunDir(run_dir).rollouts.glob("step_*.jsonl"):
        if int(f.stem.split("_")[1]) > total:
            f.unlink()  # trained by the first attempt after its last checkpoint, beyond this run's end
    check_ledger(run_dir, total)


SAME_RUN = ["mode=disagg", "strategy=sync", "total_steps=3", "batch_size=8", "sampler.prompt_repeat_k=4",
            "eval_every=0", "eval.num_prompts=8", "logger=none", "save_every=0", "seed=3",
            "cluster.engine_cpus=0.5", "cluster.trainer_cpus=0.5"]  # 1 torch thread per actor on both


def _per_step(run_dir: Path) -> list[tuple]:
    rows = [json.loads(line) for line in RunDir(run_dir).metrics.read_text().splitlines() if line.strip()]
    return [(r["step"], r["train/loss"], r["rollout/reward_mean"], r["train/grad_norm"]) for r in rows if r["step"] > 0]


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_two_node_run_trains_exactly_as_the_one_node_run(slurm_env, tmp_path):
    """Synchronous disagg (no timing in what is trained: every batch is generated by the latest
    weights, per-sample seeds): two nodes and one node give the same losses, rewards and
    gradient norms, bit for bit, so the weights that cross nodes are the trainer's exactly."""
    one = tmp_path / "one_node"
    local = run_cli(["cluster=local_ray", *SAME_RUN, f"hydra.run.dir={one}"], cwd=tmp_path, check=False,
                    env={"RAY_AUTH_MODE": "disabled"})
    assert local.returncode == 0, local.stderr[-4000:]
    sweep = tmp_path / "sweep"
    proc = start_cli(["-m", *TWO_NODE_CLUSTER, *SAME_RUN, f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                     merge_stderr=True)
    try:
        out = _finish(proc)
    finally:
        _stop(proc, sweep)
    assert proc.returncode == 0, out[-4000:]
    where = placements(sweep / "0")
    assert where["engine0"][0] == "rlh-node2" and where["torch-rank0"][0] == "rlh-node1", where
    two_nodes, one_node = _per_step(sweep / "0"), _per_step(one)
    assert [s for s, *_ in one_node] == [1, 2, 3]
    assert two_nodes == one_node


@pytest.mark.timeout(START_TIMEOUT_S + RUN_TIMEOUT_S + 2 * HANG_S)
def test_trainer_node_dying_is_named_by_the_other_node(slurm_env, tmp_path):
    """Node 0 (the driver, the Ray head, the training actor) loses its Ray: Ray ends the driver at
    once, without a message of its own; node 1 names node 0 and the checkpoint to resume from."""
    sweep = tmp_path / "sweep"
    run_dir = sweep / "0"
    out, job_id = _kill_node_mid_run(sweep, seed=8, node_rank=0)  # node 1's GCS, raylet, workers
    log = RunDir(run_dir).log().read_text()
    found = re.search(r"the Ray head on node rlh-node1 \(127\.0\.0\.2, node 0 of job \d+\) went away before its run "
                      r"ended: .* The last complete checkpoint is (\S+): run the same command again", log)
    assert found, log[-4000:]
    assert (Path(found.group(1)) / DONE).exists()
    # Node 2's task failed with that error (Hydra's JobReturn in submitit's result file).
    _, job_return = pickle.loads((sweep / ".submitit" / job_id / f"{job_id}_1_result.pkl").read_bytes())
    error = job_return._return_value
    assert type(error).__name__ == "RayHeadLost" and "node rlh-node1 (127.0.0.2" in str(error), error
    # The submitter, which reads only node 1's (missing) result, adds what node 2 said.
    assert re.search(r"error: the job's task 1: RayHeadLost: the Ray head on node rlh-node1", out), out[-3000:]
    assert "JobState=FAILED" in _slurm("scontrol", "show", "job", job_id)
    assert_nothing_left(job_id)
