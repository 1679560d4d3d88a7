"""Judgers turn a response into `reward["score"]`.

A rule judger implements `score(response_text, label) -> dict` (pure, synchronous,
with "score" among the keys). `judge_group` scores a whole group; a judger that
raises or times out marks the group FAILED (the run goes on and counts it).

Where the scoring runs:
- `score_inline(response_text, label)` is tried first, on the event loop: a judger
  whose scoring is cheap and cannot block (a rule over a bounded string, microseconds)
  returns the reward there, so judging costs no thread round trip per group (the
  producer's overhead benchmark). It returns None when the answer needs the slow
  path (the math judger's math-verify fallback, any I/O): the default, so a judger
  is inline only when it says so.
- Members scored None go to a worker thread (`asyncio.to_thread`) under the
  `timeout_s` budget: only scoring that can take long needs the timeout.
An exception from either path fails the group, with the judger and the error as reason.
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
    # Label fields `score` reads: a task whose rows lack one cannot be scored by this judger
    # (refused before a run starts).
    label_keys: tuple[str, ...] = ()

    @abc.abstractmethod
    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        """Return at least {"score": float}."""

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        """The reward if it is cheap to compute here (microseconds, no I/O, cannot hang), else None.

        Runs on the event loop; must agree with `score` whenever it answers."""
        return None

    async def judge_group(self, group: Group, timeout_s: float) -> Group:
        """Fill `reward` for every member; FAILED on error or timeout."""
        try:
            rewards = [self.score_inline(s.response_text, s.label) for s in group]
        except Exception as exc:  # noqa: BLE001 - any judger error fails the group, not the run
            return self._fail(group, f"{type(exc).__name__}: {exc}")
        slow = [i for i, r in enumerate(rewards) if r is None]
        if slow:
            def _run() -> list[dict[str, float]]:
                return [self.score(group[i].response_text, group[i].label) for i in slow]

            try:
                scored = await asyncio.wait_for(asyncio.to_thread(_run), timeout=timeout_s)
            except Exception as exc:  # noqa: BLE001 - any judger error fails the group, not the run
                reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
                return self._fail(group, reason)
            for i, r in zip(slow, scored):
                rewards[i] = r
        for s, r in zip(group, rewards):
            if "score" not in r:  # type: ignore[operator]
                raise KeyError(f"judger {self.name} returned no 'score' key: {r}")
            # Plain floats in a dict of the sample's own; the usual {"score": float} is kept as returned.
            s.reward = r if len(r) == 1 and type(r["score"]) is float else {k: float(v) for k, v in r.items()}  # type: ignore
        return group

    def _fail(self, group: Group, reason: str) -> Group:
        log.warning("judger %s failed on group %s: %s", self.name, group[0].group_id, reason)
        for s in group:
            s.status = Status.FAILED
            s.extra["fail_reason"] = f"judger {self.name}: {reason}"
        return group
