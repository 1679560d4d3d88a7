"""Judgers turn a response into `reward["score"]`.

A rule judger implements `score(response_text, label) -> dict` (pure, synchronous,
with "score" among the keys). `judge_group` runs it for a whole group in a worker
thread under a timeout; a judger that raises or times out marks the group FAILED
(the run goes on and counts it).
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Any

from rlharness.types import Group, Status

log = logging.getLogger(__name__)


class Judger(abc.ABC):
    name: str = "judger"

    @abc.abstractmethod
    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        """Return at least {"score": float}."""

    async def judge_group(self, group: Group, timeout_s: float) -> Group:
        """Fill `reward` for every COMPLETED member; FAILED on error or timeout."""

        def _run() -> list[dict[str, float]]:
            return [self.score(s.response_text, s.label) for s in group]

        try:
            rewards = await asyncio.wait_for(asyncio.to_thread(_run), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - any judger error fails the group, not the run
            reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
            log.warning("judger %s failed on group %s: %s", self.name, group[0].group_id, reason)
            for s in group:
                s.status = Status.FAILED
                s.extra["fail_reason"] = f"judger {self.name}: {reason}"
            return group
        for s, r in zip(group, rewards):
            if "score" not in r:
                raise KeyError(f"judger {self.name} returned no 'score' key: {r}")
            s.reward = {k: float(v) for k, v in r.items()}
        return group
