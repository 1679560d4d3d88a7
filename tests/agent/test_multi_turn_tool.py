"""The multi-turn tool loop: tool calls, masks, budgets, turn limits, abort and continuation.

Most tests drive the loop with `ScriptedModel`, a test double for the model's choices
(it writes a fixed plan, one character token at a time, through the real engine
interface: stop strings, max_tokens, abort with partial tokens, weight versions). The
thing under test is the loop. The last test runs the loop against the real hf engine
with a tiny random model.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from rlharness.agent import build_agent_loop
from rlharness.agent.multi_turn_tool import current_turn, find_tool_call
from rlharness.agent.tools import ToolError, ToolOutput, build_tools, calculator, calculator_tool
from rlharness.config.schema import AlgoConf, ConfigError, MultiTurnToolAgentConf, SamplingConf
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine
from rlharness.judger.base import Judger
from rlharness.judger.math import MathJudger
from rlharness.core.run_dir import RunDir
from rlharness.model.tiny import DEFAULT_CHARS, build_char_tokenizer
from rlharness.trainer.batch import build_train_batch
from rlharness.core.types import Status, make_group
from tests.helpers import HANG_S

pytestmark = pytest.mark.timeout(60)

TOK = build_char_tokenizer(DEFAULT_CHARS + "abcdefghijklmnopqrstuvwxyz<>/:'_.")
PROMPT = "q:"


def encode(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def decode(ids: list[int]) -> str:
    return TOK.decode(ids, skip_special_tokens=True)


def position_logprob(pos: int) -> float:
    """Deterministic per position, so a continuation can be compared value for value."""
    return -((pos % 7) + 1) / 10


class ScriptedModel(RolloutEngine):
    """Writes `turns[n]` in turn n (turn n starts after the n-th "</output>").

    As the hf engine does, it checks stop strings on the text it generated in this
    request only. The last turn ends with EOS; after a non-final turn's text (normally
    cut by the "</tool>" stop string) it keeps writing '9's, like a model that does not stop.
    With `hold_at` set, every member waits before its engine token number `hold_at` (counted
    over its turns) until `resume` is set: a test interrupts each member exactly there, on any
    machine (tool calls run in threads, so a count over all members would depend on timing).
    """

    def __init__(self, turns: list[str]) -> None:
        self.turns = turns
        self._version, self._abort_epoch = 0, 0
        self.requests: list[GenerateRequest] = []
        self.in_flight = 0
        self.hold_at: int | None = None
        self.held = 0
        self.resume = asyncio.Event()

    @property
    def version(self) -> int:
        return self._version

    def _tokens_before(self, prompt_ids: list[int]) -> int:
        """Engine tokens this member wrote before this request (its earlier turns and this turn so far)."""
        response = decode(prompt_ids)[len(PROMPT):]
        n = response.count("</output>")
        return sum(len(encode(t)) for t in self.turns[:n]) + len(encode(response.rsplit("</output>", 1)[-1]))

    def _plan(self, prompt_ids: list[int]) -> list[int]:
        text = decode(prompt_ids)
        assert text.startswith(PROMPT), text
        response = text[len(PROMPT):]
        n = response.count("</output>")
        current = response.rsplit("</output>", 1)[-1]
        plan = self.turns[n] if n < len(self.turns) else ""
        rest = encode(plan[len(current):]) if plan.startswith(current) else []
        return rest + ([TOK.eos_token_id] if n >= len(self.turns) - 1 else encode("9" * 200))

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        epoch, plan = self._abort_epoch, self._plan(request.prompt_ids)
        ids: list[int] = []
        steps: list[int] = []
        reason = "length"
        self.in_flight += 1
        position = self._tokens_before(request.prompt_ids)
        try:
            for i, tok in enumerate(plan[: request.sampling.max_tokens]):
                if position + i == self.hold_at:
                    self.held += 1
                    await self.resume.wait()
                await asyncio.sleep(0)  # one token per turn of the event loop
                if self._abort_epoch != epoch:
                    reason = "abort"
                    break
                ids.append(tok)
                steps.append(self._version)
                if tok == TOK.eos_token_id or any(s in decode(ids) for s in request.sampling.stop):
                    reason = "stop"
                    break
        finally:
            self.in_flight -= 1
        start = len(request.prompt_ids)
        return GenerateResult(request.request_id, ids, [position_logprob(start + i) for i in range(len(ids))],
                              steps, reason, decode(ids))

    async def abort_all(self) -> int:
        self._abort_epoch += 1
        return self.in_flight

    async def load_weights(self, state: dict[str, Any], version: int) -> None:
        self._version = version


def setup(turns: list[str], *, k: int = 2, max_tokens: int = 200, max_turns: int = 4, answer: str = "5",
          judger: Judger | None = None, tool_timeout_s: float | None = None):
    engine = ScriptedModel(turns)
    conf = MultiTurnToolAgentConf(sampling=SamplingConf(max_tokens=max_tokens), max_turns=max_turns,
                                  **({} if tool_timeout_s is None else {"tool_timeout_s": tool_timeout_s}))
    loop = build_agent_loop(conf, engine, judger or MathJudger(), decode, encode=encode)
    group = make_group(task="t", prompt_index=0, epoch=0, prompt_text=PROMPT, prompt_ids=encode(PROMPT),
                       label={"answer": answer}, k=k)
    return engine, loop, group


def run(loop, group, partial: bool = True):
    return asyncio.run(loop.generate_group(group, enable_partial_rollout=partial))


def runs_of(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of zeros."""
    out, i = [], 0
    while i < len(mask):
        if mask[i] == 0:
            j = i
            while j < len(mask) and mask[j] == 0:
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def check_aligned(s) -> None:
    n = len(s.response_ids)
    assert len(s.response_logprobs) == len(s.response_model_steps) == len(s.response_mask) == n
    for start, end in runs_of(s.response_mask):
        assert start > 0  # a tool output always follows the model's call
        assert s.response_logprobs[start:end] == [0.0] * (end - start)
        assert s.response_model_steps[start:end] == [s.response_model_steps[start - 1]] * (end - start)


