"""One registration per implementation: each config group's options, their schemas and what builds them.

A group's names (what `group=<name>` accepts and what an error lists), its Hydra schemas
(`rlharness.config.store`) and its builder (`build`) all come from `GROUPS`. Adding an
engine, judger, backend, agent loop, task or strategy is one row here, its schema class in
`schema.py`, its YAML in `conf/<group>/`, and the implementation. Builders are named
"module:attribute" and imported only when something is built, so this layer imports nothing
heavy: validating a config never loads torch, transformers or Ray.

A YAML option that only presets values of an implementation (`model=smollm2`, `algo=drgrpo`,
`task=arithmetic_unpadded`) extends that implementation's schema; it is not a row.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from rlharness.config import schema as s
from rlharness.config.schema import ConfigError


@dataclass(frozen=True)
class Impl:
    schema: type  # its defaults and validation
    target: str | None = None  # "module:attribute" that builds it from its config; None: chosen by type only


GROUPS: dict[str, dict[str, Impl]] = {
    "strategy": {"sync": Impl(s.SyncStrategyConf, "rlharness.producer.strategies:SyncProduceStrategy"),
                 "async": Impl(s.AsyncStrategyConf, "rlharness.producer.strategies:AsyncProduceStrategy")},
    "sampler": {"default": Impl(s.SamplerConf)},
    "agent": {"single_turn": Impl(s.SingleTurnAgentConf, "rlharness.agent.single_turn:SingleTurnAgentLoop"),
              "multi_turn_tool": Impl(s.MultiTurnToolAgentConf, "rlharness.agent.multi_turn_tool:MultiTurnToolAgentLoop"),
              "openai_gateway": Impl(s.OpenAIGatewayAgentConf, "rlharness.agent.openai_gateway:GatewayAgentLoop")},
    "judger": {"auto": Impl(s.AutoJudgerConf),  # the task's own judger (config/tasks.py)
               "math": Impl(s.MathJudgerConf, "rlharness.judger.math:MathJudger"),
               "countdown": Impl(s.CountdownJudgerConf, "rlharness.judger.countdown:CountdownJudger"),
               "format": Impl(s.FormatJudgerConf, "rlharness.judger.format:FormatJudger"),
               "reasoning_gym": Impl(s.ReasoningGymJudgerConf, "rlharness.judger.reasoning_gym:ReasoningGymJudger"),
               "router": Impl(s.RouterJudgerConf, "rlharness.judger.router:RouterJudger"),
               "remote": Impl(s.RemoteJudgerConf, "rlharness.judger.remote:RemoteJudger"),
               "reward_model": Impl(s.RewardModelJudgerConf, "rlharness.judger.reward_model:RewardModelJudger"),
               "llm": Impl(s.LLMJudgerConf, "rlharness.judger.llm:LLMJudger")},
    "model": {"default": Impl(s.ModelConf)},
    "engine": {"hf": Impl(s.HFEngineConf, "rlharness.engine.hf:HFEngine"),
               "vllm": Impl(s.VLLMEngineConf, "rlharness.engine.vllm:VLLMEngine"),
               "sim": Impl(s.SimEngineConf, "rlharness.engine.sim:SimEngine.for_model")},
    # The learner over each model runner; deepspeed's and fsdp2's ranks run as Ray actors
    # (rlharness.distributed.train_actor.start_ranked_backend), each built with its rank.
    "backend": {"torch": Impl(s.TorchBackendConf, "rlharness.backend.learner:Learner"),
                "deepspeed": Impl(s.DeepSpeedBackendConf, "rlharness.backend.deepspeed_runner:deepspeed_learner"),
                "fsdp2": Impl(s.FSDP2BackendConf, "rlharness.backend.fsdp2_runner:fsdp2_learner"),
                "sim": Impl(s.SimBackendConf, "rlharness.backend.sim:SimBackend")},
    "algo": {"default": Impl(s.AlgoConf)},
    "task": {"arithmetic": Impl(s.ArithmeticTaskConf, "rlharness.data.arithmetic:make_arithmetic_task"),
             "countdown": Impl(s.CountdownTaskConf, "rlharness.data.countdown:make_countdown_task"),
             "jsonl": Impl(s.JsonlTaskConf, "rlharness.data.jsonl:load_jsonl_task"),
             "reasoning_gym": Impl(s.ReasoningGymTaskConf, "rlharness.data.reasoning_gym:make_reasoning_gym_task")},
    "cluster": {"local": Impl(s.LocalClusterConf), "local_ray": Impl(s.LocalRayClusterConf),
                "slurm": Impl(s.SlurmClusterConf)},
    "logger": {"wandb": Impl(s.WandbLoggerConf), "none": Impl(s.NoneLoggerConf)},
}


def names(group: str) -> tuple[str, ...]:
    return tuple(GROUPS[group])


def schema_of(group: str, name: str) -> type:
    return _impl(group, name).schema


def _impl(group: str, name: str) -> Impl:
    impl = GROUPS[group].get(name)
    if impl is None:
        raise ConfigError(f"{group}.name={name!r} is not allowed: expected one of {', '.join(GROUPS[group])}")
    return impl


def resolve(target: str) -> Callable[..., Any]:
    """The callable a "module:attribute.attribute" names (imported now)."""
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def build(group: str, conf: Any, *args: Any, **kwargs: Any) -> Any:
    """The implementation `conf.name` of `group`, built from `conf` (and what that group's builders take)."""
    impl = _impl(group, conf.name)
    if impl.target is None:
        raise ConfigError(f"{group}={conf.name} is not built here")
    return resolve(impl.target)(conf, *args, **kwargs)
