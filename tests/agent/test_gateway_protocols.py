"""The Anthropic Messages API and the OpenAI Responses API beside chat completions (agent=openai_gateway),
driven by the real `anthropic` and `openai` client packages.

The calculator agent written three ways (examples/gateway_calculator_agent.py, gateway_anthropic_agent.py,
gateway_responses_agent.py) trains the same tokens on the same seeds: the APIs differ only in how the
conversation travels, never in what is rendered or sampled.
"""

from __future__ import annotations

import pytest

from rlharness.core.types import Status
from tests.agent import gateway_agents
from tests.agent.gateway_helpers import AGENTS, gateway, group_of, model, run_groups  # noqa: F401

pytestmark = pytest.mark.timeout(300)


def _trained(groups):
    return [(s.prompt_ids, s.response_ids, s.loss_mask(), s.extra["tool_calls"], s.reward) for g in groups for s in g]


def test_the_calculator_agent_trains_the_same_tokens_through_every_api(model):
    runs = {}
    for name, client in (("gateway_calculator_agent", "openai"), ("gateway_anthropic_agent", "anthropic"),
                         ("gateway_responses_agent", "openai")):
        _, groups = run_groups(model, gateway(f"examples.{name}:run", client=client), [group_of(2, 3), group_of(3, 3)])
        assert all(g.status == Status.COMPLETED for g in groups)
        assert not any("infra_failure" in s.extra for g in groups for s in g), [s.extra for g in groups for s in g]
        runs[name] = _trained(groups)
    assert any(calls for *_, calls, _ in runs["gateway_calculator_agent"])  # tool calls went both ways
    assert runs["gateway_anthropic_agent"] == runs["gateway_calculator_agent"]
    assert runs["gateway_responses_agent"] == runs["gateway_calculator_agent"]


def test_a_synchronous_anthropic_program_gets_messages_api_replies_and_errors(model):
    _, (g,) = run_groups(model, gateway(AGENTS + "anthropic_plain_def", client="anthropic"), [group_of(0, 2)])
    for s in g:
        seen = gateway_agents.seen(s.uid)
        status, body = seen["refused"]
        assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert "stop_sequences=['\\n']" in body["error"]["message"]
        assert seen["stop_reason"] in ("end_turn", "max_tokens") and seen["kinds"] == ["text"]
        assert seen["usage"]["output_tokens"] == len(s.response_ids) <= 8
        assert s.status == Status.COMPLETED and s.extra["calls"] == 1


def test_the_responses_api_refuses_what_it_cannot_honour(model):
    _, (g,) = run_groups(model, gateway(AGENTS + "responses_refusals"), [group_of(0, 2)])
    for s in g:
        seen = gateway_agents.seen(s.uid)
        assert {k: v[0] for k, v in seen["status"].items()} == {"previous": 400, "top_p": 400, "builtin_tool": 400}
        assert seen["status"]["previous"][1]["param"] == "previous_response_id"
        assert seen["state"] in ("completed", "incomplete") and seen["usage"]["output_tokens"] <= 6
        assert s.status == Status.COMPLETED and s.extra["calls"] == 1
