"""Parallel calls within one rollout (agent=openai_gateway): each call its own token sequence.

Two calls of one agent at once (`asyncio.gather`) were written into the same sequence: call B's
reply held A's text and the step trained with a log-prob gap of 1.42 per token. Now each call
gets a sequence of its own (a branch from the last place its text agrees with one already
held), trained as a row of its own with the sample's reward; every row's rollout log-probs are
the model's own log-probs of that row's tokens in that row's context.
"""

from __future__ import annotations

import json

import pytest
import torch

from rlharness.core.run_dir import RunDir
from rlharness.core.types import Status
from rlharness.trainer.batch import training_rows
from tests.agent import gateway_agents
from tests.agent.gateway_helpers import AGENTS, ASSET, DECODE, ROWS, gateway, group_of, model, run_groups  # noqa: F401
from tests.helpers import run_cli

pytestmark = pytest.mark.timeout(300)


def _teacher_forced_gap(model, rows) -> float:
    """Largest |rollout log-prob - the model's log-prob| over the trained tokens of `rows` (temperature 1)."""
    worst = 0.0
    with torch.no_grad():
        for prompt, ids, logprobs, _, mask in rows:
            seq = torch.tensor([prompt + ids])
            logits = model(seq).logits[0, len(prompt) - 1: len(prompt) + len(ids) - 1].float()
            own = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            for lp, m, o in zip(logprobs, mask, own.tolist()):
                if m:
                    worst = max(worst, abs(lp - o))
    return worst


def test_two_questions_at_once_get_two_sequences_and_the_follow_up_extends_its_own(model):
    _, (g,) = run_groups(model, gateway(AGENTS + "parallel_questions", max_total_tokens=120), [group_of(0, 2)])
    for s in g:
        assert s.status == Status.COMPLETED and "infra_failure" not in s.extra, s.extra
        rows = training_rows(s)
        assert s.extra["segments"] == 2 and len(rows) == 2 and s.extra["calls"] == 3
        texts = gateway_agents.seen(s.uid)["texts"]
        decoded = [DECODE([t for t, m in zip(ids, mask) if m]) for _, ids, _, _, mask in rows]
        # One sequence holds the first answer and its follow-up; the other only the second question's answer.
        assert sorted(decoded) == sorted([texts[0] + texts[2], texts[1]])
        assert _teacher_forced_gap(model, rows) < 1e-5  # each row's log-probs are its own context's


def test_four_samples_of_one_prompt_at_once_are_four_branches_of_one_prompt(model):
    _, (g,) = run_groups(model, gateway(AGENTS + "parallel_samples", max_total_tokens=160), [group_of(1, 2)])
    for s in g:
        rows = training_rows(s)
        assert s.extra["segments"] == 4 and len(rows) == 4 and s.extra["prefix_mismatch"] == 0
        assert all(r[0] == rows[0][0] for r in rows)  # the same prompt, each with its own draws
        texts = gateway_agents.seen(s.uid)["texts"]
        assert sorted(DECODE(ids) for _, ids, *_ in rows) == sorted(texts)
        assert len({tuple(ids) for _, ids, *_ in rows}) > 1  # seeded apart, not four copies of one
        assert sum(len(ids) for _, ids, *_ in rows) <= 160 and _teacher_forced_gap(model, rows) < 1e-5


def test_parallel_calls_share_the_budget_and_a_refused_one_ends_the_sample_as_the_policys(model):
    """Four calls of up to 40 tokens against a budget of 40: the first holds it, the others wait for it and
    get what it left (they were refused at once, and the sample trained nothing); once the budget is spent
    the next is refused (the sample ended at its budget): the program's error after that is not an
    infrastructure failure, and the calls served are trained."""
    _, (g,) = run_groups(model, gateway(AGENTS + "parallel_samples"), [group_of(1, 2)])
    for s in g:
        assert s.status == Status.COMPLETED and "infra_failure" not in s.extra and s.finish_reason == "length"
        rows = training_rows(s)
        assert len(rows) >= 2 and 0 < sum(len(ids) for _, ids, *_ in rows) <= 40, [r[1] for r in rows]
        assert _teacher_forced_gap(model, rows) < 1e-5


def test_a_run_whose_agent_always_calls_in_parallel_trains_at_float32_rounding(tmp_path):
    """train.py with the parallel-samples agent: every sample is trained as four rows, and the on-policy
    step's engine/trainer log-prob gap stays at float32 rounding (it was 1.42 per token)."""
    run = tmp_path / "run"
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    proc = run_cli(["experiment=gateway_tools", f"agent.entrypoint={AGENTS}parallel_samples",
                    "agent.max_total_tokens=160", f"task.path={data}",
                    f"task.eval_path={ASSET / 'data' / 'tools_eval.jsonl'}", "eval.num_prompts=2", "total_steps=1",
                    "batch_size=2", "sampler.prompt_repeat_k=2", "eval_every=0", "logger.mode=disabled",
                    f"hydra.run.dir={run}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = next(json.loads(line) for line in RunDir(run).metrics.read_text().splitlines() if '"train/loss"' in line)
    assert step["rollout/branch_rows"] == 3 * 4 and step["agent/segments_per_sample"] == 4
    assert step["train/logprob_diff_rollout"] < 1e-5
