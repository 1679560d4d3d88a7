"""Every config composes; bad values fail before anything starts, naming the key."""

from __future__ import annotations

import pytest

from rlharness.config.schema import ConfigError
from rlharness.config.store import SCHEMAS
from rlharness.launch.preflight import check_placement
from tests.helpers import ROOT, compose_conf, run_cli

GROUP_OPTIONS = [
    (group, p.stem) for group in SCHEMAS for p in sorted((ROOT / "conf" / group).glob("*.yaml"))
]
EXPERIMENTS = [p.stem for p in sorted((ROOT / "conf" / "experiment").glob("*.yaml"))]


def test_every_group_yaml_has_a_schema():
    for group, option in GROUP_OPTIONS:
        assert option in SCHEMAS[group], f"conf/{group}/{option}.yaml has no registered schema"


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_group_option_composes(group, option):
    extra = []
    if group == "task" and option == "jsonl":
        extra = ["task.path=/data/x.jsonl"]
    if group == "backend" and option == "deepspeed":
        extra = ["cluster=local_ray"]
    conf, _ = compose_conf([f"{group}={option}", *extra])
    assert getattr(conf, group).__class__ is SCHEMAS[group][option]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    extra = ["task.path=/data/x.jsonl"] if experiment == "gsm8k" else []
    conf, _ = compose_conf([f"experiment={experiment}", *extra])
    assert conf.total_steps >= 1


def test_top_level_max_staleness_reaches_the_strategy():
    conf, _ = compose_conf(["strategy=async", "max_staleness=3"])
    assert conf.strategy.max_staleness == 3 and conf.max_staleness == 3


@pytest.mark.parametrize("override,key", [
    ("batch_size=0", "batch_size"),
    ("mode=sideways", "mode"),
    ("algo.lr=-1", "algo.lr"),
    ("sampler.prompt_repeat_k=0", "sampler.prompt_repeat_k"),
    ("algo.loss_agg=mean", "algo.loss_agg"),
    ("eval.num_prompts=100000", "eval.num_prompts"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_conf([override])


def test_wrong_type_names_the_key():
    with pytest.raises(Exception, match="lr"):
        compose_conf(["algo.lr=abc"])


def test_disagg_that_the_cluster_cannot_hold_is_refused():
    with pytest.raises(ConfigError, match="num_cpus"):
        check_placement(compose_conf(["mode=disagg", "cluster=local_ray", "cluster.num_cpus=1"])[0])


def test_config_validity_does_not_depend_on_what_is_installed():
    """The config module imports nothing that runs a job (engines, Ray, Slurm, the placement plan): where a
    vLLM engine runs depends on the installed vLLM build, so that is asked by preflight, never by RunConf."""
    import ast

    tree = ast.parse((ROOT / "rlharness" / "config" / "schema.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m.startswith(("rlharness.engine", "rlharness.distributed",
                                                      "rlharness.launch", "rlharness.distributed.placement_plan"))}
    compose_conf(["cluster=slurm", "mode=disagg", "cluster.nodes=2", "engine=vllm"])  # valid, vLLM or not


@pytest.mark.slow
def test_cli_unknown_option_lists_the_available_ones(tmp_path):
    proc = run_cli(["strategy=bogus"], cwd=tmp_path, check=False, timeout_s=120)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "bogus" in out and "async" in out and "sync" in out


@pytest.mark.slow
def test_cli_help_and_cfg_job(tmp_path):
    helped = run_cli(["--help"], cwd=tmp_path, timeout_s=120)
    for group in ("strategy", "engine", "backend", "algo", "task", "cluster"):
        assert group in helped.stdout
    shown = run_cli(["strategy=async", "max_staleness=1", "--cfg", "job"], cwd=tmp_path, timeout_s=120)
    assert "over_sample_threshold" in shown.stdout and "max_staleness: 1" in shown.stdout
