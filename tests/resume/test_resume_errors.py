"""Bad resume input: a clear error naming what is wrong, and the run directory untouched."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from rlharness.core.checkpoint import CheckpointError
from rlharness.config.schema import ConfigError
from rlharness.launch.overrides import prepare_resume_argv
from rlharness.core.run_dir import RunDir
from tests.helpers import run_in_process

SIM = ["engine=sim", "backend=sim", "eval_every=0", "logger.mode=disabled", "batch_size=8",
       "sampler.prompt_repeat_k=2", "engine.time_per_token_s=0.0002"]


def snapshot(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("resume") / "run"
    run_in_process(run_dir, [*SIM, "total_steps=4", "save_every=2"])
    RunDir(run_dir).hydra.mkdir()
    RunDir(run_dir).overrides.write_text(yaml.safe_dump([*SIM, "total_steps=4", "save_every=2"]))
    return run_dir


def test_missing_directory(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        prepare_resume_argv(["train.py", f"resume={tmp_path / 'nope'}"])


def test_not_a_run_directory(tmp_path):
    with pytest.raises(ConfigError, match="not a run directory"):
        prepare_resume_argv(["train.py", f"resume={tmp_path}"])


def test_no_complete_checkpoint(tmp_path):
    RunDir(tmp_path).hydra.mkdir()
    RunDir(tmp_path).overrides.write_text("[]\n")
    RunDir(tmp_path).checkpoint(2).mkdir(parents=True)  # no DONE: a write that was killed
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        prepare_resume_argv(["train.py", f"resume={tmp_path}"])


def test_override_that_breaks_the_checkpoint_is_refused(finished_run):
    with pytest.raises(ConfigError, match="model.path"):
        prepare_resume_argv(["train.py", f"resume={finished_run}", "model.path=/elsewhere"])
    with pytest.raises(ConfigError, match="task"):
        prepare_resume_argv(["train.py", f"resume={finished_run}", "task=countdown"])


def test_saved_overrides_are_replayed_and_new_ones_win(finished_run):
    argv, applied = prepare_resume_argv(["train.py", f"resume={finished_run}", "total_steps=6"])
    assert applied == ["total_steps=6"]
    assert "total_steps=6" in argv and "total_steps=4" not in argv
    assert "engine=sim" in argv and f"hydra.run.dir={finished_run.resolve()}" in argv
    assert "resume=auto" in argv


def test_resume_continues_to_more_steps(tmp_path):
    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*SIM, "total_steps=3", "save_every=3"])
    run_in_process(run_dir, [*SIM, "total_steps=5", "save_every=3"])
    from rlharness.logging_utils.metrics import read_metrics

    steps = [r["step"] for r in read_metrics(RunDir(run_dir).metrics) if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5]


def test_corrupted_checkpoint_is_a_clear_error_and_damages_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*SIM, "total_steps=2", "save_every=2"])
    trainer_pt = RunDir(run_dir).checkpoint(2) / "trainer.pt"
    trainer_pt.write_bytes(trainer_pt.read_bytes()[:100])
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError, match="step_00000002.*corrupted"):
        run_in_process(run_dir, [*SIM, "total_steps=4"])
    assert snapshot(run_dir) == before


def test_input_refused_before_training_is_a_refused_input_carrying_its_error(tmp_path):
    """What train.py rolls back and prints as one line is told by type: `launcher.run` raises RefusedInput
    (the CheckpointError that refused it inside), and nothing of the run was touched."""
    from rlharness.launch.launcher import RefusedInput, run
    from tests.helpers import compose_conf

    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*SIM, "total_steps=2", "save_every=2"])
    trainer_pt = RunDir(run_dir).checkpoint(2) / "trainer.pt"
    trainer_pt.write_bytes(trainer_pt.read_bytes()[:100])
    before = snapshot(run_dir)
    with pytest.raises(RefusedInput, match="step_00000002.*corrupted") as refused:
        run(*compose_conf([*SIM, "total_steps=4"], run_dir))
    assert isinstance(refused.value.error, CheckpointError) and refused.value.__cause__ is refused.value.error
    assert snapshot(run_dir) == before
