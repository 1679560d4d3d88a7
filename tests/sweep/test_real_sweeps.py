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
