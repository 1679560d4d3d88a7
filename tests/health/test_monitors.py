"""The health monitors as functions of the rows they read (rlharness/health/): each fires on the
condition it names, once per episode, with the step, the signal, the numbers and the advice; and
stays quiet on rows that are healthy."""

from __future__ import annotations

import math

import pytest

from rlharness.config.schema import (DegenerateOutputsConf, EntropyCollapseConf, HealthConf, HostMemoryConf,
                                     KLAccelerationConf, RewardFrozenConf, RewardHackingConf, ZeroSignalConf)
from rlharness.health import HealthMonitors, HealthStop
from rlharness.health.learning_signal import RewardFrozen, ZeroSignal
from rlharness.health.memory import HostMemory
from rlharness.health.outputs import DegenerateOutputs, output_stats, repeated_share
from rlharness.health.policy import EntropyCollapse, KLAcceleration
from rlharness.health.reward_hacking import RewardHacking, proportion_drop_z
from rlharness.health.trend import slope_t
from rlharness.core.types import RolloutState, Status


def feed(monitor, rows):
    """Every alarm (step, signal) the rows raise, in order."""
    out = []
    for row in rows:
        _, alarms = monitor.observe(row)
        out += [(a.step, a.signal) for a in alarms]
    return out


def noise(i: int, scale: float) -> float:
    """Deterministic zero-mean wiggle (no RNG: the same rows everywhere)."""
    return scale * math.sin(1.7 * i + 0.3) * math.cos(0.9 * i)


def test_slope_and_its_certainty():
    assert slope_t([1, 2, 3, 4]) == (1.0, math.inf)
    assert slope_t([5, 5, 5]) == (0.0, 0.0)
    assert slope_t([1, 2]) == (0.0, 0.0)  # too few points to tell
    slope, t = slope_t([0.0 + noise(i, 1.0) for i in range(30)])
    assert abs(t) < 3
    slope, t = slope_t([0.1 * i + noise(i, 0.2) for i in range(30)], steps=range(10, 40))
    assert slope == pytest.approx(0.1, abs=0.02) and t > 10


def test_proportion_drop_in_standard_errors():
    assert proportion_drop_z(0.175, 0.03, 200) == pytest.approx(4.9, abs=0.1)  # the arith_rm run's first eval
    assert proportion_drop_z(0.5, 0.45, 200) < 1.5  # eval noise
    assert proportion_drop_z(0.3, 0.4, 200) < 0


def rm_rows(acc_by_step: dict[int, float], steps: int, rise: float):
    """A learned-reward run: the trained reward rises by `rise` per step, eval at the given steps."""
    for s in range(steps + 1):
        row = {"step": s}
        if s:
            row["rollout/reward_mean"] = 1.0 + rise * s + noise(s, 0.05)
        if s in acc_by_step:
            row["eval/accuracy"] = acc_by_step[s]
        yield row


def test_reward_hacking_fires_when_the_reward_rises_and_eval_falls():
    conf = RewardHackingConf()
    fired = feed(RewardHacking(conf, eval_independent=True, eval_prompts=200),
                 rm_rows({0: 0.175, 25: 0.03, 50: 0.06}, 50, rise=0.02))
    assert fired == [(25, "the trained reward rises while eval/accuracy (independent of it) falls")]


@pytest.mark.parametrize("why, accs, rise, independent", [
    ("eval noise", {0: 0.30, 25: 0.27, 50: 0.29}, 0.02, True),
    ("the reward does not rise", {0: 0.175, 25: 0.03}, 0.0, True),
    ("eval judges what trains (a rule judger)", {0: 0.175, 25: 0.03}, 0.02, False),
    ("eval rises", {0: 0.175, 25: 0.3}, 0.02, True),
])
def test_reward_hacking_stays_quiet(why, accs, rise, independent):
    assert feed(RewardHacking(RewardHackingConf(), independent, 200), rm_rows(accs, 50, rise)) == [], why


