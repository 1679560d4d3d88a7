"""LoRA (`model.lora.*`) on the tiny random model: what trains, the reference, what engines receive, checkpoints."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest
import torch

from rlharness.model import lora
from rlharness.algo.losses import token_logprobs
from rlharness.backend.learner import Learner
from rlharness.core.checkpoint import CheckpointError
from rlharness.config.schema import AlgoConf, ConfigError, HFEngineConf, LoraConf, ModelConf, TorchBackendConf
from rlharness.engine import GenerateRequest, SamplingParams, build_engine
from rlharness.weights.transfer import state_bytes
from tests.backend.test_torch_backend import make_batch, step

pytestmark = pytest.mark.timeout(180)


def lora_backend(model_dir: str, rank: int = 4, sync: str = "merged", targets=(), **algo_kw) -> Learner:
    algo = AlgoConf(name="test", **{"lr": 1e-2, **algo_kw})
    model_conf = ModelConf(path=model_dir, lora=LoraConf(rank=rank, alpha=8.0, sync=sync,
                                                         target_modules=list(targets)))
    return Learner(TorchBackendConf(), model_conf, algo, total_steps=10, seed=0)


def base_weights(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def test_only_adapters_train_and_counts_are_logged(tiny_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="rlharness.model.lora"):
        b = lora_backend(tiny_model_dir)
    trainable, total = lora.parameter_counts(b.model)
    assert 0 < trainable < total / 4
    assert f"{trainable} trainable of {total} parameters" in caplog.text
    assert "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj" in caplog.text
    optimized = [p for g in b.optimizer.param_groups for p in g["params"]]
    assert sum(p.numel() for p in optimized) == trainable
    frozen_before = {n: p.detach().clone() for n, p in b.model.named_parameters() if not p.requires_grad}
    step(b, make_batch(b.algo))
    assert all(torch.equal(p, frozen_before[n]) for n, p in b.model.named_parameters() if not p.requires_grad)
    assert len(b.optimizer.state) == len(optimized)  # Adam moments for the adapters only
    assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in b.model.named_parameters() if "lora_B" in n)


def test_reference_is_the_model_with_adapters_off(tiny_model_dir):
    b = lora_backend(tiny_model_dir, kl_coef=0.1)
    assert b.reference is None  # no second copy
    batch = make_batch(b.algo)
    assert step(b, batch)["train/kl"] == pytest.approx(0.0, abs=1e-7)
    assert step(b, batch)["train/kl"] > 0
    # Adapters off = the base model loaded from disk.
    ids = batch.input_ids[:2]
    with torch.no_grad():
        with lora.reference(b.peft_model):
            off = b.model(input_ids=ids).logits
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits
    assert torch.allclose(off, base, atol=1e-6)


def test_merged_sync_sends_the_base_once_then_only_adapted_matrices(tiny_model_dir):
    b = lora_backend(tiny_model_dir, targets=["q_proj", "v_proj"])
    step(b, make_batch(b.algo))
    first = asyncio.run(b.get_weights())
    base = base_weights(tiny_model_dir)
    # The first sync: every tensor once, under the base model's names (the tied head as the embedding).
    assert set(first) == set(base) - {"lm_head.weight"}
    second = asyncio.run(b.get_weights())
    assert set(second) == {k for k in base if k.endswith(("q_proj.weight", "v_proj.weight"))}
    for name, value in second.items():
        module = b.peft_model.base_model.model.get_submodule(name.rsplit(".", 1)[0])
        expected = base[name] + module.scaling["default"] * module.lora_B["default"].weight @ module.lora_A[
            "default"].weight
        assert torch.allclose(value, expected, atol=1e-6)
        assert not torch.equal(value, base[name])  # trained


def test_adapter_sync_sends_only_a_and_b(tiny_model_dir):
    b = lora_backend(tiny_model_dir, sync="adapter")
    sent = asyncio.run(b.get_weights())
    assert sent and all(".lora_A." in k or ".lora_B." in k for k in sent)
    assert state_bytes(sent) == sum(p.numel() * 4 for p in b.model.parameters() if p.requires_grad)


def _engine_vs_trainer(b: Learner, engine) -> float:
    """Largest |engine log-prob - trainer log-prob| over sampled tokens of a few prompts."""
    async def run():
        await engine.load_weights(await b.get_weights(), 1)
        reqs = [GenerateRequest(str(i), [5 + i, 9, 7, 11], SamplingParams(max_tokens=12), seed=i) for i in range(4)]
        return await engine.generate_many(reqs)

    results = asyncio.run(run())
    worst = 0.0
    b.model.eval()
    with torch.no_grad():
        for req_ids, res in zip(([5 + i, 9, 7, 11] for i in range(4)), results):
            ids = torch.tensor([req_ids + res.token_ids])
            lp = token_logprobs(b.model(input_ids=ids).logits, ids, 1.0)[0, len(req_ids):]
            worst = max(worst, float((lp - torch.tensor(res.logprobs)).abs().max()))
    asyncio.run(engine.close())
    return worst


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_engine_logprobs_equal_the_trainers(tiny_model_dir, sync):
    b = lora_backend(tiny_model_dir, sync=sync, lr=5e-2)
    for seed in range(3):
        step(b, make_batch(b.algo, seed=seed))
    engine = build_engine(HFEngineConf(max_batch_size=8), ModelConf(path=tiny_model_dir, lora=b.lora_conf), seed=0)
    if sync == "adapter":
        assert any(".lora_A." in k for k in engine._params)
    else:
        assert not any("lora" in k for k in engine._params)
    diff = _engine_vs_trainer(b, engine)
    # A full-weight run's engine/trainer gap on the same model is the yardstick.
    full = Learner(TorchBackendConf(), ModelConf(path=tiny_model_dir), AlgoConf(name="t", lr=1e-3), 10, 0)
    step(full, make_batch(full.algo))
    full_diff = _engine_vs_trainer(full, build_engine(HFEngineConf(max_batch_size=8), ModelConf(path=tiny_model_dir),
                                                      seed=0))
    print(f"engine-trainer log-prob gap: lora {sync} {diff:.2e}, full weights {full_diff:.2e}")
    assert diff < max(10 * full_diff, 1e-5), (diff, full_diff)


def test_checkpoint_is_peft_format_and_resumes_bit_exact(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    first = lora_backend(tiny_model_dir, lr_schedule="cosine", warmup_steps=1)
    step(first, make_batch(first.algo, seed=1))
    rng_at_save = torch.get_rng_state()
    asyncio.run(first.save(str(tmp_path / "ckpt")))
    files = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "backend_state.pt"} <= files
    assert "model.safetensors" not in files  # the base is not copied
    reference = step(first, make_batch(first.algo, seed=2))
    ref_weights = asyncio.run(first.get_weights())

    fresh = lora_backend(tiny_model_dir, lr_schedule="cosine", warmup_steps=1)
    asyncio.run(fresh.load(str(tmp_path / "ckpt")))
    assert torch.equal(torch.get_rng_state(), rng_at_save)
    assert step(fresh, make_batch(fresh.algo, seed=2))["train/loss"] == reference["train/loss"]
    asyncio.run(fresh.get_weights())  # the first sync (everything); the second compares like for like
    weights = asyncio.run(fresh.get_weights())
    assert weights.keys() <= ref_weights.keys()
    assert all(torch.equal(weights[k], ref_weights[k]) for k in weights)

    # PEFT loads it on the base; the merged model is what export writes.
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(tmp_path / "ckpt"))
    ids = torch.tensor([[5, 6, 7, 8]])
    merged = lora.merged_model_from_checkpoint(tmp_path / "ckpt", tiny_model_dir)
    assert type(merged).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5)
        with lora.reference(loaded):
            assert not torch.allclose(loaded(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5)


def test_resume_with_other_lora_settings_is_refused(tiny_model_dir, tmp_path):
    b = lora_backend(tiny_model_dir)
    asyncio.run(b.save(str(tmp_path / "lora")))
    full = Learner(TorchBackendConf(), ModelConf(path=tiny_model_dir), AlgoConf(name="t"), 10, 0)
    asyncio.run(full.save(str(tmp_path / "full")))
    with pytest.raises(CheckpointError, match="written by a LoRA run .*rank=4.*this run has model.lora.rank=0"):
        asyncio.run(full.load(str(tmp_path / "lora")))
    with pytest.raises(CheckpointError, match="written by a full-weight run.*model.lora.rank=4"):
        asyncio.run(b.load(str(tmp_path / "full")))
    with pytest.raises(CheckpointError, match=r"LoRA rank 4 on .*this run asks for rank 8"):
        asyncio.run(lora_backend(tiny_model_dir, rank=8).load(str(tmp_path / "lora")))
    with pytest.raises(CheckpointError, match=r"rank 4 on \['down_proj'.*rank 4 on \['q_proj'\]"):
        asyncio.run(lora_backend(tiny_model_dir, targets=["q_proj"]).load(str(tmp_path / "lora")))


def test_bad_lora_settings_are_refused_by_key(tiny_model_dir):
    for kw, key in (({"rank": -1}, "model.lora.rank"), ({"alpha": 0.0}, "model.lora.alpha"),
                    ({"dropout": 1.0}, "model.lora.dropout"), ({"dropout": -0.1}, "model.lora.dropout"),
                    ({"sync": "delta"}, "model.lora.sync")):
        with pytest.raises(ConfigError, match=key):
            LoraConf(**kw)
    conf = ModelConf(path=tiny_model_dir, lora=LoraConf(rank=4, target_modules=["q_proj", "qkv"]))
    with pytest.raises(ConfigError) as err:
        lora.check_model_conf(conf)
    assert str(err.value) == ("model.lora.target_modules: 'qkv' matches no module; the model's linear layers are: "
                              "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj")
    lora.check_model_conf(dataclasses.replace(conf, lora=LoraConf(rank=4)))  # defaults: found by name


def test_adapter_sync_beyond_what_vllm_serves_is_refused_naming_the_sync_that_works():
    from tests.helpers import compose_conf

    with pytest.raises(ConfigError, match=r"model.lora.sync=adapter with engine=vllm .*rank=1024.*use model.lora.sync="
                                          r"merged"):
        compose_conf(["engine=vllm", "model.lora.rank=1024", "model.lora.sync=adapter"])
    compose_conf(["engine=vllm", "model.lora.rank=1024", "model.lora.sync=merged"])
    compose_conf(["engine=hf", "model.lora.rank=1024", "model.lora.sync=adapter"])  # the hf engine serves any rank
