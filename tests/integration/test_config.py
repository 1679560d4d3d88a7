"""Every config composes; bad values fail before anything starts, naming the key."""

from __future__ import annotations

import re

import pytest

from rlharness.config.schema import ConfigError
from rlharness.config.store import SCHEMAS
from rlharness.launch.preflight import check_placement
from tests.helpers import ROOT, compose_conf, run_cli

GROUP_OPTIONS = [
    (group, p.stem) for group in SCHEMAS for p in sorted((ROOT / "conf" / group).glob("*.yaml"))
]
EXPERIMENTS = [p.stem for p in sorted((ROOT / "conf" / "experiment").glob("*.yaml"))]


def extended_schema(group: str, option: str) -> str:
    """The implementation whose schema conf/<group>/<option>.yaml extends (itself, or the one it presets)."""
    found = re.search(rf"/schema/{group}/(\w+)@", (ROOT / "conf" / group / f"{option}.yaml").read_text())
    assert found, f"conf/{group}/{option}.yaml extends no schema"
    return found.group(1)


def test_every_group_yaml_extends_a_registered_implementation():
    for group, option in GROUP_OPTIONS:
        assert extended_schema(group, option) in SCHEMAS[group], f"conf/{group}/{option}.yaml: no such implementation"


def test_one_table_names_schemas_and_builds_every_implementation():
    """rlharness/config/registry.py is the one registration: each target it names exists (imported
    here), and what a group accepts is what its table lists."""
    from rlharness.config import registry

    import dataclasses

    for group, impls in registry.GROUPS.items():
        for name, impl in impls.items():
            default_name = {f.name: f.default for f in dataclasses.fields(impl.schema)}.get("name", name)
            assert default_name in (name, dataclasses.MISSING, "???"), (group, name, default_name)
            if impl.target is not None:
                assert callable(registry.resolve(impl.target)), (group, name)
    with pytest.raises(ConfigError, match=r"engine.name='nope'.*hf, vllm, sim"):
        registry.build("engine", type("C", (), {"name": "nope"})())


def test_the_config_layer_loads_nothing_heavy():
    """Validating a config imports no torch, transformers or Ray (the registry names builders as text)."""
    import subprocess
    import sys

    code = ("import sys; import rlharness.config.store, rlharness.config.run, rlharness.config.registry; "
            "print(sorted({'torch', 'transformers', 'ray', 'vllm'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_group_option_composes(group, option):
    extra = []
    if group == "task" and option == "jsonl":
        extra = ["task.path=/data/x.jsonl"]
    if group == "backend" and option in ("deepspeed", "fsdp2"):
        extra = ["cluster=local_ray"]
    conf, _ = compose_conf([f"{group}={option}", *extra])
    assert getattr(conf, group).__class__ is SCHEMAS[group][extended_schema(group, option)]


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


@pytest.mark.parametrize("backend", ["deepspeed", "fsdp2"])
def test_ranked_backends_need_ray_and_at_least_one_worker(backend):
    with pytest.raises(ConfigError, match=f"backend={backend} runs its workers as Ray actors"):
        compose_conf([f"backend={backend}"])
    with pytest.raises(ConfigError, match=r"backend\.num_workers=0"):
        compose_conf([f"backend={backend}", "cluster=local_ray", "backend.num_workers=0"])
    conf, _ = compose_conf([f"backend={backend}", "cluster=local_ray"])
    assert conf.backend.ranked and conf.backend.workers == 2


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
    proc = run_cli(["strategy=bogus"], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "bogus" in out and "async" in out and "sync" in out


@pytest.mark.slow
def test_cli_help_and_cfg_job(tmp_path):
    helped = run_cli(["--help"], cwd=tmp_path)
    for group in ("strategy", "engine", "backend", "algo", "task", "cluster"):
        assert group in helped.stdout
    shown = run_cli(["strategy=async", "max_staleness=1", "--cfg", "job"], cwd=tmp_path)
    assert "over_sample_threshold" in shown.stdout and "max_staleness: 1" in shown.stdout


def test_a_run_loads_its_tokenizer_once(monkeypatch):
    """Preflight, the build, the engine and the backend share the process's one tokenizer."""
    import transformers

    from rlharness.launch.build import build_components
    from rlharness.launch.preflight import check_model

    calls = []
    real = transformers.AutoTokenizer.from_pretrained

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", counting)
    monkeypatch.setattr("rlharness.model.load._TOKENIZERS", {})  # as a fresh process: none loaded yet
    conf, _ = compose_conf(["logger=none", "eval.num_prompts=4"])
    check_model(conf)
    components = build_components(conf)
    assert components.tokenizer is components.backend.tokenizer is components.engine.tokenizer
    assert len(calls) == 1, calls
