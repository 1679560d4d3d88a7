"""Multi-turn agent loop with tools: the model calls a tool, the loop answers, the model goes on.

Convention (markers from `MultiTurnToolAgentConf`, defaults shown): the model writes
`<tool>2+3</tool>`; the engine stops at the end marker (a stop string); the loop runs
the tool and appends `<output>5</output>`, encoded with the tokenizer, then asks the
model to continue from prompt + everything so far. `<tool>name: argument</tool>` picks
a tool other than the first configured one. Only the first end marker of a turn
counts: with no start marker before it, it is not a call and the response ends there.
A turn is one model generation; after `max_turns` turns a further call is not run and
the sample ends (finish_reason "length"). The whole response, model and tool tokens,
stays within `sampling.max_tokens` (a tool output is cut to fit). The judger scores the
whole response text, tool outputs included.

Tools: `calculator` (in process) and `python` (the argument runs as a program in the sandbox,
`rlharness.sandbox`). A sample may run at most `max_turns - 1` calls and spend at most
`tool_budget_s` seconds in them; a call past the budget is not run and shows
"error: ...". Each call's outcome (`stop`: "ok" or why it failed, and its seconds) is kept in
`extra["tool_results"]` and shown with its turn in the rollouts/ ledger; a failed call fails
only itself (the model is shown the error and goes on).

Per-token bookkeeping: tool-output tokens get `response_mask` 0 (no loss), log-prob
0.0 and, as model step, the version that produced the call just before them, so
`min/max(response_model_steps)` and staleness are those of the model's own tokens.

Partial rollout: a pause aborts the engine requests (members come back ABORTED with
every token so far, completed tool turns included) and stops members between engine
calls. The loop needs no saved position: the current turn is the tokens after the last
inserted output (mask 0). If its text holds a complete call, the call's output is
missing and the tool runs; otherwise the model continues the turn (an unfinished call
included). Tokens generated past a call's end marker (a marker split across the abort,
or a multi-character token) are dropped: the turn ends at the token completing the call.
"""

from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from rlharness.agent.single_turn import SingleTurnAgentLoop
from rlharness.agent.tools import ToolError, ToolOutput, build_tools
from rlharness.config.schema import MultiTurnToolAgentConf
from rlharness.engine.base import GenerateRequest, RolloutEngine, new_request_id
from rlharness.judger.base import Judger
from rlharness.core.member_failures import mark_infra_failure
from rlharness.core.types import Group, RolloutState, Status

log = logging.getLogger(__name__)
# Tool call outcomes that are the machine's failure, not the code's: the sandbox could not be set up, or
# it did not end the call itself (the loop's own timer, a grace period past the sandbox's, fired).
INFRA_TOOL_STOPS = ("sandbox_error", "timeout")

_TOOL_NAME_RE = re.compile(r"\s*([A-Za-z_]\w*)\s*:(.*)", re.DOTALL)


def find_tool_call(text: str, start: str, end: str) -> str | None:
    """The argument of the call closed by the first `end` marker in `text`, else None."""
    close = text.find(end)
    if close < 0:
        return None
    open_ = text.rfind(start, 0, close)
    if open_ < 0:
        return None
    return text[open_ + len(start): close]


