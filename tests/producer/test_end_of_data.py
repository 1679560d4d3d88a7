"""The end of the data (sampler.allow_epoch_rollover=false) ends production cleanly, in both modes."""

from __future__ import annotations

import asyncio
import logging

import pytest
from producer_harness import build, check_batch, check_nothing_lost, run_colocate, run_disagg, strategy_conf, sync_weights

from rlharness.producer.sampler import DataExhausted
from tests.helpers import run_on_virtual_clock

pytestmark = pytest.mark.timeout(120)
STEPS, BATCH = 5, 4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_disaggregated_run_over_exactly_the_data_trains_every_step_and_draws_nothing_more(seed):
    # Over-sampling and a staleness window made the producer target steps past the last one,
    # run out of data and fail; get_batch then raised that error before seeing its batch ready.
    h = build(strategy_conf("async", max_staleness=1, over_sample_threshold=0.5), n_rows=STEPS * BATCH,
              batch_size=BATCH, rollover=False, seed=seed, last_step=STEPS)
    run_on_virtual_clock(run_disagg(h, STEPS))
    assert len(h.trained) == STEPS * BATCH
    assert h.sampler.drawn == STEPS * BATCH  # nothing drawn for steps after the last
    check_nothing_lost(h)


def test_consumer_past_the_data_gets_data_exhausted_not_a_timeout():
    h = build(strategy_conf("async", max_staleness=1), n_rows=2 * BATCH, batch_size=BATCH, rollover=False)

    async def main():
        loop_task = asyncio.create_task(h.mgr.produce_loop())
        try:
            for step in (1, 2):
                check_batch(h, await h.mgr.get_batch(step, timeout_s=30), step)
                await h.mgr.pause()
                await sync_weights(h, step)  # the engine's weights and the manager's step, as a trainer does
                h.mgr.resume()
            with pytest.raises(DataExhausted, match=r"train step 3: the data ran out .*allow_epoch_rollover=False"):
                await h.mgr.get_batch(3, timeout_s=30)
        finally:
            await h.mgr.close()
            await asyncio.wait_for(loop_task, timeout=10)
        assert loop_task.exception() is None  # the producer did not fail

    run_on_virtual_clock(main())
    check_nothing_lost(h)


def test_colocated_run_over_exactly_the_data_then_data_exhausted():
    h = build(strategy_conf("async", max_staleness=1, over_sample_threshold=0.5), n_rows=STEPS * BATCH,
              batch_size=BATCH, rollover=False, last_step=STEPS)
    run_on_virtual_clock(run_colocate(h, STEPS))
    assert h.sampler.drawn == STEPS * BATCH
    with pytest.raises(DataExhausted, match="train step 6"):
        run_on_virtual_clock(h.mgr.produce_batch(STEPS + 1))
    check_nothing_lost(h)


def test_a_batch_larger_than_the_dataset_is_refused_or_warned(caplog):
    with pytest.raises(ValueError, match=r"batch_size=5 .* 4 prompts .*allow_epoch_rollover=False"):
        build(strategy_conf("sync"), n_rows=4, batch_size=5, rollover=False)
    with caplog.at_level(logging.WARNING):
        h = build(strategy_conf("sync"), n_rows=4, batch_size=5, rollover=True)
    warned = [r.getMessage() for r in caplog.records if "exceeds the dataset" in r.getMessage()]
    assert warned == ["task t: batch_size=5 groups per step exceeds the dataset's 4 prompts: every batch holds "
                      "some prompts more than once (from consecutive epochs)"]
    batch = run_on_virtual_clock(h.mgr.produce_batch(1))  # it does: 5 groups from 4 prompts
    assert len({g.prompt_index for g in batch.groups}) == 4
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        build(strategy_conf("sync"), n_rows=5, batch_size=5, rollover=True)
    assert not caplog.records
