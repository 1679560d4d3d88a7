"""engine=vllm: runs where vLLM and a CUDA device exist; elsewhere only the clear error is checked."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from rlharness.config.schema import ModelConf, VLLMEngineConf
from rlharness.engine import build_engine
from rlharness.engine.base import GenerateRequest, SamplingParams


def _vllm_and_cuda() -> str | None:
    """Why the vLLM tests cannot run here, or None when they can."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (CUDA-only build; see ENVIRONMENT.md)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


SKIP_REASON = _vllm_and_cuda()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_missing_vllm_gives_a_clear_error(tiny_model_dir):
    with pytest.raises(ImportError, match="engine=vllm needs vLLM"):
        build_engine(VLLMEngineConf(), ModelConf(path=tiny_model_dir), seed=0)


@pytest.mark.vllm
@pytest.mark.gpu
@pytest.mark.skipif(SKIP_REASON is not None, reason=str(SKIP_REASON))
@pytest.mark.timeout(600)
def test_vllm_greedy_abort_and_weights(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "123+456=", "77"]]

    async def go():
        engine = build_engine(VLLMEngineConf(gpu_memory_utilization=0.2), ModelConf(path=tiny_model_dir), 0)
        try:
            greedy = await asyncio.gather(*(engine.generate(GenerateRequest(
                str(i), p, SamplingParams(greedy=True, max_tokens=12))) for i, p in enumerate(prompts)))
            long = asyncio.create_task(engine.generate(GenerateRequest(
                "long", prompts[0], SamplingParams(temperature=1.0, max_tokens=100_000))))
            await asyncio.sleep(0.5)
            assert await engine.abort_all() == 1
            partial = await asyncio.wait_for(long, 30)
            state = {k: v * 1.5 for k, v in model.state_dict().items()}
            await engine.load_weights(state, version=3)
            after = await engine.generate(GenerateRequest("a", prompts[0], SamplingParams(greedy=True, max_tokens=12)))
            return greedy, partial, after
        finally:
            await engine.close()

    greedy, partial, after = asyncio.run(go())
    for p, res in zip(prompts, greedy):
        ids = torch.tensor([p])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                             pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
        assert res.token_ids == ref
    assert partial.finish_reason == "abort" and len(partial.token_ids) == len(partial.logprobs) > 0
    assert after.model_steps == [3] * len(after.token_ids)
