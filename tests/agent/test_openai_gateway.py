"""agent=openai_gateway: an `openai.AsyncOpenAI` agent program (in an agent process) against the local
gateway, backed by the real hf engine and the embedded chat model (assets/tiny-chat): the trajectories
it records, the API errors it answers, pauses mid-call, agents that crash or hang, and the command line.
Hostile programs, request bounds, parallel calls and the other APIs have test files of their own
(test_gateway_*.py)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from rlharness.agent.gateway_render import ToolMarkers, render
from rlharness.config.schema import MultiTurnToolAgentConf, SamplingConf
from rlharness.engine.hf import HFEngine
from rlharness.core.run_dir import RunDir
from rlharness.core.types import Status
from tests.agent import gateway_agents
from tests.agent.gateway_helpers import (AGENTS, ASSET, DECODE, ENCODE, ROWS, TOK, gateway, group_of, make_loop,  # noqa: F401
                                         model, run_groups)
from tests.helpers import run_cli

pytestmark = pytest.mark.timeout(240)


# ----------------------------------------------------------------------------- trajectories
def test_the_example_agent_trains_exactly_what_the_built_in_tool_loop_does(model):
    """examples/gateway_calculator_agent.py through the gateway, 4 members at once, each in its own
    process: prompt ids, model tokens, masked tool tokens, log-probs, versions and rewards are those of
    agent=multi_turn_tool on the same seeds (token-in/token-out: the second call reuses the model's own
    tokens as its prefix, never a re-tokenisation), and the re-rendered conversation shows no drift."""
    gl, gateway_groups = run_groups(model, gateway("examples.gateway_calculator_agent:run"),
                                    [group_of(2, 4)])
    _, tool_groups = run_groups(model, MultiTurnToolAgentConf(sampling=SamplingConf(max_tokens=40), max_turns=2),
                                [group_of(2, 4, templated=True)])
    called = 0
    for g, t in zip(gateway_groups, tool_groups):
        assert g.status == Status.COMPLETED
        for s, m in zip(g, t):
            assert s.prompt_ids == m.prompt_ids and s.response_ids == m.response_ids
            # Log-probs to float noise: the engine batched other members alongside (another batch shape).
            assert s.response_mask == m.loss_mask() and s.response_logprobs == pytest.approx(m.response_logprobs, abs=1e-5)
            assert s.response_model_steps == m.response_model_steps and s.reward == m.reward
            assert s.extra["prefix_mismatch"] == 0 and s.extra["segments"] == 1 and "branches" not in s.extra
            assert s.extra["calls"] == 1 + s.extra["tool_calls"] and s.extra["tool_calls"] == m.extra["tool_calls"]
            assert "infra_failure" not in s.extra
            if not m.extra["tool_calls"]:
                assert "token_drift" not in s.extra
            else:
                called += 1
                # The audit finds where incremental tokens differ from the re-rendered whole: the tool output
                # inserted after `</tool>` starts with the token `<output`, the whole text splits `><` first.
                drift = s.extra["token_drift"]
                assert drift["segment"] == 0 and drift["role"] == "assistant" and drift["in"] == "inserted"
                assert drift["trained_text"] == "<output" and drift["rendered_text"] == "<"
                tool_out = [t["text"] for t in m.extra["turns"] if t["role"] == "tool"]
                assert [t["text"] for t in s.extra["turns"] if t["role"] == "tool"] == tool_out
                assert [t["role"] for t in s.extra["turns"]] == ["user", "assistant", "tool", "assistant"]
    assert called >= 2  # the comparison covered tool calls (masked outputs, a second call)
    metrics = gl.step_metrics(gateway_groups)
    assert metrics["agent/calls_per_sample"] == sum(s.extra["calls"] for g in gateway_groups for s in g) / 4
    assert metrics["agent/prefix_mismatch"] == 0 and metrics["agent/token_drift_frac"] == called / 4
    assert metrics["agent/segments_per_sample"] == 1


def test_an_edited_history_branches_at_the_last_place_it_agrees_and_both_sequences_are_trained(model):
    """The second call sends back an assistant message other than the one the model wrote: it continues
    from the end of the first call's prompt (a branch), the first call's tokens stay trained as the
    sample's own row, and no token is trained twice."""
    loop, (g,) = run_groups(model, gateway(AGENTS + "edits_history"), [group_of(2, 2)])
    assert g.status == Status.COMPLETED
    markers = ToolMarkers("<tool>", "</tool>", "<output>", "</output>")
    for s in g:
        messages = gateway_agents.seen(s.uid)["messages"]
        assert s.extra["prefix_mismatch"] == 0 and s.extra["segments"] == 2 and s.extra["calls"] == 2
        first_prompt = ENCODE(render(TOK, messages[:1], None, markers))
        assert s.prompt_ids == first_prompt and 0 < len(s.response_ids) <= 6
        (branch,) = s.extra["branches"]
        # The branch: the first prompt's tokens, then the edited turns (masked), then only its own sample.
        assert branch["prompt_ids"] == first_prompt
        full = branch["prompt_ids"] + branch["response_ids"]
        assert full[: len(ENCODE(render(TOK, messages, None, markers)))] == ENCODE(render(TOK, messages, None, markers))
        assert 0 < sum(branch["response_mask"]) <= 6
        assert [t["role"] for t in s.extra["turns"]] == ["user", "assistant", "user", "assistant", "user",
                                                         "assistant"]
    assert loop.step_metrics([g])["agent/segments_per_sample"] == 2


