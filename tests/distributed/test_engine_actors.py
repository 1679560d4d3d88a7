"""Engine actors behind driver-side proxies: weight versions, transfer timeout, restart without losses."""

from __future__ import annotations

import asyncio
import dataclasses
import sys

import pytest
from ray import cloudpickle as ray_cloudpickle

from rlharness.config.schema import ModelConf, SimEngineConf
from rlharness.distributed.engine_actor import EngineActor
from rlharness.distributed.remote_engine import RayEngineRouter, RemoteEngine, WeightSyncTimeout
from rlharness.distributed.spawn import spawn_engines
from rlharness.engine.base import GenerateRequest, SamplingParams
from tests.helpers import HANG_S

pytestmark = [pytest.mark.ray, pytest.mark.timeout(2 * HANG_S)]

SIM = SimEngineConf(mean_response_len=8, cv=0.5, time_per_token_s=0.002, slots=16)


def request(i: int, max_tokens: int = 8) -> GenerateRequest:
    return GenerateRequest(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=max_tokens))


class SlowLoadEngineActor(EngineActor):
    """A real engine actor whose weight load hangs for ever (a stuck transfer)."""

    async def load_weights(self, state, version):
        await asyncio.Event().wait()


# Actor processes cannot import this test module by name: ship its classes by value.
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_weight_versions_arrive_in_order_at_every_engine(ray_session, tiny_model_dir):
    engine = spawn_engines(dataclasses.replace(SIM, num_engines=2), ModelConf(path=tiny_model_dir),
                           seed=0, cpus=0.5, gpus=0, timeout_s=HANG_S)
    assert isinstance(engine, RayEngineRouter) and len(engine.engines) == 2

    async def main():
        try:
            for version in (1, 2, 3, 4):
                # Requests run while versions change; each token is stamped with its version.
                results = await asyncio.gather(*(engine.generate(request(i)) for i in range(6)),
                                               engine.load_weights({"w": version}, version))
                assert all(r.finish_reason in ("stop", "length") for r in results[:-1])
            infos = [await e.info() for e in engine.engines]
            assert [i["versions_loaded"] for i in infos] == [[1, 2, 3, 4], [1, 2, 3, 4]]
            assert engine.version == 4
            after = await asyncio.gather(*(engine.generate(request(i)) for i in range(4)))
            assert {v for r in after for v in r.model_steps} == {4}
            with pytest.raises(ValueError, match="versions must not go back"):
                await engine.load_weights({"w": 0}, 3)
            assert engine.stats()["weight_loads"] == 8  # 4 versions x 2 engines
        finally:
            await engine.close()

    asyncio.run(main())


def test_a_hung_weight_transfer_times_out_instead_of_blocking(ray_session, tiny_model_dir):
    engine = spawn_engines(SIM, ModelConf(path=tiny_model_dir), seed=0, cpus=0.5, gpus=0, timeout_s=HANG_S,
                           actor_cls=SlowLoadEngineActor)
    assert isinstance(engine, RemoteEngine)

    async def main():
        try:
            engine.timeout_s = 1.5  # this load's bound (it never ends); every other call keeps HANG_S
            with pytest.raises(WeightSyncTimeout, match=r"engine0: load_weights\(version=1\) did not finish within "
                                                        r"timeout_s=1.5"):
                await engine.load_weights({"w": 1}, 1)
            engine.timeout_s = HANG_S
            assert engine.version == 0  # the version only moves when the engine has the weights
            result = await engine.generate(request(0))  # the cancelled load left the engine serving
            assert result.finish_reason in ("stop", "length") and set(result.model_steps) == {0}
        finally:
            await engine.close()

    asyncio.run(main())


def test_killed_engine_actor_restarts_and_no_group_is_lost(ray_session, tiny_model_dir):
    """Kill the engine actor mid-production: its requests come back aborted, their groups go back
    to the buffer and are sampled again; the restarted actor gets the current weights first."""
    import ray
    from producer_harness import build, check_batch, check_nothing_lost, strategy_conf

    engine = spawn_engines(SIM, ModelConf(path=tiny_model_dir), seed=0, cpus=0.5, gpus=0, timeout_s=HANG_S,
                           max_restarts=2)
    h = build(strategy_conf("async", max_staleness=1, over_sample_threshold=0.5), engine=engine,
              batch_size=4, k=2, max_tokens=12)
    killed_pid = None

    async def main():
        nonlocal killed_pid
        producer = asyncio.create_task(h.mgr.produce_loop())
        try:
            for step in range(1, 7):
                batch = await h.mgr.get_batch(step, timeout_s=HANG_S)  # a restart takes a minute on a busy box
                check_batch(h, batch, step)
                if step == 3:
                    killed_pid = (await engine.info())["pid"]
                    while h.mgr.in_flight() == 0:  # kill it while it is serving
                        await asyncio.sleep(0.005)
                    ray.kill(engine.actor, no_restart=False)
                await asyncio.sleep(0.05)  # "training", concurrent with production
                await h.mgr.pause()
                assert h.mgr.accounting()["unaccounted"] == 0
                await engine.load_weights({}, step)
                h.mgr.set_model_step(step)
                h.mgr.resume()
        finally:
            await h.mgr.close()
            await asyncio.wait_for(producer, timeout=HANG_S)
        info = await engine.info()
        stats = engine.stats()
        await engine.close()
        return info, stats

    info, stats = asyncio.run(main())
    check_nothing_lost(h)
    assert stats["restarts"] == 1 and info["pid"] != killed_pid
    assert stats["requests_failed"] >= 1
    # The new incarnation got the version in force at the restart again, then every later one, in order.
    assert info["versions_loaded"] == sorted(info["versions_loaded"]) and info["versions_loaded"][-1] == 6
    assert info["versions_loaded"][0] <= 3
