"""Judger.judge_group: cheap rules are scored inline (no worker thread); the rest keeps the thread and timeout."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from rlharness.config.schema import RouterJudgerConf
from rlharness.judger.base import Judger
from rlharness.judger.countdown import CountdownJudger
from rlharness.judger.format import FormatJudger
from rlharness.judger.math import MathJudger
from rlharness.judger.remote import RemoteJudger
from rlharness.judger.router import RouterJudger
from rlharness.core.types import Status, make_group
from tests.helpers import HANG_S


def _group(texts: list[str], label: dict[str, Any]):
    group = make_group(task="t", prompt_index=0, epoch=0, prompt_text="p", prompt_ids=[1], label=label, k=len(texts))
    for s, text in zip(group, texts):
        s.response_text, s.status = text, Status.COMPLETED
    return group


class _ThreadRecorder(Judger):
    """Scores len(text) % 2; `inline` decides which texts score_inline answers. Records the threads used."""

    name = "recorder"

    def __init__(self, inline: bool, hold: threading.Event | None = None, raise_inline: bool = False):
        self.inline, self.hold, self.raise_inline = inline, hold, raise_inline
        self.score_threads: list[int] = []

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        self.score_threads.append(threading.get_ident())
        if self.hold is not None:  # a stuck scorer: it returns only once the test lets it
            self.hold.wait()
        return {"score": float(len(response_text) % 2)}

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        if self.raise_inline:
            raise ValueError("bad label")
        return {"score": float(len(response_text) % 2)} if self.inline else None


def test_an_inline_judger_never_uses_a_worker_thread():
    j = _ThreadRecorder(inline=True)
    group = asyncio.run(j.judge_group(_group(["a", "ab"], {}), timeout_s=5))
    assert [s.reward for s in group] == [{"score": 1.0}, {"score": 0.0}]
    assert j.score_threads == []  # `score` (the thread path) was never called


def test_a_judger_without_an_inline_answer_scores_in_a_worker_thread():
    j = _ThreadRecorder(inline=False)
    group = asyncio.run(j.judge_group(_group(["a", "ab"], {}), timeout_s=HANG_S))
    assert [s.reward["score"] for s in group] == [1.0, 0.0]
    assert j.score_threads and all(t != threading.get_ident() for t in j.score_threads)


@pytest.mark.timeout(30)
def test_the_thread_path_keeps_its_timeout_and_fails_the_member():
    """Past its timeout the member failed for a reason that is not the policy's (algo.failed_member_policy)."""
    hold = threading.Event()
    j = _ThreadRecorder(inline=False, hold=hold)

    async def main():
        try:
            return await j.judge_group(_group(["a"], {}), timeout_s=0.05)
        finally:
            hold.set()  # the abandoned thread ends, so the loop's executor can shut down

    group = asyncio.run(main())
    assert group.status == Status.COMPLETED and group.samples[0].extra["infra_failure"].endswith("timeout")


def test_an_inline_raise_fails_the_group_with_the_reason():
    group = asyncio.run(_ThreadRecorder(inline=True, raise_inline=True).judge_group(_group(["a", "b"], {}), 5))
    assert all(s.status == Status.FAILED for s in group)
    assert group.drop_reason == "judger recorder: ValueError: bad label"


def test_math_judger_answers_plain_numbers_inline_and_defers_expressions_to_math_verify():
    j = MathJudger()
    assert j.score_inline("so the answer is 1,234", {"answer": "1234"}) == {"score": 1.0}
    assert j.score_inline("#### 7", {"answer": "8"}) == {"score": 0.0}
    assert j.score_inline("no number here", {"answer": "8"}) == {"score": 0.0}
    assert j.score_inline("\\boxed{\\frac{1}{2}}", {"answer": "0.5"}) is None  # needs math-verify
    with pytest.raises(KeyError, match="answer"):
        j.score_inline("3", {"target": 3})
    # Mixed group: plain members inline, the expression on the thread; all scored like `score`.
    texts = ["\\boxed{\\frac{1}{2}}", "0.5", "0.25"]
    group = asyncio.run(j.judge_group(_group(texts, {"answer": "0.5"}), timeout_s=HANG_S))
    assert [s.reward["score"] for s in group] == [j.score(t, {"answer": "0.5"})["score"] for t in texts] == [1.0, 1.0, 0.0]


def test_rule_judgers_inline_answers_agree_with_score():
    cd, fm = CountdownJudger(), FormatJudger()
    label = {"numbers": [3, 5, 7], "target": 56}
    for text in ["(3+5)*7", "3+5", "(3+5)*7=56", "x"]:
        assert cd.score_inline(text, label) == cd.score(text, label)
        assert fm.score_inline(text, {}) == fm.score(text, {})


def test_router_is_inline_only_when_every_part_is():
    label = {"answer": "0.5"}
    r = RouterJudger(RouterJudgerConf(weights={"math": 1.0, "format": 0.5}, format_pattern=r".*"))
    assert r.score_inline("0.5", label) == r.score("0.5", label) == {"score": 1.5, "math": 1.0, "format": 1.0}
    assert r.score_inline("\\boxed{\\frac{1}{2}}", label) is None


def test_remote_judger_is_never_inline():
    from rlharness.config.schema import RemoteJudgerConf

    assert RemoteJudger(RemoteJudgerConf(url="http://127.0.0.1:9/judge")).score_inline("3", {"answer": "3"}) is None
