"""`agent.tools=[python]` in the multi-turn loop: the model's code runs in the sandbox, its output comes
back masked, hostile code fails only its own call with a reason in the rollouts/ ledger, and the
per-sample budgets hold.

The model is a test double (`Scripted`: it writes a fixed program per prompt, one character token at a
time, through the real engine interface); the tool, the sandbox and the ledger are real.
"""

from __future__ import annotations

import asyncio
import hashlib
import string
import tempfile
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlharness.agent import build_agent_loop
from rlharness.config.schema import MultiTurnToolAgentConf, SamplingConf, SandboxConf
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine
from rlharness.judger.math import MathJudger
from rlharness.logging_utils.ledger import RolloutLedger, read_ledger
from rlharness.sandbox import SandboxUnavailable, check_available
from rlharness.model.tiny import build_char_tokenizer
from rlharness.core.types import Status, make_group
from tests.helpers import HANG_S

pytestmark = pytest.mark.timeout(300)
try:
    check_available()
except SandboxUnavailable as exc:
    pytest.skip(f"sandbox unavailable: {exc}", allow_module_level=True)

TOK = build_char_tokenizer("".join(c for c in string.printable if c not in "\x0b\x0c\r"))


def encode(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def decode(ids: list[int]) -> str:
    return TOK.decode(ids, skip_special_tokens=True)


class Scripted(RolloutEngine):
    """Writes `plans[prompt][n]` in turn n (turns are separated by "</output>"), then EOS."""

    def __init__(self, plans: dict[str, list[str]]) -> None:
        self.plans = plans

    @property
    def version(self) -> int:
        return 0

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        text = decode(request.prompt_ids)
        prompt = next(p for p in self.plans if text.startswith(p))
        response = text[len(prompt):]
        turns = self.plans[prompt]
        n = response.count("</output>")
        plan = encode(turns[n]) if n < len(turns) else []
        ids: list[int] = []
        reason = "length"
        for tok in plan[: request.sampling.max_tokens]:
            ids.append(tok)
            if any(s in decode(ids) for s in request.sampling.stop):
                reason = "stop"
                break
        else:
            if len(ids) < request.sampling.max_tokens:
                ids.append(TOK.eos_token_id)
                reason = "stop"
        await asyncio.sleep(0)
        return GenerateResult(request.request_id, ids, [-0.5] * len(ids), [0] * len(ids), reason, decode(ids))

    async def abort_all(self) -> int:
        return 0

    async def load_weights(self, state: dict[str, Any], version: int) -> None:
        pass


def tree(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


def conf(**changes) -> MultiTurnToolAgentConf:
    # wall_s: a call that must succeed starts a sandboxed Python (seconds on a loaded box), and an endless
    # loop must reach its 1 CPU-second at a share of a core (a fifteenth under the CI's load) before it.
    sandbox = SandboxConf(cpu_s=1, wall_s=60, max_output_bytes=4096)
    return MultiTurnToolAgentConf(**{"sampling": SamplingConf(max_tokens=2000), "max_turns": 2, "tools": ["python"],
                                     "tool_timeout_s": 60, "tool_budget_s": 60, "sandbox": sandbox, **changes})


def groups_for(plans: dict[str, list[str]], k: int = 2) -> list:
    return [make_group(task="t", prompt_index=i, epoch=0, prompt_text=p, prompt_ids=encode(p),
                       label={"answer": "5"}, k=k) for i, p in enumerate(plans)]


def test_hostile_calls_fail_alone_with_their_reason_in_the_ledger():
    run_dir = Path(tempfile.mkdtemp(prefix="rlharness-test-run-", dir="/var/tmp"))  # not under the sandbox's /tmp
    try:
        (run_dir / "checkpoints" / "step_00000001").mkdir(parents=True)
        (run_dir / "checkpoints" / "step_00000001" / "DONE").write_text("ok")
        ckpt = run_dir / "checkpoints"
        hostile = {
            # Each process has its own CPU seconds: a bomb that keeps replacing its children runs to the wall.
            "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                          ("cpu_time", "wall_time")),
            "endless loop": ("while True:\n    pass", "cpu_time"),
            "10 GB": ("x = bytearray(10 * 2**30)", "memory"),
            "100 MB printed": ("print('x' * 100_000_000)", "output_limit"),
            "shadow": ("print(open('/etc/shadow').read())", "error"),
            "checkpoint write": (f"open('{ckpt}/step_00000001/DONE', 'w').write('x')", "error"),
            "socket": ("import socket\nsocket.create_connection(('127.0.0.1', 22))", "error"),
            "benign": ("print(2 + 3)", "ok"),
        }
        hostile = {name: (code, (reason,) if isinstance(reason, str) else reason)
                   for name, (code, reason) in hostile.items()}
        plans = {f"{name}:": [f"<tool>{code}</tool>", "#### 5"] for name, (code, _) in hostile.items()}
        before = tree(run_dir)
        loop = build_agent_loop(conf(), Scripted(plans), MathJudger(), decode, encode=encode)

        async def main():
            groups = groups_for(plans)
            return await asyncio.gather(*(loop.generate_group(g, enable_partial_rollout=True) for g in groups))

        groups = asyncio.run(main())
        assert tree(run_dir) == before
        RolloutLedger(run_dir).write_step(1, groups)
        trained, _ = read_ledger(run_dir)
        by_prompt = {}
        for row in trained:
            by_prompt.setdefault(row["prompt"], []).append(row)
        for name, (_, reason) in hostile.items():
            rows = by_prompt[f"{name}:"]
            assert len(rows) == 2 and all(r["status"] == "completed" for r in rows)
            for row in rows:
                tool_turns = [t for t in row["turns"] if t["role"] == "tool"]
                assert len(tool_turns) == 1 and tool_turns[0]["stop"] in reason, (name, row["turns"])
                assert tool_turns[0]["seconds"] >= 0
                # The model went on after its tool turn, whatever the tool did.
                assert row["turns"][-1] == {"role": "assistant", "text": "#### 5"}
                if reason != ("ok",):
                    assert tool_turns[0]["text"].startswith("error: ")
        benign = by_prompt["benign:"][0]
        assert benign["turns"][1]["text"] == "5" and benign["reward"] == 1.0
        metrics = loop.step_metrics(groups)
        assert metrics["agent/tool_calls_per_sample"] == 1.0
        assert metrics["agent/tool_failed_frac"] == pytest.approx(7 / 8)
        assert set(tree(run_dir)) - set(before) == {"rollouts", "rollouts/step_00000001.jsonl"}
    finally:
        shutil.rmtree(run_dir)


def test_output_is_masked_and_cut_to_the_tool_output_limit():
    plans = {"q:": ["<tool>print('a' * 1000)</tool>", "#### 5"]}
    loop = build_agent_loop(conf(max_tool_output_chars=10), Scripted(plans), MathJudger(), decode, encode=encode)
    (group,) = groups_for(plans, k=1)
    (s,) = asyncio.run(loop.generate_group(group, enable_partial_rollout=True))
    call, output = "<tool>print('a' * 1000)</tool>", "<output>" + "a" * 10 + "</output>"
    assert s.response_text == call + output + "#### 5"
    assert s.response_mask == [1] * len(call) + [0] * len(output) + [1] * (len("#### 5") + 1)
    assert s.extra["tool_results"] == [{"stop": "ok", "seconds": pytest.approx(s.extra["tool_results"][0]["seconds"])}]


def test_the_time_budget_and_the_call_budget_hold_per_sample():
    """Three calls with a 20 s budget: the first is quick (ok), the second never ends by itself and is
    stopped at what is left of the budget (wall_time, not at its own wall_s), the third is not run;
    max_turns=4 allows 3 calls. None depends on the machine's speed: a quick call needs seconds at most,
    the endless one could not end within any budget."""
    quick = "<tool>print(1)</tool>"
    endless = "<tool>import time\ntime.sleep(3600)</tool>"
    plans = {"q:": [quick, endless, quick, "#### 5"]}
    sandbox = SandboxConf(cpu_s=1, wall_s=HANG_S, max_output_bytes=4096)
    loop = build_agent_loop(conf(max_turns=4, tool_budget_s=20, tool_timeout_s=HANG_S, sandbox=sandbox),
                            Scripted(plans), MathJudger(), decode, encode=encode)
    (group,) = groups_for(plans, k=1)
    (s,) = asyncio.run(loop.generate_group(group, enable_partial_rollout=True))
    stops = [r["stop"] for r in s.extra["tool_results"]]
    assert stops == ["ok", "wall_time", "budget"], s.extra["tool_results"]
    first, second, _ = (r["seconds"] for r in s.extra["tool_results"])
    assert 20 - first - 0.01 <= second < HANG_S  # stopped at its share of the budget (ms rounding), not its wall_s
    tools = [t for t in s.extra["turns"] if t["role"] == "tool"]
    assert tools[2]["text"] == "error: this sample's tool time (20 s) is spent"
    assert s.status == Status.COMPLETED and s.response_text.endswith("#### 5")
    # max_turns=2: one call, and the sample ends at the second.
    loop = build_agent_loop(conf(max_turns=2), Scripted({"q:": [quick, quick, "#### 5"]}), MathJudger(), decode,
                            encode=encode)
    (group,) = groups_for({"q:": []}, k=1)
    (s,) = asyncio.run(loop.generate_group(group, enable_partial_rollout=True))
    assert len(s.extra["tool_results"]) == 1 and s.finish_reason == "length"


def test_a_sandbox_that_cannot_start_fails_the_member_not_the_policy():
    """The sandbox itself fails (here its interpreter vanished after the start-up check): the model is shown
    the error as before, and the member is marked as failed for a reason that is not the policy's
    (algo.failed_member_policy), never scored as a wrong answer; a call whose code fails is the code's."""
    from dataclasses import replace

    plans = {"broken:": ["<tool>print(2 + 3)</tool>", "#### 5"]}
    loop = build_agent_loop(conf(), Scripted(plans), MathJudger(), decode, encode=encode)
    tool = loop.tools["python"]
    tool.conf = replace(tool.conf, isolation="rlimits", python="/nonexistent/python3", warm=0)
    (group,) = groups_for(plans, k=2)
    done = asyncio.run(loop.generate_group(group, enable_partial_rollout=True))
    for s in done:
        assert s.extra["tool_results"][0]["stop"] == "sandbox_error"
        assert "sandbox_error" in s.extra["infra_failure"] and s.status == Status.COMPLETED
    plans = {"raises:": ["<tool>raise ValueError('x')</tool>", "#### 5"]}
    loop = build_agent_loop(conf(), Scripted(plans), MathJudger(), decode, encode=encode)
    (group,) = groups_for(plans, k=1)
    (s,) = asyncio.run(loop.generate_group(group, enable_partial_rollout=True))
    assert s.extra["tool_results"][0]["stop"] == "error" and "infra_failure" not in s.extra