def test_reward_hacking_sees_router_parts_move_apart():
    rows = [{"step": s, "rollout/reward_format_mean": 0.2 + 0.03 * s + noise(s, 0.01),
             "rollout/reward_math_mean": 0.15 - 0.008 * s + noise(s + 5, 0.003),
             "rollout/reward_mean": 0.0} for s in range(1, 26)]
    fired = feed(RewardHacking(RewardHackingConf(window_steps=10), False, 200), rows)
    assert fired == [(10, "judger part 'format' rises while part 'math' falls")]
    both_rise = [{**r, "rollout/reward_math_mean": 0.05 + 0.003 * r["step"]} for r in rows]
    assert feed(RewardHacking(RewardHackingConf(window_steps=10), False, 200), both_rise) == []


def test_entropy_collapse_against_the_runs_start_when_the_reward_does_not_rise():
    narrowing = [{"step": s, "train/entropy": 0.8 * (0.8 ** s), "rollout/reward_mean": 0.5 + noise(s, 0.02),
                  "rollout/reward_std": 0.5} for s in range(1, 30)]
    fired = feed(EntropyCollapse(EntropyCollapseConf(min_ratio=0.2, window_steps=5)), narrowing)
    assert fired == [(13, "the policy's entropy collapsed without the reward rising")]
    # The same fall onto answers that score (reward 0.35 -> 0.9, as experiment=chat_tools) is convergence.
    converging = [{**r, "rollout/reward_mean": min(0.9, 0.35 + 0.05 * r["step"])} for r in narrowing]
    assert feed(EntropyCollapse(EntropyCollapseConf()), converging) == []
    healthy = [{"step": s, "train/entropy": 0.85 - 0.01 * s + noise(s, 0.03)} for s in range(1, 60)]
    assert feed(EntropyCollapse(EntropyCollapseConf()), healthy) == []


def test_kl_acceleration_not_a_kl_that_flattens():
    # A healthy KL: quadratic at the very start (a policy drifting at a steady pace), then flattening.
    flattening = [{"step": s, "train/kl": 0.2 * (1 - math.exp(-(s / 15) ** 2)) + noise(s, 0.002)} for s in range(1, 80)]
    assert feed(KLAcceleration(KLAccelerationConf()), flattening) == []
    blowing_up = [{"step": s, "train/kl": 0.001 * math.exp(s / 4)} for s in range(1, 40)]
    fired = feed(KLAcceleration(KLAccelerationConf()), blowing_up)
    assert [signal for _, signal in fired] == ["the KL to the reference policy is accelerating"]
    no_kl_term = [{"step": s, "train/kl": 0.0} for s in range(1, 60)]
    assert feed(KLAcceleration(KLAccelerationConf()), no_kl_term) == []


def sample(ids: list[int], finish: str = "stop") -> RolloutState:
    s = RolloutState(uid=str(ids), group_id="g", task="t", prompt_index=0, epoch=0, prompt_text="p",
                     prompt_ids=[1], response_ids=list(ids),
                     response_logprobs=[0.0] * len(ids), response_model_steps=[0] * len(ids))
    s.status, s.finish_reason = Status.COMPLETED, finish
    return s


def test_output_shapes():
    assert repeated_share([7, 8, 9, 7, 8, 9, 7, 8, 9], 3) == pytest.approx(4 / 7)
    assert repeated_share([1, 2], 3) == 0.0
    eos = 2
    groups = [[sample([5, 6, 7, eos]),                    # an answer
               sample([eos]),                             # empty
               sample([9, 9, 9, 9, 9, 9], "length"),      # one token over and over, cut by the budget
               sample([4, 5, 6, 4, 5, 6, 4, 5, 6, eos])]]  # repeats its 3-grams
    stats = output_stats(groups, ngram=3, repeat_share=0.5)
    assert stats == {"health/empty_frac": 0.25, "health/one_token_frac": 0.25, "health/repeat_frac": 0.5,
                     "health/degenerate_frac": 0.75}


