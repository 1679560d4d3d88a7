"""Admission mode (`strategy.staleness_mode=admission`): the bound held where groups start.

Ledger tests on the real producer and the sim engine: every trained group was budgeted,
when it started, for a step within max_staleness of the weights it started on; nothing
expires; no prompt is lost or duplicated; sync and async agree at max_staleness=0.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from producer_harness import TASK, build, check_nothing_lost, run_colocate, run_disagg, strategy_conf
from rlharness.config.schema import AsyncStrategyConf, ConfigError, SimEngineConf
from rlharness.producer.progress import ProduceProgress
from rlharness.producer.staleness import StalenessPolicy
from rlharness.producer.replay_buffer import ReplayBuffer
from rlharness.core.run_dir import RunDir
from rlharness.core.types import Status, make_group
from tests.helpers import run_on_virtual_clock

pytestmark = pytest.mark.timeout(60)

# A long tail: some responses outlive several steps (they would expire under the token rule).
TAIL = SimEngineConf(mean_response_len=10, cv=1.5, time_per_token_s=3e-4, slots=8)


@pytest.mark.parametrize("seed", range(4))
def test_admission_mode_holds_the_bound_at_admission_expires_nothing_and_loses_nothing(seed):
    rng = random.Random(seed)
    for runner in (run_colocate, run_disagg):
        s = rng.choice([0, 1, 2])
        name = rng.choice(["sync", "async"])
        kw = {} if name == "sync" else dict(over_sample_threshold=rng.choice([0.0, 0.25, 1.0]),
                                            enable_partial_rollout=rng.random() < 0.7)
        h = build(strategy_conf(name, max_staleness=s, staleness_mode="admission",
                                group_filter=rng.choice(["none", "all_equal_reward"]), **kw),
                  seed=seed, engine_conf=TAIL, n_rows=rng.choice([13, 64]), k=rng.choice([2, 3]), batch_size=4)
        run_on_virtual_clock(runner(h, 8))  # check_batch: admission staleness <= s for every trained group
        check_nothing_lost(h)
        assert h.rb.counters["expired"] == 0 and h.rb.count(TASK, Status.EXPIRED) == 0


def test_a_started_group_continues_on_new_weights_past_the_token_bound():
    """What admission mode trades: a slow group is continued, not expired, so some tokens are older
    than max_staleness allows under the token rule; the token rule throws those groups away."""
    def run(mode):
        h = build(strategy_conf("async", max_staleness=1, staleness_mode=mode, over_sample_threshold=0.25,
                                enable_partial_rollout=True), engine_conf=TAIL, batch_size=4, max_tokens=64)

        # On a virtual clock: the same schedule however loaded the machine is.
        run_on_virtual_clock(run_disagg(h, 12, train_s=0.004))
        check_nothing_lost(h)
        stale = [step - 1 - min(s.response_model_steps) for step, g in h.trained for s in g]
        mixed = sum(len(set(s.response_model_steps)) > 1 for _, g in h.trained for s in g)
        return h, max(stale), mixed

    admission, admission_max, mixed = run("admission")
    token, token_max, _ = run("token")
    assert token_max <= 1 and token.rb.counters["expired"] > 0
    assert admission.rb.counters["expired"] == 0
    assert admission_max > 1, "expected a slow group trained past the token bound (the test exercised nothing)"
    assert mixed > 0, "expected samples continued on newer weights"


@pytest.mark.parametrize("mode", ["token", "admission"])
@pytest.mark.parametrize("runner", [run_colocate, run_disagg])
def test_sync_and_async_train_the_same_on_policy_batches_at_max_staleness_0(mode, runner):
    """At max_staleness=0 async is sync: same prompts, same tokens, every token from the step's weights.
    In admission mode this holds even with strategy=async's default over-sampling (no room for it)."""
    over_sample = AsyncStrategyConf.over_sample_threshold if mode == "admission" else 0.0
    runs = []
    for name, kw in (("sync", {}), ("async", dict(over_sample_threshold=over_sample, enable_partial_rollout=True))):
        h = build(strategy_conf(name, max_staleness=0, staleness_mode=mode, **kw), engine_conf=TAIL, batch_size=4)
        run_on_virtual_clock(runner(h, 6))
        check_nothing_lost(h)
        for step, g in h.trained:
            assert {v for s in g for v in s.response_model_steps} == {step - 1}
        runs.append(sorted((step, g.prompt_index, tuple(tuple(s.response_ids) for s in g))
                           for step, g in h.trained))
    assert runs[0] == runs[1]


