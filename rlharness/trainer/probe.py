"""Worst case first (`trainer.probe_longest`): before any training data is consumed, train one
micro-batch of the longest sample the run can see, so that an out-of-memory happens at start with a
message naming the settings to lower, not hours in.

The longest sample: the longest training prompt of any task (its data is loaded and checked against
`task.max_prompt_tokens` already; found without tokenizing every prompt: rows longest in bytes first,
until no shorter row can hold more tokens) plus that task's response budget. The micro-batch: as many
such rows as one micro-batch may hold (`algo.micro_batch_size`, or what `backend.micro_batch_tokens`
fits, at most a rank's share of a mini-batch). The backend trains it and undoes it
(rlharness/backend/probe.py). On by default for real models (`PROBE_AUTO_MIN_PARAMS` parameters or
more), off for the embedded tiny ones; `trainer.probe_longest=true|false` decides.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

from rlharness.config.run import RunConf
from rlharness.config.schema import ConfigError
from rlharness.data.prompt_length import longest_prompt_tokens
from rlharness.trainer.memory_estimate import model_shape

log = logging.getLogger(__name__)

PROBE_AUTO_MIN_PARAMS = 10_000_000


def probe_on(conf: RunConf) -> bool:
    """`trainer.probe_longest`, or (null) whether the model is a real one: PROBE_AUTO_MIN_PARAMS or more."""
    if conf.trainer.probe_longest is not None:
        return conf.trainer.probe_longest
    shape = model_shape(conf.model.path)
    return shape is not None and shape.parameters >= PROBE_AUTO_MIN_PARAMS


def probe_shape(conf: RunConf, task_data: dict[str, Any], encode: Callable[[str], list[int]]) -> tuple[int, int, int]:
    """(rows, prompt tokens, response tokens) of the micro-batch to probe (module docstring)."""
    prompt, response = 0, 0
    for name, entry in conf.task_entries().items():
        p, r = longest_prompt_tokens(task_data[name].train, encode), conf.sampling_for(entry).max_tokens
        if p + r > prompt + response:
            prompt, response = p, r
    return longest_micro_batch_rows(conf, prompt + response), prompt, response


def longest_micro_batch_rows(conf: RunConf, longest: int) -> int:
    """Rows of the largest micro-batch of samples `longest` tokens long: `algo.micro_batch_size`, or what
    `backend.micro_batch_tokens` holds, at most one rank's share of a mini-batch."""
    samples = conf.batch_size * conf.sampler.prompt_repeat_k
    per_rank = math.ceil(math.ceil(samples / conf.algo.mini_batches) / conf.backend.workers)
    budget = getattr(conf.backend, "micro_batch_tokens", None)
    rows = conf.algo.micro_batch_size if budget is None else max(1, budget // longest)
    return min(rows, per_rank)


def oom_message(rows: int, prompt: int, response: int, error: str, conf: RunConf) -> str:
    lower = ("algo.micro_batch_size" if getattr(conf.backend, "micro_batch_tokens", None) is None
             else "backend.micro_batch_tokens")
    return (f"trainer.probe_longest: one training micro-batch of the longest sample this config allows ({rows} rows x "
            f"{prompt + response} tokens: the longest prompt, {prompt} tokens, + agent.sampling.max_tokens="
            f"{response}) does not fit in memory ({error}); lower {lower}, agent.sampling.max_tokens or "
            f"task.max_prompt_tokens, or set backend.gradient_checkpointing=true (trainer.probe_longest=false "
            f"skips this check)")


async def probe_longest(conf: RunConf, backend, task_data: dict[str, Any], encode) -> dict[str, float]:
    """Run the probe; its metrics for the step-0 row. Out of memory: ConfigError (nothing was trained)."""
    rows, prompt, response = probe_shape(conf, task_data, encode)
    result = await backend.probe_longest(rows, prompt, response)
    if result is None:
        log.info("trainer.probe_longest: backend=%s does not run the probe; skipped", conf.backend.name)
        return {}
    if "oom" in result:
        raise ConfigError(oom_message(rows, prompt, response, result["oom"], conf))
    log.info("trainer.probe_longest: trained once on %d rows x %d tokens (prompt %d + response %d) in %.2fs, peak "
             "memory %.0f MB; nothing kept", rows, prompt + response, prompt, response, result["perf/probe_s"],
             result["probe/peak_mb"])
    return {**result, "probe/rows": float(rows), "probe/tokens": float(prompt + response)}
