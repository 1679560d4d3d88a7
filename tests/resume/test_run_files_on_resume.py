"""A resumed run forgets what its lost steps wrote to metrics.jsonl and rollouts/, and rewrites
those files whole (a kill during the rewrite leaves the old file, never a cut one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlharness.logging_utils.ledger import RolloutLedger
from rlharness.logging_utils.metrics import MetricsWriter, read_metrics
from rlharness.core.run_dir import RunDir


def write_rows(path: Path, steps: range) -> None:
    path.write_text("".join(json.dumps({"step": s, "train/loss": 0.1 * s}) + "\n" for s in steps))


def test_metrics_rows_past_the_checkpoint_are_dropped_and_no_temporary_file_is_left(tmp_path):
    write_rows(RunDir(tmp_path).metrics, range(0, 7))
    MetricsWriter(tmp_path, resume_step=4).close()
    assert [r["step"] for r in read_metrics(RunDir(tmp_path).metrics)] == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_failed_rewrite_leaves_the_old_metrics_file_whole(tmp_path, monkeypatch):
    path = RunDir(tmp_path).metrics
    write_rows(path, range(0, 7))
    before = path.read_text()

    def killed(self, target):  # the process dies between writing the new text and publishing it
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        MetricsWriter(tmp_path, resume_step=2)
    assert path.read_text() == before


def test_ledger_steps_and_dropped_rows_past_the_checkpoint_are_forgotten(tmp_path):
    rollouts = RunDir(tmp_path).rollouts
    rollouts.mkdir()
    for step in (1, 2, 3):
        (rollouts / f"step_{step:08d}.jsonl").write_text(json.dumps({"train_step": step}) + "\n")
    (rollouts / "dropped.jsonl").write_text("".join(json.dumps({"train_step": s, "reason": "filtered"}) + "\n"
                                                    for s in (1, 2, 3)))
    RolloutLedger(tmp_path, resume_step=2)
    assert sorted(p.name for p in rollouts.iterdir()) == ["dropped.jsonl", "step_00000001.jsonl",
                                                          "step_00000002.jsonl"]
    assert [json.loads(ln)["train_step"] for ln in (rollouts / "dropped.jsonl").read_text().splitlines()] == [1, 2]