# ----------------------------------------------------------------------------- tools
def test_calculator_evaluates_exactly_and_refuses_everything_else():
    assert calculator("2+3") == "5"
    assert calculator(" 2 * (3 + 4) - 10 / 4 ") == "11.5"
    assert calculator("-3*-2") == "6"
    assert calculator("1/3") == "0.3333333333"
    assert calculator("0.1+0.2") == "0.3"  # exact, not 0.30000000000000004
    assert calculator("123456789*987654321") == str(123456789 * 987654321)
    assert calculator("(" * 120 + "1" + ")" * 120) == "1"
    for bad, why in [("1/0", "division by zero"), ("", "empty"), ("2**10", "not an expression"),
                     ("__import__('os')", "only digits"), ("abs(1)", "only digits"), ("(1+2", "not an expression"),
                     ("1" * 300, "longer than"), ("1.2.3", "not an expression")]:
        with pytest.raises(ToolError, match=why):
            calculator(bad)


def test_tool_names_and_call_parsing():
    assert list(build_tools(["calculator"])) == ["calculator"]
    with pytest.raises(ValueError, match=r"agent.tools=\['calculator', 'web'\].*'web'"):
        build_tools(["calculator", "web"])
    assert find_tool_call("think <tool>2+3</tool>", "<tool>", "</tool>") == "2+3"
    assert find_tool_call("<tool>2+3</to", "<tool>", "</tool>") is None
    assert find_tool_call("a</tool><tool>1</tool>", "<tool>", "</tool>") is None  # first end marker decides
    assert find_tool_call("<tool>1<tool>2+2</tool>x", "<tool>", "</tool>") == "2+2"
    assert current_turn([5, 6, 7, 8, 9, 10], [1, 0, 0, 1, 0, 1]) == (5, 2)
    assert current_turn([5, 6], [1, 1]) == (0, 0)
    with pytest.raises(ConfigError, match="agent.tool_call_end"):
        MultiTurnToolAgentConf(tool_call_end="<tool>")
    with pytest.raises(ConfigError, match="agent.tool_output_start"):
        MultiTurnToolAgentConf(tool_output_start="")
    with pytest.raises(ConfigError, match="agent.tools"):
        MultiTurnToolAgentConf(tools=[])
    with pytest.raises(ValueError, match="needs `encode`"):
        build_agent_loop(MultiTurnToolAgentConf(), ScriptedModel([]), MathJudger(), decode)


