"""The rollout engine interface every backend (hf, vllm, sim) implements.

An engine serves many concurrent `generate` calls (continuous batching is its own
business), can abort everything in flight (each aborted call returns the tokens it
produced so far with finish_reason "abort"), and swaps weights between requests,
stamping every token with the weight version that produced it.

Weights arrive by `load_weights(state, version)` (this process holds them) or, when the
run formed a broadcast group with training rank 0 (`rlharness.weights.transfer`), by
`join_weight_group` once and `receive_weights(version)` per sync. The default joins this
process and loads what it receives (hf, sim); an engine whose workers live elsewhere
(vllm) has them join and receive instead.

`generate_many(requests)` serves several requests (one group's members) in one call;
the default gathers `generate`, and an engine that can take a batch at once overrides
it so a group costs one future instead of a task per member. Its contract is that of
`generate` per request: results in request order, and an abort returns each request's
partial tokens with finish_reason "abort".
"""

from __future__ import annotations

import abc
import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

import torch

from rlharness.weights.transfer import WeightGroupMember


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)  # stop strings, matched on decoded text (read-only: shared)
    greedy: bool = False  # argmax; logprobs are still those of the (temperature-1) distribution


_request_ids = itertools.count()


def new_request_id() -> str:
    """An id for an engine request, unique in this process (cheaper than a random uid: one per request)."""
    return str(next(_request_ids))


@dataclass(slots=True)
class GenerateRequest:
    request_id: str
    prompt_ids: list[int]  # for a continuation: prompt + the partial response so far; engines only read it
    sampling: SamplingParams  # read-only: requests with the same settings share one
    # Per-request seed: a request's samples then depend on it alone, not on which other
    # requests share its batch, so runs (and resumed runs) are reproducible. None = engine RNG.
    seed: int | None = None


@dataclass(slots=True)
class GenerateResult:
    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    model_steps: list[int]  # weight version that produced each token
    finish_reason: str  # "stop" | "length" | "abort"
    text: str = ""  # decoded token_ids (engines with a tokenizer fill it)


class RolloutEngine(abc.ABC):
    """Async interface; local engines and Ray actor proxies look the same to callers."""

    supports_abort: bool = True
    weight_group_ranks: int = 1  # ranks this engine takes in a weight group (one per process that loads)
    _weight_member: WeightGroupMember | None = None

    @property
    @abc.abstractmethod
    def version(self) -> int: ...

    @abc.abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    async def generate_many(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """`generate` for each request, concurrently; results in the order of `requests`."""
        if len(requests) == 1:
            return [await self.generate(requests[0])]
        return list(await asyncio.gather(*(self.generate(r) for r in requests)))

    @abc.abstractmethod
    async def abort_all(self) -> int:
        """Abort every in-flight request; each returns its partial tokens. Returns how many."""

    @abc.abstractmethod
    async def load_weights(self, state: dict[str, Any], version: int) -> None:
        """Swap weights between requests (no request sees a mix) and set `version`."""

    async def join_weight_group(self, backend: str, host: str, port: int, rank: int, world_size: int,
                                timeout_s: float) -> None:
        """Join training rank 0's weight broadcast group as rank `rank` (in a thread: blocking rendezvous)."""
        self._weight_member = await asyncio.to_thread(WeightGroupMember, backend, host, port, rank, world_size,
                                                      timeout_s)

    async def receive_weights(self, version: int) -> None:
        """Receive `version` by broadcast (in a thread: the loop keeps serving), then load it."""
        if self._weight_member is None:
            raise RuntimeError(f"{type(self).__name__}: receive_weights before join_weight_group")
        state = await asyncio.to_thread(self._weight_member.receive, version)
        await self.load_weights(state, version)

    async def sleep(self) -> None:  # noqa: B027 - optional hook
        """Free the accelerator for training (engine=vllm with sleep_mode); the next request or
        weight load wakes it. Others: nothing to do."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def stats(self) -> dict[str, float]:
        """Counters for metrics: busy time, tokens generated... (engine-specific)."""
        return {}

    def weight_checksums(self) -> dict[str, torch.Tensor] | None:
        """Exact block checksums (`rlharness.weights.transfer.weight_checksums`) of the weights this engine
        computes with, where they live in this process (onpolicy_guard.py); None for engines elsewhere."""
        return None
