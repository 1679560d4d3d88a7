"""Rollout engines: `build_engine` picks one by `engine.name` (hf | vllm | sim)."""

from __future__ import annotations

from typing import Any

from rlharness.config.schema import ConfigError, EngineConf, ModelConf
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine, SamplingParams

__all__ = ["GenerateRequest", "GenerateResult", "RolloutEngine", "SamplingParams", "build_engine"]


def build_engine(conf: EngineConf, model_conf: ModelConf, seed: int, name: str | None = None,
                 **kw: Any) -> RolloutEngine:
    """One engine for `conf` (imports its backend lazily: vLLM and transformers are heavy).

    `name` labels the engine where it names itself in errors (vllm: "vllm engine <name>").
    `kw` goes to the engine's constructor: for hf e.g. `model=`, `tokenizer=`; for sim
    `vocab_size=`, `eos_token_id=`, `decode=` (taken from model_conf's tokenizer when absent).
    """
    if conf.name == "hf":
        from rlharness.engine.hf import HFEngine

        return HFEngine(conf, model_conf, seed, **kw)
    if conf.name == "vllm":
        from rlharness.engine.vllm import VLLMEngine

        if name is not None:
            kw = {"name": f"vllm engine {name}", **kw}
        return VLLMEngine(conf, model_conf, seed, **kw)
    if conf.name == "sim":
        from rlharness.engine.sim import SimEngine

        if "vocab_size" not in kw:
            from rlharness.model.load import load_tokenizer

            tok = load_tokenizer(model_conf)
            kw = {"vocab_size": len(tok), "eos_token_id": tok.eos_token_id,
                  "decode": lambda ids: tok.decode(ids, skip_special_tokens=True), **kw}
        return SimEngine(conf, seed, **kw)
    raise ConfigError(f"engine.name={conf.name!r} is not allowed: expected one of hf, vllm, sim")
