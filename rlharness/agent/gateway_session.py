"""One rollout's record at the gateway: its token sequences, its calls, its budget, and pausing.

A *segment* is one token sequence: a prompt, then per call the model's sampled tokens (trained,
mask 1) and, before the next call, whatever that call's rendering adds after them (template,
tool output, user turns: mask 0). The model's own tokens are reused, never re-tokenised: a
call continues a sequence when its rendered text starts with text the sequence already holds,
at a *mark* (a place where text and tokens agree: a segment's start, the end of a call's
prompt, the end of a completion).

- The longest mark of any segment that the call's text starts with decides. If it is the end
  of an idle segment, the call extends that segment in place (the usual multi-turn agent).
- If that segment is busy (another call of the same rollout is generating into it: parallel
  calls) or the mark lies inside it (the agent edited or forked its history), the call gets a
  *branch*: a new segment whose prompt is the tokens up to the mark and whose response is only
  its own. Nothing is ever interleaved, and no token is trained twice.
- No mark at all: a new segment from the text, tokenised (`prefix_mismatch`).

Every segment with tokens is trained, as a row of its own with the sample's reward: the first
as the sample's own trajectory, the others as `extra["branches"]` (rlharness/trainer/batch.py).
The first segment holds the sample's oldest token (every other one was started later), so the
sample's versions and staleness are read from it.

Budget: `spent` counts the response tokens of every segment (model and inserted, the inherited
prefix of a branch not included) against `agent.max_total_tokens`; a call in flight holds what it
may still generate (`reserved`), so parallel calls never take the sample past it together.

Pausing: a call whose engine request comes back aborted (the producer pauses for a weight
sync), or a call that arrives while paused, *parks*: it keeps its tokens and waits in its HTTP
handler until the agent loop resumes the session (the group continued, on new weights), then
goes on generating; the agent never sees the interruption. The session counts as parked when
a call waits and none is generating.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

from rlharness.core.types import RolloutState, stable_seed


@dataclass(eq=False)
class Segment:
    prompt_ids: list[int]
    # The text served so far: the last call's prompt as rendered, then the model's tokens decoded with
    # their special tokens (so a BOS the tokenizer added, absent from the text, never breaks a match).
    text: str
    seed: int  # seeds its token draws (the sample's seed for the first segment)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    marks: list[tuple[int, int]] = field(default_factory=list)  # (chars of text, tokens of ids) that agree
    busy: bool = False
    last_call: Any = None  # (the call, its completion): what the audit re-renders

    def __post_init__(self) -> None:
        self.marks.append((len(self.text), 0))

    def append(self, ids: list[int], logprobs: list[float], versions: list[int], trained: bool) -> None:
        self.ids += ids
        self.logprobs += logprobs
        self.versions += versions
        self.mask += [int(trained)] * len(ids)

    def truncate(self, n: int) -> None:
        del self.ids[n:], self.logprobs[n:], self.versions[n:], self.mask[n:]

    def mark(self) -> None:
        if self.marks[-1] != (len(self.text), len(self.ids)):
            self.marks.append((len(self.text), len(self.ids)))

    def trained_row(self) -> dict[str, list]:
        return {"prompt_ids": list(self.prompt_ids), "response_ids": list(self.ids),
                "response_logprobs": list(self.logprobs), "response_model_steps": list(self.versions),
                "response_mask": list(self.mask)}


@dataclass
class Plan:
    """Where a call goes: `seg` extended (its `suffix_ids` appended), or a new segment made of
    `prompt_ids` (a branch: the tokens of `parent` up to a mark) and then the suffix."""

    text: str
    suffix_ids: list[int]
    seg: Segment | None = None  # extended in place
    prompt_ids: list[int] | None = None  # a new segment's prompt
    parent_text: str = ""  # a new segment's text before the suffix
    mismatch: bool = False  # a new segment from scratch after others existed

    @property
    def context_len(self) -> int:
        """Tokens the call's generation starts after."""
        if self.seg is not None:
            return len(self.seg.prompt_ids) + len(self.seg.ids) + len(self.suffix_ids)
        return len(self.prompt_ids) + len(self.suffix_ids)