def test_degenerate_and_truncated_outputs_rising():
    rows = [{"step": s, "health/degenerate_frac": 0.01 if s < 20 else 0.6, "rollout/truncated_frac": 0.0}
            for s in range(1, 40)]
    fired = feed(DegenerateOutputs(DegenerateOutputsConf(window_steps=5)), rows)
    assert fired == [(22, "the responses are degenerating")]
    rows = [{"step": s, "rollout/truncated_frac": min(1.0, 0.02 * s)} for s in range(1, 40)]
    assert feed(DegenerateOutputs(DegenerateOutputsConf(window_steps=5)), rows) == [
        (20, "more and more responses hit the length budget")]
    # Many cut answers from the start that RL shortens (smollm2_arith) is not an alarm.
    falling = [{"step": s, "rollout/truncated_frac": max(0.0, 0.8 - 0.03 * s)} for s in range(1, 40)]
    assert feed(DegenerateOutputs(DegenerateOutputsConf(window_steps=5)), falling) == []


def test_zero_signal_once_per_streak():
    fracs = [1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0]
    rows = [{"step": s, "rollout/groups_zero_signal_frac": f} for s, f in enumerate(fracs, start=1)]
    assert [s for s, _ in feed(ZeroSignal(ZeroSignalConf(steps=3)), rows)] == [3, 8]


def test_frozen_rewards_but_not_noisy_ones():
    frozen = [{"step": s, "rollout/reward_mean": 0.0, "rollout/reward_std": 0.0, "rollout/num_samples": 512.0}
              for s in range(1, 12)]
    assert [s for s, _ in feed(RewardFrozen(RewardFrozenConf()), frozen)] == [10]
    moving = [{"step": s, "rollout/reward_mean": 0.3 + noise(s, 0.02), "rollout/reward_std": 0.45,
               "rollout/num_samples": 512.0} for s in range(1, 40)]
    assert feed(RewardFrozen(RewardFrozenConf()), moving) == []


def test_host_memory_slope_and_exhaustion():
    conf = HostMemoryConf(warmup_steps=3, window_steps=10)
    leak = [{"step": s, "health/rss_mb": 900 + 50 * s + noise(s, 5), "health/available_mb": 10_000}
            for s in range(1, 30)]
    assert [s for s, _ in feed(HostMemory(conf, total_steps=400), leak)] == [13]
    slow_but_fatal = [{"step": s, "health/rss_mb": 900 + 5 * s + noise(s, 1), "health/available_mb": 1_000}
                      for s in range(1, 30)]
    assert [s for s, _ in feed(HostMemory(conf, total_steps=1000), slow_but_fatal)] == [13]
    flat = [{"step": s, "health/rss_mb": 900 + noise(s, 40), "health/available_mb": 10_000} for s in range(1, 60)]
    assert feed(HostMemory(conf, total_steps=1000), flat) == []


def test_the_monitors_named_run_and_stop_asks_after_the_row():
    conf = HealthConf(monitors=["zero_signal"], zero_signal=ZeroSignalConf(steps=2, on_alarm="stop"))
    health = HealthMonitors(conf, eval_independent=False, eval_prompts=200, total_steps=10)
    metrics = health.check({"step": 1, "rollout/groups_zero_signal_frac": 1.0})
    assert metrics["health/zero_signal_steps"] == 1.0 and "health/rss_mb" not in metrics  # host_memory is off
    health.stop_if_asked()
    health.check({"step": 2, "rollout/groups_zero_signal_frac": 1.0})
    with pytest.raises(HealthStop, match=r"^step 2: stopped by health.zero_signal.on_alarm=stop: no learning signal "):
        health.stop_if_asked()
    assert health.stopped


def test_replay_continues_a_window_without_saying_it_again():
    health = HealthMonitors(HealthConf(zero_signal=ZeroSignalConf(steps=3)), eval_independent=False,
                            eval_prompts=200, total_steps=10)
    said = health.replay([{"step": s, "rollout/groups_zero_signal_frac": 1.0} for s in (1, 2, 3)])
    assert [a.step for a in said] == [3] and health.alarms == []  # said by the life that wrote those rows
    assert health.check({"step": 4, "rollout/groups_zero_signal_frac": 1.0})["health/zero_signal_steps"] == 4.0
