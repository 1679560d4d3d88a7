"""Without partial rollout, a group interrupted again and again is failed after strategy.max_aborts."""

from __future__ import annotations

import asyncio
import logging

import pytest
from producer_harness import (build, buffered_groups, check_batch, check_nothing_lost, strategy_conf, strategy_of,
                              sync_weights)

from rlharness.config.schema import SimEngineConf
from tests.helpers import run_on_virtual_clock

pytestmark = pytest.mark.timeout(120)
# Heavy-tailed lengths: the batch fills with short responses and the over-sampled long ones are
# interrupted at every step; restarted with the same seed, they are long again.
ENGINE = SimEngineConf(mean_response_len=6, cv=2.0, time_per_token_s=1e-3, slots=16)


def _run(max_aborts: int, steps: int = 12):
    h = build(strategy_conf("async", max_staleness=1, over_sample_threshold=1.0, enable_partial_rollout=False,
                            max_aborts=max_aborts), engine_conf=ENGINE, max_tokens=96, batch_size=4, seed=3)
    most, capped = 0, 0.0

    async def main():
        nonlocal most, capped
        for step in range(1, steps + 1):
            batch = await h.mgr.produce_batch(step)
            check_batch(h, batch, step)
            capped += batch.stats["rollout/groups_abort_capped"]
            most = max([most, *(s.num_aborts for g in buffered_groups(h.rb) for s in g)])
            await sync_weights(h, step)

    run_on_virtual_clock(main())
    return h, most, capped


def test_without_a_cap_a_long_group_is_interrupted_again_and_again():
    _, most, capped = _run(max_aborts=0)
    assert most > 3 and capped == 0


def test_the_cap_fails_the_group_with_the_reason_and_counts_it():
    h, most, capped = _run(max_aborts=3)
    assert most <= 3 - 1  # a group reaching the cap leaves the buffer as FAILED
    h.dropped.extend(h.mgr.pop_dropped())
    reasons = [g.drop_reason for g in h.dropped]
    assert capped >= 1 and len(reasons) == capped
    assert all(r.startswith("interrupted 3 times without partial rollout (strategy.max_aborts=3)") for r in reasons)
    check_nothing_lost(h)


def test_partial_rollout_off_with_staleness_warns_at_start(caplog):
    with caplog.at_level(logging.WARNING):
        strategy_of(strategy_conf("async", max_staleness=1, enable_partial_rollout=False))
    assert any("enable_partial_rollout=false with max_staleness=1" in r.getMessage() for r in caplog.records)
    caplog.clear()
    strategy_of(strategy_conf("async", max_staleness=0, enable_partial_rollout=False))
    strategy_of(strategy_conf("async", max_staleness=1))
    assert not caplog.records
