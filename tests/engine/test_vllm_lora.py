"""engine=vllm with LoRA: `sync=adapter` (vLLM serves the adapter: enable_lora + a LoRARequest per version)
and `sync=merged` (only the adapted matrices, merged, after the first sync) give the trainer's log-probs.

Run in .venv-vllm (`bash scripts/setup_vllm.sh`; `.venv-vllm/bin/python -m pytest -m vllm`). On the CPU
build both are the tested path; the same code runs on the CUDA build (`test_adapter_serving_on_gpu`).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlharness.algo.losses import token_logprobs
from rlharness.backend.learner import Learner
from rlharness.config.schema import AlgoConf, LoraConf, ModelConf, TorchBackendConf, VLLMEngineConf
from rlharness.engine import build_engine
from rlharness.engine.base import GenerateRequest, SamplingParams
from tests.backend.test_torch_backend import make_batch, step
from tests.helpers import HANG_S

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
TOL = 1e-4  # as tests/engine/test_vllm_engine.py: vLLM's kernels are not HF's (measured gaps are printed)


def trained_lora(model_dir: str, sync: str) -> Learner:
    model_conf = ModelConf(path=model_dir, lora=LoraConf(rank=4, alpha=8.0, sync=sync))
    b = Learner(TorchBackendConf(), model_conf, AlgoConf(name="t", lr=5e-2), total_steps=10, seed=0)
    for seed in range(3):
        step(b, make_batch(b.algo, seed=seed))
    return b


def worst_gap(b: Learner, results, prompts) -> float:
    worst = 0.0
    with torch.no_grad():
        for p, res in zip(prompts, results):
            ids = torch.tensor([p + res.token_ids])
            lp = token_logprobs(b.model(input_ids=ids).logits, ids, 1.0)[0, len(p):]
            worst = max(worst, float((lp - torch.tensor(res.logprobs)).abs().max()))
    return worst


def run_engine(b: Learner, model_dir: str, syncs: int = 2) -> tuple[float, float, list[int]]:
    """Build a vLLM engine for `b`'s LoRA settings, sync `syncs` times; (gap before sync, gap after, bytes per sync)."""
    prompts = [[5 + i, 9, 7, 11] for i in range(4)]
    reqs = [GenerateRequest(str(i), p, SamplingParams(max_tokens=12), seed=i) for i, p in enumerate(prompts)]

    async def go():
        engine = build_engine(VLLMEngineConf(sync_timeout_s=HANG_S),  # the default route: collective (gloo)
                              ModelConf(path=model_dir, lora=b.lora_conf), seed=0)
        try:
            before = await asyncio.gather(*(engine.generate(r) for r in reqs))
            sent = []
            for v in range(1, syncs + 1):
                weights = await b.get_weights()
                sent.append(sum(t.numel() * t.element_size() for t in weights.values()))
                await engine.load_weights(weights, v)
            after = await asyncio.gather(*(engine.generate(r) for r in reqs))
            return before, after, sent
        finally:
            await engine.close()

    before, after, sent = asyncio.run(go())
    b.model.eval()
    return worst_gap(b, before, prompts), worst_gap(b, after, prompts), sent


@pytest.mark.parametrize("sync", ["adapter", "merged"])
def test_vllm_gives_the_trainers_logprobs_with_lora(tiny_model_dir, sync):
    b = trained_lora(tiny_model_dir, sync)
    before, after, sent = run_engine(b, tiny_model_dir)
    print(f"vllm lora sync={sync}: gap before sync {before:.2e}, after {after:.2e}, bytes per sync {sent}")
    assert before > 10 * TOL  # the engine started from the base: the trained adapter matters
    assert after < TOL
    if sync == "merged":
        assert sent[1] < sent[0]  # after the first sync only the adapted matrices
    else:
        assert sent[0] == sent[1] == sum(p.numel() * 4 for p in b.model.parameters() if p.requires_grad)


@pytest.mark.gpu
def test_adapter_serving_on_gpu(tiny_model_dir):
    """The same path on the CUDA build (LoRA kernels of the GPU)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU and the CUDA build of vLLM")
    b = trained_lora(tiny_model_dir, "adapter")
    _, after, _ = run_engine(b, tiny_model_dir)
    assert after < 1e-3  # GPU kernels (bf16-capable LoRA ops) round differently from the CPU trainer