def test_admission_room_is_the_budget_of_the_absolute_counts():
    """Hand-computed: batch 4, threshold 3 (max_staleness=2), engines at version 5, consumer at step 7
    (6 steps consumed = 24 groups), 2 COMPLETED waiting: steps 7 and 8 are open (<= 5 + 3), so 8 groups
    may be produced beyond consumption: 8 - 2 waiting = 6 may be in flight."""
    h = build(strategy_conf("async", max_staleness=2, staleness_mode="admission"), batch_size=4)
    ctx = h.mgr.contexts[TASK]
    h.mgr.set_model_step(5)
    h.mgr.progress.load_state_dict({**ProduceProgress.build([TASK]).state_dict(), "next_consumer_step": 7,
                                    "consumed_samples": {TASK: 24}, "target_samples": {TASK: 24}})
    for _ in range(2):
        g = h.sampler.sample()
        for s in g:
            s.append_tokens([1], [-0.1], [5])
            s.status = Status.COMPLETED
        h.rb.put(g, model_step=5, train_step=7)
    assert ctx.staleness.threshold(TASK) == 3
    assert ctx.admission_room() == 6
    h.mgr.progress.finish_consume(7)  # step 7 taken, weights not synced yet: only step 8 is open
    assert ctx.admission_room() == 4 - 2
    h.mgr.set_model_step(7)
    assert ctx.admission_room() == 3 * 4 - 2


def test_the_buffer_in_admission_mode_never_expires_a_group():
    rb = ReplayBuffer(StalenessPolicy(max_staleness=0, mode="admission"))
    g = make_group(task=TASK, prompt_index=0, epoch=0, prompt_text="p", prompt_ids=[1], label={}, k=2)
    for s in g:
        s.append_tokens([1, 2], [-0.1, -0.2], [0, 3])
        s.status = Status.COMPLETED
    assert rb.put(g, model_step=9, train_step=10) == Status.COMPLETED  # token staleness 9
    assert rb.refresh_staleness(20) == 0
    assert rb.take_batch({TASK: 1}, train_step=30) == [g]
    with pytest.raises(ValueError, match="staleness_mode='bogus' is not one of token, admission"):
        ReplayBuffer(StalenessPolicy(max_staleness=0, mode="bogus"))
    with pytest.raises(ConfigError, match="strategy.staleness_mode='tokens' is not allowed"):
        AsyncStrategyConf(max_staleness=1, staleness_mode="tokens")
    with pytest.raises(ValueError, match="staleness_mode='admission' disagrees"):
        from rlharness.producer.manager import AgentLoopManager
        from rlharness.producer.strategies import build_strategy
        h = build(strategy_conf("sync"))
        AgentLoopManager(tasks={TASK: (h.sampler, h.mgr.contexts[TASK].agent_loop)},
                         strategy=build_strategy(strategy_conf("sync", staleness_mode="admission"),
                                                 StalenessPolicy(max_staleness=0, mode="admission")),
                         replay_buffer=h.rb, batch_size=4)


def test_step_stats_report_both_measures_and_the_histogram_plot_sums_them(tmp_path):
    import json

    from rlharness.logging_utils.plots import staleness_histogram, write_plots

    h = build(strategy_conf("async", max_staleness=2, staleness_mode="admission", over_sample_threshold=1.0,
                            enable_partial_rollout=True), engine_conf=TAIL, batch_size=4, max_tokens=64)
    rows = []

    async def main():
        loop_task = asyncio.create_task(h.mgr.produce_loop())
        for step in range(1, 7):
            batch = await h.mgr.get_batch(step, timeout_s=30)
            tokens = [step - 1 - v for g in batch.groups for s in g for v in s.response_model_steps]
            hist = {int(k.rsplit("_", 1)[1]): v for k, v in batch.stats.items() if k.startswith("staleness/tokens_at_")}
            assert hist == {k: float(tokens.count(k)) for k in set(tokens)}
            assert batch.stats["staleness/max"] == max(tokens)
            admitted = [g.admission.staleness for g in batch.groups]
            assert batch.stats["staleness/admission_max"] == max(admitted) <= 2
            assert batch.stats["staleness/admission_mean"] == pytest.approx(sum(admitted) / len(admitted))
            rows.append({"step": step, **batch.stats})
            await h.mgr.pause()
            await h.engine.load_weights({}, step)
            h.mgr.set_model_step(step)
            h.mgr.resume()
        await h.mgr.close()
        await asyncio.wait_for(loop_task, timeout=10)

    run_on_virtual_clock(main())
    RunDir(tmp_path).metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    total = staleness_histogram(rows)
    assert sum(total.values()) == sum(r["rollout/response_len_mean"] * 4 * 2 for r in rows)  # 4 groups of 2
    assert (RunDir(tmp_path).plots / "staleness_hist.png") in write_plots(tmp_path)
