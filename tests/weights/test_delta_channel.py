"""Delta syncs through the colocated weight channel, end to end: a float32 trainer (real train steps)
feeding a bfloat16 hf engine leaves it bit for bit where full syncs leave another one; a resume and a
failed sync send every tensor whole."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlharness.backend.learner import Learner
from rlharness.config.schema import AlgoConf, ConfigError, HFEngineConf, LoraConf, ModelConf, TorchBackendConf
from rlharness.distributed.weight_channel import build_weight_channel
from rlharness.engine import build_engine
from rlharness.model.lora import DEFAULT_TARGETS
from rlharness.trainer.onpolicy_guard import onpolicy_gap_warning
from rlharness.weights.delta import BLOCKS, VALUES, WeightEncoding, payload_names
from rlharness.weights.transfer import state_bytes
from tests.backend.test_torch_backend import make_batch, make_groups

pytestmark = pytest.mark.timeout(300)


class FailingOnce:
    """An engine whose next load fails after it has taken part of the version (a broken-off sync)."""

    def __init__(self, engine):
        self.engine, self.fail = engine, False

    async def load_weights(self, state, version):
        if self.fail:
            self.fail = False
            first = payload_names(state)[0]
            part = {k: v for k, v in state.items() if k in (first, first + BLOCKS, first + VALUES)}
            await self.engine.load_weights(part, version)
            raise RuntimeError("connection lost")
        await self.engine.load_weights(state, version)


def test_a_float32_trainer_feeds_a_bfloat16_engine_by_differences(tiny_model_dir):
    model = ModelConf(path=tiny_model_dir, engine_dtype="bfloat16")
    algo = AlgoConf(name="grpo", lr=1e-5)
    trainer = Learner(TorchBackendConf(), model, algo, total_steps=10, seed=0)
    by_delta, by_full = (build_engine(HFEngineConf(), model, seed=0) for _ in range(2))
    assert next(by_delta.model.parameters()).dtype == torch.bfloat16  # the engine loads its own dtype
    delta_engine = FailingOnce(by_delta)
    delta = build_weight_channel(trainer, delta_engine, "in_process", 60, WeightEncoding("bfloat16", delta=True))
    full = build_weight_channel(trainer, by_full, "in_process", 60, WeightEncoding("bfloat16", delta=False))
    full_bytes = state_bytes({k: v.to(torch.bfloat16) for k, v in trainer.get_weights_blocking().items()})

    async def main():
        sent = []
        try:
            for version in range(1, 6):
                await trainer.train_step(make_batch(algo, seed=version))
                if version == 4:  # breaks off after the first tensor: the next sync must send everything
                    delta_engine.fail = True
                    with pytest.raises(RuntimeError, match="connection lost"):
                        await delta.sync(version)
                sent.append((await delta.sync(version)).bytes_sent)
                assert (await full.sync(version)).bytes_sent == full_bytes
                ours, theirs = by_delta.weight_checksums(), by_full.weight_checksums()
                assert set(ours) == set(theirs)
                assert all(torch.equal(ours[k], theirs[k]) for k in theirs), version
            sent.append((await delta.sync(6, full=True)).bytes_sent)  # what a resume asks for
        finally:
            await by_delta.close()
            await by_full.close()
        return sent

    sent = asyncio.run(main())
    assert sent[0] == full_bytes  # the first sync has no base
    assert 0 < max(sent[1:3]) < 0.75 * full_bytes
    assert sent[3] == full_bytes  # after the broken-off sync
    assert sent[4] < full_bytes
    assert sent[5] == full_bytes  # full=True


def test_engine_dtype_and_weight_delta_settings():
    assert ModelConf(engine_dtype="bfloat16").narrowest_dtype == "bfloat16"
    assert ModelConf(dtype="bfloat16", engine_dtype="float32").narrowest_dtype == "bfloat16"
    assert ModelConf().narrowest_dtype == "float32"
    assert ModelConf(engine_dtype="bfloat16").for_engine().dtype == "bfloat16"
    hf = HFEngineConf()  # weight_delta=auto: narrower than float32 and the trainer on a GPU
    assert hf.sends_deltas(ModelConf(dtype="bfloat16"), trainer_on_gpu=True)
    assert hf.sends_deltas(ModelConf(engine_dtype="float16"), trainer_on_gpu=True)
    assert not hf.sends_deltas(ModelConf(dtype="bfloat16"))  # a CPU trainer: encoding costs more than it saves
    assert not hf.sends_deltas(ModelConf(), trainer_on_gpu=True)  # float32: a step changes nearly every value
    assert HFEngineConf(weight_delta="on").sends_deltas(ModelConf())
    assert not HFEngineConf(weight_delta="off").sends_deltas(ModelConf(dtype="bfloat16"), trainer_on_gpu=True)
    lora_adapter = ModelConf(dtype="bfloat16", lora=LoraConf(rank=4, sync="adapter"))
    assert not hf.sends_deltas(lora_adapter, trainer_on_gpu=True)  # the adapter is the small thing already
    with pytest.raises(ConfigError, match=r"model.engine_dtype='int8'.*float32, bfloat16, float16"):
        ModelConf(engine_dtype="int8")
    with pytest.raises(ConfigError, match=r"engine.weight_delta='yes'.*auto, on, off"):
        HFEngineConf(weight_delta="yes")


def test_the_run_resolves_weight_delta_once_and_refuses_deltas_of_an_adapter():
    from tests.helpers import compose_conf

    assert compose_conf(["model.dtype=bfloat16"])[0].engine.weight_delta == "off"  # a CPU trainer
    assert compose_conf(["model.dtype=bfloat16", "backend.device=cuda"])[0].engine.weight_delta == "on"
    assert compose_conf(["engine.weight_delta=on"])[0].engine.weight_delta == "on"
    with pytest.raises(ConfigError, match="engine.weight_delta=on with model.lora.sync=adapter"):
        compose_conf(["engine.weight_delta=on", "model.lora.rank=4", "model.lora.sync=adapter"])


def test_the_onpolicy_guard_is_off_when_the_engine_is_narrower_than_the_trainer():
    groups = make_groups(0, num_groups=1, k=4)
    model = ModelConf(engine_dtype="bfloat16")
    assert onpolicy_gap_warning(3, groups, [3e-2] * 4, 3e-2, threshold=1e-5, dtype=model.narrowest_dtype) is None
    assert onpolicy_gap_warning(3, groups, [3e-2] * 4, 3e-2, threshold=1e-5,
                                dtype=ModelConf().narrowest_dtype) is not None


def test_differences_travel_as_plain_tensors():
    """A payload is a state dict of tensors: the object store, a broadcast group and vLLM's RPC specs carry it."""
    from rlharness.distributed.object_store_weights import PackedWeights
    from rlharness.weights.delta import DeltaEncoder
    from rlharness.weights.transfer import spec_rows, specs_from_rows, tensor_specs

    encoder = DeltaEncoder("bfloat16", delta=True)
    encoder.encode({"w": torch.zeros(4096)})
    encoder.commit(1)
    changed = torch.zeros(4096)
    changed[10] = 1.0
    payload = encoder.encode({"w": changed})
    assert set(payload) == {"w" + BLOCKS, "w" + VALUES}
    packed = PackedWeights(payload).tensors()
    assert all(torch.equal(packed[k], v) and packed[k].dtype == v.dtype for k, v in payload.items())
    assert specs_from_rows(spec_rows(tensor_specs(payload))) == tensor_specs(payload)


