"""Rollout engines: `build_engine` makes the one `engine.name` names (hf | vllm | sim)."""

from __future__ import annotations

from typing import Any

from rlharness.config import registry
from rlharness.config.schema import EngineConf, ModelConf
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine, SamplingParams

__all__ = ["GenerateRequest", "GenerateResult", "RolloutEngine", "SamplingParams", "build_engine"]


def build_engine(conf: EngineConf, model_conf: ModelConf, seed: int, name: str | None = None,
                 **kw: Any) -> RolloutEngine:
    """One engine for `conf` (its module is imported now: vLLM and transformers are heavy).

    The engine loads the model in its own dtype (`model.engine_dtype`, else `model.dtype`).
    `name` labels the engine where it names itself in errors. `kw` goes to the engine's
    constructor: for hf e.g. `model=`, `tokenizer=`; for sim `vocab_size=`, `eos_token_id=`,
    `decode=` (taken from model_conf's tokenizer when absent).
    """
    return registry.build("engine", conf, model_conf.for_engine(), seed, name=name, **kw)
