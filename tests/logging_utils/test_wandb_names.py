"""W&B names a run by what tells it apart: a run by its `<date>/<time>`, a sweep's job by its sweep and its own
point of the sweep (its directory's bare number said nothing in W&B's run list), grouped by its sweep;
`logger.run_name` and `logger.group` override both."""

from __future__ import annotations

import yaml

from rlharness.logging_utils.wandb_logger import run_names
from tests.helpers import run_cli


def test_a_run_is_named_by_its_date_and_time(tmp_path):
    assert run_names(tmp_path / "outputs" / "2026-11-29" / "02-10-00") == ("2026-11-29/02-10-00", None)


def test_a_sweep_job_is_named_by_its_point_and_grouped_by_its_sweep(tmp_path):
    sweep = tmp_path / "multirun" / "2026-11-29" / "02-10-00"
    (sweep / "1" / ".hydra").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": [
        "engine=sim", "strategy=sync,async", "algo.lr=1e-6,3e-6"]}}}))
    (sweep / "1" / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(
        ["engine=sim", "strategy=sync", "algo.lr=3e-6"]))
    assert run_names(sweep / "1") == ("2026-11-29/02-10-00#1 strategy=sync algo.lr=3e-6", "2026-11-29/02-10-00")


def test_a_real_sweep_names_its_w_and_b_runs(tmp_path):
    sweep = tmp_path / "multirun"
    run_cli(["-m", "engine=sim", "backend=sim", "total_steps=1", "batch_size=2", "sampler.prompt_repeat_k=2",
             "eval_every=0", "strategy=sync,async", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    for n, strategy in enumerate(("sync", "async")):
        log = (sweep / str(n) / "train.log").read_text()
        assert f"'{tmp_path.name}/multirun#{n} strategy={strategy}' in group '{tmp_path.name}/multirun'" in log
    run = tmp_path / "run"
    run_cli(["engine=sim", "backend=sim", "total_steps=1", "batch_size=2", "sampler.prompt_repeat_k=2",
             "eval_every=0", "logger.run_name=baseline", "logger.group=ablation", f"hydra.run.dir={run}"], cwd=tmp_path)
    assert "'baseline' in group 'ablation' (offline)" in (run / "train.log").read_text()
