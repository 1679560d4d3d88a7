"""Multi-task configuration: composes, overrides from the command line, refuses bad mixes early."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException

from rlharness.launch.build import build_components
from rlharness.config.schema import (ArithmeticTaskConf, ConfigError, CountdownJudgerConf, CountdownTaskConf,
                                     JsonlTaskConf, MathJudgerConf, MultiTurnToolAgentConf)
from tests.helpers import compose_conf


def test_single_task_runs_are_unchanged():
    conf, as_dict = compose_conf([])
    assert conf.tasks == {} and as_dict["tasks"] == {}
    (name, entry), = conf.task_entries().items()
    assert name == "arithmetic" and entry.task is conf.task and entry.weight == 1.0
    assert conf.judger_for(entry) == MathJudgerConf()


def test_the_mix_experiment_composes_two_tasks_with_weights():
    conf, _ = compose_conf(["experiment=arith_mix"])
    entries = conf.task_entries()
    assert list(entries) == ["padded", "unpadded"]
    assert [e.weight for e in entries.values()] == [0.7, 0.3]
    assert entries["padded"].task.zero_pad and not entries["unpadded"].task.zero_pad
    assert all(isinstance(e.task, ArithmeticTaskConf) for e in entries.values())


def test_every_part_can_be_changed_from_the_command_line():
    conf, _ = compose_conf([
        "experiment=arith_mix", "tasks.padded.weight=0.5", "tasks.unpadded.task.digits=2",
        "tasks.unpadded.task.num_train=5000",  # 2 digits: 10^4 distinct problems, the eval split included
        "task@tasks.padded.task=jsonl", "tasks.padded.task.path=/data/x.jsonl",
        "+task@tasks.extra.task=countdown", "+judger@tasks.extra.judger=countdown",
        "+agent@tasks.extra.agent=multi_turn_tool", "+tasks.extra.sampling.max_tokens=12",
        "tasks.extra.weight=2", "tasks.extra.allow_epoch_rollover=false"])
    e = conf.task_entries()
    assert e["padded"].weight == 0.5 and isinstance(e["padded"].task, JsonlTaskConf)
    assert e["padded"].task.path == "/data/x.jsonl" and e["unpadded"].task.digits == 2
    assert isinstance(e["extra"].task, CountdownTaskConf) and e["extra"].judger == CountdownJudgerConf()
    agent = conf.agent_for(e["extra"])
    assert isinstance(agent, MultiTurnToolAgentConf) and agent.sampling.max_tokens == 12
    assert conf.agent_for(e["padded"]) is conf.agent  # the run's agent unless a task has its own
    assert conf.max_response_tokens() == 12
    assert e["extra"].allow_epoch_rollover is False


@pytest.mark.parametrize("overrides,message", [
    (["tasks.padded.weight=0"], "tasks.padded.weight=0.0 is not allowed"),
    (["tasks.unpadded.weight=-1"], "tasks.unpadded.weight=-1.0 is not allowed"),
    (["+tasks.padded.sampling.temperature=0.5"], "tasks.padded samples at temperature 0.5"),
    (["+tasks.padded.sampling.max_len=3"], "tasks.padded.sampling"),
    (["batch_size=1"], "batch_size=1 is smaller than the number of tasks"),
    (["eval.num_prompts=300"], "exceeds tasks.padded.task.num_eval=200"),
    (["tasks.padded.over_sample_threshold=0.5"], "tasks.padded.over_sample_threshold=0.5 is not allowed: expected "
                                                 "null with strategy=sync"),
])
def test_bad_mixes_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose_conf(["experiment=arith_mix", *overrides])


@pytest.mark.parametrize("overrides,message", [
    (["+task@tasks.extra.task=algebra"], "Could not find 'task/algebra'"),  # unknown task type
    (["+task@tasks.padded.task=countdown"], "Multiple values for task@tasks.padded.task"),  # a second task under an existing name
    (["tasks.padded.nonsense=1"], "nonsense"),
])
def test_unknown_and_duplicate_task_names_are_refused(overrides, message):
    with pytest.raises(ConfigCompositionException, match=message):
        compose_conf(["experiment=arith_mix", *overrides])


def test_a_task_without_a_task_config_is_refused():
    with pytest.raises(Exception, match="tasks.*"):
        compose_conf(["experiment=arith_mix", "+tasks.lonely.weight=1"])


def test_duplicate_names_in_a_yaml_file_are_refused(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "dup.yaml").write_text(
        "# @package _global_\ntasks:\n  padded:\n    weight: 1\n  padded:\n    weight: 2\n")
    with pytest.raises(Exception, match="duplicate key padded"):
        compose_conf([f"hydra.searchpath=[file://{tmp_path}]", "experiment=arith_mix", "+experiment@_global_=dup"])


def test_a_judger_that_cannot_score_its_task_is_refused_before_anything_starts(tmp_path):
    conf, _ = compose_conf(["experiment=arith_mix", "+judger@tasks.unpadded.judger=countdown"], tmp_path)
    with pytest.raises(ConfigError, match=r"tasks.unpadded.judger=countdown cannot score task 'unpadded' "
                                          r"\(arithmetic\): it needs label field\(s\) target, numbers"):
        build_components(conf)
    conf, _ = compose_conf(["judger=countdown"], tmp_path)  # single-task runs are checked too
    with pytest.raises(ConfigError, match="judger=countdown cannot score task 'arithmetic'"):
        build_components(conf)
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_refusals_name_the_task_s_keys(tmp_path):
    from rlharness.data.jsonl import DataFileError
    from rlharness.launch.preflight import compose_checked

    with pytest.raises(ConfigError, match=r"tasks.a.b: a task name cannot contain '.'"):
        compose_checked(["experiment=arith_mix", "+task@tasks.a.b.task=arithmetic"])
    with pytest.raises(ConfigError, match="every task has task.num_eval=0"):
        compose_conf(["experiment=arith_mix", "tasks.padded.task.num_eval=0", "tasks.unpadded.task.num_eval=0"])
    swap = ["experiment=arith_mix", "task@tasks.unpadded.task=jsonl"]  # the experiment's own example
    conf, _ = compose_conf([*swap, f"tasks.unpadded.task.path={tmp_path / 'missing.jsonl'}"], tmp_path / "a")
    with pytest.raises(ConfigError, match=r"^tasks.unpadded.task.path='.*missing.jsonl': no such file"):
        build_components(conf)
    (tmp_path / "empty.jsonl").write_text("")
    conf, _ = compose_conf([*swap, f"tasks.unpadded.task.path={tmp_path / 'empty.jsonl'}"], tmp_path / "b")
    with pytest.raises(DataFileError, match=r"^tasks.unpadded: .*empty.jsonl: no rows"):
        build_components(conf)
