"""Callers that each send a few rows to one scorer: their rows go together, one call at a time.

Why: with a call per caller, many small groups in flight (8 groups of 4 rows, 16 rows a call)
cost 8 small forward passes, each a round trip to the scoring process, one after the other
(benchmarks/reward_model_coalescing.py). A call goes out at once when none is running (no added
wait); the callers that arrive meanwhile queue here and, when it ends, are packed in arrival
order into calls of at most `max_rows` rows (a caller with more goes alone; the scorer splits its
rows into passes). Used by the reward model (rlharness/judger/reward_model.py) and the
distillation teacher (rlharness/teacher/): a row's score does not depend on what it is batched
with (right padding: its tokens never attend to the padding; float rounding aside).

A packed call's limit is the smallest of its callers' timeouts, timed from when it is sent (as a
caller's own call was); its failure reaches every caller in it. A caller that stops waiting
(cancelled) before its call goes out is left out of it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Awaitable, Callable

# (rows, timeout_s) -> one result per row, in order.
Send = Callable[[list[Any], float], Awaitable[list[Any]]]


class Coalescing:
    def __init__(self, send: Send, max_rows: int, on_call: Callable[[], None] | None = None):
        self.send = send
        self.max_rows = max_rows
        self.on_call = on_call  # told of every call sent (a judger's scoring_calls count)
        self._waiting: deque[tuple[list[Any], float, asyncio.Future]] = deque()
        self._sender: asyncio.Task | None = None

    async def call(self, rows: list[Any], timeout_s: float) -> list[Any]:
        """One result per row of `rows`, from a call that may carry other callers' rows too."""
        answer = asyncio.get_running_loop().create_future()
        self._waiting.append((rows, timeout_s, answer))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_waiting())
        return await answer

    async def _send_waiting(self) -> None:
        try:
            while batch := self._next_call():
                if self.on_call is not None:
                    self.on_call()
                try:
                    results = await self.send([r for rows, _, _ in batch for r in rows],
                                              min(timeout_s for _, timeout_s, _ in batch))
                except asyncio.CancelledError:
                    for _, _, answer in batch:
                        answer.cancel()
                    raise
                except Exception as exc:  # noqa: BLE001 - each caller decides what a failure means
                    for _, _, answer in batch:
                        if not answer.done():
                            answer.set_exception(exc)
                    continue
                start = 0
                for rows, _, answer in batch:
                    if not answer.done():
                        answer.set_result(results[start: start + len(rows)])
                    start += len(rows)
        finally:  # left early (cancelled: the loop or the owner closing): nobody waits forever
            while self._waiting:
                self._waiting.popleft()[2].cancel()

    def _next_call(self) -> list[tuple[list[Any], float, asyncio.Future]]:
        """The waiting callers, in arrival order, whose rows fit in `max_rows` (at least one)."""
        batch: list[tuple[list[Any], float, asyncio.Future]] = []
        rows = 0
        while self._waiting:
            items, _, answer = self._waiting[0]
            if answer.done():  # it stopped waiting
                self._waiting.popleft()
                continue
            if batch and rows + len(items) > self.max_rows:
                break
            batch.append(self._waiting.popleft())
            rows += len(items)
        return batch
