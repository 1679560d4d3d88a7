"""Evaluation: avg@n and the unbiased pass@k from n >= k samples, on the real agent loop and sim engine."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from rlharness.agent import build_agent_loop
from rlharness.config.schema import ConfigError, EvalConf, SamplingConf, SimEngineConf, SingleTurnAgentConf
from rlharness.data.base import PromptRow
from rlharness.engine.sim import SimEngine
from rlharness.trainer.evaluator import Evaluator, pass_at_k
from rlharness.judger.base import Judger
from tests.helpers import compose_conf

pytestmark = pytest.mark.timeout(60)


def test_pass_at_k_is_the_combinatorial_estimator():
    # 1 - C(n - c, k) / C(n, k)
    for n, c, k in [(4, 1, 2), (8, 3, 4), (10, 0, 3), (5, 5, 1), (6, 2, 6)]:
        expected = 1.0 - (math.comb(n - c, k) / math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(expected)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


class FirstCCorrect(Judger):
    """Member i of prompt p is correct iff i < p % (n + 1): c_p known for every prompt."""

    name = "first_c"

    def __init__(self, n: int) -> None:
        self.n = n

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        raise NotImplementedError

    async def judge_group(self, group, timeout_s):
        for i, s in enumerate(group):
            s.reward = {"score": float(i < s.prompt_index % (self.n + 1))}
        return group


@pytest.mark.parametrize("n, k", [(4, 2), (6, 6), (5, 1)])
def test_avg_at_n_and_pass_at_k_from_n_samples(n, k):
    engine = SimEngine(SimEngineConf(mean_response_len=3, cv=0.0, time_per_token_s=1e-5, slots=64), seed=0,
                       vocab_size=30)
    judger = FirstCCorrect(n)

    def loop(temperature):
        return build_agent_loop(SingleTurnAgentConf(sampling=SamplingConf(temperature=temperature, max_tokens=4)),
                                engine, judger, lambda ids: " ".join(map(str, ids)))

    rows = [PromptRow(index=i, prompt_text=f"p{i}") for i in range(12)]
    conf = EvalConf(num_prompts=12, num_samples=n if n != k else 0, pass_k=k)
    ev = Evaluator(conf, "t", rows, lambda text: [5, 6], greedy_loop=loop(0.0), sampled_loop=loop(1.0), seed=0)
    metrics = asyncio.run(ev.evaluate())
    cs = [i % (n + 1) for i in range(12)]
    assert metrics["eval/avg@n"] == pytest.approx(sum(c / n for c in cs) / 12)
    assert metrics["eval/pass@k"] == pytest.approx(sum(1 - math.comb(n - c, k) / math.comb(n, k) for c in cs) / 12)
    assert metrics["eval/accuracy"] == pytest.approx(sum(c >= 1 for c in cs) / 12)  # greedy: member 0


def test_eval_settings_are_checked():
    with pytest.raises(ConfigError, match="eval.num_samples=3 .*pass@k needs n >= k"):
        EvalConf(num_samples=3, pass_k=4)
    assert EvalConf(pass_k=4).n == 4 and EvalConf(num_samples=8, pass_k=4).n == 8 and EvalConf().n == 1
    with pytest.raises(ConfigError, match="eval.temperature > 0"):
        compose_conf(["eval.num_samples=4", "eval.temperature=0"])