def test_lora_merged_syncs_start_whole_then_send_differences_of_the_merged_matrices(tiny_model_dir):
    """model.lora.sync=merged: the first sync of a trainer process is the whole model (base and merged
    matrices: what a LoRA merge hands over), sent whole; later ones only the adapted matrices, as
    differences; the engine ends where full syncs leave another one."""
    model = ModelConf(path=tiny_model_dir, engine_dtype="bfloat16", lora=LoraConf(rank=4, alpha=8.0))
    algo = AlgoConf(name="grpo", lr=1e-5)
    # Two trainers that train alike (a LoRA trainer's syncs are its own: the first sends everything).
    trainers = [Learner(TorchBackendConf(), model, algo, total_steps=10, seed=0) for _ in range(2)]
    by_delta, by_full = (build_engine(HFEngineConf(), model, seed=0) for _ in range(2))
    delta = build_weight_channel(trainers[0], by_delta, "in_process", 60, WeightEncoding("bfloat16", delta=True))
    full = build_weight_channel(trainers[1], by_full, "in_process", 60, WeightEncoding("bfloat16", delta=False))
    adapted = sum(v.numel() * 2 for k, v in by_full._params.items() if any(f".{t}." in k for t in DEFAULT_TARGETS))

    async def main():
        sent = []
        try:
            for version in range(1, 4):
                for trainer in trainers:
                    await trainer.train_step(make_batch(algo, seed=version))
                sent.append(((await delta.sync(version)).bytes_sent, (await full.sync(version)).bytes_sent))
                ours, theirs = by_delta.weight_checksums(), by_full.weight_checksums()
                assert all(torch.equal(ours[k], theirs[k]) for k in theirs), version
        finally:
            await by_delta.close()
            await by_full.close()
        return sent

    (first, first_full), *later = asyncio.run(main())
    assert first == first_full > adapted  # the first: the whole model, every tensor whole
    assert all(0 < ours < theirs == adapted for ours, theirs in later)  # then differences of the adapted only
