"""Run files changed behind a run's back are said on resume, with file and line, and the rest is kept
(issue 22, item 10): a corrupt line of metrics.jsonl or rollouts/dropped.jsonl, a deleted rollouts/."""

from __future__ import annotations

import json
import logging
import shutil

from rlharness.logging_utils.ledger import RolloutLedger
from rlharness.logging_utils.metrics import MetricsWriter, read_metrics
from rlharness.core.run_dir import RunDir
from tests.faults.test_refused_input import SIM
from tests.helpers import run_in_process


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_corrupt_metrics_line_is_named_and_the_rest_kept(tmp_path, caplog):
    path = RunDir(tmp_path).metrics
    rows = [json.dumps({"step": s, "train/loss": 0.1 * s}) for s in range(5)]
    rows[2] = '{"step": 2, "train/lo'  # changed by hand, not the last line
    rows.insert(4, '["not", "a", "row"]')
    path.write_text("\n".join(rows) + "\n")
    with caplog.at_level(logging.WARNING):
        MetricsWriter(tmp_path, resume_step=3).close()
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 3]
    said = _warnings(caplog)
    assert len(said) == 2, said
    assert f"{path}:3: not JSON" in said[0] and f"{path}:5: no integer 'step'" in said[1]


def test_a_corrupt_dropped_line_is_named_and_the_rest_kept(tmp_path, caplog):
    rollouts = RunDir(tmp_path).rollouts
    rollouts.mkdir()
    for step in (1, 2):
        (rollouts / f"step_{step:08d}.jsonl").write_text(json.dumps({"train_step": step}) + "\n")
    dropped = rollouts / "dropped.jsonl"
    dropped.write_text(json.dumps({"train_step": 1, "reason": "a"}) + "\n\x00\x00garbage\n"
                       + json.dumps({"train_step": 2, "reason": "b"}) + "\n")
    with caplog.at_level(logging.WARNING):
        RolloutLedger(tmp_path, resume_step=2)
    assert [json.loads(ln)["reason"] for ln in dropped.read_text().splitlines()] == ["a", "b"]
    said = _warnings(caplog)
    assert len(said) == 1 and f"{dropped}:2: not JSON" in said[0], said


def test_a_deleted_ledger_is_said_on_resume(tmp_path, caplog):
    run_dir = tmp_path / "run"
    args = [*SIM, "total_steps=2", "save_every=2"]
    run_in_process(run_dir, args)
    shutil.rmtree(RunDir(run_dir).rollouts)
    with caplog.at_level(logging.WARNING):
        run_in_process(run_dir, [*SIM, "total_steps=3", "save_every=2"])
    said = [m for m in _warnings(caplog) if "rollouts" in m]
    assert len(said) == 1 and "missing" in said[0] and "steps 1-2" in said[0], _warnings(caplog)
    assert RunDir(run_dir).rollout(3).is_file()  # the run went on
    # Some step files gone: each is named.
    for step in (1, 3):
        RunDir(run_dir).rollout(step).unlink(missing_ok=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        RolloutLedger(run_dir, resume_step=3)
    said = [m for m in _warnings(caplog) if "rollouts" in m]
    assert len(said) == 1 and "3 of the checkpoint's 3 steps" in said[0] and "steps 1, 2, 3" in said[0], said