def test_the_completions_endpoint_continues_its_own_text(model):
    _, (g,) = run_groups(model, gateway(AGENTS + "completes_text"), [group_of(3, 2)])
    for s in g:
        assert s.status == Status.COMPLETED and s.extra["prefix_mismatch"] == 0 and s.extra["calls"] == 2
        assert s.prompt_ids == ENCODE(ROWS[3]["question"]) and s.response_mask == [1] * len(s.response_ids)
        assert DECODE(s.response_ids) == "".join(gateway_agents.seen(s.uid)["texts"])


def test_a_plain_def_program_runs_with_the_synchronous_client(model):
    _, (g,) = run_groups(model, gateway(AGENTS + "plain_def"), [group_of(0, 2)])
    for s in g:
        assert s.status == Status.COMPLETED and "infra_failure" not in s.extra
        assert 0 < len(s.response_ids) <= 5 and s.extra["calls"] == 1


# ----------------------------------------------------------------------------- bad requests
def test_refused_requests_get_openai_errors_and_the_rollout_goes_on(model):
    """Every field that would be silently ignored is refused (400) and named; malformed bodies are 400
    and an oversized one 413, never 500; the served call after them is the only one recorded."""
    loop, (g,) = run_groups(model, gateway(AGENTS + "refused_then_served"), [group_of(1, 2)])
    seen = gateway_agents.seen(g.samples[0].uid)
    status = {name: code for name, (code, _) in seen["status"].items()}
    assert status == {"model": 404, "temperature": 400, "temperature_nan": 400, "n": 400, "max_tokens": 400,
                      "stream": 400, "top_p": 400, "top_k": 400, "min_p": 400, "repetition_penalty": 400,
                      "stop": 400, "seed": 400, "logprobs": 400, "unknown": 400, "special_token": 400,
                      "malformed": 400, "not_utf8": 400, "surrogate": 400, "deep": 400, "too_large": 413,
                      "rollout": 404}
    body = {name: b for name, (_, b) in seen["status"].items()}
    assert body["stop"]["param"] == "stop" and body["top_k"]["param"] == "top_k"  # the client's exc.body: the error
    assert body["unknown"]["code"] == "unsupported_parameter" and body["unknown"]["param"] == "guided_json"
    assert body["special_token"]["code"] == "special_token_in_content" and "<|im_end|>" in body["special_token"]["message"]
    assert body["temperature_nan"]["error"]["param"] == "temperature"
    for name in ("malformed", "not_utf8", "surrogate", "deep"):
        assert body[name]["error"]["type"] == "invalid_request_error" and body[name]["error"]["code"] == "malformed_json"
    assert body["too_large"]["error"]["code"] == "request_too_large"
    assert seen["models"] == ["policy"]
    assert seen["finish_reason"] in ("stop", "length") and seen["usage"]["completion_tokens"] <= 8
    for s in g:  # only the served call is recorded and trained
        assert s.status == Status.COMPLETED and s.extra["calls"] == 1 and 0 < len(s.response_ids) <= 8
        assert [t["role"] for t in s.extra["turns"]] == ["user", "assistant"]
    assert loop.step_metrics([g])["agent/requests_refused"] == 2 * (len(status) - 1)  # the unknown route: no owner
    assert loop.step_metrics([g])["agent/requests_refused"] == 0  # counted once


