"""Every Hydra entry form passes the same preflight as a plain start (issue 22, items 2 and 6):
`--config-dir`/`-cd`, `--config-name`/`-cn`, `--config-path`/`-cp`, `-m`, `hydra.run.dir=`,
`resume=`. Fixed keys are refused however they would change, the first life's `.hydra/` is
kept, and a config error is one `error:` line with no new directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from rlharness.launch import run_lock
from rlharness.config.schema import ConfigError
from rlharness.launch.preflight import preflight
from rlharness.core.run_dir import RunDir
from tests.faults.test_refused_input import SIM, refused, snapshot
from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.timeout(600)]


@pytest.fixture
def config_dir(tmp_path) -> Path:
    """A user's own experiment file that changes a fixed key (as `--config-dir` is used for)."""
    d = tmp_path / "myconf"
    (d / "experiment").mkdir(parents=True)
    (d / "experiment" / "mine.yaml").write_text("# @package _global_\nseed: 11\n")
    (d / "experiment" / "keep3.yaml").write_text("# @package _global_\nkeep_checkpoints: 3\n")
    return d


@pytest.mark.parametrize("form, expect", [
    (["--config-dir", "{cd}", "hydra.run.dir={run}", "seed=5", "total_steps=6"], ["seed=5", "fixed"]),
    (["-cd", "{cd}", "hydra.run.dir={run}", "sampler.prompt_repeat_k=4", "total_steps=6"],
     ["sampler.prompt_repeat_k=4", "fixed"]),
    # The change comes from an experiment file, not an override: compared by value with the run's config.
    (["--config-dir={cd}", "hydra.run.dir={run}", "experiment=mine", "total_steps=6"], ["seed=11", "fixed"]),
    (["--config-dir", "{cd}", "resume={run}", "experiment=mine", "total_steps=6"], ["seed=11", "fixed"]),
    (["--config-name", "config", "hydra.run.dir={run}", "seed=5", "total_steps=6"], ["seed=5", "fixed"]),
    (["-cp", str(ROOT / "conf"), "-cn", "config", "hydra.run.dir={run}", "task.seed=7", "total_steps=6"],
     ["task.seed=7", "fixed"]),
    (["resume={run}", "sampler.shuffle=false"], ["sampler.shuffle=false", "fixed"]),
    (["resume={run}", "batch_size=4", "total_steps=6"], ["batch_size=4", "fixed"]),
    (["-m", "resume={run}", "total_steps=6"], ["-m", "resume="]),
])
def test_every_entry_form_refuses_a_fixed_key_and_keeps_the_run(finished_run, config_dir, form, expect):
    args = [a.format(cd=config_dir, run=finished_run, parent=finished_run.parent) for a in form]
    refused([*SIM, *args], finished_run.parent, expect, watch=finished_run)


@pytest.mark.parametrize("form, expect", [
    (["--config-dir", "{cd}", "algo.lrr=3"], ["algo.lrr=3", "did you mean algo.lr?"]),
    (["--config-dir", "{cd}", "experiment=nope"], ["experiment=nope", "mine"]),  # the user's files are listed
    (["--config-dir", "{cd}/missing"], ["--config-dir", "no such directory"]),
    (["-cn", "nope"], ["nope"]),
    (["-m", "-cd", "{cd}", "seed=1,-2"], ["seed=-2"]),
])
def test_config_errors_of_every_entry_form_are_one_line_and_leave_no_directory(tmp_path, config_dir, form, expect):
    work = tmp_path / "work"
    work.mkdir()
    refused([*SIM, *[a.format(cd=config_dir) for a in form]], work, expect)


def test_a_config_dir_resume_keeps_the_first_hydra_and_records_the_new_config(finished_run, config_dir, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    first = {p.name: p.read_bytes() for p in RunDir(run_dir).hydra.glob("*.yaml")}
    proc = run_cli(["--config-dir", str(config_dir), *SIM, f"hydra.run.dir={run_dir}", "experiment=keep3",
                    "total_steps=5"], cwd=tmp_path)
    assert "continuing it as resume=" in proc.stderr
    assert {p.name: p.read_bytes() for p in RunDir(run_dir).hydra.glob("*.yaml")} == first
    resumed = sorted(RunDir(run_dir).hydra.glob("resumed-*"))
    assert len(resumed) == 1
    assert "experiment=keep3" in yaml.safe_load((resumed[0] / "overrides.yaml").read_text())
    # The user's experiment applied: three checkpoints kept (steps 2, 4, 5), not the default two.
    assert sorted(p.name for p in RunDir(run_dir).checkpoints.iterdir()) == [
        "step_00000002", "step_00000004", "step_00000005"]
    # Resumed again without --config-dir: composed as the newest life was (its overrides, its --config-dir).
    try:
        argv, _, _ = preflight(["train.py", f"resume={run_dir}", "total_steps=7"])
    finally:
        run_lock.release(run_dir)
    assert f"--config-dir={config_dir}" in argv and "experiment=keep3" in argv and argv[-4] == "total_steps=7"


def _run_dir_with(tmp_path: Path, overrides: list[str]) -> Path:
    """A run directory as a first life leaves it before its first checkpoint (.hydra/ only)."""
    run_dir = tmp_path / "run"
    RunDir(run_dir).hydra.mkdir(parents=True)
    RunDir(run_dir).overrides.write_text(yaml.safe_dump(overrides))
    return run_dir


def test_resume_overrides_of_keys_only_the_runs_experiment_has(tmp_path):
    """`agent.max_turns` exists only under experiment=chat_tools (multi_turn_tool): checked after the
    run's saved overrides are merged, not against the defaults."""
    run_dir = _run_dir_with(tmp_path, ["experiment=chat_tools", "engine=sim", "backend=sim"])
    try:
        argv, applied, guard = preflight(["train.py", f"hydra.run.dir={run_dir}", "agent.max_turns=3"])
    finally:
        run_lock.release(run_dir)
    assert applied == ["agent.max_turns=3"]
    assert "experiment=chat_tools" in argv and "agent.max_turns=3" in argv
    with pytest.raises(ConfigError, match="agent.max_turns"):  # still checked: a bad value is refused
        preflight(["train.py", f"hydra.run.dir={run_dir}", "agent.max_turns=0"])
    assert not run_lock.holds(run_dir)


def test_a_resume_composes_from_the_runs_own_config_dir(tmp_path, config_dir):
    """The run's first life was composed with --config-dir: a resume without it uses the same one."""
    run_dir = _run_dir_with(tmp_path, ["experiment=keep3", "engine=sim", "backend=sim"])
    (RunDir(run_dir).hydra / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {
        "job": {"config_name": "config"},
        "runtime": {"config_sources": [{"path": str(config_dir), "schema": "file", "provider": "command-line"}]}}}))
    try:
        argv, _, _ = preflight(["train.py", f"hydra.run.dir={run_dir}", "total_steps=3"])
    finally:
        run_lock.release(run_dir)
    assert f"--config-dir={config_dir}" in argv
    with pytest.raises(ConfigError, match="--config-name=other"):
        preflight(["train.py", "-cn", "other", f"hydra.run.dir={run_dir}"])
    assert snapshot(run_dir)  # still there