# ----------------------------------------------------------------------------- the loop
def test_tool_output_is_inserted_masked_and_the_whole_text_is_judged():
    engine, loop, group = setup(["<tool>2+3</tool>", "#### 5"])
    out = run(loop, group)
    assert out.status == Status.COMPLETED
    call, output, answer = "<tool>2+3</tool>", "<output>5</output>", "#### 5"
    for s in out:
        assert s.response_text == call + output + answer
        assert s.response_ids == encode(call + output + answer) + [TOK.eos_token_id]
        assert s.response_mask == [1] * len(call) + [0] * len(output) + [1] * (len(answer) + 1)
        check_aligned(s)
        p = len(s.prompt_ids)
        model_positions = [i for i, m in enumerate(s.response_mask) if m]
        assert [s.response_logprobs[i] for i in model_positions] == [position_logprob(p + i) for i in model_positions]
        assert set(s.response_model_steps) == {0}
        assert (s.finish_reason, s.reward["score"], s.extra["tool_calls"]) == ("stop", 1.0, 1)
    assert all(a is b for a, b in zip(out, group))  # generated in place
    # Two engine calls per member; the second continues from prompt + call + output.
    assert len(engine.requests) == 4
    assert sorted(r.seed for r in engine.requests) == sorted(2 * [s.sample_seed for s in group])  # seeded
    assert all("</tool>" in r.sampling.stop for r in engine.requests)
    second = [r for r in engine.requests if len(r.prompt_ids) > len(encode(PROMPT))]
    assert {decode(r.prompt_ids) for r in second} == {PROMPT + call + output}
    assert loop.tool_calls == 2 and loop.tool_errors == 0


def test_tool_errors_and_named_tools_are_shown_to_the_model():
    turns = ["<tool>1/0</tool>", "<tool>calculator: 2*(3+4)</tool>", "<tool>python: 1</tool>",
             "<tool>__import__('os')</tool>", "#### 14"]
    _, loop, group = setup(turns, k=1, max_turns=5, answer="14", max_tokens=400)
    (s,) = run(loop, group)
    outputs = [decode(s.response_ids[a:b]) for a, b in runs_of(s.response_mask)]
    assert outputs == ["<output>error: division by zero</output>", "<output>14</output>",
                       "<output>error: unknown tool 'python' (available: calculator)</output>",
                       "<output>error: only digits, . + - * / ( ) and spaces are allowed</output>"]
    assert s.extra["tool_calls"] == 4 and s.reward["score"] == 1.0
    assert (loop.tool_calls, loop.tool_errors) == (3, 3)
    check_aligned(s)


def test_turn_limit_stops_before_running_another_call():
    engine, loop, group = setup(["<tool>1+1</tool>", "<tool>2+2</tool>", "#### 4"], k=1, max_turns=2)
    (s,) = run(loop, group)
    assert s.response_text == "<tool>1+1</tool><output>2</output><tool>2+2</tool>"
    assert (s.status, s.finish_reason, s.extra["tool_calls"]) == (Status.COMPLETED, "length", 1)
    assert len(engine.requests) == 2


@pytest.mark.parametrize("max_tokens, text, engine_calls", [
    (21, "<tool>2+3</tool><outp", 1),  # the tool output is cut to the budget
    (16, "<tool>2+3</tool>", 1),  # the call used the whole budget: the tool does not run
    (10, "<tool>2+3<", 1),  # the engine's own max_tokens
    (39, "<tool>2+3</tool><output>5</output>#### ", 2),  # the last turn gets what is left
])
def test_the_whole_response_stays_within_max_tokens(max_tokens, text, engine_calls):
    engine, loop, group = setup(["<tool>2+3</tool>", "#### 5"], k=1, max_tokens=max_tokens)
    (s,) = run(loop, group)
    assert (s.response_text, s.status, s.finish_reason) == (text, Status.COMPLETED, "length")
    assert len(s.response_ids) == max_tokens
    assert len(engine.requests) == engine_calls
    assert engine.requests[-1].sampling.max_tokens == max_tokens - len(engine.requests[-1].prompt_ids) + len(encode(PROMPT))
    check_aligned(s)


TURNS = ["<tool>12*3</tool>", "so <tool>36-1</tool>", "#### 35"]


def reference():
    _, loop, group = setup(TURNS, k=1, answer="35")
    (s,) = run(loop, group)
    assert s.status == Status.COMPLETED and s.reward["score"] == 1.0 and s.extra["tool_calls"] == 2
    return s


async def interrupt_at(loop, engine, group, cut: int, partial: bool = True):
    """Pause the group once each member has written exactly `cut` engine tokens (each held there)."""
    engine.hold_at = cut
    task = asyncio.create_task(loop.generate_group(group, enable_partial_rollout=partial))
    while engine.held < len(group):
        assert not task.done(), "the group ended before every member reached the cut"
        await asyncio.sleep(0.001)
    await loop.pause()  # the abort is in before any held member writes on
    engine.hold_at = None
    engine.resume.set()
    return await task


