"""Invariants of the producer on the sim engine: nothing lost, staleness bound, partial rollout, resume.

Every run is on a virtual clock (tests/helpers.py run_on_virtual_clock): the sim engine's tokens,
the trainer's "training" and every timeout take virtual time, so what is in flight when a batch
completes, a pause lands or a snapshot is taken is the same on any machine."""

from __future__ import annotations

import asyncio
import random

import pytest

from producer_harness import (
    TASK,
    ParityJudger,
    RaisingJudger,
    build,
    buffered_groups,
    check_accounting,
    check_batch,
    check_nothing_lost,
    run_colocate,
    run_disagg,
    strategy_conf,
    sync_weights,
)
from rlharness.config.schema import SimEngineConf
from rlharness.engine.sim import SimEngine
from rlharness.producer.strategies import ProductionStalled
from rlharness.producer.sampler import DataExhausted
from rlharness.core.types import Status
from tests.helpers import run_on_virtual_clock

pytestmark = pytest.mark.timeout(60)


def _random_config(rng: random.Random) -> dict:
    name = rng.choice(["sync", "async"])
    kw = {}
    if name == "async":
        kw = dict(over_sample_threshold=rng.choice([0.0, 0.5, 1.0]), enable_partial_rollout=rng.random() < 0.5,
                  tail_batch_trigger_size=rng.choice([0, 2]))
    return dict(name=name, max_staleness=rng.choice([0, 1, 2]),
                group_filter=rng.choice(["none", "all_equal_reward"]), **kw)


@pytest.mark.parametrize("seed", range(6))
def test_randomized_runs_lose_nothing_and_hold_the_staleness_bound(seed):
    """Random strategy/staleness/filter/over-sampling, colocated and disaggregated, 8 steps each."""
    rng = random.Random(seed)
    for mode in ("colocate", "disagg"):
        cfg = _random_config(rng)
        name = cfg.pop("name")
        engine_conf = SimEngineConf(mean_response_len=rng.choice([4, 8]), cv=rng.choice([0.5, 1.5]),
                                    time_per_token_s=rng.choice([1e-4, 3e-4]), slots=rng.choice([2, 8]))
        k = rng.choice([1, 2, 3])
        if k == 1:
            cfg["group_filter"] = "none"  # a group of one always has equal rewards (refused, tested below)
        h = build(strategy_conf(name, **cfg), seed=seed, engine_conf=engine_conf, n_rows=rng.choice([13, 64]),
                  k=k, batch_size=rng.choice([2, 4]))
        runner = run_colocate if mode == "colocate" else run_disagg
        run_on_virtual_clock(runner(h, 8))
        check_nothing_lost(h)
        assert [s for s, _ in h.trained] == sorted(s for s, _ in h.trained)


def test_sync_strategy_with_max_staleness_0_trains_exactly_on_policy():
    for runner in (run_colocate, run_disagg):
        h = build(strategy_conf("sync", max_staleness=0, group_filter="all_equal_reward"))
        run_on_virtual_clock(runner(h, 6))
        for step, g in h.trained:
            assert {v for s in g for v in s.response_model_steps} == {step - 1}
        check_nothing_lost(h)


def test_over_sampling_never_exceeds_its_in_flight_budget():
    h = build(strategy_conf("async", max_staleness=1, over_sample_threshold=0.5, enable_partial_rollout=True),
              batch_size=4, engine_conf=SimEngineConf(mean_response_len=8, time_per_token_s=3e-4, slots=4))
    ctx = h.mgr.contexts[TASK]
    assert h.mgr.strategy.oversample(ctx) == 2  # ceil(0.5 * 4)
    budget = 4 + 2  # colocated: the target is one batch beyond consumption
    seen = []

    async def main():
        for step in range(1, 7):
            ctx.pending.max_count_seen = 0
            batch = await h.mgr.produce_batch(step)
            check_batch(h, batch, step)
            seen.append(ctx.pending.max_count_seen)
            await sync_weights(h, step)

    run_on_virtual_clock(main())
    assert max(seen) == budget, seen  # reached, never exceeded
    check_nothing_lost(h)


def test_over_sampled_leftovers_are_aborted_not_lost_in_colocated_mode():
    h = build(strategy_conf("async", max_staleness=1, over_sample_threshold=1.0),
              engine_conf=SimEngineConf(mean_response_len=20, cv=1.0, time_per_token_s=5e-4, slots=4))
    run_on_virtual_clock(run_colocate(h, 5))
    check_nothing_lost(h)
    assert h.mgr.replay_buffer.counters["aborted"] > 0  # the leftovers went back to the buffer