# ----------------------------------------------------------------------------- pause mid-call
def test_a_pause_mid_call_parks_it_and_the_continued_group_finishes_it_on_new_weights(model):
    """The engine aborts a call half-way (a weight sync); the group comes back ABORTED with the
    tokens so far; continued after new weights (version 1) the same agent's call goes on: its
    tokens are those of an uninterrupted run (draws are seeded by position), the first ones of
    version 0, the rest of version 1, and the agent saw one call."""
    conf = gateway(AGENTS + "one_call")
    _, (ref,) = run_groups(model, conf, [group_of(0, 1)])
    forwards, at_fourth, resume = [0], threading.Event(), threading.Event()

    def hold_at_the_fourth(_module, _args):  # the engine thread: its 4th forward waits for the test
        forwards[0] += 1
        if forwards[0] == 4:  # prefill + 3 tokens of the served call
            at_fourth.set()
            resume.wait()

    handle = model.register_forward_pre_hook(hold_at_the_fourth)

    async def go():
        engine = HFEngine.from_model(model, TOK)
        loop = make_loop(conf, engine)
        try:
            group = group_of(0, 1)
            task = asyncio.create_task(loop.generate_group(group, enable_partial_rollout=True))
            await asyncio.to_thread(at_fourth.wait)
            # The pause's abort is queued while the engine is held mid-call: it lands after this forward
            # on any machine (the engine takes commands between forwards).
            queued = engine._inbox.qsize()
            pause = asyncio.create_task(loop.pause())
            while engine._inbox.qsize() == queued:
                await asyncio.sleep(0)
            resume.set()
            await pause
            first = await task
            snapshot = [s.clone() for s in first]
            await engine.load_weights(dict(model.state_dict()), version=1)
            return snapshot, await loop.generate_group(first, enable_partial_rollout=True)
        finally:
            resume.set()
            await loop.close()
            await engine.close()

    try:
        (a,), (s,) = asyncio.run(go())
    finally:
        handle.remove()
    r = ref.samples[0]
    n = len(a.response_ids)
    assert a.status == Status.ABORTED and a.num_aborts == 1 and 0 < n < len(r.response_ids)
    assert set(a.response_model_steps) == {0}
    assert s.status == Status.COMPLETED and s.response_ids == r.response_ids and s.prompt_ids == r.prompt_ids
    assert s.response_model_steps[:n] == a.response_model_steps and set(s.response_model_steps[n:]) == {1}
    assert s.extra["calls"] == 1 and s.response_text == r.response_text  # one call, the whole text


# ----------------------------------------------------------------------------- failing agents
def test_a_crashing_agent_fails_its_member_with_the_reason_and_its_traceback(model):
    """Not the policy's fault: the member keeps COMPLETED, carries the reason and the program's own
    traceback (for its ledger row), and scores nothing; the group's other members are unaffected."""
    _, (g,) = run_groups(model, gateway(AGENTS + "crashes"), [group_of(0, 2)])
    for s in g:
        assert s.status == Status.COMPLETED and "raised RuntimeError: the agent's own bug" in s.extra["infra_failure"]
        assert "Traceback" in s.extra["agent_traceback"] and "gateway_agents.py" in s.extra["agent_traceback"]
        assert s.response_text == ""


def test_a_hanging_agent_is_stopped_at_its_timeout_and_its_process_killed(model):
    loop, (g,) = run_groups(model, gateway(AGENTS + "hangs", timeout_s=1.0), [group_of(0, 2)])
    for s in g:
        assert "did not finish within agent.timeout_s=1" in s.extra["infra_failure"]
        assert 0 < len(s.response_ids) <= 4  # its call is recorded (masked in training, not lost)
    assert not loop._sessions and loop.hub is None  # nothing left running; the gateway closed with the loop


@pytest.mark.parametrize("limit", [1, 3])
def test_agent_programs_run_at_most_max_concurrency_at_once(model, limit):
    gateway_agents.company(expect=limit)
    _, (g,) = run_groups(model, gateway(AGENTS + "counts_company", max_concurrency=limit), [group_of(0, 3)])
    assert all(s.status == Status.COMPLETED and "infra_failure" not in s.extra for s in g)
    assert gateway_agents.company()["most"] == limit


