"""Sizes are bounded where they can be at the start, and long generation shows progress: a task that
would generate 10^9 rows, a reasoning-gym config whose items take minutes each (`max_terms: 1e8`), a
LoRA alpha that overflows the update, a LoRA rank wider than the layer it adapts, a step of more
samples than memory holds, more judging processes than any machine runs: one line each, exit 2."""

from __future__ import annotations

import logging

import pytest

from rlharness.config.schema import ConfigError
from rlharness.launch.preflight import compose_checked
from tests.faults.test_refused_input import SIM, refused

pytestmark = [pytest.mark.timeout(600)]


@pytest.mark.parametrize("overrides, expect", [
    (["task=reasoning_gym", "task.num_train=1000000000"], ["task.num_train=1000000000", "1..10000000"]),
    (["task=arithmetic", "task.num_train=20000000", "task.digits=9"], ["task.num_train=20000000", "1..10000000"]),
    (["task=countdown", "task.num_train=10000001"], ["task.num_train=10000001"]),
    (["task=arithmetic", "task.num_eval=100000000", "task.digits=9"], ["task.num_eval=100000000"]),
    (["model.lora.rank=8", "model.lora.alpha=1e308"], ["model.lora.alpha=1e+308", "at most 1024 x model.lora.rank"]),
    (["model.lora.rank=2", "model.lora.alpha=4096"], ["model.lora.alpha=4096"]),
    (["model.lora.rank=200"], ["model.lora.rank=200 is not allowed", "128 wide", "model.lora.rank <= 128"]),
    (["model.lora.rank=100", "model.lora.target_modules=[k_proj]", "model=tiny_chat"],
     ["model.lora.rank=100", "k_proj is 64 wide"]),
    (["batch_size=100000", "sampler.prompt_repeat_k=100"], ["10000000 samples per step", "at most 1000000"]),
    (["eval.num_prompts=200", "eval.num_samples=10000", "eval.pass_k=1"], ["eval.num_prompts=200 x 10000"]),
    (["judger=math", "judger.num_workers=100000"], ["judger.num_workers=100000", "1..256"]),
    (["judger=llm", "judger.num_workers=1000"], ["judger.num_workers=1000"]),
    (["judger=llm", "judger.max_rendered_chars=0"], ["judger.max_rendered_chars=0"]),
])
def test_a_size_beyond_its_bound_is_refused_by_the_config(overrides, expect):
    with pytest.raises(ConfigError) as err:
        compose_checked(overrides)
    for word in expect:
        assert word in str(err.value), str(err.value)


def test_sizes_at_their_usual_values_pass():
    compose_checked(["model.lora.rank=8", "model.lora.alpha=16"])
    compose_checked(["model.lora.rank=128", "model.lora.alpha=256"])  # rank = the tiny model's width
    compose_checked(["task=reasoning_gym", "task.num_train=10000000"])


def test_a_reasoning_gym_config_whose_items_take_forever_is_refused_before_generating(tmp_path):
    """max_terms=1e8 generated silently until killed; now a few items are tried first, where they can be
    killed, and the run is refused in one line."""
    refused([*SIM, "task=reasoning_gym", "task.dataset=basic_arithmetic", "+task.dataset_config.max_terms=100000000",
             "task.probe_timeout_s=3"], tmp_path,
            ["task.dataset_config={'max_terms': 100000000} is not allowed", "took more than 3 s",
             "task.probe_timeout_s", "too large"])


def test_a_reasoning_gym_config_making_huge_questions_is_refused(monkeypatch):
    """The probe's longest question is checked against MAX_QUESTION_CHARS (lowered here so that an ordinary
    config trips it: generating questions of 100,000 characters would take the test minutes)."""
    from rlharness.data import reasoning_gym

    monkeypatch.setattr(reasoning_gym, "MAX_QUESTION_CHARS", 5)
    monkeypatch.setattr(reasoning_gym, "_PROBED", {})
    with pytest.raises(ConfigError, match=r"task.dataset_config=\{'max_terms': 3\} is not allowed: dataset "
                                          r"'basic_arithmetic' makes questions of \d+ characters \(at most 5\)"):
        reasoning_gym.probe_dataset("basic_arithmetic", {"max_terms": 3}, timeout_s=120)


def test_long_generation_says_how_far_it_is(caplog):
    """A generator's progress line: done, total, elapsed, left (every `every_s`; here at once)."""
    from rlharness.logging_utils.progress import Progress

    progress = Progress("task arithmetic: generating 4096 problems", 4096, every_s=0.0)
    with caplog.at_level(logging.INFO, logger="rlharness"):
        for done in range(4096):
            progress.update(done)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("task arithmetic: generating 4096 problems: 1024 of 4096 (25%) in ")
    assert len(lines) == 3 and "s left" in lines[-1]
