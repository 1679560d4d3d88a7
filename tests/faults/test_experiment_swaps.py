"""A group swapped under an experiment (`experiment=chat_math judger=reward_model`) gives a run, or one
line naming the experiment, the key and what to do; never Hydra's raw ConfigKeyError.

What happens is decided for every shipped experiment and every option of every group it picks or sets
keys of (the matrix below composes each pair as train.py's preflight does): the experiments keep their
group-specific settings in options of those groups (judger=math_strict, task=tiny_chat_math,
agent=one_tool_call, ...), so a swap replaces that part whole and the run goes on with the
experiment's other settings. The exceptions are `REFUSED`: an experiment whose point is the group
(sim_async's async strategy), a key only some options have (gateway_tools' task.apply_chat_template),
and a multi-task experiment, where a run-level task or judger would apply to no task."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml

from rlharness.config.schema import ConfigError
from rlharness.config.store import SCHEMAS
from rlharness.launch.preflight import compose_typed
from tests.helpers import ROOT
from tests.integration.test_config import extended_schema

EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
GROUPS = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "experiment")
# What a swapped-in option needs on any command line (not the experiment's business).
NEEDS = {("task", "jsonl"): ["task.path=/data/x.jsonl"], ("judger", "reward_model"): ["judger.path=/models/rm"],
         ("backend", "deepspeed"): ["cluster=local_ray"], ("cluster", "slurm"): []}
EXPERIMENT_NEEDS = {"gsm8k": ["task.path=/data/x.jsonl"]}
# (experiment, group) -> the options refused, with a word the line must hold.
REFUSED = {
    ("sim_async", "strategy"): ({"sync"}, "strategy.over_sample_threshold"),
    ("gateway_tools", "task"): ({"arithmetic", "arithmetic_unpadded", "countdown"}, "task.apply_chat_template"),
    ("gateway_code", "task"): ({"arithmetic", "arithmetic_unpadded", "countdown"}, "task.apply_chat_template"),
    ("arith_mix", "task"): ("every", "several tasks"),
    ("arith_mix", "judger"): ("every", "several tasks"),
}


def touched_groups(experiment: str) -> set[str]:
    """The groups an experiment picks (defaults) or sets keys of: the swaps that could meet its settings."""
    spec = yaml.safe_load((ROOT / "conf" / "experiment" / f"{experiment}.yaml").read_text()) or {}
    picked = {next(iter(d)).split("/")[-1].split("@")[0] for d in spec.get("defaults", []) if isinstance(d, dict)}
    several_tasks = {"task", "judger"} if "tasks" in spec else set()  # run-level ones would apply to no task
    return (picked | set(spec) | several_tasks) & set(GROUPS)


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


def schema(group: str, option: str) -> type:
    """The schema conf/<group>/<option>.yaml extends (an implementation's, or the one it presets)."""
    return SCHEMAS[group][extended_schema(group, option)]


def missing_keys(values: dict, schema: type, prefix: str) -> list[str]:
    """The keys of `values` (nested) that `schema` does not have."""
    hints = typing.get_type_hints(schema)
    missing = []
    for key, value in values.items():
        if key not in hints:
            missing.append(prefix + key)
        elif isinstance(value, dict) and dataclasses.is_dataclass(hints[key]):
            missing += missing_keys(value, hints[key], f"{prefix}{key}.")
    return missing


def refused_options(experiment: str, group: str) -> set[str]:
    chosen, _ = REFUSED.get((experiment, group), (set(), ""))
    return set(options(group)) if chosen == "every" else chosen


def test_every_experiment_sets_only_keys_that_every_option_of_the_group_has():
    """The rule that makes swaps work, checked for every experiment x group x option without composing
    (fast): the keys an experiment sets under a group exist in every option of that group, except where
    `REFUSED` says so (and there they must be missing, or the table is stale)."""
    for experiment in EXPERIMENTS:
        spec = yaml.safe_load((ROOT / "conf" / "experiment" / f"{experiment}.yaml").read_text()) or {}
        for group in sorted(touched_groups(experiment)):
            for option in options(group):
                if REFUSED.get((experiment, group), ("",))[0] == "every":
                    continue  # refused whatever the keys (a multi-task experiment)
                missing = missing_keys(spec.get(group) or {}, schema(group, option), f"{group}.")
                assert not missing or option in refused_options(experiment, group), (
                    f"experiment={experiment} sets {missing}, which {group}={option} does not have: move them into "
                    f"an option of conf/{group}/ that the experiment picks, or add the pair to REFUSED")
                assert missing or option not in refused_options(experiment, group), (
                    f"REFUSED is stale: experiment={experiment} {group}={option} composes")


# The swaps users try, composed as train.py's preflight does: a run, with the user's option whole and the
# experiment's other settings kept.
RUNS = [("chat_math", "judger", "reward_model"), ("chat_math", "judger", "llm"), ("chat_math", "judger", "remote"),
        ("chat_math", "model", "smollm2"), ("chat_math", "algo", "ppo"), ("chat_math", "task", "countdown"),
        ("chat_tools", "agent", "single_turn"), ("chat_tools", "judger", "math"), ("chat_tools", "model", "smollm2"),
        ("gateway_tools", "agent", "multi_turn_tool"), ("gateway_tools", "task", "tiny_chat_math"),
        ("smollm2_arith", "judger", "math"), ("smollm2_arith", "task", "arithmetic"),
        ("smollm2_arith", "model", "tiny_chat"), ("arith_rm", "judger", "reward_model"),
        ("arith_async", "strategy", "sync"), ("gsm8k", "algo", "drgrpo"), ("countdown", "task", "arithmetic"),
        ("code_tools", "agent", "multi_turn_tool"), ("code_tools", "judger", "math"), ("gateway_code", "agent", "single_turn")]
REFUSALS = [(e, g, o) for (e, g), (chosen, _) in REFUSED.items()
            for o in (["countdown" if g == "task" else "math"] if chosen == "every" else sorted(chosen))]


@pytest.mark.parametrize("experiment, group, option", RUNS + REFUSALS)
def test_a_group_swapped_under_an_experiment_runs_or_is_refused_in_one_line(experiment, group, option):
    extra = EXPERIMENT_NEEDS.get(experiment, []) + NEEDS.get((group, option), [])
    args = [f"experiment={experiment}", f"{group}={option}", *extra, "hydra.run.dir=/tmp/unused"]
    if option in refused_options(experiment, group):
        with pytest.raises(ConfigError) as err:
            compose_typed(args)
        line = str(err.value)
        assert "\n" not in line and REFUSED[experiment, group][1] in line and f"experiment={experiment}" in line, line
        assert "ConfigKeyError" not in line and "full_key" not in line, line
        return
    _, conf = compose_typed(args)
    assert type(getattr(conf, group)) is schema(group, option)  # the user's option, whole
    base = compose_typed([f"experiment={experiment}", *EXPERIMENT_NEEDS.get(experiment, []),
                          "hydra.run.dir=/tmp/unused"])[1]
    for key in ("batch_size", "total_steps", "eval_every"):  # the experiment's other settings stay
        assert getattr(conf, key) == getattr(base, key)


def test_the_issues_example_trains_with_the_experiments_model_and_data(tmp_path):
    """`experiment=chat_math judger=reward_model judger.path=...`: the real command line trains on the
    reward model, with chat_math's model, data and budget."""
    import json

    from rlharness.core.run_dir import RunDir
    from tests.helpers import run_cli
    from tests.judger.test_learned_judgers import save_classifier

    rm = save_classifier(tmp_path / "rm")
    run_dir = tmp_path / "run"
    run_cli(["experiment=chat_math", "judger=reward_model", f"judger.path={rm}", "engine=sim", "backend=sim",
             "total_steps=1", "batch_size=2", "sampler.prompt_repeat_k=2", "eval_every=0", "eval.num_prompts=2",
             "logger=none", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    config = yaml.safe_load(RunDir(run_dir).config.read_text())
    assert config["judger"]["name"] == "reward_model" and config["model"]["path"] == "assets/tiny-chat"
    assert config["task"]["path"].endswith("math_train.jsonl") and config["agent"]["sampling"]["max_tokens"] == 96
    rows = [json.loads(line) for line in RunDir(run_dir).metrics.read_text().splitlines()]
    assert any("rollout/reward_mean" in r for r in rows)


def test_an_experiment_of_ones_own_that_sets_a_key_the_swapped_option_lacks_is_named(tmp_path):
    """A user's experiment (--config-dir) that sets a math judger's key, run with judger=countdown."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /judger: math\njudger:\n  fallback_last_number: false\n")
    from rlharness.launch.preflight import ConfigSource

    with pytest.raises(ConfigError) as err:
        compose_typed(["experiment=mine", "judger=countdown"], ConfigSource(config_dir=str(tmp_path)))
    assert str(err.value).startswith(
        "experiment=mine sets judger.fallback_last_number, which judger=countdown (CountdownJudgerConf) does not "
        "have: experiment=mine was made for its own judger: leave out judger=countdown"), str(err.value)


def test_the_refusal_is_the_command_lines_one_line(tmp_path):
    from tests.faults.test_refused_input import refused

    refused(["experiment=sim_async", "strategy=sync"], tmp_path,
            ["experiment=sim_async sets strategy.over_sample_threshold", "strategy=sync", "leave out strategy=sync"])
    refused(["experiment=arith_mix", "task=countdown", "engine=sim", "backend=sim"], tmp_path,
            ["task=countdown is not allowed", "several tasks", "task@tasks.<name>.task"])
