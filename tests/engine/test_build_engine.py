"""build_engine dispatches on engine.name and loads model.path for engine=hf."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from rlharness.config.schema import ConfigError, EngineConf, HFEngineConf, ModelConf, SimEngineConf
from rlharness.engine import build_engine
from rlharness.engine.base import GenerateRequest, SamplingParams


@pytest.mark.timeout(120)
def test_hf_engine_from_model_path(tiny_model_dir):
    from rlharness.engine.hf import HFEngine

    async def go():
        engine = build_engine(HFEngineConf(max_batch_size=4), ModelConf(path=tiny_model_dir), seed=0)
        try:
            assert isinstance(engine, HFEngine) and engine.version == 0
            ids = engine.tokenizer("12+34=")["input_ids"]
            return await engine.generate(GenerateRequest("a", ids, SamplingParams(max_tokens=5)))
        finally:
            await engine.close()

    res = asyncio.run(go())
    assert len(res.token_ids) <= 5 and len(res.logprobs) == len(res.token_ids)


def test_unknown_engine_name_is_refused():
    with pytest.raises(ConfigError, match="engine.name='nope'"):
        build_engine(EngineConf(name="nope"), ModelConf(), seed=0)


@pytest.mark.skipif(importlib.util.find_spec("rlharness.engine.sim") is None, reason="sim engine not written yet")
@pytest.mark.timeout(60)
def test_sim_engine_takes_vocab_from_the_tokenizer(tiny_model_dir):
    engine = build_engine(SimEngineConf(), ModelConf(path=tiny_model_dir), seed=0)
    assert type(engine).__name__ == "SimEngine"
    asyncio.run(engine.close())
