"""Real runs, recorded, replayed through the monitors with their default thresholds
(benchmarks/results/health/*.jsonl, written by `benchmarks/health_thresholds.py --record`; the
commands and dates are in docs/operations/health.md): healthy runs raise no alarm, and the run that hacked its
learned reward model (`experiment=arith_rm`) raises the reward-hacking alarm within the steps where
its accuracy falls."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlharness.config.schema import HealthConf
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
thresholds = load_script(ROOT / "benchmarks" / "health_thresholds.py", "health_thresholds")


def replay(name: str) -> tuple[list[dict], list]:
    return thresholds.replay(ROOT / "benchmarks" / "results" / "health" / f"{name}.jsonl", HealthConf())


# The recorded runs and their last step (smollm2_arith: steps 0-13 of its 16, docs/operations/health.md).
@pytest.mark.parametrize("name,steps", [("default", 400), ("chat_tools", 30), ("smollm2_arith", 13),
                                        ("kl_healthy", 150)])
def test_healthy_runs_raise_no_alarm(name, steps):
    rows, alarms = replay(name)
    assert rows[-1]["step"] == steps
    assert [a.line("warn") for a in alarms] == []


def test_the_learned_reward_run_is_caught_while_its_accuracy_falls():
    rows, alarms = replay("arith_rm")
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    low = min(acc for _, acc in evals)
    # The steps where accuracy falls: from step 0 to the first eval within 2 points of the run's lowest.
    fall_end = next(step for step, acc in evals if acc <= low + 0.02)
    assert evals[0][1] - low > 0.1, evals  # the run did fall
    hacking = [a for a in alarms if a.monitor == "reward_hacking"]
    assert hacking and 0 < hacking[0].step <= fall_end, (evals, [a.line("warn") for a in alarms])
    assert "eval/accuracy" in hacking[0].evidence and "rollout/reward_mean rose" in hacking[0].evidence
