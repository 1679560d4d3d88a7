"""Single-turn agent loop: one engine call per member, all members concurrently, then judge.

Partial rollout: a member interrupted by `pause()` comes back ABORTED with its
tokens, log-probs and versions so far; continuing it sends prompt + partial response
and asks only for the tokens still allowed, and only appends to what is there. With
partial rollout off, an interrupted group loses all its responses and restarts later.
"""

from __future__ import annotations

import asyncio
import logging

from rlharness.agent.base import AgentLoop
from rlharness.engine.base import GenerateRequest
from rlharness.types import Group, RolloutState, Status, new_uid

log = logging.getLogger(__name__)


class SingleTurnAgentLoop(AgentLoop):
    async def generate_group(self, group: Group, enable_partial_rollout: bool) -> Group:
        group = [s.clone() for s in group]
        todo = [s for s in group if s.status != Status.COMPLETED]
        if not enable_partial_rollout:
            for s in todo:
                self._discard(s)
        await asyncio.gather(*(self._generate_member(s) for s in todo))

        if any(s.status == Status.ABORTED for s in group):
            if not enable_partial_rollout:
                for s in group:  # the whole group restarts on newer weights
                    self._discard(s)
                    s.status = Status.ABORTED
            return group
        try:
            return await self.judger.judge_group(group, self.conf.judge_timeout_s)
        except Exception as exc:  # noqa: BLE001 - a broken judger fails the group, not the run
            log.warning("judging group %s raised %r; group FAILED", group[0].group_id, exc)
            for s in group:
                s.status = Status.FAILED
                s.extra["fail_reason"] = f"judger {self.judger.name}: {type(exc).__name__}: {exc}"
            return group

    def _discard(self, s: RolloutState) -> None:
        self.tokens_discarded += len(s.response_ids)
        s.reset_response()

    async def _generate_member(self, s: RolloutState) -> None:
        remaining = self.conf.sampling.max_tokens - len(s.response_ids)
        if remaining <= 0:  # a continuation that already holds its whole budget
            s.status, s.finish_reason = Status.COMPLETED, "length"
            s.response_text = self.decode(s.response_ids)
            return
        request = GenerateRequest(
            request_id=new_uid(),
            prompt_ids=list(s.prompt_ids) + list(s.response_ids),
            sampling=self.sampling_params(remaining, seed=s.sample_seed),
        )
        result = await self.engine.generate(request)
        s.append_tokens(result.token_ids, result.logprobs, result.model_steps)
        s.finish_reason = result.finish_reason
        s.response_text = self.decode(s.response_ids)
        if result.finish_reason == "abort":
            s.status = Status.ABORTED
            s.num_aborts += 1
        else:
            s.status = Status.COMPLETED

