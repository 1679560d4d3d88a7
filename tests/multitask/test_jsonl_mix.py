"""A jsonl task mixed with a built-in task, each scored by its own judger (real tiny model)."""

from __future__ import annotations

import json
import re

import pytest

from rlharness.logging_utils.ledger import read_ledger
from tests.helpers import QUICK, run_in_process


@pytest.mark.timeout(300)
def test_a_jsonl_task_and_a_builtin_task_train_together_with_their_own_judgers(tmp_path):
    data = tmp_path / "sums.jsonl"
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(100, 120) for b in range(500, 502)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    last = run_in_process(run_dir, [
        *QUICK, "experiment=arith_mix", "total_steps=3", "eval_every=0", "batch_size=6",
        "~tasks.unpadded",  # drop the experiment's second task, mix in the jsonl one instead
        "+task@tasks.sums.task=jsonl", f"tasks.sums.task.path={data}",
        "tasks.sums.task.apply_chat_template=false", "tasks.sums.task.num_eval=16", "tasks.sums.weight=0.5",
        "tasks.padded.weight=0.5", "+judger@tasks.sums.judger=format", "tasks.sums.judger.pattern='[0-9]{3}'"])
    trained, _ = read_ledger(run_dir)
    by_task = {t: [r for r in trained if r["task"] == t] for t in ("padded", "sums")}
    assert {t: len({r["group_id"] for r in rs}) for t, rs in by_task.items()} == {"padded": 9, "sums": 9}
    answers = {r["question"]: r["answer"] for r in rows}
    for r in by_task["sums"]:  # the format judger: any three digits score 1, right or wrong
        assert r["prompt"] in answers
        assert r["reward"] == (1.0 if re.fullmatch(r"[0-9]{3}", r["response"]) else 0.0), r
    assert any(r["reward"] == 1.0 and r["response"] != answers[r["prompt"]] for r in by_task["sums"])
    for r in by_task["padded"]:  # the math judger: the exact sum
        a, b = r["prompt"].rstrip("=").split("+")
        assert r["reward"] == (1.0 if r["response"].strip() == str(int(a) + int(b)) else 0.0), r
    assert "eval/sums/accuracy" in last and "eval/padded/accuracy" in last
