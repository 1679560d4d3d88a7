"""Single-turn agent loop: one engine call per member, all members at once, then judge.

The members' requests go to the engine in one `generate_many` call (one future per
group for an engine that batches natively, a task per member otherwise).

Partial rollout: a member interrupted by `pause()` comes back ABORTED with its
tokens, log-probs and versions so far; continuing it sends prompt + partial response
and asks only for the tokens still allowed, and only appends to what is there. With
partial rollout off, an interrupted group loses all its responses and restarts later.
"""

from __future__ import annotations

import logging

from rlharness.agent.base import AgentLoop, gather_or_cancel
from rlharness.engine.base import GenerateRequest, GenerateResult, new_request_id
from rlharness.core.types import Group, RolloutState, Status

log = logging.getLogger(__name__)


class SingleTurnAgentLoop(AgentLoop):
    async def generate_group(self, group: Group, enable_partial_rollout: bool) -> Group:
        todo = [s for s in group if s.status is not Status.COMPLETED]
        if not enable_partial_rollout:
            for s in todo:
                if s.status is not Status.INIT:  # a fresh member (never generated) has nothing to discard
                    self._discard(s)
        await self._generate_members(todo)

        if any(s.status is Status.ABORTED for s in group):
            if not enable_partial_rollout:
                for s in group:  # the whole group restarts on newer weights
                    self._discard(s)
                    s.status = Status.ABORTED
            return group
        return await self.judge_or_fail(group)

    def _discard(self, s: RolloutState) -> None:
        self.tokens_discarded += len(s.response_ids)
        s.reset_response()

    async def _generate_members(self, todo: list[RolloutState]) -> None:
        if type(self)._generate_member is not SingleTurnAgentLoop._generate_member:
            # A subclass with its own per-member loop (several engine calls, tools): run those concurrently;
            # a member that crashes takes its siblings down with it (they write into the group in place).
            await gather_or_cancel(self._generate_member(s) for s in todo)
            return
        request_for = self._request  # bound once: this runs for every member of every group
        members, requests = [], []
        for s in todo:
            request = request_for(s)
            if request is not None:
                members.append(s)
                requests.append(request)
        if requests:
            apply = self._apply
            for s, result in zip(members, await self.engine.generate_many(requests)):
                apply(s, result)

    async def _generate_member(self, s: RolloutState) -> None:
        """One member alone (the batched path above does the same for all members in one call)."""
        request = self._request(s)
        if request is not None:
            self._apply(s, await self.engine.generate(request))

    def _request(self, s: RolloutState) -> GenerateRequest | None:
        """The engine request that continues `s`, or None (and `s` COMPLETED) if its budget is spent."""
        remaining = self.conf.sampling.max_tokens - len(s.response_ids)
        if remaining <= 0:  # a continuation that already holds its whole budget
            s.status, s.finish_reason = Status.COMPLETED, "length"
            s.response_text = self.decode(s.response_ids)
            return None
        # Engines only read prompt_ids: a fresh member's prompt is sent as it is, not copied.
        prompt = [*s.prompt_ids, *s.response_ids] if s.response_ids else s.prompt_ids
        return GenerateRequest(new_request_id(), prompt, self.sampling_params(remaining), s.sample_seed)

    def _apply(self, s: RolloutState, result: GenerateResult) -> None:
        s.append_tokens(result.token_ids, result.logprobs, result.model_steps)
        s.finish_reason = result.finish_reason
        s.response_text = self.decode(s.response_ids)
        if result.finish_reason == "abort":
            s.status = Status.ABORTED
            s.num_aborts += 1
        else:
            s.status = Status.COMPLETED

