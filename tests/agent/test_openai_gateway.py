"""agent=openai_gateway: an `openai.AsyncOpenAI` agent program against the local gateway, backed
by the real hf engine and the embedded chat model (assets/tiny-chat): the trajectories it
records, the API errors it answers, pauses mid-call, and agents that crash or hang."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from rlharness.agent import build_agent_loop
from rlharness.agent.gateway_render import ToolMarkers, render
from rlharness.model.load import text_codec
from rlharness.config.schema import (MathJudgerConf, ModelConf, MultiTurnToolAgentConf, OpenAIGatewayAgentConf,
                                     SamplingConf)
from rlharness.engine.hf import HFEngine
from rlharness.judger.math import MathJudger
from rlharness.model.load import PROJECT_ROOT, load_model, load_tokenizer
from rlharness.core.run_dir import RunDir
from rlharness.core.types import Status, make_group
from tests.agent import gateway_agents
from tests.helpers import run_cli

pytestmark = pytest.mark.timeout(240)

ASSET = PROJECT_ROOT / "assets" / "tiny-chat"
MODEL = ModelConf(path=str(ASSET))
TOK = load_tokenizer(MODEL)
ENCODE, DECODE = text_codec(TOK)
ROWS = [json.loads(line) for line in (ASSET / "data" / "tools_train.jsonl").read_text().splitlines()[:4]]
AGENTS = "tests.agent.gateway_agents:"


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL)


def chat(question: str) -> str:
    return TOK.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)


def group_of(i: int, k: int, templated: bool = False):
    q = ROWS[i]["question"]
    return make_group(task="t", prompt_index=i, epoch=0, prompt_text=chat(q) if templated else q,
                      prompt_ids=ENCODE(chat(q)), label={"answer": ROWS[i]["answer"].rsplit("####", 1)[1].strip()},
                      k=k, seed=5)


def gateway(entrypoint: str, **kw) -> OpenAIGatewayAgentConf:
    return OpenAIGatewayAgentConf(entrypoint=entrypoint, sampling=SamplingConf(max_tokens=40), **kw)


def make_loop(conf, engine):
    return build_agent_loop(conf, engine, MathJudger(MathJudgerConf(fallback_last_number=False)), DECODE,
                            encode=lambda t: TOK.encode(t, add_special_tokens=False), tokenizer=TOK)


def run_groups(model, conf, groups):
    async def go():
        engine = HFEngine.from_model(model, TOK)
        loop = make_loop(conf, engine)
        try:
            return loop, [await loop.generate_group(g, enable_partial_rollout=True) for g in groups]
        finally:
            if hasattr(loop, "server"):
                await loop.close()
            await engine.close()
    return asyncio.run(go())


# ----------------------------------------------------------------------------- trajectories
def test_the_example_agent_trains_exactly_what_the_built_in_tool_loop_does(model):
    """examples/gateway_calculator_agent.py through the gateway, 4 members at once:
    prompt ids, model tokens, masked tool tokens, log-probs, versions and rewards are those of
    agent=multi_turn_tool on the same seeds (token-in/token-out: the second call reuses the
    model's own tokens as its prefix, never a re-tokenisation)."""
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
            assert s.extra["prefix_mismatch"] == 0 and s.extra["segments"] == 1
            assert s.extra["calls"] == 1 + s.extra["tool_calls"] and s.extra["tool_calls"] == m.extra["tool_calls"]
            if m.extra["tool_calls"]:
                called += 1
                tool_out = [t["text"] for t in m.extra["turns"] if t["role"] == "tool"]
                assert [t["text"] for t in s.extra["turns"] if t["role"] == "tool"] == tool_out
                assert [t["role"] for t in s.extra["turns"]] == ["user", "assistant", "tool", "assistant"]
    assert called >= 2  # the comparison covered tool calls (masked outputs, a second call)
    metrics = gl.step_metrics(gateway_groups)
    assert metrics["agent/calls_per_sample"] == sum(s.extra["calls"] for g in gateway_groups for s in g) / 4
    assert metrics["agent/prefix_mismatch"] == 0


def test_a_request_that_does_not_extend_the_last_one_starts_a_new_segment(model):
    loop, (g,) = run_groups(model, gateway(AGENTS + "edits_history"), [group_of(2, 2)])
    assert g.status == Status.COMPLETED
    for s in g:
        messages = gateway_agents.SEEN[s.uid]["messages"]
        assert s.extra["prefix_mismatch"] == 1 and s.extra["segments"] == 2 and s.extra["calls"] == 2
        # The trajectory is the second segment: its rendered prompt, then only model tokens.
        assert s.prompt_ids == ENCODE(render(TOK, messages, None, ToolMarkers("<tool>", "</tool>", "<output>",
                                                                               "</output>")))
        assert 0 < len(s.response_ids) <= 6 and s.response_mask == [1] * len(s.response_ids)
        assert [t["role"] for t in s.extra["turns"]] == ["user", "assistant", "user", "assistant", "user",
                                                         "assistant"]
    assert loop.step_metrics([g])["agent/prefix_mismatch"] == 2


def test_the_completions_endpoint_continues_its_own_text(model):
    _, (g,) = run_groups(model, gateway(AGENTS + "completes_text"), [group_of(3, 2)])
    for s in g:
        assert s.status == Status.COMPLETED and s.extra["prefix_mismatch"] == 0 and s.extra["calls"] == 2
        assert s.prompt_ids == ENCODE(ROWS[3]["question"]) and s.response_mask == [1] * len(s.response_ids)
        assert DECODE(s.response_ids) == "".join(gateway_agents.SEEN[s.uid]["texts"])


# ----------------------------------------------------------------------------- bad requests
def test_refused_requests_get_openai_errors_and_the_rollout_goes_on(model):
    loop, (g,) = run_groups(model, gateway(AGENTS + "refused_then_served"), [group_of(1, 2)])
    seen = gateway_agents.SEEN[g.samples[0].uid]
    status = {name: code for name, (code, _) in seen["status"].items()}
    assert status == {"model": 404, "temperature": 400, "n": 400, "max_tokens": 400, "stream": 400,
                      "top_p": 400, "stop": 400, "seed": 400, "logprobs": 400, "malformed": 400, "rollout": 404}
    assert seen["status"]["stop"][1]["param"] == "stop"  # the openai client's exc.body: the error object
    body = seen["status"]["malformed"][1]
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "malformed_json"
    assert seen["models"] == ["policy"]
    assert seen["finish_reason"] in ("stop", "length") and seen["usage"]["completion_tokens"] <= 8
    for s in g:  # only the served call is recorded and trained
        assert s.status == Status.COMPLETED and s.extra["calls"] == 1 and 0 < len(s.response_ids) <= 8
        assert [t["role"] for t in s.extra["turns"]] == ["user", "assistant"]
    assert loop.step_metrics([g])["agent/requests_refused"] == 22  # 11 per member
    assert loop.step_metrics([g])["agent/requests_refused"] == 0  # counted once


# ----------------------------------------------------------------------------- pause mid-call
def test_a_pause_mid_call_parks_it_and_the_continued_group_finishes_it_on_new_weights(model):
    """The engine aborts a call half-way (a weight sync); the group comes back ABORTED with the
    tokens so far; continued after new weights (version 1) the same agent's call goes on: its
    tokens are those of an uninterrupted run (draws are seeded by position), the first ones of
    version 0, the rest of version 1, and the agent saw one call."""
    conf = gateway(AGENTS + "refused_then_served")
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
def test_a_crashing_agent_fails_its_group_with_the_reason(model):
    _, (g,) = run_groups(model, gateway(AGENTS + "crashes"), [group_of(0, 2)])
    assert all(s.status == Status.FAILED for s in g)
    assert "raised RuntimeError: the agent's own bug" in g.drop_reason


def test_a_hanging_agent_is_stopped_at_its_timeout_and_fails_its_group(model):
    gateway_agents.CANCELLED.clear()
    loop, (g,) = run_groups(model, gateway(AGENTS + "hangs", timeout_s=1.0), [group_of(0, 2)])
    assert all(s.status == Status.FAILED for s in g)
    assert "did not finish within agent.timeout_s=1" in g.drop_reason
    assert gateway_agents.CANCELLED == [ROWS[0]["question"]] * 2 and not loop._sessions  # nothing left running


@pytest.mark.parametrize("limit", [1, 3])
def test_agent_programs_run_at_most_max_concurrency_at_once(model, limit):
    gateway_agents.RUNNING.update(now=0, most=0, expect=limit)
    _, (g,) = run_groups(model, gateway(AGENTS + "counts_company", max_concurrency=limit), [group_of(0, 3)])
    assert all(s.status == Status.COMPLETED for s in g) and gateway_agents.RUNNING["most"] == limit


# ----------------------------------------------------------------------------- the command line
def test_a_run_with_a_crashing_agent_ledgers_every_group(tmp_path):
    """train.py with an agent that crashes on one of the two training prompts: each of its groups is in
    rollouts/dropped.jsonl with the reason and counted, the other prompt's groups are trained with
    their calls in `turns`; nothing is lost."""
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
    metrics = [json.loads(line) for line in RunDir(run).metrics.read_text().splitlines()]
    step = next(m for m in metrics if "agent/calls_per_sample" in m)
    assert step["agent/calls_per_sample"] >= 1 and step["rollout/groups_failed"] == len(dropped) // 2


@pytest.mark.parametrize("overrides, says", [
    (["agent.entrypoint=no_such_pkg.agent:run"], "does not import"),
    ([f"agent.entrypoint={AGENTS}not_callable"], "not a callable"),
    (["agent.entrypoint=just_a_module"], "expected module:function"),
    (["model=default"], "has no chat template"),  # the tiny character model: nothing to render messages with
])
def test_an_agent_that_cannot_run_is_refused_in_one_line_before_start(tmp_path, overrides, says):
    run = tmp_path / "run"
    proc = run_cli(["experiment=gateway_tools", *overrides, f"hydra.run.dir={run}"], cwd=tmp_path, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: agent")
    assert says in lines[0] and not run.exists()
