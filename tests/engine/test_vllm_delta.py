"""Delta syncs into vLLM (rlharness/weights/delta.py): a bfloat16 engine fed differences, through its
workers' broadcast group and through the disk route, computes exactly what it computes after a full
sync of the same version (same tokens, bit-equal log-probs: the same engine, the same weights).

Runs in .venv-vllm (tests/conftest.py deselects it elsewhere); one engine (~30 s on 2 cores).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from rlharness.config.schema import ModelConf, VLLMEngineConf
from rlharness.engine import build_engine
from rlharness.engine.base import GenerateRequest, SamplingParams
from rlharness.weights.delta import BLOCKS, DeltaEncoder

PROMPTS = ["1+2=", "123+456=", "77", "905+5="]


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_differences_leave_vllm_where_a_full_sync_does(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    engine = run(_build(tiny_model_dir))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    trainer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    encoder = DeltaEncoder("bfloat16", delta=True)
    g = torch.Generator().manual_seed(0)

    def step(scale: float) -> None:  # float32 updates, most below bfloat16's resolution
        for t in trainer.values():
            t.add_(scale * torch.randn(t.shape, generator=g))

    def greedy():
        reqs = [GenerateRequest(str(i), p, SamplingParams(greedy=True, max_tokens=12)) for i, p in enumerate(prompts)]

        async def all_of():
            return await asyncio.gather(*(engine.generate(q) for q in reqs))
        return [(r.token_ids, r.logprobs) for r in run(all_of())]

    def sync(version: int, full: bool = False) -> dict:
        payload = encoder.encode(trainer, full)
        run(engine.load_weights(payload, version))
        encoder.commit(version)
        return payload

    try:
        assert engine._deltas
        for route, first in (("collective", 1), ("disk", 5)):
            engine.conf = dataclasses.replace(engine.conf, weight_sync=route)
            sync(first, full=True)  # a route's first sync: the receiver's shadow starts here
            for version in range(first + 1, first + 3):
                step(1e-5)
                assert any(k.endswith(BLOCKS) for k in sync(version))
            by_delta = greedy()
            sync(first + 3, full=True)
            assert greedy() == by_delta, route  # tokens and log-probs, exactly
    finally:
        run(engine.close())
        loop.close()


async def _build(model_dir):
    return build_engine(VLLMEngineConf(sync_timeout_s=60.0, weight_delta="on"), ModelConf(path=model_dir, dtype="bfloat16"),
                        seed=0)
