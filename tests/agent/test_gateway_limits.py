"""Every request is bounded before it reaches the engine, and every sample by one budget (agent=openai_gateway).

The embedded chat model has 256 positions. A 600 KB prompt is refused (400, OpenAI's
`context_length_exceeded`) without being tokenised and the engine serves the next call; a call
whose prompt plus `max_tokens` passes the positions is refused; one sample's calls share
`agent.max_total_tokens` (default the task's `agent.sampling.max_tokens`) whether they grow one
conversation or start fresh ones, and nothing longer than the model's context is trained.
"""

from __future__ import annotations

import pytest

from rlharness.core.types import Status
from rlharness.trainer.batch import training_rows
from tests.agent import gateway_agents
from tests.agent.gateway_helpers import AGENTS, gateway, group_asking, group_of, model, run_groups  # noqa: F401

pytestmark = pytest.mark.timeout(300)
POSITIONS = 256


def _response_tokens(s) -> int:
    return sum(len(ids) for _, ids, *_ in training_rows(s))


def test_a_huge_prompt_is_refused_before_the_engine_and_the_engine_serves_on(model):
    _, (g,) = run_groups(model, gateway(AGENTS + "huge_prompt"), [group_of(0, 2)])
    for s in g:
        seen = gateway_agents.seen(s.uid)
        status, body = seen["huge"]
        assert status == 400 and body["code"] == "context_length_exceeded" and "256 tokens" in body["message"]
        assert seen["after"] in ("stop", "length") and s.status == Status.COMPLETED and "infra_failure" not in s.extra
        assert s.extra["calls"] == 1 and 0 < len(s.response_ids) <= 4


def test_prompt_plus_max_tokens_past_the_positions_is_refused(model):
    """`max_tokens` within the budget but past what the context has left: OpenAI's 400."""
    conf = gateway(AGENTS + "asks_past_context", max_total_tokens=1000)
    conf.sampling.max_tokens = 300  # a call that asks for none gets this, cut to the positions left
    _, (g,) = run_groups(model, conf, [group_of(0, 2)])
    for s in g:
        status, body = gateway_agents.seen(s.uid)["past"]
        assert status == 400 and body["code"] == "context_length_exceeded" and "250 of max_tokens" in body["message"]
        assert s.status == Status.COMPLETED and s.extra["calls"] == 1
        assert len(s.prompt_ids) + len(s.response_ids) <= POSITIONS


@pytest.mark.parametrize("entrypoint", ["long_conversation", "fresh_conversations"])
def test_one_budget_covers_every_call_of_a_sample(model, entrypoint):
    """150 calls on one growing conversation (2,110 tokens were trained against a budget of 40), or 30
    fresh conversations (400-600 generated): every sequence of the sample together stays within 40
    response tokens, each within the model's positions; the calls past the budget are refused (400)
    and the sample ends, cut by its budget."""
    _, (g,) = run_groups(model, gateway(AGENTS + entrypoint), [group_of(1, 2)])
    for s in g:
        refused = gateway_agents.seen(s.uid)["refused"]
        assert s.status == Status.COMPLETED and "infra_failure" not in s.extra
        assert 0 < _response_tokens(s) <= 40 and s.finish_reason == "length"
        assert all(len(p) + len(r) <= POSITIONS for p, r, *_ in training_rows(s))
        assert refused and all((c[0] if isinstance(c, list) else c) == 400 for c in refused)
        assert s.extra["calls"] + len(refused) == (150 if entrypoint == "long_conversation" else 30)


def test_max_total_tokens_raises_the_budget_of_a_sample(model):
    _, (g,) = run_groups(model, gateway(AGENTS + "fresh_conversations", max_total_tokens=120), [group_of(1, 2)])
    for s in g:
        assert 40 < _response_tokens(s) <= 120 and s.extra["segments"] >= 3