@pytest.mark.parametrize("cut", [3, 12, 16, 17, 25, 36, 40])  # the plan is 45 engine tokens
def test_abort_anywhere_then_continue_gives_the_uninterrupted_response(cut):
    ref = reference()
    engine, loop, group = setup(TURNS, k=2, answer="35")

    async def main():
        first = await interrupt_at(loop, engine, group, cut)
        await engine.load_weights({}, version=1)
        # A copy of the interrupted group: the continuation works on `first` in place.
        return first.clone(), await loop.generate_group(first, enable_partial_rollout=True)

    first, second = asyncio.run(main())
    assert first.status == Status.ABORTED
    for a, s in zip(first, second):
        assert a.status == Status.ABORTED and a.num_aborts == 1 and 0 < len(a.response_ids) < len(ref.response_ids)
        assert len(a.response_ids) - sum(1 for m in a.response_mask if m == 0) == cut  # engine tokens, not tool output
        check_aligned(a)
        n = len(a.response_ids)
        assert s.status == Status.COMPLETED and s.reward["score"] == 1.0
        assert s.response_ids == ref.response_ids and s.response_mask == ref.response_mask
        assert s.response_logprobs == ref.response_logprobs  # values are per position
        assert s.response_text == ref.response_text and s.extra["tool_calls"] == 2
        check_aligned(s)
        assert s.response_model_steps[:n] == a.response_model_steps and set(a.response_model_steps) == {0}
        assert set(s.response_model_steps[n:]) <= {0, 1} and s.response_model_steps[-1] == 1


def test_continue_after_an_abort_that_split_the_end_marker():
    """'</to' before the abort, 'ol>' after: the engine misses the stop string (it sees only
    its own text) and writes on; the loop ends the turn at the token completing the call."""
    ref = reference()
    engine, loop, group = setup(TURNS, k=1, answer="35")
    (s,) = group
    partial = encode("<tool>12*3</to")
    s.append_tokens(partial, [position_logprob(len(s.prompt_ids) + i) for i in range(len(partial))], [0] * len(partial))
    s.status, s.finish_reason, s.num_aborts = Status.ABORTED, "abort", 1
    (out,) = run(loop, group)
    assert (out.response_ids, out.response_mask, out.response_text) == (
        ref.response_ids, ref.response_mask, ref.response_text)
    assert loop.tokens_discarded > 0  # the '9's written past the marker
    assert "9" not in out.response_text


def test_continue_after_a_complete_call_whose_output_is_missing_runs_the_tool_first():
    ref = reference()
    engine, loop, group = setup(TURNS, k=1, answer="35")
    (s,) = group
    call = encode("<tool>12*3</tool>")
    s.append_tokens(call, [position_logprob(len(s.prompt_ids) + i) for i in range(len(call))], [0] * len(call))
    s.status = Status.ABORTED
    (out,) = run(loop, group)
    assert (out.response_ids, out.response_mask) == (ref.response_ids, ref.response_mask)
    # No engine call for the first turn: the first request already holds the tool output.
    assert decode(engine.requests[0].prompt_ids) == PROMPT + "<tool>12*3</tool><output>36</output>"


def test_a_pause_during_a_tool_call_stops_the_member_before_its_next_engine_call():
    ref = reference()
    # The tool is held until the test lets it go: no tool timeout may end it first, however slow the machine.
    engine, loop, group = setup(TURNS, k=1, answer="35", tool_timeout_s=HANG_S)
    started, release = threading.Event(), threading.Event()

    def slow_calculator(argument: str, timeout_s: float) -> ToolOutput:
        started.set()
        release.wait()
        return calculator_tool(argument, timeout_s)

    loop.tools["calculator"] = slow_calculator

    async def main():
        task = asyncio.create_task(loop.generate_group(group, enable_partial_rollout=True))
        try:
            await asyncio.to_thread(started.wait)
            await loop.pause()
        finally:
            release.set()
        first = await task
        loop.tools["calculator"] = calculator_tool
        # A copy of the interrupted group: the continuation works on `first` in place.
        return first.clone(), await loop.generate_group(first, enable_partial_rollout=True)

    (first,), (second,) = asyncio.run(main())
    assert first.status == Status.ABORTED
    assert first.response_text == "<tool>12*3</tool><output>36</output>"  # the tool's answer is kept
    assert second.response_ids == ref.response_ids and second.response_mask == ref.response_mask


