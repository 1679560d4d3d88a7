"""Weight transfer by broadcast group (rlharness.weights.transfer, rlharness.distributed.weight_channel).

The GPU path is NCCL; here the same code path runs with gloo between real Ray actors
(a training actor hosting a Learner, engine actors), which tests the mechanism:
rendezvous, specs through the store, bucketed broadcast, loading as a version, and
a missing sender raising instead of hanging.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import sys

import pytest
import torch
from ray import cloudpickle as ray_cloudpickle

from rlharness.config.schema import (AlgoConf, ConfigError, HFEngineConf, ModelConf, SimEngineConf, TorchBackendConf,
                                     VLLMEngineConf)
from rlharness.distributed.engine_actor import EngineActor
from rlharness.distributed.spawn import spawn_engines
from rlharness.distributed.train_actor import spawn_train_workers
from rlharness.distributed.weight_channel import (BroadcastChannel, ObjectStoreChannel, build_weight_channel,
                                                  choose_route)
from rlharness.weights.transfer import TensorSpec, WeightGroupError, plan_buckets
from tests.helpers import HANG_S

SIM = SimEngineConf(mean_response_len=4, cv=0.5, time_per_token_s=0.001, slots=8)


def test_buckets_hold_one_dtype_and_respect_the_cap():
    specs = [TensorSpec("a", (4,), "float32"), TensorSpec("b", (2, 2), "bfloat16"),
             TensorSpec("c", (8,), "float32"), TensorSpec("d", (100,), "float32"), TensorSpec("e", (1,), "bfloat16")]
    buckets = plan_buckets(specs, bucket_bytes=48)  # 12 float32
    assert sorted(i for b in buckets for i in b) == [0, 1, 2, 3, 4]
    for b in buckets:
        assert len({specs[i].dtype for i in b}) == 1
        assert b == sorted(b)
    assert [0, 2] in buckets  # 16 + 32 bytes fit together
    assert [3] in buckets  # larger than the cap: a bucket of its own
    assert [1, 4] in buckets
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(specs, 0)


def test_nccl_is_chosen_only_when_both_sides_hold_gpus():
    assert choose_route("auto", 1.0, 1.0) == "nccl"
    assert choose_route("auto", 0.0, 1.0) == choose_route("auto", 1.0, 0.0) == "object_store"


def test_the_route_follows_the_engines_declared_weight_sync():
    """Chosen once from `engine.weight_sync` and where the actors sit, never from the engine's name."""
    assert choose_route("collective", 0.0, 0.0) == choose_route("collective", 0.0, 1.0) == "gloo"
    assert choose_route("collective", 1.0, 1.0) == "nccl"
    assert choose_route("disk", 1.0, 1.0) == choose_route("disk", 0.0, 0.0) == "object_store"
    assert HFEngineConf().weight_sync == SimEngineConf().weight_sync == "auto"
    assert VLLMEngineConf().weight_sync == "collective"
    with pytest.raises(ConfigError, match=r"engine.weight_sync='disk'.*auto, collective"):
        HFEngineConf(weight_sync="disk")


