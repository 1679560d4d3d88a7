"""Real sweeps of train.py (simulated engine and trainer) on the basic launcher and on
submitit_local; each ends with the sweep summary."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rlharness.core.run_dir import RunDir
from tests.helpers import run_cli

SMALL = ["engine=sim", "backend=sim", "total_steps=3", "batch_size=2", "sampler.prompt_repeat_k=2",
         "eval.num_prompts=8", "logger=none"]


def _sweep(tmp_path: Path, *overrides: str) -> tuple[Path, str]:
    sweep = tmp_path / "multirun"
    out = run_cli(["-m", *SMALL, *overrides, f"hydra.sweep.dir={sweep}"], cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return sweep, out.stdout + out.stderr


def _summary(sweep: Path) -> list[dict]:
    with (sweep / "summary.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_strategy_by_staleness_sweep_on_the_basic_launcher(tmp_path):
    sweep, _ = _sweep(tmp_path, "strategy=sync,async", "max_staleness=0,1")
    rows = _summary(sweep)
    assert len(rows) == 4
    assert {r["overrides"].split(" ", len(SMALL))[-1] for r in rows} == {
        "strategy=sync max_staleness=0", "strategy=sync max_staleness=1",
        "strategy=async max_staleness=0", "strategy=async max_staleness=1"}
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert [r["steps_done"] for r in rows] == ["3"] * 4
    assert all(r["train/loss"] != "" and r["rollout/reward_mean"] != "" for r in rows)
    for num in range(4):
        assert RunDir(sweep / str(num)).metrics.is_file()
    assert (sweep / "summary.md").is_file() and (sweep / "summary.png").stat().st_size > 5000


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sweep_on_submitit_local(tmp_path):
    sweep, out = _sweep(tmp_path, "hydra/launcher=submitit_local", "strategy=sync,async")
    rows = _summary(sweep)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert [r["job_id"] for r in rows] != ["", ""]  # submitit's local job ids
    assert all(f"id {r['job_id']}, ok" in out for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["basic", "submitit_local"])
def test_a_sweep_with_a_failed_job_still_ends_with_its_summary(tmp_path, launcher):
    """Hydra raises the failed job's error once every job has run, before its end-of-sweep callback: the summary
    is written all the same, the other jobs' results with it, and the last line names the failed job."""
    good = tmp_path / "good.jsonl"
    good.write_text("".join(f'{{"question": "{i}+1", "answer": "#### {i + 1}"}}\n' for i in range(40)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + '{"question": "no answer"}\n')
    sweep = tmp_path / "multirun"
    chosen = [] if launcher == "basic" else [f"hydra/launcher={launcher}"]
    out = run_cli(["-m", *SMALL, *chosen, "task=jsonl", "task.num_eval=8", f"task.path={good},{bad}",
                   f"hydra.sweep.dir={sweep}"], cwd=tmp_path, check=False)
    assert out.returncode == 1, out.stderr[-3000:]
    assert [(r["status"], r["steps_done"]) for r in _summary(sweep)] == [("ok", "3"), ("failed", "0")]
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: 1 of 2 sweep job(s) did not finish: #1 (task.path={bad}); each one's train.log says why; "
        f"summary: {sweep}/summary.md")
    assert "bad.jsonl:41: missing field 'answer'" in (sweep / "1" / "train.log").read_text()
    assert (sweep / "summary.png").is_file()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sweep_stopped_by_a_signal_says_how_to_continue_it_and_does(tmp_path):
    """SIGINT at job 0's second step (a named point, not a moment) stops the whole sweep with its summary; the
    same command again into the same directory continues job 0 from its checkpoint and runs the other."""
    from rlharness.core.fault_points import signal_at

    sweep = tmp_path / "multirun"
    command = ["-m", *SMALL, "save_every=1", "seed=1,2", f"hydra.sweep.dir={sweep}"]
    out = run_cli(command, cwd=tmp_path, check=False, env=signal_at("SIGINT", "step_trained", 2))
    assert out.returncode == 130, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert f"continue the sweep with its command and hydra.sweep.dir={sweep}" in lines[-2]
    assert lines[-1] == (f"error: the sweep was stopped by SIGINT after 1 job(s) had started; summary: "
                         f"{sweep}/summary.md; to continue it (each started job from its checkpoint, then the jobs "
                         f"not started), run its command again with hydra.sweep.dir={sweep}")
    assert [(r["status"], r["steps_done"]) for r in _summary(sweep)] == [("failed", "2")]
    run_cli(command, cwd=tmp_path)
    assert [(r["status"], r["steps_done"]) for r in _summary(sweep)] == [("ok", "3"), ("ok", "3")]
    assert "resumed from" in (sweep / "0" / "train.log").read_text()
    # The sweep's own directory where a run directory is asked for: its jobs are named.
    jobs = f"a sweep's directory, whose jobs are the run directories {sweep}/0, {sweep}/1"
    for args, script in (([f"resume={sweep}"], "train.py"), ([f"resume={sweep}"], "evaluate.py"),
                         ([sweep, tmp_path / "exported"], "rlharness.export")):
        refused = run_cli(args, cwd=tmp_path, check=False, script=script)
        assert refused.returncode == 2 and jobs in refused.stderr.strip().splitlines()[-1], refused.stderr[-2000:]
