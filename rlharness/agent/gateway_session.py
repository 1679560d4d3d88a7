"""One rollout's record at the gateway: the token sequence served so far, the calls, and pausing.

A *segment* is one token sequence: the rendered prompt of its first call, then per call the
model's sampled tokens (trained, mask 1) and, before the next call, whatever that call's
rendering adds after them (template, tool output, user turns: mask 0). A call extends the
current segment when its rendered text starts with the segment's text (decoded with special
tokens), so the model's own tokens are reused, never re-tokenised; anything else starts a
new segment (`prefix_mismatch`). The trajectory trained is the last segment (the one the
answer came from); the model tokens of earlier ones are not trained.

Pausing: a call whose engine request comes back aborted (the producer pauses for a weight
sync), or a call that arrives while paused, *parks*: it keeps its tokens and waits in the
HTTP handler until the agent loop resumes the session (the group continued, on new
weights), then goes on generating; the agent never sees the interruption.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rlharness.core.types import RolloutState


@dataclass
class Segment:
    prompt_ids: list[int]
    # The text served so far: the last call's prompt as rendered, then the model's tokens decoded with
    # their special tokens (so a BOS the tokenizer added, absent from the text, never breaks a match).
    text: str = ""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)

    def append(self, ids: list[int], logprobs: list[float], versions: list[int], trained: bool) -> None:
        self.ids += ids
        self.logprobs += logprobs
        self.versions += versions
        self.mask += [int(trained)] * len(ids)

    def add_completion(self, ids: list[int], decode_raw) -> None:
        self.text += decode_raw(ids)

    def truncate(self, n: int) -> None:
        del self.ids[n:], self.logprobs[n:], self.versions[n:], self.mask[n:]

    def generated(self) -> int:
        """Response tokens so far (model and inserted), counted against `sampling.max_tokens`."""
        return len(self.ids)


class Session:
    """The gateway's state for one member's agent run (`/rollout/<id>/v1`)."""

    def __init__(self, rollout_id: str, state: RolloutState, epoch: int) -> None:
        self.id = rollout_id
        self.state = state
        self.epoch = epoch  # the agent loop's pause epoch this session runs under
        self.segments: list[Segment] = []
        self.turns: list[dict[str, Any]] = []  # messages sent and text returned, in order
        self.calls = 0
        self.tool_calls = 0
        self.prefix_mismatch = 0
        self.seen_messages = 0  # messages of the last call, plus the assistant message it returned
        self.agent_task: asyncio.Task | None = None
        self.handlers: set[asyncio.Task] = set()  # its requests being served (cancelled with it)
        self.slot_held = False
        self._resume: asyncio.Future | None = None
        self._signal: asyncio.Future | None = None  # wakes the agent loop: parked or finished

    # ------------------------------------------------------------------ pausing
    def watch(self) -> asyncio.Future:
        """A future resolved when this session next parks or its agent finishes."""
        self._signal = asyncio.get_running_loop().create_future()
        if self.parked or (self.agent_task is not None and self.agent_task.done()):
            self._signal.set_result(None)
        return self._signal

    def notify(self) -> None:
        if self._signal is not None and not self._signal.done():
            self._signal.set_result(None)

    @property
    def parked(self) -> bool:
        return self._resume is not None and not self._resume.done()

    async def park(self) -> None:
        self._resume = asyncio.get_running_loop().create_future()
        self.notify()
        await self._resume

    def resume(self, epoch: int) -> None:
        self.epoch = epoch
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)

    # ------------------------------------------------------------------ the token record
    def extend_or_start(self, text: str, version: int, encode, encode_suffix) -> tuple[Segment, bool]:
        """The segment a call with prompt `text` generates into; True if it extends the last one.
        Inserted tokens carry the version of the model token before them (as in the tool loop)."""
        seg = self.segments[-1] if self.segments else None
        if seg is not None:
            if text.startswith(seg.text):
                extra = encode_suffix(text[len(seg.text):]) if len(text) > len(seg.text) else []
                seg.text = text
                version = seg.versions[-1] if seg.versions else version
                seg.append(extra, [0.0] * len(extra), [version] * len(extra), trained=False)
                return seg, True
            self.prefix_mismatch += 1
        seg = Segment(prompt_ids=encode(text), text=text)
        self.segments.append(seg)
        return seg, False

    def write_to(self, s: RolloutState) -> None:
        """The last segment as `s`'s trajectory (prompt, tokens, log-probs, versions, mask) and its turns."""
        seg = self.segments[-1] if self.segments else None
        s.reset_response()
        if seg is not None:
            # The agent rendered its own prompt (system prompt, tools...): that is what was trained on.
            s.prompt_ids = list(seg.prompt_ids)
            s.append_tokens(list(seg.ids), list(seg.logprobs), list(seg.versions), mask=list(seg.mask))
        s.extra["turns"] = list(self.turns)
        s.extra["tool_calls"] = self.tool_calls
        s.extra["calls"] = self.calls
        s.extra["prefix_mismatch"] = self.prefix_mismatch
        s.extra["segments"] = len(self.segments)