class RecordingEngineActor(EngineActor):
    """A real engine actor that also keeps the last state dict its engine loaded (by any route)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        load = self.engine.load_weights

        async def recording_load(state, version):
            self.last_state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
            self.last_devices = {k: v.device.type for k, v in state.items()}
            return await load(state, version)

        self.engine.load_weights = recording_load

    def last_loaded(self):
        return self.last_state

    def last_loaded_devices(self):
        return self.last_devices

    def wait_at_most(self, timeout_s: float) -> None:
        """This member's waits in the weight group end after `timeout_s` (the group's own bound is
        for transfers that must succeed; a version nobody sends gets a short one)."""
        self.engine._weight_member.timeout_s = timeout_s


ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _torch_backend_factory(model_dir: str):
    from rlharness.backend.learner import Learner

    def factory(rank, addr, port):
        return functools.partial(Learner, TorchBackendConf(), ModelConf(path=model_dir), AlgoConf(name="grpo"),
                                 10, 0)
    return factory


@pytest.mark.ray
@pytest.mark.timeout(2 * HANG_S)
def test_gloo_broadcast_group_delivers_the_trainers_exact_weights(ray_session, tiny_model_dir):
    backend = spawn_train_workers(_torch_backend_factory(tiny_model_dir), 1, 0.5, 0, {}, HANG_S, name="bcast")
    engine = spawn_engines(dataclasses.replace(SIM, num_engines=2), ModelConf(path=tiny_model_dir), seed=0,
                           cpus=0.5, gpus=0, timeout_s=HANG_S, actor_cls=RecordingEngineActor, name="bcast-engine")

    async def main():
        try:
            expected = dict(await backend.get_weights())  # object-store path: the reference copy
            # The group's timeout bounds the rendezvous and each transfer: only a hang reaches it.
            channel = build_weight_channel(backend, engine, "gloo", timeout_s=HANG_S)
            assert isinstance(channel, BroadcastChannel) and len(channel.group.engine_actors) == 2
            for version in (1, 2):
                assert (await channel.sync(version)).bytes_sent == sum(t.numel() * t.element_size()
                                                                       for t in expected.values())
                assert engine.version == version
                for e in engine.engines:
                    got = await e.actor.last_loaded.remote()
                    assert list(got) == list(expected)
                    for name, tensor in expected.items():
                        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
            infos = [await e.info() for e in engine.engines]
            assert [i["versions_loaded"] for i in infos] == [[1, 2], [1, 2]]
            assert engine.stats()["weight_loads"] == 4

            # Nobody sends: the receivers' own timeout (2 s for this version) ends the transfer with an
            # error naming a member.
            class NeverSends:
                async def send_to_group(self, version, full=False):
                    await asyncio.Event().wait()

            for e in engine.engines:
                await e.actor.wait_at_most.remote(2.0)
            with pytest.raises(WeightGroupError, match=r"version 3.*failed at engine"):
                await BroadcastChannel(NeverSends(), engine.engines, channel.group).sync(3)
            for e in engine.engines:
                await e.actor.wait_at_most.remote(HANG_S)
            assert engine.version == 2
            # The group is still usable after a timed-out wait.
            await channel.sync(4)
            assert engine.version == 4
        finally:
            await engine.close()
            await backend.close()

    asyncio.run(main())


@pytest.mark.ray
@pytest.mark.timeout(2 * HANG_S)
def test_object_store_channel_puts_each_version_once_for_every_engine(ray_session, tiny_model_dir):
    """The disaggregated default: training rank 0 puts a version into the store (after its step when
    asked to), every engine actor reads that one object, and the engines hold the trainer's exact weights."""
    backend = spawn_train_workers(_torch_backend_factory(tiny_model_dir), 1, 0.5, 0, {}, HANG_S, name="store",
                                  put_weights_after_step=True)
    engine = spawn_engines(dataclasses.replace(SIM, num_engines=2), ModelConf(path=tiny_model_dir), seed=0,
                           cpus=0.5, gpus=0, timeout_s=HANG_S, actor_cls=RecordingEngineActor, name="store-engine")

    async def main():
        try:
            channel = build_weight_channel(backend, engine, "object_store", timeout_s=HANG_S)
            assert isinstance(channel, ObjectStoreChannel)
            expected = dict(await backend.get_weights())
            assert (await channel.sync(1)).bytes_sent >= sum(t.numel() * t.element_size() for t in expected.values())
            for e in engine.engines:
                got = await e.actor.last_loaded.remote()
                assert all(torch.equal(got[k], v) for k, v in expected.items())
            assert [(await e.info())["versions_loaded"] for e in engine.engines] == [[1], [1]]
            with pytest.raises(ValueError, match="must not go back"):
                await channel.sync(0)
        finally:
            await engine.close()
            await backend.close()

    asyncio.run(main())


@pytest.mark.gpu
@pytest.mark.ray
@pytest.mark.timeout(2 * HANG_S)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="the NCCL weight group needs 2 CUDA devices (a training actor and an engine actor)")
def test_nccl_broadcast_group_on_two_gpus(ray_session, tiny_model_dir):
    backend = spawn_train_workers(_torch_backend_factory(tiny_model_dir), 1, 0.5, 1, {}, HANG_S, name="nccl")
    engine = spawn_engines(dataclasses.replace(SIM, num_engines=1), ModelConf(path=tiny_model_dir), seed=0,
                           cpus=0.5, gpus=1, timeout_s=HANG_S, actor_cls=RecordingEngineActor, name="nccl-engine")

    async def main():
        try:
            expected = dict(await backend.get_weights())
            await build_weight_channel(backend, engine, "nccl", timeout_s=HANG_S).sync(1)
            got = await engine.actor.last_loaded.remote()
            assert set((await engine.actor.last_loaded_devices.remote()).values()) == {"cuda"}
            for name, tensor in expected.items():
                assert torch.equal(got[name], tensor), name
        finally:
            await engine.close()
            await backend.close()

    asyncio.run(main())


@pytest.mark.ray
def test_object_store_weights_are_copied_once_and_read_in_place(ray_session):
    """The object store holds a version as `PackedWeights`: what an engine reads are views of the
    store's memory (read-only, no copy), bit-exact for every dtype, bfloat16 and 0-dim included."""
    import ray

    from rlharness.distributed.object_store_weights import PackedWeights, RemoteWeights, to_object_ref, unpacked

    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(7, generator=g).to(torch.bfloat16),
             "step": torch.tensor(3, dtype=torch.int64), "t": torch.randn(8, 4, generator=g).t()}
    stored = ray.get(to_object_ref(state))
    assert isinstance(stored, PackedWeights)
    assert not any(a.flags.writeable for a in stored.arrays)  # the store's own memory, not a copy
    for got in (unpacked(stored), dict(RemoteWeights(to_object_ref(state), 30.0))):
        assert list(got) == list(state)
        for name, t in state.items():
            assert got[name].dtype == t.dtype and got[name].shape == t.shape and torch.equal(got[name], t), name
