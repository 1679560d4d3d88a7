"""With `sync_weights_interval` > 1 the evaluation runs on the weights just trained, and the ledger's
policy versions are those the engine had (issue 22, item 5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlharness.core.checkpoint import complete_checkpoints
from rlharness.trainer.evaluator import Evaluator
from rlharness.core.run_dir import RunDir
from tests.faults.test_refused_input import SIM
from tests.helpers import run_in_process

pytestmark = [pytest.mark.timeout(300)]


def ledger_versions(run_dir: Path) -> dict[int, tuple[int, int]]:
    """train step -> (min, max) policy version over its trained samples."""
    out = {}
    for f in sorted(RunDir(run_dir).rollouts.glob("step_*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        out[rows[0]["train_step"]] = (min(r["min_policy_version"] for r in rows),
                                      max(r["max_policy_version"] for r in rows))
    return out


@pytest.fixture
def eval_versions(monkeypatch) -> list[int]:
    """The engine's weight version at every evaluation."""
    seen: list[int] = []
    original = Evaluator.evaluate

    async def evaluate(self):
        seen.append(self.greedy_loop.engine.version)
        return await original(self)

    monkeypatch.setattr(Evaluator, "evaluate", evaluate)
    return seen


def test_evaluation_uses_the_trained_weights_and_versions_stay_true(tmp_path, eval_versions):
    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*SIM, "sync_weights_interval=3", "eval_every=2", "total_steps=5", "save_every=0"])
    # Evaluations at steps 0, 2, 4 and 5 (the last step): each on that step's weights, synced first.
    assert eval_versions == [0, 2, 4, 5]
    # Samples of step 3 come from the weights synced for step 2's evaluation; step 4's from step 3's
    # regular sync (3 % 3 == 0); step 5's from step 4's evaluation.
    assert ledger_versions(run_dir) == {1: (0, 0), 2: (0, 0), 3: (2, 2), 4: (3, 3), 5: (4, 4)}


def test_a_resumed_engine_is_stamped_with_the_checkpoints_weights(tmp_path, eval_versions):
    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*SIM, "sync_weights_interval=3", "eval_every=0", "total_steps=3", "save_every=1",
                             "keep_checkpoints=5"])
    for step, path in complete_checkpoints(run_dir)[1:]:  # back to the checkpoint of step 1 (engine at 0)
        shutil.rmtree(path)
    run_in_process(run_dir, [*SIM, "sync_weights_interval=3", "eval_every=0", "total_steps=3", "save_every=1",
                             "keep_checkpoints=5"])
    # The resumed engine holds the weights of step 1 (the checkpoint's): its tokens say version 1, not 0.
    assert ledger_versions(run_dir) == {1: (0, 0), 2: (1, 1), 3: (1, 1)}
