"""Evaluation on the task's held-out split: greedy pass@1, and pass@k when asked.

It talks to the rollout engine directly (eval prompts never enter the producer or
the replay buffer) and scores with the run's judger. A response counts as correct
when its score is at least 1.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Callable

from rlharness.config.schema import EvalConf
from rlharness.data.base import PromptRow
from rlharness.engine.base import GenerateRequest, RolloutEngine, SamplingParams
from rlharness.judger.base import Judger

log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021) from n samples with c correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


class Evaluator:
    def __init__(self, conf: EvalConf, rows: list[PromptRow], encode: Callable[[str], list[int]],
                 engine: RolloutEngine, judger: Judger, max_tokens: int, stop: list[str], seed: int):
        self.conf = conf
        self.rows = rows[: conf.num_prompts]
        self.prompt_ids = [encode(r.prompt_text) for r in self.rows]
        self.engine = engine
        self.judger = judger
        self.max_tokens = conf.max_tokens or max_tokens
        self.stop = list(stop)
        self.seed = seed

    async def _scores(self, sampling: list[SamplingParams], tag: str) -> list[float]:
        results = await asyncio.gather(*(
            self.engine.generate(GenerateRequest(f"eval-{tag}-{i}", ids, sp))
            for i, (ids, sp) in enumerate(zip(self.prompt_ids * (len(sampling) // len(self.rows)), sampling))
        ))
        rows = self.rows * (len(sampling) // len(self.rows))

        def score_all() -> list[float]:
            return [self.judger.score(r.text, row.label)["score"] for r, row in zip(results, rows)]

        return await asyncio.to_thread(score_all)

    async def evaluate(self) -> dict[str, float]:
        greedy = [SamplingParams(max_tokens=self.max_tokens, stop=self.stop, greedy=True) for _ in self.rows]
        scores = await self._scores(greedy, "greedy")
        correct = [s >= 1.0 for s in scores]
        metrics = {"eval/accuracy": sum(correct) / len(correct), "eval/score_mean": sum(scores) / len(scores)}
        k = self.conf.pass_k
        if k > 1:
            sampled = [
                SamplingParams(max_tokens=self.max_tokens, stop=self.stop, temperature=self.conf.temperature,
                               seed=self.seed * 1_000_003 + j * len(self.rows) + i)
                for j in range(k) for i in range(len(self.rows))
            ]
            scores_k = await self._scores(sampled, "passk")
            n = len(self.rows)
            per_prompt = [sum(scores_k[j * n + i] >= 1.0 for j in range(k)) for i in range(n)]
            metrics["eval/pass@k"] = sum(pass_at_k(k, c, k) for c in per_prompt) / n
            metrics["eval/pass@1_sampled"] = sum(pass_at_k(k, c, 1) for c in per_prompt) / n
        return metrics
