"""A run that cannot learn says so (issue 22, item 8): greedy rollout sampling with a group baseline
is warned about at the start, and all-equal rewards that last `health.zero_signal.steps` steps
are warned about while the run goes on (the health monitor `zero_signal`, tests/health/)."""

from __future__ import annotations

import logging

import pytest

from rlharness.config.schema import SamplingConf
from rlharness.trainer.zero_signal import greedy_reason
from tests.faults.test_refused_input import SIM
from tests.helpers import run_in_process

pytestmark = [pytest.mark.timeout(300)]


@pytest.mark.parametrize("sampling, expect", [
    (SamplingConf(temperature=0.0), "temperature=0"),
    (SamplingConf(top_k=1), "top_k=1"),
    (SamplingConf(top_p=0.001), "top_p=0.001"),
    (SamplingConf(), None),
    (SamplingConf(temperature=0.7, top_p=0.9, top_k=50), None),
])
def test_greedy_sampling_is_recognised(sampling, expect):
    reason = greedy_reason(sampling)
    assert (reason is None) if expect is None else (expect in reason)


def test_a_greedy_run_is_warned_at_start_and_while_it_runs(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        run_in_process(tmp_path / "run", [*SIM, "total_steps=3", "agent.sampling.temperature=0",
                                          "health.zero_signal.steps=2"])
    messages = [r.getMessage() for r in caplog.records if r.name in ("rlharness.trainer.zero_signal",
                                                                      "rlharness.health")]
    assert any("agent.sampling.temperature=0" in m and "algo.advantage=grpo" in m and "zero signal" in m
               for m in messages), messages
    assert any(m.startswith("step 2: health alarm zero_signal: no learning signal: every group of the last 2 steps "
                            "had equal rewards") for m in messages), messages


def test_a_sampling_run_is_not_warned_at_start(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="rlharness.trainer.zero_signal"):
        run_in_process(tmp_path / "run", [*SIM, "total_steps=1"])
    assert not any("greedy" in r.getMessage() for r in caplog.records), caplog.text
