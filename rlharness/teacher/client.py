"""A teacher as the producer sees it: `await teacher.score_or_fail(group)` fills each member's
`teacher_logprobs` (the teacher's log-prob of every response token), as soon as the group is
generated and judged, while the rest of the batch is still being produced (or, disaggregated,
while the trainer trains).

Where the forward passes run (`TeacherModel`, rlharness/teacher/model.py):
- colocated: in this process (the driver's), on a worker thread, so the event loop keeps serving
  the engines; `algo.teacher.device` may put it on a device of its own;
- mode=disagg: a Ray actor in a placement group of its own (`algo.teacher.num_cpus`, one GPU when
  the device is cuda), as the reward model (rlharness/judger/reward_model.py).

One call at a time; the groups that finish meanwhile go together in the next call, up to
`batch_rows` rows (rlharness/core/coalesce.py). A call past `timeout_s`, or one that raises,
fails its groups (FAILED, with the reason: counted and re-sampled, the run goes on).
"""

from __future__ import annotations

import asyncio
import logging
import time

from rlharness.config.schema import TeacherConf
from rlharness.core.coalesce import Coalescing
from rlharness.core.types import Group

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0  # loading the teacher in its actor (a big one from a slow disk)


class _LocalTeacher:
    """The model in this process; forward passes on a worker thread."""

    def __init__(self, conf: TeacherConf):
        from rlharness.teacher.model import TeacherModel

        self.model = TeacherModel(conf)

    async def logprobs(self, rows, temperature: float) -> list[list[float]]:
        return await asyncio.to_thread(self.model.logprobs, rows, temperature)

    def close(self) -> None:
        self.model = None


class _RayTeacher:
    """The model as a Ray actor with its own placement group (mode=disagg)."""

    def __init__(self, conf: TeacherConf):
        from rlharness.cluster.placement import start_side_actor
        from rlharness.teacher.model import TeacherModel

        self.actor, self.placement_group = start_side_actor(TeacherModel, "teacher", conf.num_cpus, conf.device,
                                                            conf.torch_threads, START_TIMEOUT_S, conf,
                                                            conf.torch_threads)

    async def logprobs(self, rows, temperature: float) -> list[list[float]]:
        return await asyncio.wrap_future(self.actor.logprobs.remote(rows, temperature).future())

    def close(self) -> None:
        from rlharness.cluster.placement import stop_side_actor

        stop_side_actor(self.actor, self.placement_group)


class Teacher:
    """One teacher (a folder, dtype and device), shared by every task it scores for."""

    def __init__(self, conf: TeacherConf, temperature: float, on_ray: bool):
        """`temperature`: the rollouts' (the student's log-probs are taken at it; greedy rollouts at 1)."""
        self.conf = conf
        self.temperature = temperature if temperature > 0 else 1.0
        self._model = _RayTeacher(conf) if on_ray else _LocalTeacher(conf)
        self.where = "Ray actor" if on_ray else f"this process ({conf.device})"
        self._calls = Coalescing(self._send, conf.batch_rows)
        self.busy_s = 0.0  # seconds its calls took (one runs at a time), cumulative

    async def _send(self, rows, timeout_s: float) -> list[list[float]]:
        t0 = time.monotonic()
        try:
            return await asyncio.wait_for(self._model.logprobs(rows, self.temperature), timeout_s)
        finally:
            self.busy_s += time.monotonic() - t0

    async def score(self, group: Group) -> None:
        """Each member's `teacher_logprobs`: one per response token."""
        rows = [(s.prompt_ids + s.response_ids, len(s.prompt_ids)) for s in group]
        scores = await self._calls.call(rows, self.conf.timeout_s)
        for s, lp in zip(group, scores):
            s.teacher_logprobs = lp

    async def score_or_fail(self, group: Group) -> Group:
        """`score`; a teacher that raises or times out fails the group (with the reason), not the run."""
        try:
            await self.score(group)
        except Exception as exc:  # noqa: BLE001 - a failing teacher fails the group, not the run
            what = "timed out" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
            log.warning("teacher %s on group %s: %s; group FAILED", self.conf.path, group.group_id, what)
            group.mark_failed(f"teacher {self.conf.path}: {what}")
        return group

    def close(self) -> None:
        self._model.close()