def _put_expired(h, n):
    groups = [h.sampler.sample() for _ in range(n)]  # draw all first: the sampler re-takes EXPIRED ones
    for g in groups:
        for s in g:
            s.status = Status.EXPIRED
        h.rb.put(g, model_step=0, train_step=1)


@pytest.mark.parametrize("expired", [2, 3])
def test_tail_batch_triggers_at_its_threshold(expired):
    h = build(strategy_conf("async", max_staleness=0, over_sample_threshold=1.0, tail_batch_trigger_size=3),
              batch_size=4)
    _put_expired(h, expired)
    expired_ids = {g.group_id for g in h.rb.groups(TASK, Status.EXPIRED)}
    ctx = h.mgr.contexts[TASK]
    drawn_before = h.sampler.drawn
    batch = run_on_virtual_clock(h.mgr.produce_batch(1))
    check_batch(h, batch, 1)
    tail = expired >= 3
    assert ctx.last_round_tail is tail and ctx.tail_rounds == int(tail)
    # EXPIRED groups are re-sampled first in both modes (never stranded).
    assert h.rb.count(TASK, Status.EXPIRED) == 0
    assert expired_ids <= {g.group_id for g in h.dropped} | {g.group_id for _, g in h.trained} | {
        g.group_id for g in buffered_groups(h.rb)}
    if tail:  # no over-sampling: only the missing groups were drawn fresh
        assert ctx.pending.max_count_seen <= 4
        assert h.sampler.drawn - drawn_before == 4 - expired
    else:
        assert ctx.pending.max_count_seen == 8  # batch + ceil(1.0 * batch)
    check_nothing_lost(h)


def test_partial_rollout_keeps_tokens_logprobs_versions_and_only_appends():
    engine_conf = SimEngineConf(mean_response_len=12, cv=1.0, time_per_token_s=1e-3, slots=4)
    h = build(strategy_conf("async", max_staleness=2, over_sample_threshold=1.0, enable_partial_rollout=True),
              engine_conf=engine_conf, max_tokens=32)
    snapshots: dict[str, tuple] = {}
    checked = {"continued": 0, "trained_seen": 0}

    def prefix_ok(s, g):
        snap = snapshots.get(s.uid)
        if snap is None or snap[3] != g.num_expired:
            return None
        ids, lps, steps, _ = snap
        n = len(ids)
        assert len(s.response_ids) >= n
        assert s.response_ids[:n] == ids and s.response_logprobs[:n] == lps and s.response_model_steps[:n] == steps
        return len(s.response_ids) > n

    def on_pause(h):
        for _, g in h.trained[checked["trained_seen"]:]:
            for s in g:
                if prefix_ok(s, g):
                    checked["continued"] += 1
        checked["trained_seen"] = len(h.trained)
        for g in h.rb.groups(TASK, Status.ABORTED):
            for s in g:
                prefix_ok(s, g)  # a later interruption extends the earlier one
                snapshots[s.uid] = (list(s.response_ids), list(s.response_logprobs), list(s.response_model_steps),
                                    g.num_expired)

    run_on_virtual_clock(run_disagg(h, 12, train_s=0.004, on_pause=on_pause))
    check_nothing_lost(h)
    assert checked["continued"] > 0, "no interrupted sample was continued and trained; the test exercised nothing"
    mixed = [s for _, g in h.trained for s in g if len(set(s.response_model_steps)) > 1]
    assert mixed, "expected samples whose tokens span several weight versions"


def test_save_mid_async_run_and_load_into_a_fresh_manager_continues_with_nothing_lost():
    def make():
        return build(strategy_conf("async", max_staleness=1, over_sample_threshold=1.0, enable_partial_rollout=True,
                                   group_filter="all_equal_reward"),
                     n_rows=40, engine_conf=SimEngineConf(mean_response_len=10, time_per_token_s=5e-4, slots=4))

    h1 = make()
    saved = {}

    async def first_run():
        loop_task = asyncio.create_task(h1.mgr.produce_loop())
        for step in range(1, 5):
            batch = await h1.mgr.get_batch(step, timeout_s=30)
            check_batch(h1, batch, step)
            await sync_weights(h1, step)
        await asyncio.sleep(0.003)  # let production get under way again
        saved["in_flight"] = h1.mgr.in_flight()
        saved["state"] = h1.mgr.state_dict()  # synchronous, from inside the running loop
        await h1.mgr.close()
        await asyncio.wait_for(loop_task, timeout=10)

    run_on_virtual_clock(first_run())
    assert saved["in_flight"] > 0, "the snapshot should catch groups in flight"
    import json

    state = json.loads(json.dumps(saved["state"]))  # plain data: survives JSON

    h2 = make()
    h2.mgr.load_state_dict(state)
    assert h2.mgr.model_step == 4
    run_on_virtual_clock(h2.engine.load_weights({}, 4))  # the trainer restores the engines' weights too
    h2.trained = []
    assert h2.mgr.accounting()["unaccounted"] == 0
    run_on_virtual_clock(run_disagg(h2, 12, first_step=5))
    # Union over both runs: run 1's trained + run 1's dropped before the snapshot are not in run 2's state.
    run1_dropped_before = list(h1.dropped)
    check_nothing_lost(h2, extra_trained=[g for _, g in h1.trained], extra_dropped=run1_dropped_before)
    assert sorted({s for s, _ in h2.trained}) == list(range(5, 17))