def test_without_partial_rollout_an_interrupted_group_restarts_from_scratch():
    ref = reference()
    engine, loop, group = setup(TURNS, k=2, answer="35")

    async def main():
        first = await interrupt_at(loop, engine, group, cut=20, partial=False)
        assert all(s.status == Status.ABORTED and s.response_ids == [] == s.response_mask for s in first)
        await engine.load_weights({}, version=2)
        return await loop.generate_group(first, enable_partial_rollout=False)

    second = asyncio.run(main())
    assert loop.tokens_discarded > 0
    for s in second:
        assert s.response_ids == ref.response_ids and set(s.response_model_steps) == {2}


# ----------------------------------------------------------------------------- real engine
@pytest.mark.timeout(120)
def test_end_to_end_on_the_hf_engine_with_a_tiny_random_model():
    """Random weights, no EOS, "(" and ")" as call markers so the model makes calls by chance."""
    from rlharness.engine.hf import HFEngine
    from rlharness.model.tiny import build_tiny_llama

    tok = build_char_tokenizer(DEFAULT_CHARS)  # '(' and ')' are 2 of 24 tokens
    model = build_tiny_llama(len(tok), seed=3, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                             eos_token_id=tok.eos_token_id)
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    dec = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    max_tokens = 48
    conf = MultiTurnToolAgentConf(sampling=SamplingConf(max_tokens=max_tokens), max_turns=3,
                                  tool_call_start="(", tool_call_end=")", tool_output_start="=",
                                  tool_output_end=",")
    # Requests are seeded by the members' seeds; with run seed 3 some members close a call (with 0 none does).
    group = make_group(task="t", prompt_index=0, epoch=0, prompt_text="12+3=", prompt_ids=enc("12+3="),
                       label={"answer": "15"}, k=8, seed=3)

    async def main():
        engine = HFEngine.from_model(model, tok, eos_token_ids=[])
        try:
            loop = build_agent_loop(conf, engine, MathJudger(), dec, encode=enc)
            return loop, await loop.generate_group(group, enable_partial_rollout=True)
        finally:
            await engine.close()

    loop, out = asyncio.run(main())
    assert out.status == Status.COMPLETED
    assert loop.tool_calls > 0, "expected the random model to close at least one '(' call"
    tools = build_tools(["calculator"])
    for s in out:
        check_aligned(s)
        # Without EOS a member ends at the budget, or at a ")" that closes no call.
        assert len(s.response_ids) == max_tokens if s.finish_reason == "length" else s.finish_reason == "stop"
        assert len(s.response_ids) <= max_tokens
        assert s.reward is not None and set(s.response_model_steps) == {0}
        blocks = runs_of(s.response_mask)
        assert len(blocks) == s.extra["tool_calls"] <= conf.max_turns - 1
        for start, end in blocks:  # each output answers the call just before it, cut to the budget
            turn_start, _ = current_turn(s.response_ids[:start], s.response_mask[:start])
            turn = dec(s.response_ids[turn_start:start])
            assert turn.endswith(")")
            call = find_tool_call(turn, "(", ")")
            try:
                expected = tools["calculator"](call, 1.0).text
            except ToolError as exc:
                expected = f"error: {exc}"
            assert s.response_ids[start:end] == enc("=" + expected + ",")[: max_tokens - start]
    # The batch keeps every token and masks the inserted ones.
    batch, _ = build_train_batch([out], AlgoConf(name="grpo"), tok.pad_token_id, 1, max_tokens, 1.0)
    for b, s in enumerate(out):
        p = len(s.prompt_ids)
        assert batch.response_mask[b, p: p + len(s.response_ids)].tolist() == s.response_mask


@pytest.mark.timeout(300)
def test_train_py_agent_multi_turn_tool_runs_and_trains(tmp_path):
    """The composed run (`python train.py agent=multi_turn_tool ...`, in process), with
    markers inside the default model's character vocabulary."""
    from rlharness.logging_utils.ledger import read_ledger
    from rlharness.logging_utils.metrics import read_metrics
    from tests.helpers import QUICK, run_in_process

    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*QUICK, "agent=multi_turn_tool", "total_steps=2", "eval_every=0",
                             "agent.tool_call_start='('", "agent.tool_call_end=')'",
                             "agent.tool_output_start='='", "agent.tool_output_end=','", "agent.sampling.max_tokens=12"])
    rows = read_metrics(RunDir(run_dir).metrics)
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    trained, _ = read_ledger(run_dir)
    assert {r["train_step"] for r in trained} == {1, 2}
    assert all(r["response_len"] <= 12 for r in trained)
