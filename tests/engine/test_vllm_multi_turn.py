"""Seeded multi-turn continuations through the real vLLM engine on the embedded chat model.

A tool loop sends, per sample, the prompt + the tokens the model wrote + the tool output
as a new request with the sample's seed. Many such continuations arriving together exceed
vLLM's token budget; with chunked prefill a seeded request prefilled in parts had its
generator rewound by an offset that the CPU generator does not have, and the engine core
died ("CPU Generator does not use offset", issue 14). Runs in .venv-vllm (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from rlharness.config.schema import ModelConf, VLLMEngineConf
from rlharness.engine import build_engine
from rlharness.engine.base import GenerateRequest, SamplingParams
from rlharness.model.load import PROJECT_ROOT, load_tokenizer
from tests.helpers import HANG_S

ASSET = PROJECT_ROOT / "assets" / "tiny-chat"
NUM_SAMPLES = 64


def _continuations(tok) -> list[list[int]]:
    """Per sample: a chat prompt, earlier tool rounds as the loop appends them (each segment
    tokenized on its own), ending where the model writes next: ~100-200 tokens each."""
    rows = [json.loads(line) for line in (ASSET / "data" / "tools_eval.jsonl").read_text().splitlines()]
    out = []
    for i in range(NUM_SAMPLES):
        row = rows[i % len(rows)]
        ids = tok.apply_chat_template([{"role": "user", "content": row["question"]}], tokenize=False,
                                      add_generation_prompt=True)
        ids = tok.encode(ids, add_special_tokens=False)
        for r in rows[i + 1: i + 4 + i % 4]:
            a, b = (int(x) for x in r["answer"].split(" = ")[0].split(" * "))
            ids += tok.encode(f"<tool>{a}*{b}</tool>", add_special_tokens=False)
            ids += tok.encode(f"<output>{a * b}</output>", add_special_tokens=False)
        out.append(ids)
    return out


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_seeded_multi_turn_continuations_arriving_together_complete_and_reproduce():
    tok = load_tokenizer(ModelConf(path=str(ASSET)))
    prompts = _continuations(tok)
    loop = asyncio.new_event_loop()

    async def build():  # in the loop that will run it: the engine's output handler lives there
        return build_engine(VLLMEngineConf(sync_timeout_s=HANG_S), ModelConf(path=str(ASSET)), seed=0)

    engine = loop.run_until_complete(build())
    try:
        budget = engine._llm.vllm_config.scheduler_config.max_num_batched_tokens
        assert sum(map(len, prompts)) > 2 * budget, "the continuations must overflow one step's token budget"
        params = SamplingParams(temperature=1.0, max_tokens=12, stop=("</tool>",))

        async def draw(seed: int):
            reqs = [GenerateRequest(f"c{seed}-{i}", p, params, seed=seed + i) for i, p in enumerate(prompts)]
            return await asyncio.gather(*(engine.generate(r) for r in reqs))

        first = loop.run_until_complete(draw(100))
        assert all(r.finish_reason in ("stop", "length") and r.token_ids for r in first)
        # Per-request seeds still hold: the same seeds give the same tokens, other seeds others.
        again = loop.run_until_complete(draw(100))
        assert [r.token_ids for r in again] == [r.token_ids for r in first]
        other = loop.run_until_complete(draw(5000))
        assert [r.token_ids for r in other] != [r.token_ids for r in first]
    finally:
        loop.run_until_complete(engine.close())
        loop.close()
