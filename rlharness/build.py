"""Assemble the components of a run from `RunConf`: the one place that reads all of it.

Every component gets only its own sub-config (plus a few scalars); this module is
where they are handed out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable

from rlharness.config.schema import RunConf

log = logging.getLogger(__name__)


@dataclass
class Components:
    tokenizer: Any
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    task_data: Any
    judger: Any
    engine: Any
    manager: Any
    backend: Any
    evaluator: Any


def text_codec(tokenizer) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    bos = tokenizer.bos_token

    def encode(text: str) -> list[int]:
        # Chat templates already start with BOS; don't add a second one.
        return tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)))

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    return encode, decode


def validate_data(conf: RunConf, task_data) -> None:
    """Refuse, before anything starts, data the run cannot use (names the values)."""
    from rlharness.config.schema import ConfigError

    n = len(task_data.train)
    if n == 0:
        raise ConfigError(f"task={conf.task.name}: the training split is empty")
    if not task_data.eval:
        raise ConfigError(f"task={conf.task.name}: the eval split is empty")
    if not conf.sampler.allow_epoch_rollover and conf.batch_size * conf.total_steps > n:
        raise ConfigError(
            f"batch_size={conf.batch_size} x total_steps={conf.total_steps} needs "
            f"{conf.batch_size * conf.total_steps} prompts but task={conf.task.name} has {n} and "
            f"sampler.allow_epoch_rollover=false"
        )


def build_engine_for(conf: RunConf, tokenizer, decode):
    from rlharness.engine import build_engine

    if conf.engine.name == "sim":
        return build_engine(conf.engine, conf.model, conf.seed, vocab_size=len(tokenizer),
                            eos_token_id=tokenizer.eos_token_id, decode=decode)
    return build_engine(conf.engine, conf.model, conf.seed)


def build_components(conf: RunConf, engine=None, backend=None) -> Components:
    """Build everything; `engine`/`backend` may be passed in (e.g. Ray actor proxies)."""
    from rlharness.agent import build_agent_loop
    from rlharness.backend import build_backend
    from rlharness.data import build_task
    from rlharness.evaluator import Evaluator
    from rlharness.judger import build_judger
    from rlharness.model import load_tokenizer
    from rlharness.producer.manager import AgentLoopManager
    from rlharness.producer.strategies import build_strategy
    from rlharness.replay_buffer import ReplayBuffer
    from rlharness.sampler import Sampler

    tokenizer = load_tokenizer(conf.model)
    encode, decode = text_codec(tokenizer)
    task_data = build_task(conf.task, tokenizer)
    validate_data(conf, task_data)
    judger_conf = conf.judger
    if judger_conf.name == "auto":
        from rlharness.config.store import SCHEMAS

        judger_conf = SCHEMAS["judger"][conf.task.default_judger]()
    judger = build_judger(judger_conf)
    if engine is None:
        engine = build_engine_for(conf, tokenizer, decode)
    if backend is None:
        backend = build_backend(conf.backend, conf.model, conf.algo, conf.total_steps, conf.seed)

    replay_buffer = ReplayBuffer(max_staleness=conf.max_staleness, sync_weights_interval=conf.sync_weights_interval)
    sampler = Sampler(conf.sampler, task_data.name, task_data.train, encode, replay_buffer, conf.seed)
    # Text the agent loop inserts mid-response (tool output) must not get a BOS of its own.
    def agent_loop_with(temperature: float | None = None, max_tokens: int | None = None):
        sampling = conf.agent.sampling
        if temperature is not None:
            sampling = replace(sampling, temperature=temperature, max_tokens=max_tokens or sampling.max_tokens)
        return build_agent_loop(replace(conf.agent, sampling=sampling), engine, judger, decode,
                                encode=lambda text: tokenizer.encode(text, add_special_tokens=False))

    agent_loop = agent_loop_with()
    manager = AgentLoopManager(
        tasks={task_data.name: (sampler, agent_loop)},
        strategy=build_strategy(conf.strategy),
        replay_buffer=replay_buffer,
        batch_size=conf.batch_size,
        max_staleness=conf.max_staleness,
        sync_weights_interval=conf.sync_weights_interval,
    )
    eval_tokens = conf.eval.max_tokens or conf.agent.sampling.max_tokens
    evaluator = Evaluator(
        conf.eval, task_data.name, task_data.eval, encode,
        greedy_loop=agent_loop_with(temperature=0.0, max_tokens=eval_tokens),
        sampled_loop=agent_loop_with(conf.eval.temperature, eval_tokens) if conf.eval.pass_k > 1 else None,
        seed=conf.seed)
    return Components(tokenizer, encode, decode, task_data, judger, engine, manager, backend, evaluator)
