"""judger=llm with its judge engine on vLLM (`judger.engine=vllm`), for real, in .venv-vllm.

One vLLM start for the module: a 2-step `train.py` run (policy on engine=hf, the judge on its
own vLLM engine; the tiny arithmetic model judges, as JUDGE in test_learned_judgers.py). The
rewards it logged are then checked against the same judger on engine=hf, scoring the same
prompts and responses: greedy on both engines, so every parsed score, every unparseable
answer (scored 0 with on_timeout=zero, counted as judge/unparseable) must be the same.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from rlharness.config.schema import LLMJudgerConf
from rlharness.judger import build_judger
from rlharness.core.run_dir import RunDir
from rlharness.core.types import Group, RolloutState, Status

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

# The judge shown "<response>+000=" writes digits; only answers of 3+ digits parse (the rest are
# unparseable and score 0), so the run has both kinds.
TEMPLATE = "{{ response }}+000="
PATTERN = r"^(\d\d\d+)"
JUDGE = ["judger=llm", "judger.engine=vllm", "judger.path=assets/tiny-arith", f"judger.template='{TEMPLATE}'",
         f"judger.score_pattern='{PATTERN}'", "judger.max_tokens=4", "judger.reward_scale=1.0",
         "judger.on_timeout=zero"]


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory):
    from tests.helpers import QUICK, run_in_process

    run_dir = tmp_path_factory.mktemp("llm_vllm") / "run"
    said, logger = Said(), logging.getLogger("rlharness.judger.llm")
    level = logger.level
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    try:
        run_in_process(run_dir, [*QUICK, "batch_size=2", "total_steps=2", "eval_every=0", "save_every=0", *JUDGE])
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
    rd = RunDir(run_dir)
    rows = [json.loads(line) for line in rd.metrics.read_text().splitlines()]
    samples = [json.loads(line) for path in sorted(rd.rollouts.glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    return said.lines, rows, samples


class Said(logging.Handler):
    """What the judger logged during the run (an in-process run has no train.log)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_run_with_a_vllm_judge_trains_and_logs_judge_metrics(judged_run):
    said, rows, samples = judged_run
    trained = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in trained] == [1, 2]
    assert sum(r["judge/judge_requests"] for r in trained) == len(samples) == 16  # 2 steps x 2 prompts x 4
    assert all(r["judge/groups_failed"] == 0 and r["judge/timeouts"] == 0 for r in trained)
    assert "judger llm: engine=vllm (VLLMEngine) with assets/tiny-arith" in said  # the judge's engine was vLLM


def test_the_vllm_judge_scores_as_the_hf_judge_and_counts_unparseable(judged_run):
    _, rows, samples = judged_run
    conf = LLMJudgerConf(path="assets/tiny-arith", engine="hf", template=TEMPLATE, score_pattern=PATTERN,
                         max_tokens=4, reward_scale=1.0, on_timeout="zero")
    reference = build_judger(conf)
    states = [RolloutState(uid=s["uid"], group_id=s["group_id"], task=s["task"], prompt_index=s["prompt_index"],
                           epoch=s["epoch"], prompt_text=s["prompt"], prompt_ids=[], label={},
                           response_text=s["response"]) for s in samples]

    async def go():
        try:  # every trained sample in one call: the judge scores each member's own prompt and response
            return await reference.judge_group(Group("all", "arithmetic", 0, 0, "", {}, states), 120.0)
        finally:
            await reference.close()

    expected = asyncio.run(go())
    assert all(s.status is not Status.FAILED for s in expected)
    assert [s["reward"] for s in samples] == [s.reward["score"] for s in expected]
    unparseable = reference.stats()["unparseable"]
    assert 0 < unparseable < len(samples), [s["response"] for s in samples]  # both kinds were judged
    assert sum(r["judge/unparseable"] for r in rows) == unparseable
    assert sum(r["judge/scored_zero_on_timeout"] for r in rows) == unparseable