def test_disaggregated_consumer_gets_every_step_and_times_out_clearly_without_a_producer():
    h = build(strategy_conf("async", max_staleness=1, over_sample_threshold=0.5, enable_partial_rollout=True))
    run_on_virtual_clock(run_disagg(h, 10, train_s=0.003))
    assert sorted({s for s, _ in h.trained}) == list(range(1, 11))
    check_nothing_lost(h)

    idle = build(strategy_conf("sync"))
    with pytest.raises(TimeoutError, match=r"get_batch\(train_step=1\) waited timeout_s=0.2.*produce_loop running=False"):
        run_on_virtual_clock(idle.mgr.get_batch(1, timeout_s=0.2))


def test_a_judger_that_raises_marks_the_group_failed_and_the_run_goes_on():
    for runner in (run_colocate, run_disagg):
        h = build(strategy_conf("sync", max_staleness=0), judger=RaisingJudger(every=3), n_rows=30)
        run_on_virtual_clock(runner(h, 6))
        check_nothing_lost(h)
        failed = [g for g in h.dropped if g.status == Status.FAILED]
        assert failed and all("cannot judge prompt" in g.drop_reason for g in failed)
        assert all(g.prompt_index % 3 == 0 for g in failed)
        assert all(g.prompt_index % 3 != 0 for _, g in h.trained)


class DeafEngine(SimEngine):
    """Fault injection: an engine whose abort is lost, so a pause can only time out."""

    async def abort_all(self) -> int:
        return 0


@pytest.mark.parametrize("strategy", ["sync", "async"])
def test_a_pause_whose_timeout_expires_still_returns_every_prompt(strategy):
    kw = dict(over_sample_threshold=1.0, enable_partial_rollout=True) if strategy == "async" else {}
    engine = DeafEngine(SimEngineConf(mean_response_len=1000, cv=0.0, time_per_token_s=0.01, slots=64), seed=0,
                        vocab_size=50)
    h = build(strategy_conf(strategy, max_staleness=1, pause_timeout_s=0.1, **kw), engine=engine, max_tokens=2000)

    async def main():
        loop_task = asyncio.create_task(h.mgr.produce_loop())
        while h.mgr.in_flight() < 4:
            await asyncio.sleep(0.01)
        drawn = h.sampler.drawn
        await h.mgr.pause()
        assert h.mgr.in_flight() == 0
        assert h.rb.count(TASK, Status.ABORTED) == drawn
        check_accounting(h)
        await h.mgr.close()
        await asyncio.wait_for(loop_task, timeout=10)

    run_on_virtual_clock(main())
    check_nothing_lost(h)


def test_bad_input_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match=r"batch_size=5 .* 4 prompts .*allow_epoch_rollover=False"):
        build(strategy_conf("sync"), n_rows=4, batch_size=5, rollover=False)
    h = build(strategy_conf("sync"), n_rows=6, batch_size=4, rollover=False)

    async def main():
        batch = await h.mgr.produce_batch(1)
        check_batch(h, batch, 1)
        await sync_weights(h, 1)
        with pytest.raises(DataExhausted, match="allow_epoch_rollover=False"):
            await h.mgr.produce_batch(2)

    run_on_virtual_clock(main())
    check_nothing_lost(h)  # the 2 prompts drawn for step 2 are back in the buffer

    with pytest.raises(ValueError, match="all_equal_reward with sampler.prompt_repeat_k=1"):
        build(strategy_conf("sync", group_filter="all_equal_reward"), k=1)

    stale = build(strategy_conf("sync", max_staleness=0))
    with pytest.raises(ValueError, match="call set_model_step"):
        run_on_virtual_clock(stale.mgr.produce_batch(3))


class CrashingEngine(SimEngine):
    """Fault injection: requests for prompts p3, p30..p39 always raise (an engine bug)."""

    async def generate(self, request):
        if request.prompt_ids[1] == ord("3") % 50:
            raise RuntimeError("engine exploded")
        return await super().generate(request)