class Session:
    """The gateway's state for one member's agent run (`/rollout/<id>`)."""

    def __init__(self, rollout_id: str, state: RolloutState, epoch: int) -> None:
        self.id = rollout_id
        self.state = state
        self.epoch = epoch  # the agent loop's pause epoch this session runs under
        self.segments: list[Segment] = []
        self.turns: list[dict[str, Any]] = []  # messages sent and text returned, in order
        self.calls = 0
        self.tool_calls = 0
        self.prefix_mismatch = 0
        self.budget_spent = False  # a call was refused for the sample's budget: the sample has ended
        self.seen_messages: dict[int, int] = {}  # segment id -> messages its last call sent (+ its reply)
        self.agent_task: asyncio.Task | None = None
        self.handlers: set[asyncio.Task] = set()  # its requests being served (cancelled with it)
        self.slot_held = False
        self.generating = 0  # calls being served and not parked
        self.deadline: float | None = None  # loop time past which its agent is stopped (None: not started)
        self.failure: str | None = None  # why the gateway stopped its agent (a timeout)
        self.in_flight: list[tuple[Segment, int, int]] = []  # calls generating: (segment, start, tokens asked)
        self._resume: asyncio.Future | None = None
        self._signal: asyncio.Future | None = None  # wakes the agent loop: parked or finished
        self._call_end: asyncio.Future | None = None  # wakes calls waiting for budget held by calls in flight

    # ------------------------------------------------------------------ pausing
    def watch(self) -> asyncio.Future:
        """A future resolved when this session next parks or becomes idle (its agent and its calls done)."""
        self._signal = asyncio.get_running_loop().create_future()
        if self.parked or self.idle:
            self._signal.set_result(None)
        return self._signal

    def notify(self) -> None:
        if self._signal is not None and not self._signal.done():
            self._signal.set_result(None)

    @property
    def parked(self) -> bool:
        """A call waits for `resume` and none is generating."""
        return self._resume is not None and not self._resume.done() and self.generating == 0

    async def park(self) -> None:
        """Wait, as a call being served, until `resume`."""
        if self._resume is None or self._resume.done():
            self._resume = asyncio.get_running_loop().create_future()
        resume = self._resume
        self.generating -= 1
        self.notify()
        try:
            await resume
        finally:
            self.generating += 1

    @property
    def idle(self) -> bool:
        """Its agent program finished and none of its calls is being served."""
        return self.agent_task is not None and self.agent_task.done() and not self.handlers

    async def wait_for_a_call(self) -> None:
        """Wait, as a call being served (not counted as generating), until a call in flight ends."""
        if self._call_end is None or self._call_end.done():
            self._call_end = asyncio.get_running_loop().create_future()
        call_end = self._call_end
        self.generating -= 1
        self.notify()  # the calls in flight may be parked: then so is the session
        try:
            await call_end
        finally:
            self.generating += 1

    def call_ended(self) -> None:
        if self._call_end is not None and not self._call_end.done():
            self._call_end.set_result(None)

    def resume(self, epoch: int) -> None:
        self.epoch = epoch
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)

    # ------------------------------------------------------------------ the token record
    @property
    def spent(self) -> int:
        """Response tokens of every segment (model and inserted), against agent.max_total_tokens."""
        return sum(len(seg.ids) for seg in self.segments)

    def reserved(self) -> int:
        """Tokens the calls in flight may still generate (held against the budget: parallel calls share it)."""
        return sum(max(0, want - (len(seg.ids) - start)) for seg, start, want in self.in_flight)

    def plan(self, text: str, encode: Callable[[str], list[int]],
             encode_suffix: Callable[[str], list[int]]) -> Plan:
        """Where a call with prompt `text` goes (module docstring); changes nothing."""
        best: tuple[int, Segment, int] | None = None  # (chars, segment, tokens)
        for seg in self.segments:
            for chars, tokens in reversed(seg.marks):
                if best is not None and chars <= best[0]:
                    break
                if text.startswith(seg.text[:chars]):
                    best = (chars, seg, tokens)
                    break
        if best is None:
            return Plan(text, [], prompt_ids=encode(text), parent_text=text, mismatch=bool(self.segments))
        chars, seg, tokens = best
        suffix = encode_suffix(text[chars:]) if len(text) > chars else []
        if not seg.busy and (chars, tokens) == seg.marks[-1] and tokens == len(seg.ids):
            return Plan(text, suffix, seg=seg)
        return Plan(text, suffix, prompt_ids=seg.prompt_ids + seg.ids[:tokens], parent_text=seg.text[:chars])

    def commit(self, plan: Plan, version: int) -> Segment:
        """Carry out `plan`; the segment the call generates into, busy. Inserted tokens carry the
        version of the model token before them (as in the tool loop), else the engine's."""
        seg = plan.seg
        if seg is None:
            if plan.mismatch:
                self.prefix_mismatch += 1
            seed = self.state.sample_seed if not self.segments else stable_seed(
                self.state.sample_seed, "segment", len(self.segments))
            seg = Segment(prompt_ids=plan.prompt_ids, text=plan.parent_text, seed=seed)
            self.segments.append(seg)
        if plan.suffix_ids:
            version = seg.versions[-1] if seg.versions else version
            seg.append(plan.suffix_ids, [0.0] * len(plan.suffix_ids), [version] * len(plan.suffix_ids), trained=False)
        seg.text = plan.text
        seg.mark()
        seg.busy = True
        return seg

    def write_to(self, s: RolloutState) -> None:
        """The segments as `s`'s trajectory (the first) and branches (the others with tokens), and its turns."""
        rows = [seg for seg in self.segments if seg.ids]
        s.reset_response()
        if rows:
            first = rows[0]
            # The agent rendered its own prompt (system prompt, tools...): that is what was trained on.
            s.prompt_ids = list(first.prompt_ids)
            s.append_tokens(list(first.ids), list(first.logprobs), list(first.versions), mask=list(first.mask))
        if len(rows) > 1:
            s.extra["branches"] = [seg.trained_row() for seg in rows[1:]]
        else:
            s.extra.pop("branches", None)
        s.extra["turns"] = list(self.turns)
        s.extra["tool_calls"] = self.tool_calls
        s.extra["calls"] = self.calls
        s.extra["prefix_mismatch"] = self.prefix_mismatch
        s.extra["segments"] = len(rows)
