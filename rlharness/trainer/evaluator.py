"""Evaluation on the task's held-out split: greedy pass@1, and avg@n / pass@k when asked.

With `eval.num_samples` = n (or `eval.pass_k` = k alone, n = k) each prompt gets n samples
at `eval.temperature`: eval/avg@n is their mean accuracy (the unbiased sampled pass@1)
and eval/pass@k the unbiased estimator 1 - C(n - c, k) / C(n, k) with c correct
(Chen et al. 2021), averaged over prompts. (verl's best@k, a bootstrap maximum, is
biased low; with n = k this estimator is the plain "any of the k correct".)

It runs the same agent loop as training (so a multi-turn tool agent uses its tools
in eval too), with greedy sampling for pass@1 and `eval.temperature` for pass@k,
but never touches the producer or the replay buffer. A response counts as correct
when its score is at least 1. A failed judgement (judger error, timeout, remote
judger down) is never counted as a wrong answer: it is left out of the accuracy and
counted in `eval/judge_failed`; when nothing could be judged, `eval/accuracy` is
absent from the row rather than 0.

After each `evaluate()`, `last_rows` holds what was written: one row per prompt with its
samples, extracted answers and judgements (rlharness/logging_utils/samples.py), for
`evals/step_XXXXXXXX.jsonl` and the W&B eval table.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Callable

from rlharness.agent.base import AgentLoop
from rlharness.core.member_failures import infra_failure
from rlharness.config.schema import EvalConf
from rlharness.data.base import PromptRow
from rlharness.logging_utils.samples import eval_rows
from rlharness.core.types import Group, Status, make_group

log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021) from n samples with c correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def _correct(group: Group) -> list[bool | None]:
    """Per member: correct or not; None where the judgement failed, or the member failed for a reason that
    is not the policy's (an agent program that crashed, the judger's limits): neither right nor wrong."""
    return [None if s.status == Status.FAILED or infra_failure(s) is not None else
            (s.status == Status.COMPLETED and s.reward is not None and s.reward["score"] >= 1.0) for s in group.samples]


def tool_metrics(samples: list) -> dict[str, float]:
    """For a multi-turn tool loop (samples carry `extra["turns"]`): the share of samples that
    ran a tool, and the share where a tool output is exactly the gold answer (the tool was
    asked the right question). Empty for single-turn loops."""
    if not samples or not all("turns" in s.extra for s in samples):
        return {}
    used = sum(s.extra.get("tool_calls", 0) > 0 for s in samples)
    right = sum(any(t["role"] == "tool" and t["text"].strip() == str(s.label.get("answer", "")).strip()
                    for t in s.extra["turns"]) for s in samples)
    return {"eval/tool_use_frac": used / len(samples), "eval/tool_answer_frac": right / len(samples)}


class Evaluator:
    def __init__(self, conf: EvalConf, task: str, rows: list[PromptRow], encode: Callable[[str], list[int]],
                 greedy_loop: AgentLoop, sampled_loop: AgentLoop | None, seed: int):
        self.conf = conf
        self.task = task
        self.rows = rows[: conf.num_prompts]
        self.prompt_ids = [encode(r.prompt_text) for r in self.rows]
        self.greedy_loop = greedy_loop
        self.sampled_loop = sampled_loop
        self.seed = seed
        self.last_rows: list[dict] = []

    def agent_loops(self) -> list[AgentLoop]:
        return [loop for loop in (self.greedy_loop, self.sampled_loop) if loop is not None]

    @property
    def num_prompts(self) -> int:
        return len(self.rows)

    async def _groups(self, loop: AgentLoop, k: int) -> list[Group]:
        groups = [
            make_group(task=self.task, prompt_index=row.index, epoch=-1, prompt_text=row.prompt_text,
                       prompt_ids=ids, label=row.label, k=k, seed=self.seed)
            for row, ids in zip(self.rows, self.prompt_ids)
        ]
        return list(await asyncio.gather(*(loop.generate_group(g, enable_partial_rollout=False) for g in groups)))

    async def evaluate(self) -> dict[str, float]:
        greedy_groups = await self._groups(self.greedy_loop, 1)
        greedy = [_correct(g)[0] for g in greedy_groups]
        judged = [c for c in greedy if c is not None]
        failed = len(greedy) - len(judged)
        metrics: dict[str, float] = {}
        if judged:
            metrics["eval/accuracy"] = sum(judged) / len(judged)
        metrics.update(tool_metrics([s for g in greedy_groups for s in g.samples]))
        n, k = self.conf.n, self.conf.pass_k
        sampled_groups = None
        if self.sampled_loop is not None and n > 1:
            sampled_groups = await self._groups(self.sampled_loop, n)
            sampled = [_correct(g) for g in sampled_groups]
            failed += sum(c.count(None) for c in sampled)
            # Over the samples that were judged: avg over prompts with any, pass@k over those with >= k.
            judged_sets = [[bool(x) for x in c if x is not None] for c in sampled]
            some = [c for c in judged_sets if c]
            if some:
                metrics["eval/avg@n"] = sum(sum(c) / len(c) for c in some) / len(some)
            enough = [c for c in judged_sets if len(c) >= k]
            if enough:
                metrics["eval/pass@k"] = sum(pass_at_k(len(c), sum(c), k) for c in enough) / len(enough)
        metrics["eval/judge_failed"] = float(failed)
        if failed:
            log.warning("eval: %d judgement(s) failed; left out of the accuracy (see eval/judge_failed)", failed)
        self.last_rows = eval_rows(greedy_groups, sampled_groups, self.greedy_loop.judger.extract_answer)
        return metrics


class MultiTaskEvaluator:
    """Every task's evaluator: `eval/<task>/<metric>` per task, and `eval/<metric>` the
    weighted mean over tasks (by the tasks' mix weights), so `eval/accuracy` stays the
    run's headline number. Tasks are evaluated together (one engine batch)."""

    def __init__(self, evaluators: dict[str, Evaluator], weights: dict[str, float]):
        self.evaluators = evaluators
        total = sum(weights.values())
        self.weights = {t: w / total for t, w in weights.items()}

    async def evaluate(self) -> dict[str, float]:
        results = await asyncio.gather(*(e.evaluate() for e in self.evaluators.values()))
        metrics: dict[str, float] = {}
        means: dict[str, float] = {}
        for task, per_task in zip(self.evaluators, results):
            for key, value in per_task.items():
                stage, name = key.split("/", 1)
                metrics[f"{stage}/{task}/{name}"] = value
                means[key] = means.get(key, 0.0) + self.weights[task] * value
        # A mean is known only when every task reported it (a task none of whose answers could be
        # judged has no accuracy); failed judgements add up.
        means = {k: v for k, v in means.items() if all(k in r for r in results)}
        means["eval/judge_failed"] = float(sum(r.get("eval/judge_failed", 0.0) for r in results))
        return {**means, **metrics}

    @property
    def num_prompts(self) -> int:
        return sum(e.num_prompts for e in self.evaluators.values())

    def agent_loops(self) -> list[AgentLoop]:
        return [loop for e in self.evaluators.values() for loop in e.agent_loops()]

    @property
    def last_rows(self) -> list[dict]:
        return [row for e in self.evaluators.values() for row in e.last_rows]
