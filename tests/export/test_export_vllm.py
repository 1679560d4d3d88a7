"""An exported checkpoint is a folder vLLM serves: vLLM's engine (the CPU build in .venv-vllm, or CUDA)
loads `python -m rlharness.export`'s output of a real LoRA run (the merged model) and greedily generates
what the exported model generates under transformers, with its log-probs."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlharness.core.checkpoint import complete_checkpoints
from tests.export.test_export import CHAT_RUN, export
from tests.helpers import run_cli


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_vllm_serves_an_exported_lora_run(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlharness.config.schema import ModelConf, VLLMEngineConf
    from rlharness.engine import build_engine
    from rlharness.engine.base import GenerateRequest, SamplingParams

    run_dir, out = tmp_path / "run", tmp_path / "exported"
    run_cli([*CHAT_RUN, "total_steps=1", "model.lora.rank=4", "algo.lr=5e-2", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path)
    assert len(complete_checkpoints(run_dir)) == 1
    export(run_dir, out)
    tok = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for q in ("What is 12*34?", "What is 56*7?")]

    async def generate():
        engine = build_engine(VLLMEngineConf(), ModelConf(path=str(out)), seed=0)
        try:
            return await asyncio.gather(*(engine.generate(GenerateRequest(str(i), p, SamplingParams(
                greedy=True, max_tokens=10))) for i, p in enumerate(prompts)))
        finally:
            await engine.close()

    for prompt, res in zip(prompts, asyncio.run(generate())):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10,
                                  pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
        assert res.token_ids == want[:len(res.token_ids)] and len(res.token_ids) > 0
