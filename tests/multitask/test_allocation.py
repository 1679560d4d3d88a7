"""Each step's batch split by weight: exact per step, exact over the run, deterministic."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rlharness.producer.progress import BatchAllocation, allocate_batch_sizes


@pytest.mark.parametrize("batch_size,weights", [
    (64, {"add": 0.7, "sub": 0.3}),
    (7, {"a": 1, "b": 1, "c": 1}),
    (10, {"big": 0.97, "small": 0.03}),  # the small task gets a group every few steps
    (5, {"a": 0.5, "b": 0.25, "c": 0.125, "d": 0.125}),
    (3, {"only": 2.0}),
])
def test_every_step_sums_to_the_batch_and_the_run_keeps_the_weights(batch_size, weights):
    alloc = BatchAllocation(batch_size, weights)
    total_w = sum(Fraction(repr(float(w))) for w in weights.values())
    cum = {t: 0 for t in weights}
    for step in range(1, 301):
        sizes = alloc.sizes(step)
        assert sum(sizes.values()) == batch_size and min(sizes.values()) >= 0
        for t, n in sizes.items():
            cum[t] += n
            exact = step * batch_size * Fraction(repr(float(weights[t]))) / total_w
            assert abs(cum[t] - exact) < 1, (step, t, cum[t], exact)  # the remainder is carried
    assert cum == alloc.cumulative(300)


def test_proportions_are_exact_whenever_the_share_is_whole():
    alloc = BatchAllocation(64, {"add": 0.7, "sub": 0.3})
    assert [alloc.sizes(s) for s in (1, 2, 3)] == [{"add": 45, "sub": 19}, {"add": 45, "sub": 19},
                                                  {"add": 44, "sub": 20}]
    assert alloc.cumulative(5) == {"add": 224, "sub": 96}  # 5 x 64 x 0.7 = 224 exactly
    assert alloc.cumulative(10) == {"add": 448, "sub": 192}


def test_deterministic_and_independent_of_query_order():
    a, b = BatchAllocation(13, {"x": 0.2, "y": 0.5, "z": 0.3}), BatchAllocation(13, {"x": 0.2, "y": 0.5, "z": 0.3})
    late_first = [b.sizes(s) for s in (50, 3, 17)]
    assert late_first == [a.sizes(s) for s in (50, 3, 17)]
    assert [a.sizes(s) for s in range(1, 60)] == [b.sizes(s) for s in range(1, 60)]


def test_one_task_gets_the_whole_batch():
    assert BatchAllocation(64, {"arithmetic": 1.0}).sizes(9) == {"arithmetic": 64}


def test_bad_weights_and_batches_are_refused():
    with pytest.raises(ValueError, match="weights must be > 0"):
        allocate_batch_sizes(8, {"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError, match="smaller than the number of tasks"):
        BatchAllocation(2, {"a": 1, "b": 1, "c": 1})


def test_a_task_that_leaves_keeps_past_steps_and_the_others_share_its_weight():
    alloc = BatchAllocation(10, {"a": 0.5, "b": 0.3, "c": 0.2})
    before = [alloc.sizes(s) for s in range(1, 5)]
    alloc.leave("c", 5)
    assert [alloc.sizes(s) for s in range(1, 5)] == before
    for s in range(5, 40):
        sizes = alloc.sizes(s)
        assert sizes["c"] == 0 and sum(sizes.values()) == 10
    assert alloc.cumulative(39)["a"] - alloc.cumulative(4)["a"] in (218, 219)  # 35 x 10 x 5/8 = 218.75
    restored = BatchAllocation(10, {"a": 0.5, "b": 0.3, "c": 0.2})
    restored.load_state_dict(alloc.state_dict())
    assert [restored.sizes(s) for s in range(1, 40)] == [alloc.sizes(s) for s in range(1, 40)]
    with pytest.raises(ValueError, match="weights"):
        BatchAllocation(10, {"a": 0.5, "b": 0.5}).load_state_dict(alloc.state_dict())


def test_resumed_with_other_weights_the_producer_targets_follow_the_new_split():
    """The async producer had set targets up to step 6 when step 4 was saved; resumed with other
    weights, its targets are the new allocation's cumulative counts (steps 1-4 old, 5-6 new)."""
    from rlharness.agent import build_agent_loop
    from rlharness.config.schema import SamplerConf, SamplingConf, SingleTurnAgentConf, SimEngineConf
    from rlharness.engine.sim import SimEngine
    from rlharness.producer.manager import AgentLoopManager
    from rlharness.producer.staleness import StalenessPolicy
    from rlharness.producer.strategies import build_strategy
    from rlharness.producer.replay_buffer import ReplayBuffer
    from rlharness.producer.sampler import Sampler
    from tests.producer.producer_harness import VOCAB, ParityJudger, decode, encode, make_rows, strategy_conf

    def manager(weights):
        rb = ReplayBuffer(StalenessPolicy(max_staleness=2))
        engine = SimEngine(SimEngineConf(), seed=0, vocab_size=VOCAB)
        loop = build_agent_loop(SingleTurnAgentConf(sampling=SamplingConf(max_tokens=4)), engine, ParityJudger(), decode)
        tasks = {t: (Sampler(SamplerConf(prompt_repeat_k=2), t, make_rows(30), encode, rb, 0), loop) for t in weights}
        strategy = build_strategy(strategy_conf("async", max_staleness=2), rb.staleness)
        return AgentLoopManager(tasks=tasks, strategy=strategy, replay_buffer=rb, batch_size=10, weights=weights)

    old, new = {"a": 0.7, "b": 0.3}, {"a": 0.2, "b": 0.8}
    saved = manager(old)
    saved.progress.ensure_target_upto(6, saved.allocation)
    saved.progress.consumed_samples.update(saved.allocation.cumulative(4))
    saved.progress.finish_consume(4)
    resumed = manager(new)
    resumed.load_state_dict(saved.state_dict())
    assert saved.progress.target_samples == {"a": 42, "b": 18}  # 6 steps of 7/3
    assert resumed.progress.target_samples == {"a": 4 * 7 + 2 * 2, "b": 4 * 3 + 2 * 8}
    assert [resumed.allocation.sizes(s) for s in (5, 6)] == [{"a": 2, "b": 8}] * 2
    assert resumed.allocation.state_dict()["history"] == [[1, old], [5, new]]