def call_length(turn_ids: list[int], has_call: Callable[[list[int]], bool]) -> int:
    """Fewest leading tokens of `turn_ids` whose text already holds a complete call (`has_call` of all of them)."""
    lo, hi = 1, len(turn_ids)  # the predicate holds at hi; prefixes only grow the text
    while lo < hi:
        mid = (lo + hi) // 2
        if has_call(turn_ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return hi


def current_turn(response_ids: list[int], mask: list[int]) -> tuple[int, int]:
    """(index where the current model turn starts, number of tool outputs inserted so far)."""
    turn_start, outputs = 0, 0
    for i, m in enumerate(mask):
        if m == 0:
            turn_start = i + 1
            outputs += i == 0 or mask[i - 1] == 1
    return turn_start, outputs


class MultiTurnToolAgentLoop(SingleTurnAgentLoop):
    """Group handling (in place, partial rollout on/off, judging) is the single-turn loop's;
    each member runs the turn loop of `_generate_member`."""

    conf: MultiTurnToolAgentConf

    def __init__(self, conf: MultiTurnToolAgentConf, engine: RolloutEngine, judger: Judger,
                 decode: Callable[[list[int]], str], encode: Callable[[str], list[int]] | None = None,
                 tokenizer=None) -> None:
        super().__init__(conf, engine, judger, decode)
        if encode is None:
            raise ValueError("agent=multi_turn_tool needs `encode` (it appends tool output as tokens)")
        self.encode = encode
        if conf.tool_call_end not in self.stop_strings:  # the engine stops at the end of a call
            self.stop_strings.append(conf.tool_call_end)
        self.tools = build_tools(list(conf.tools), conf.sandbox)
        self._tool_pool = ThreadPoolExecutor(conf.tool_workers, thread_name_prefix="tool")
        self._tool_slots = asyncio.Semaphore(conf.tool_workers)
        # Bumped by pause(): a member started before it issues no further engine request.
        self._pause_epoch = 0
        self.tool_calls = 0  # counters for logs/tests
        self.tool_errors = 0

    async def pause(self) -> None:
        self._pause_epoch += 1
        await super().pause()

    def step_metrics(self, groups: list[Group]) -> dict[str, float]:
        """Per trained sample: tool calls, the share of calls that failed (any stop but "ok"), and
        the seconds of tool time."""
        results = [r for g in groups for s in g for r in s.extra.get("tool_results", [])]
        samples = sum(len(g) for g in groups)
        return {"agent/tool_calls_per_sample": len(results) / max(samples, 1),
                "agent/tool_failed_frac": sum(r["stop"] != "ok" for r in results) / max(len(results), 1),
                "agent/tool_s_per_sample": sum(r["seconds"] for r in results) / max(samples, 1)}

    def _pending_call(self, turn_ids: list[int]) -> str | None:
        return find_tool_call(self.decode(turn_ids), self.conf.tool_call_start, self.conf.tool_call_end)

    def _call_length(self, turn_ids: list[int]) -> int:
        """Fewest leading tokens of the turn whose text already holds the complete call."""
        return call_length(turn_ids, lambda ids: self._pending_call(ids) is not None)

    def _finish(self, s: RolloutState, status: Status, reason: str) -> None:
        s.status, s.finish_reason = status, reason
        s.response_text = self.decode(s.response_ids)
        mask = s.loss_mask()
        s.extra["tool_calls"] = current_turn(s.response_ids, mask)[1]
        s.extra["turns"] = self._turns(s.response_ids, mask, s.extra.get("tool_results", []))
        if status == Status.ABORTED:
            s.num_aborts += 1

    def _turns(self, ids: list[int], mask: list[int], results: list[dict]) -> list[dict]:
        """The response as turns, for the rollouts/ ledger and eval metrics: the model's text
        ("assistant") and each tool output ("tool", its markers stripped, with its call's `stop` and
        `seconds`), decoded from the tokens."""
        turns, start, outputs = [], 0, 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or mask[i] != mask[start]:
                text = self.decode(ids[start:i])
                if mask[start] == 0:
                    text = text.removeprefix(self.conf.tool_output_start).removesuffix(self.conf.tool_output_end)
                turn = {"role": "assistant" if mask[start] else "tool", "text": text}
                if mask[start] == 0 and outputs < len(results):
                    turn.update(results[outputs])
                outputs += mask[start] == 0
                turns.append(turn)
                start = i
        return turns

    async def _generate_member(self, s: RolloutState) -> None:
        conf, epoch = self.conf, self._pause_epoch
        budget = conf.sampling.max_tokens
        if not s.response_ids:  # a fresh start (or a restart after its tokens were discarded)
            s.extra.pop("tool_results", None)
        while True:
            turn_start, outputs = current_turn(s.response_ids, s.loss_mask())
            remaining = budget - len(s.response_ids)
            call = self._pending_call(s.response_ids[turn_start:])
            if call is not None:  # the turn ended with a call whose output is missing
                if outputs + 1 >= conf.max_turns or remaining <= 0:
                    self._finish(s, Status.COMPLETED, "length")
                    return
                await self._append_tool_output(s, call, remaining)
                continue
            if remaining <= 0:
                self._finish(s, Status.COMPLETED, "length")
                return
            if self._pause_epoch != epoch:  # paused between engine calls (e.g. during a tool)
                self._finish(s, Status.ABORTED, "abort")
                return
            # Seeded like single-turn requests: the engine draws by (seed, position), so every turn
            # of a member, and its continuation after an abort, draws the same tokens in any batch.
            request = GenerateRequest(request_id=new_request_id(), prompt_ids=list(s.prompt_ids) + list(s.response_ids),
                                      sampling=self.sampling_params(remaining), seed=s.sample_seed)
            result = await self.engine.generate(request)
            s.append_tokens(result.token_ids, result.logprobs, result.model_steps)
            turn_ids = s.response_ids[turn_start:]
            if self._pending_call(turn_ids) is not None:
                self._drop_after_call(s, turn_start + self._call_length(turn_ids))
            if result.finish_reason == "abort":
                self._finish(s, Status.ABORTED, "abort")
                return
            if self._pending_call(s.response_ids[turn_start:]) is None:
                self._finish(s, Status.COMPLETED, result.finish_reason)
                return

    def _drop_after_call(self, s: RolloutState, keep: int) -> None:
        if keep < len(s.response_ids):
            self.tokens_discarded += len(s.response_ids) - keep
            del s.response_ids[keep:], s.response_logprobs[keep:], s.response_model_steps[keep:]
            del s.response_mask[keep:]

    async def _append_tool_output(self, s: RolloutState, call: str, remaining: int) -> None:
        results = s.extra.setdefault("tool_results", [])
        output = await self._run_tool(call, self.conf.tool_budget_s - sum(r["seconds"] for r in results))
        results.append({"stop": output.stop, "seconds": round(output.seconds, 3)})
        if output.stop != "ok":
            self.tool_errors += 1
        if output.stop in INFRA_TOOL_STOPS:  # the sandbox failed, not the code: not the policy's fault
            mark_infra_failure(s, f"tool call {call[:80]!r}: {output.stop}: {output.text[:200]}")
        text = self.conf.tool_output_start + output.text[: self.conf.max_tool_output_chars] + self.conf.tool_output_end
        ids = self.encode(text)[:remaining]
        if not ids:  # the same call would be found again, forever
            raise ValueError(f"multi_turn_tool: encode({text!r}) returned no tokens")
        version = s.response_model_steps[-1]  # the version that wrote the call
        s.append_tokens(ids, [0.0] * len(ids), [version] * len(ids), mask=[0] * len(ids))

    async def _run_tool(self, call: str, budget_left_s: float) -> ToolOutput:
        """The tool's output, or "error: ..." for bad input, an unknown tool, a spent budget or a timeout."""
        name, argument = next(iter(self.tools)), call
        named = _TOOL_NAME_RE.fullmatch(call)
        if named:
            if named.group(1) not in self.tools:
                return ToolOutput(f"error: unknown tool {named.group(1)!r} (available: {', '.join(self.tools)})",
                                  "unknown_tool")
            name, argument = named.group(1), named.group(2)
        if budget_left_s <= 0:
            return ToolOutput(f"error: this sample's tool time ({self.conf.tool_budget_s:g} s) is spent", "budget")
        self.tool_calls += 1
        tool, timeout = self.tools[name], min(self.conf.tool_timeout_s, budget_left_s)
        loop = asyncio.get_running_loop()
        async with self._tool_slots:  # waiting for a free worker does not count against the call's time
            started = loop.time()
            try:
                return await asyncio.wait_for(loop.run_in_executor(self._tool_pool, tool, argument, timeout),
                                              timeout + getattr(tool, "grace_s", 0.0))
            except ToolError as exc:
                return ToolOutput(f"error: {exc}", "error", loop.time() - started)
            except asyncio.TimeoutError:
                log.warning("tool %s timed out after %.1f s on %r", name, timeout, argument[:80])
                return ToolOutput(f"error: timed out after {timeout:g} s", "timeout", timeout)
