"""AgentLoop: turns one group (prompt copies, maybe with partial responses) into responses.

`generate_group` works on its input group in place and returns it (no copy of every
member of every group: the producer's overhead benchmark); the producer keeps what
it needs to put the group back as it was started when a task is cancelled or crashes
(`producer.pending.Started`). Members that already finished (a continued group)
keep their result. `pause()` aborts every engine request in flight; those members
come back ABORTED with the tokens generated so far.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Awaitable, Callable, Iterable, TypeVar

from rlharness.config.schema import AgentConf
from rlharness.engine.base import RolloutEngine, SamplingParams
from rlharness.judger.base import Judger
from rlharness.core.types import Group

log = logging.getLogger(__name__)

T = TypeVar("T")


async def gather_or_cancel(aws: Iterable[Awaitable[T]]) -> list[T]:
    """Like `asyncio.gather`, but when one fails (or this is cancelled) the others are
    cancelled and awaited before the error propagates.

    Members of a group write into their states in place: a sibling left running after a
    crash would keep appending tokens to a group the producer has already restored and
    returned to the buffer.
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class AgentLoop(abc.ABC):
    def __init__(self, conf: AgentConf, engine: RolloutEngine, judger: Judger,
                 decode: Callable[[list[int]], str], encode: Callable[[str], list[int]] | None = None,
                 tokenizer=None) -> None:
        """`encode` (text -> ids, no special tokens added) is for loops that insert text; `tokenizer`
        (its chat template) for loops that render messages. Every loop takes the same arguments."""
        self.conf = conf
        self.engine = engine
        self.judger = judger
        self.decode = decode
        # Tokens thrown away when an interrupted group restarts from scratch (partial rollout off).
        self.tokens_discarded = 0
        # The stop strings of every request, one list shared by all of them (engines only read it).
        self.stop_strings: list[str] = list(conf.sampling.stop)
        self._params_by_max_tokens: dict[int, SamplingParams] = {}

    @abc.abstractmethod
    async def generate_group(self, group: Group, enable_partial_rollout: bool) -> Group:
        """Generate `group`'s responses in place and return it (COMPLETED/ABORTED/FAILED members)."""

    async def pause(self) -> None:
        await self.engine.abort_all()

    async def close(self) -> None:
        """Release what the loop holds beyond the engine (the gateway's server and agent processes)."""

    async def judge_or_fail(self, group: Group) -> Group:
        """The judger's rewards; a judger that raises fails the group (with the reason), not the run."""
        try:
            return await self.judger.judge_group(group, self.conf.judge_timeout_s)
        except Exception as exc:  # noqa: BLE001 - a broken judger fails the group, not the run
            log.warning("judging group %s raised %r; group FAILED", group.group_id, exc)
            return group.mark_failed(f"judger {self.judger.name}: {type(exc).__name__}: {exc}")

    def step_metrics(self, groups: list[Group]) -> dict[str, float]:
        """Metrics of this loop for one training step's batch (`groups`: this task's groups)."""
        return {}

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The (read-only, shared) sampling settings of a request for `max_tokens` more tokens:
        built once per budget, not per request (the seed travels on the request)."""
        params = self._params_by_max_tokens.get(max_tokens)
        if params is None:
            sc = self.conf.sampling
            params = self._params_by_max_tokens[max_tokens] = SamplingParams(
                temperature=sc.temperature, top_p=sc.top_p, top_k=sc.top_k, max_tokens=max_tokens,
                stop=self.stop_strings, greedy=False)
        return params


async def close_agent_loops(loops: list[AgentLoop]) -> None:
    """Close each loop once (a task's training and eval loops may be one object), in the event loop that ran
    them (the gateway's server and agent processes belong to it)."""
    seen: set[int] = set()
    for loop in loops:
        if id(loop) not in seen:
            seen.add(id(loop))
            try:
                await loop.close()
            except Exception:  # noqa: BLE001 - the run's end goes on (its checkpoint is written)
                log.exception("closing agent loop %s failed", type(loop).__name__)
