"""Delta syncs on the disaggregated routes (rlharness/weights/delta.py): training rank 0 (a Ray actor,
real train steps, float32) encodes, bfloat16 hf engine actors receive by a gloo broadcast group or the
object store, and hold bit for bit the trainer's weights cast to bfloat16; an engine Ray restarts is
sent its version whole, not the difference it was last pushed."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import sys

import pytest
import torch
from ray import cloudpickle as ray_cloudpickle

from rlharness.config.schema import AlgoConf, HFEngineConf, ModelConf, TorchBackendConf
from rlharness.distributed.engine_actor import EngineActor
from rlharness.distributed.spawn import spawn_engines
from rlharness.distributed.train_actor import spawn_train_workers
from rlharness.distributed.weight_channel import build_weight_channel
from rlharness.engine.base import GenerateRequest, SamplingParams
from rlharness.weights.delta import WeightEncoding
from rlharness.weights.transfer import weight_checksums
from tests.backend.test_torch_backend import make_batch

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

ALGO = AlgoConf(name="grpo", lr=1e-5)
ENCODING = WeightEncoding("bfloat16", delta=True)


class ChecksumEngineActor(EngineActor):
    """A real engine actor that also answers with the block checksums of the weights it computes with."""

    def checksums(self):
        return self.engine.weight_checksums()


ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _trainer(model_dir: str, **kw):
    from rlharness.backend.learner import Learner

    def factory(rank, addr, port):
        return functools.partial(Learner, TorchBackendConf(), ModelConf(path=model_dir), ALGO, 10, 0)
    return spawn_train_workers(factory, 1, 0.5, 0, {}, 120, name="delta", **kw)


def _engines(model_dir: str, count: int, **kw):
    model = ModelConf(path=model_dir, engine_dtype="bfloat16")
    return spawn_engines(dataclasses.replace(HFEngineConf(max_batch_size=4), num_engines=count), model, seed=0,
                         cpus=0.5, gpus=0, timeout_s=120, actor_cls=ChecksumEngineActor, name="delta-engine", **kw)


async def _expected(backend) -> dict[str, torch.Tensor]:
    """The trainer's weights as a full sync leaves a bfloat16 engine."""
    state = dict(await backend.get_weights(full=True))
    return weight_checksums({k: v.to(torch.bfloat16) for k, v in state.items()})


async def _holds(engine, expected) -> bool:
    got = await engine.actor.checksums.remote()
    return set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)


def test_differences_by_gloo_broadcast_leave_the_engines_exact(ray_session, tiny_model_dir):
    backend = _trainer(tiny_model_dir)
    engine = _engines(tiny_model_dir, 2)

    async def main():
        try:
            channel = build_weight_channel(backend, engine, "gloo", timeout_s=60.0, encoding=ENCODING)
            sent = []
            for version in (1, 2, 3):
                await backend.train_step(make_batch(ALGO, seed=version))
                sent.append((await channel.sync(version)).bytes_sent)
                expected = await _expected(backend)  # after the sync: the full put must not move the base
                for e in engine.engines:
                    assert await _holds(e, expected), (version, e.name)
            return sent
        finally:
            await engine.close()
            await backend.close()

    sent = asyncio.run(main())
    assert sent[1] < sent[0] and sent[2] < sent[0]


def test_a_restarted_engine_gets_its_version_whole(ray_session, tiny_model_dir):
    import ray

    backend = _trainer(tiny_model_dir, put_weights_after_step=True)
    engine = _engines(tiny_model_dir, 1, max_restarts=1)

    async def main():
        try:
            channel = build_weight_channel(backend, engine, "object_store", timeout_s=60.0, encoding=ENCODING)
            for version in (1, 2):
                await backend.train_step(make_batch(ALGO, seed=version))
                expected = await _expected(backend)
                await channel.sync(version)  # version 2 is a difference
                assert await _holds(engine, expected)
            # The next step's weights are already put (a difference to version 2) when the engine dies.
            await backend.train_step(make_batch(ALGO, seed=3))
            ray.kill(engine.actor, no_restart=False)
            result = None
            while result is None or result.finish_reason == "abort":  # requests sent while it dies are lost
                result = await engine.generate(GenerateRequest("r", [5, 6, 7], SamplingParams(max_tokens=2)))
            assert engine.stats()["restarts"] == 1 and set(result.model_steps) == {2}
            assert await _holds(engine, expected)  # version 2 whole, not 3, not initial + a difference
            await channel.sync(3)
            assert await _holds(engine, await _expected(backend))
        finally:
            await engine.close()
            await backend.close()

    asyncio.run(main())
