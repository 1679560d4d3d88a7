"""Sweep summary from fabricated job directories (no training): rows, statuses, files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from rlharness.core.run_dir import RunDir
from rlharness.sweep import main, read_metrics, summarize_sweep, write_summary


def _job(sweep: Path, num: int, overrides: list[str], total_steps: int, metrics: list[dict],
         job_id: str = "", tail: str = "") -> Path:
    job_dir = sweep / str(num)
    RunDir(job_dir).hydra.mkdir(parents=True)
    RunDir(job_dir).overrides.write_text(yaml.safe_dump(overrides))
    RunDir(job_dir).config.write_text(yaml.safe_dump({"total_steps": total_steps, "seed": num}))
    (RunDir(job_dir).hydra / "hydra.yaml").write_text(
        yaml.safe_dump({"hydra": {"job": {"num": num, "id": job_id or f"job_id_for_{num}"}}}))
    RunDir(job_dir).metrics.write_text("".join(json.dumps(m) + "\n" for m in metrics) + tail)
    return job_dir


def _metrics(steps: int, reward0: float, eval_every: int = 2) -> list[dict]:
    rows = []
    for step in range(1, steps + 1):
        row = {"step": step, "train/loss": 1.0 / step, "rollout/reward_mean": reward0 + 0.1 * step,
               "perf/step_s": 0.01}
        if step % eval_every == 0:
            row["eval/accuracy"] = 0.05 * step
        rows.append(row)
    return rows


@pytest.fixture
def sweep(tmp_path) -> Path:
    sweep = tmp_path / "multirun"
    _job(sweep, 0, ["strategy=sync", "max_staleness=0"], 4, _metrics(4, 0.0), job_id="101_0")
    _job(sweep, 1, ["strategy=async", "max_staleness=1", "hydra.launcher.timeout_min=5"], 4,
         _metrics(4, 0.5), job_id="101_1")
    # Crashed after 2 of 4 steps, killed mid-write: a truncated last line.
    _job(sweep, 2, ["strategy=async", "max_staleness=2"], 4, _metrics(2, 0.2), tail='{"step": 3, "train/lo')
    return sweep


def test_summary_rows_statuses_and_final_metrics(sweep):
    jobs = summarize_sweep(sweep)
    assert [j.job for j in jobs] == [0, 1, 2]
    assert [j.status for j in jobs] == ["ok", "ok", "failed"]
    assert [j.steps_done for j in jobs] == [4, 4, 2]
    assert jobs[1].job_id == "101_1"
    assert jobs[1].overrides == "strategy=async max_staleness=1"  # hydra.* overrides hidden
    assert [j.label for j in jobs] == ["strategy=sync max_staleness=0", "strategy=async max_staleness=1",
                                       "strategy=async max_staleness=2"]
    assert jobs[0].final == pytest.approx({"train/loss": 0.25, "rollout/reward_mean": 0.4, "eval/accuracy": 0.2})
    assert jobs[2].final["eval/accuracy"] == pytest.approx(0.1)
    assert jobs[1].curves["eval/accuracy"] == [(2, pytest.approx(0.1)), (4, pytest.approx(0.2))]


def test_summary_files_written(sweep):
    write_summary(sweep)
    with (sweep / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "ok", "failed"]
    assert float(rows[1]["rollout/reward_mean"]) == pytest.approx(0.9)
    assert rows[0]["job_id"] == "101_0"
    md = (sweep / "summary.md").read_text()
    assert "| strategy=async max_staleness=2 | failed | 2 | 4 |" in md
    png = (sweep / "summary.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000


def test_truncated_line_is_skipped_with_a_warning(sweep, caplog):
    rows = read_metrics(RunDir(sweep / "2").metrics)
    assert [r["step"] for r in rows] == [1, 2]
    assert "metrics.jsonl:3" in caplog.text


def test_cli_exit_status_and_bad_directory(sweep, tmp_path, capsys):
    assert main([str(sweep)]) == 1  # one job failed
    assert (sweep / "summary.md").is_file()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "empty")])
    assert "holds no Hydra job directories" in capsys.readouterr().err