def test_a_crashing_agent_loop_is_retried_then_failed_and_nothing_is_lost():
    engine = CrashingEngine(SimEngineConf(mean_response_len=6, time_per_token_s=1e-4), seed=0, vocab_size=50)
    h = build(strategy_conf("async", max_staleness=1, over_sample_threshold=0.5), engine=engine, n_rows=40)
    run_on_virtual_clock(run_colocate(h, 8))
    check_nothing_lost(h)
    failed = [g for g in h.dropped if g.status == Status.FAILED]
    assert failed and all("crashed 3 times" in g.drop_reason and "engine exploded" in g.drop_reason for g in failed)
    assert all(str(g.prompt_index).startswith("3") and g.num_crashes == 3 for g in failed)


def test_production_that_cannot_keep_anything_stops_with_a_clear_error():
    h = build(strategy_conf("sync"), judger=RaisingJudger(every=1), engine_conf=SimEngineConf(
        mean_response_len=2, time_per_token_s=1e-5, slots=64))
    # The message names the real cause (the judger), not a guess about weight sync.
    with pytest.raises(ProductionStalled, match=r"were all dropped \(\d+ judging; .*the judger is failing.*"
                                                r"Last reason: judger raising: ValueError: cannot judge prompt"):
        run_on_virtual_clock(h.mgr.produce_batch(1))
    check_nothing_lost(h)


def test_a_filter_that_drops_everything_is_named_as_the_cause():
    class Constant(ParityJudger):
        def score_inline(self, response_text, label):
            return {"score": 0.0}

    h = build(strategy_conf("sync", group_filter="all_equal_reward"), judger=Constant(), engine_conf=SimEngineConf(
        mean_response_len=2, time_per_token_s=1e-5, slots=64))
    with pytest.raises(ProductionStalled, match=r"were all dropped \(\d+ filter; .*strategy.group_filter drops every "
                                                r"group.*Last reason: all_equal_reward: every member scored 0.0"):
        run_on_virtual_clock(h.mgr.produce_batch(1))
    check_nothing_lost(h)


def test_colocated_manager_can_be_driven_by_one_event_loop_per_step():
    h = build(strategy_conf("async", max_staleness=1, over_sample_threshold=1.0, enable_partial_rollout=True))
    for step in range(1, 5):
        batch = run_on_virtual_clock(h.mgr.produce_batch(step))
        check_batch(h, batch, step)
        run_on_virtual_clock(sync_weights(h, step))
    check_nothing_lost(h)


def test_a_task_that_crashes_after_writing_into_its_group_gives_the_group_back_as_it_was_started():
    """Agent loops generate in place; a crash or cancel must not leave half-written members behind."""
    h = build(strategy_conf("async", max_staleness=1, enable_partial_rollout=True), k=2)
    ctx = h.mgr.contexts[TASK]
    agent = ctx.agent_loop

    class WritesThenCrashes(type(agent)):
        async def generate_group(self, group, enable_partial_rollout):
            await super().generate_group(group, enable_partial_rollout)  # tokens, text, reward written
            raise RuntimeError("crash after writing")

    ctx.agent_loop = WritesThenCrashes(agent.conf, agent.engine, agent.judger, agent.decode)
    fresh = h.sampler.sample()
    partial = h.sampler.sample()  # a continuation: a member holding partial tokens from an earlier round
    first, second = partial.samples
    first.append_tokens([7, 8], [-0.5, -0.5], [0, 0])
    first.status, first.finish_reason, first.num_aborts = Status.ABORTED, "abort", 1
    second.status = Status.ABORTED
    before = [s.clone() for s in partial]

    async def main():
        tasks = [ctx.start(g, enable_partial_rollout=True) for g in (fresh, partial)]
        await asyncio.wait(tasks)
        await asyncio.sleep(0)  # done-callbacks
        ctx.collect(ctx.pending.claim(tasks))

    run_on_virtual_clock(main())
    back = {g.group_id: g for g in [h.rb.pop_group(TASK, Status.ABORTED), h.rb.pop_group(TASK, Status.ABORTED)]}
    got_fresh, got_partial = back[fresh.group_id], back[partial.group_id]
    assert got_fresh.num_crashes == 1 and got_partial.num_crashes == 1
    assert got_fresh.admission is None  # stamped when it started: undone with the rest
    assert all(s.status == Status.ABORTED and not s.response_ids and not s.response_text and s.reward is None
               for s in got_fresh)
    for s, b in zip(got_partial, before):
        assert (s.response_ids, s.response_logprobs, s.response_model_steps, s.response_text, s.reward, s.num_aborts) \
            == (b.response_ids, b.response_logprobs, b.response_model_steps, b.response_text, b.reward, b.num_aborts)
        assert s.status == Status.ABORTED
