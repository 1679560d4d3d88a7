"""The run directory's names (the README's run-directory table, written out here, not read from RunDir) and what
marks a directory as holding a run."""

from __future__ import annotations

from pathlib import Path

from rlharness.core.run_dir import RunDir


def test_the_names_are_design_mds(tmp_path):
    run = RunDir(tmp_path)
    assert run.hydra == tmp_path / ".hydra"
    assert run.config == tmp_path / ".hydra" / "config.yaml"
    assert run.overrides == tmp_path / ".hydra" / "overrides.yaml"
    assert run.log() == tmp_path / "train.log"
    assert run.lock == tmp_path / ".lock"
    assert run.metrics == tmp_path / "metrics.jsonl"
    assert run.checkpoint(12) == tmp_path / "checkpoints" / "step_00000012"
    assert run.rollout(3) == tmp_path / "rollouts" / "step_00000003.jsonl"
    assert run.dropped == tmp_path / "rollouts" / "dropped.jsonl"
    assert run.eval_file(0) == tmp_path / "evals" / "step_00000000.jsonl"
    assert run.eval_file("model") == tmp_path / "evals" / "model.jsonl"
    assert run.plots == tmp_path / "plots"
    assert run.wandb == tmp_path / "wandb"
    assert run.summary == tmp_path / "summary.json"


def test_what_marks_a_run(tmp_path):
    run = RunDir(tmp_path / "run")
    assert not run.holds_run()  # not there
    run.path.mkdir()
    (run.path / ".lock").write_text("1\n")
    (run.path / "train.log").write_text("refused\n")
    assert not run.holds_run()  # what a refused start may leave
    (run.path / ".hydra").mkdir()
    assert run.holds_run()  # composed here: its config (fixed keys included) is the run's
    assert not run.has_run_outputs()  # ...but a job's own Hydra writes .hydra/ before the job starts
    for name in ("checkpoints", "metrics.jsonl", "rollouts"):
        other = RunDir(tmp_path / name)
        other.path.mkdir()
        (Path(other.path) / name).mkdir()
        assert other.holds_run() and other.has_run_outputs(), name
