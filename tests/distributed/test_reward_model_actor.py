"""judger=reward_model on Ray (mode=disagg): the model is an actor in a placement group of its own and
scores what the local process would."""

from __future__ import annotations

import pytest

from rlharness.config.schema import RewardModelJudgerConf
from rlharness.judger import build_judger
from rlharness.judger.reward_model import _RayScorer
from tests.judger.test_learned_judgers import PAIRS, group, judge, reference_logits, save_classifier

pytestmark = [pytest.mark.timeout(300)]


def test_reward_model_is_a_ray_actor_with_its_own_placement_when_ray_is_up(ray_session, tmp_path):
    rm = save_classifier(tmp_path / "rm")
    judger = build_judger(RewardModelJudgerConf(path=str(rm), batch_size=4, num_cpus=1, reward_scale=3.0))

    async def kind():
        return type((await judger._scorer()).scorer)

    import asyncio

    assert asyncio.run(kind()) is _RayScorer
    assert judger.__dict__["_pool"].scorer.placement_group is not None
    out = judge(judger, group(PAIRS))
    expected = [3.0 * float(x[0]) for x in reference_logits(rm, [p + r for p, r in PAIRS])]
    assert [s.reward["score"] for s in out] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert "_pool" not in judger.__dict__  # closed: actor and placement group gone
