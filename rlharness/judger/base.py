"""Judgers turn a response into `reward["score"]`.

A rule judger implements `score(response_text, label) -> dict` (pure, synchronous,
with "score" among the keys). `judge_group` scores a whole group; a judger that
raises or runs past its limits marks the group FAILED (the run goes on and counts it).

Where the scoring runs:
- `score_inline(response_text, label)` is tried first, on the event loop: a judger
  whose scoring is cheap and cannot block (a rule over a bounded string, microseconds)
  returns the reward there, so judging costs no round trip per group (the producer's
  overhead benchmark). It returns None when the answer needs the slow path (the math
  judger's math-verify fallback, any I/O): the default, so a judger is inline only
  when it says so.
- Members scored None go to `score_slow`: for a rule judger (conf a `RuleJudgerConf`)
  each member is scored in a judging process (`rlharness.judger.pool`) that is killed
  and replaced past `timeout_s`, so one pathological answer costs at most its timeout
  and never blocks the trainer's interpreter; the member then fails for a reason that is
  not the policy's (`judger.on_timeout=fail`: `algo.failed_member_policy` decides, see
  rlharness/core/member_failures.py) or scores 0 (`on_timeout=zero`). The remote judger
  overrides `score_slow` (HTTP, concurrent). A judger without a rule conf (a test's or a user's own) scores in a
  worker thread under the same timeout.
An exception from any path fails the group, with the judger and the error as reason.

`stats()` holds cumulative counts (groups failed, timeouts, processes replaced, HTTP
requests and retries); the trainer logs their per-step differences as `judge/<name>`.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
import threading
from collections import Counter
from typing import Any

from rlharness.core.member_failures import mark_infra_failure
from rlharness.core.types import Group, RolloutState

log = logging.getLogger(__name__)

# Attributes that live only in the trainer's process (never pickled into a judging process).
_RUNTIME_ATTRS = ("_pool", "_pool_lock", "_counts", "_http")


class Judger(abc.ABC):
    name: str = "judger"
    # Label fields `score` reads: a task whose rows lack one cannot be scored by this judger
    # (refused before a run starts).
    label_keys: tuple[str, ...] = ()
    conf: Any = None

    @abc.abstractmethod
    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        """Return at least {"score": float}."""

    def extract_answer(self, response_text: str) -> str | None:
        """The final answer this judger reads from a response, for people reading eval completions
        (None: the judger scores the whole response, or extracts nothing)."""
        return None

    def check_sample(self, prompt_text: str, label: dict[str, Any], timeout_s: float, key: str, where: str) -> None:
        """Refuse (ConfigError naming `key`) before the run starts what would fail every group: a judger
        whose own code the config writes (an llm judge's template) tries it on one of the task's rows."""

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        """The reward if it is cheap to compute here (microseconds, no I/O, cannot hang), else None.

        Runs on the event loop; must agree with `score` whenever it answers."""
        return None

    # ------------------------------------------------------------------ counts
    @property
    def counts(self) -> Counter:
        c = self.__dict__.get("_counts")
        if c is None:
            c = self.__dict__["_counts"] = Counter()
        return c

    # The counts `stats` reports (always all of them, zeros included).
    count_keys: tuple[str, ...] = ("groups_failed", "timeouts", "memory_or_crash", "scored_zero_on_timeout",
                                   "processes_replaced", "rewards_out_of_range")

    def stats(self) -> dict[str, float]:
        """Cumulative counts since the judger was built (never reset)."""
        counts = self.counts
        pool = self.__dict__.get("_pool")
        counts["processes_replaced"] = counts["processes_replaced_closed"] + (pool.workers_replaced if pool else 0)
        return {k: float(counts[k]) for k in self.count_keys}

    # ------------------------------------------------------------------ judging
    async def judge_group(self, group: Group, timeout_s: float) -> Group:
        """Fill `reward` for every member; FAILED on error or when a member runs past its limits."""
        try:
            rewards = [self.score_inline(s.response_text, s.label) for s in group]
        except Exception as exc:  # noqa: BLE001 - any judger error fails the group, not the run
            return self._fail(group, f"{type(exc).__name__}: {exc}")
        slow = [i for i, r in enumerate(rewards) if r is None]
        if slow:
            try:
                scored = await self.score_slow([group.samples[i] for i in slow], timeout_s)
            except Exception as exc:  # noqa: BLE001 - any judger error fails the group, not the run
                return self._fail(group, _reason(exc))
            for i, r in zip(slow, scored):
                rewards[i] = r
        for r in rewards:
            if "score" not in r:  # type: ignore[operator]
                raise KeyError(f"judger {self.name} returned no 'score' key: {r}")
        bad = next((reason for r in rewards if (reason := reward_out_of_range(r)) is not None), None)
        if bad is not None:  # a NaN or float32-overflowing reward would poison the step's loss
            self.counts["rewards_out_of_range"] += 1
            return self._fail(group, bad)
        for s, r in zip(group, rewards):
            # Plain floats in a dict of the sample's own; the usual {"score": float} is kept as returned.
            s.reward = r if len(r) == 1 and type(r["score"]) is float else {k: float(v) for k, v in r.items()}  # type: ignore
        return group

    async def score_slow(self, members: list[RolloutState], timeout_s: float) -> list[dict[str, float]]:
        """Score `members` (those `score_inline` left), each within `timeout_s`; raises to fail the group.

        The members run concurrently; the first failure cancels the rest (the group fails anyway)."""
        from rlharness.judger.pool import JudgeLimitExceeded

        on_timeout = getattr(self.conf, "on_timeout", "fail")

        async def one(s: RolloutState) -> dict[str, float]:
            try:
                return await self._score_one(s.response_text, s.label, timeout_s)
            except (JudgeLimitExceeded, asyncio.TimeoutError) as exc:
                self.counts["timeouts" if getattr(exc, "kind", "timeout") == "timeout" else "memory_or_crash"] += 1
                if on_timeout != "zero":  # fail: not the policy's fault; algo.failed_member_policy decides
                    log.warning("judger %s: %s on a response of group %s; the member failed (not the policy's "
                                "fault)", self.name, _reason(exc), s.group_id)
                    mark_infra_failure(s, f"judger {self.name}: {_reason(exc)}")
                    return {"score": 0.0}  # never read: the member is masked, zeroed or its group dropped
                log.warning("judger %s: %s on a response of group %s; scored 0 (judger.on_timeout=zero)",
                            self.name, _reason(exc), s.group_id)
                self.counts["scored_zero_on_timeout"] += 1
                s.judge_limit = _reason(exc)
                return {"score": 0.0}

        return await gather_fail_fast([one(s) for s in members])

    async def _score_one(self, response_text: str, label: dict[str, Any], timeout_s: float) -> dict[str, float]:
        pool = await self._judge_pool()
        if pool is None:  # not a rule judger: a worker thread (cannot be killed, only abandoned)
            return await asyncio.wait_for(asyncio.to_thread(self.score, response_text, label), timeout=timeout_s)
        return await pool.score(response_text, label, timeout_s)

    async def _judge_pool(self):
        """The judging processes of a rule judger, started on first use (off the event loop)."""
        from rlharness.config.schema import RuleJudgerConf

        if not isinstance(self.conf, RuleJudgerConf):
            return self.__dict__.get("_pool")
        return await self._started("_pool", self._new_pool)

    def _new_pool(self):
        from rlharness.judger.pool import JudgePool

        pool = JudgePool(self, self.conf.num_workers, self.conf.worker_memory_mb)
        pool.start()
        log.info("judger %s: %d judging process(es) started", self.name, self.conf.num_workers)
        return pool

    async def _started(self, key: str, start):
        """What `start()` builds (processes, a model, an engine), built once and kept under `key`.

        Built off the event loop (it takes seconds); a lock (`<key>_lock`) makes concurrent first
        calls build it once. `close` pops both keys."""
        held = self.__dict__.get(key)
        if held is None:
            held = await asyncio.to_thread(self._start_once, key, start)
        return held

    def _start_once(self, key: str, start):
        with self.__dict__.setdefault(f"{key}_lock", threading.Lock()):
            held = self.__dict__.get(key)
            if held is None:
                held = self.__dict__[key] = start()
            return held

    async def close(self) -> None:
        """Stop the judging processes (and anything else the judger holds)."""
        pool = self.__dict__.pop("_pool", None)
        self.__dict__.pop("_pool_lock", None)
        if pool is not None:
            self.counts["processes_replaced_closed"] += pool.workers_replaced
            await asyncio.to_thread(pool.close)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _RUNTIME_ATTRS}

    def _fail(self, group: Group, reason: str) -> Group:
        log.warning("judger %s failed on group %s: %s", self.name, group.group_id, reason)
        self.counts["groups_failed"] += 1
        return group.mark_failed(f"judger {self.name}: {reason}")


async def gather_fail_fast(coros: list) -> list:
    """Results of `coros` run concurrently; the first exception cancels the others and is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    for t in tasks:
        # A task cancelled below can still end with its own exception (Python 3.11's wait_for returns the
        # inner result when the cancel arrives as the inner task finishes: a refused judge reply arriving
        # for every member at once). Retrieve it whenever it ends, else asyncio logs "Task exception was
        # never retrieved" with a traceback for each.
        t.add_done_callback(_retrieve)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
    # Every finished task's exception is retrieved (asyncio would log the others as never retrieved).
    errors = [t.exception() for t in tasks if t.done() and not t.cancelled()]
    for exc in errors:
        if exc is not None:
            raise exc
    return [t.result() for t in tasks]


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


# Rewards become float32 tensors (advantages, loss): anything beyond float32's range is inf there.
FLOAT32_MAX = 3.4028234663852886e38


def reward_out_of_range(reward: dict[str, Any]) -> str | None:
    """Why a judger's reward cannot be trained on (a value not a finite number in float32 range), or None."""
    for key, value in reward.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            return f"reward[{key!r}]={value!r} is not a number"
        if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
            return (f"reward[{key!r}]={number!r} is not allowed: expected a finite number within float32 range "
                    f"(|x| <= {FLOAT32_MAX:.4g})")
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError) and not str(exc):
        return "timeout"
    return f"{type(exc).__name__}: {exc}"
