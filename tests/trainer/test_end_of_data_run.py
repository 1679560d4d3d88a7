"""Real runs (sim engine and trainer) that end at the end of the data, and the step's raw reward stats."""

from __future__ import annotations

import json

import pytest

from rlharness.core.run_dir import DONE, RunDir
from tests.helpers import run_in_process

pytestmark = pytest.mark.timeout(180)

# Random sim text scores 1 when it starts with 0-4 (~1 in 4): with k=2 and all_equal_reward most groups
# are filtered, so 40 prompts run out before 5 steps of 4 groups.
FILTERED_RUN = ["engine=sim", "backend=sim", "judger=format", "judger.pattern='(?s)[0-4].*'", "sampler.prompt_repeat_k=2",
                "strategy.group_filter=all_equal_reward", "sampler.allow_epoch_rollover=false", "total_steps=5",
                "batch_size=4", "task.num_train=40", "task.num_eval=8", "eval.num_prompts=8", "logger=none"]


def _rows(run_dir):
    return [json.loads(line) for line in RunDir(run_dir).metrics.read_text().splitlines()]


def test_the_end_of_the_data_ends_the_run_with_a_checkpoint(tmp_path, caplog):
    # (Disaggregated runs need Ray here; their manager-level end of data: tests/producer/test_end_of_data.py.)
    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*FILTERED_RUN, "strategy=async", "max_staleness=1"])  # returns: no exception
    steps = [r["step"] for r in _rows(run_dir) if r["step"] > 0]
    assert 1 <= steps[-1] < 5
    assert (RunDir(run_dir).checkpoint(steps[-1]) / DONE).exists()
    stops = [r.getMessage() for r in caplog.records if "the data ran out" in r.getMessage()]
    assert len(stops) == 1 and stops[0].startswith(f"stopping after step {steps[-1]} of 5")


def test_raw_reward_stats_are_measured_before_the_filter(tmp_path):
    run_in_process(tmp_path, FILTERED_RUN)
    rows = [r for r in _rows(tmp_path) if r["step"] > 0]
    for r in rows:
        # the trained groups are mixed pairs: reward exactly 0.5 whatever the policy does
        assert r["rollout/reward_mean"] == pytest.approx(0.5)
        assert r["rollout/samples_generated"] >= 8 and r["rollout/raw_samples_judged"] >= 8
        assert r["perf/produce_s"] > 0
    raw = sum(r["rollout/raw_reward_mean"] * r["rollout/raw_samples_judged"] for r in rows)
    raw /= sum(r["rollout/raw_samples_judged"] for r in rows)
    assert 0.1 < raw < 0.4  # ~ the share of random texts starting with 0-4