def test_loops_of_one_event_loop_share_one_server_started_once(model):
    """Several groups and two loops starting at the same moment: one listener, closed with the last loop."""
    async def go():
        engine = HFEngine.from_model(model, TOK)
        loops = [make_loop(gateway(AGENTS + "one_call"), engine) for _ in range(2)]
        try:
            await asyncio.gather(*(lp.generate_group(group_of(i, 2), enable_partial_rollout=True)
                                   for i in range(3) for lp in loops))
            hubs = {id(lp.hub) for lp in loops}
            server = loops[0].hub.server
            assert len(hubs) == 1 and len(server._runner.addresses) == 1
            await loops[0].close()
            assert server._runner is not None  # the other loop still uses it
        finally:
            await loops[1].close()
            await engine.close()
        return server

    assert asyncio.run(go())._runner is None


# ----------------------------------------------------------------------------- the command line
def test_a_run_with_a_crashing_agent_ledgers_every_sample(tmp_path):
    """train.py with an agent that crashes on one of the two training prompts: that prompt's groups have
    no valid member left (algo.failed_member_policy=mask) and are in rollouts/dropped.jsonl with the
    reason and the program's traceback, counted; the other prompt's groups are trained with their calls
    in `turns`; nothing is lost, and the run ends 0."""
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "CRASH: what is 2 * 3?", "answer": "#### 6"}) + "\n"
                    + json.dumps(ROWS[0]) + "\n")
    run = tmp_path / "run"
    proc = run_cli(["experiment=gateway_tools", f"agent.entrypoint={AGENTS}crashes_on_marked_prompts",
                    f"task.path={data}", f"task.eval_path={ASSET / 'data' / 'tools_eval.jsonl'}", "eval.num_prompts=2",
                    "total_steps=1", "batch_size=2", "sampler.prompt_repeat_k=2", "eval_every=0",
                    "logger.mode=disabled", f"hydra.run.dir={run}"], cwd=tmp_path)
    assert proc.returncode == 0
    trained = [json.loads(line) for line in RunDir(run).rollout(1).read_text().splitlines()]
    dropped = [json.loads(line) for line in RunDir(run).dropped.read_text().splitlines()]
    assert len(trained) == 4 and all(r["prompt_index"] == 1 and r["turns"] for r in trained)
    assert dropped and len(dropped) % 2 == 0  # whole groups
    assert all(r["prompt_index"] == 0 and "the agent's own bug on prompt 0" in r["reason"] for r in dropped)
    assert all("Traceback" in r["agent_traceback"] for r in dropped)
    assert "Traceback" not in proc.stderr  # the programs' tracebacks go to the ledger, not the console
    metrics = [json.loads(line) for line in RunDir(run).metrics.read_text().splitlines()]
    step = next(m for m in metrics if "agent/calls_per_sample" in m)
    assert step["agent/calls_per_sample"] >= 1 and step["rollout/groups_failed"] == len(dropped) // 2
    assert step["rollout/members_failed_infra"] == len(dropped) and 0 <= step["agent/token_drift_frac"] <= 1


@pytest.mark.parametrize("overrides, says", [
    (["agent.entrypoint=no_such_pkg.agent:run"], "does not import"),
    ([f"agent.entrypoint={AGENTS}not_callable"], "not a callable"),
    ([f"agent.entrypoint={AGENTS}AClass"], "is a class"),
    ([f"agent.entrypoint={AGENTS}wrong_signature"], "cannot be called as fn(row, client)"),
    (["agent.entrypoint=os:system"], "is a builtin"),
    (["agent.entrypoint=just_a_module"], "expected module:function"),
    (["agent.client=claude"], "agent.client"),
    (["model=default"], "has no chat template"),  # the tiny character model: nothing to render messages with
])
def test_an_agent_that_cannot_run_is_refused_in_one_line_before_start(tmp_path, overrides, says):
    run = tmp_path / "run"
    proc = run_cli(["experiment=gateway_tools", *overrides, f"hydra.run.dir={run}"], cwd=tmp_path, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: agent")
    assert says in lines[0] and not run.exists()
