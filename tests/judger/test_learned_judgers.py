"""Learned rewards (issue 26): judger=reward_model scores with the model's own logits, in batches, in a
process of its own; judger=llm reads a judge model's answer with a regex and counts what it cannot read;
both mix with rule judgers in judger=router; bad folders and templates are refused before work."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlharness.config.schema import (ConfigError, HFEngineConf, LLMJudgerConf, ModelConf, RewardModelJudgerConf,
                                     RouterJudgerConf)
from rlharness.judger import build_judger
from rlharness.judger.llm import LLMJudger
from rlharness.judger.reward_model import RewardModelJudger, check_reward_model
from rlharness.core.run_dir import RunDir
from rlharness.core.types import Group, RolloutState, Status
from tests.helpers import HANG_S

pytestmark = [pytest.mark.timeout(300)]


# The reward model's own tokenizer differs from the policy's (assets/tiny-arith): other characters, other
# ids. Allowed: the judger re-tokenizes the text with it.
RM_CHARS = "=+-*9876543210 #\\{}abcdefghijklmnopqrstuvwxyz"


def save_classifier(out: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A tiny random Llama sequence classifier with a character tokenizer (an ordinary HF folder)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rlharness.model.tiny import build_char_tokenizer

    tok = build_char_tokenizer(RM_CHARS)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                         num_labels=num_labels, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, attn_implementation="eager")
    LlamaForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(autouse=True)
def process_scorer(monkeypatch):
    """The reward model scores in a process of its own here, whether or not an earlier test left Ray
    running in this pytest process (tests/distributed's session-wide Ray: the judger would become a Ray
    actor). The Ray actor is tests/distributed/test_reward_model_actor.py's."""
    from rlharness.judger import reward_model

    monkeypatch.setattr(reward_model, "_on_ray", lambda: False)


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    return save_classifier(tmp_path_factory.mktemp("rm") / "rm")


def group(pairs: list[tuple[str, str]], label: dict | None = None) -> Group:
    """One sample per (prompt, response) pair: the judgers score each member's own prompt and response."""
    label = label or {"answer": "959"}
    return Group("g", "arithmetic", 0, 0, "", label, [
        RolloutState(uid=str(i), group_id="g", task="arithmetic", prompt_index=0, epoch=0, prompt_text=p,
                     prompt_ids=[], label=label, response_text=r, sample_seed=i) for i, (p, r) in enumerate(pairs)])


def judge(judger, states, timeout_s: float = HANG_S):
    async def go():
        try:
            return await judger.judge_group(states, timeout_s)
        finally:
            await judger.close()

    return asyncio.run(go())


def reference_logits(folder: Path, texts: list[str], max_length: int = 512) -> list[torch.Tensor]:
    """The model's logits for each text on its own (no padding, no batch), as transformers computes them."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return [model(input_ids=torch.tensor([tok.encode(t)[-max_length:]])).logits[0] for t in texts]


# Different lengths, so batches pad; the same response after different prompts.
PAIRS = [("042+917=", "959"), ("042+917=", "958"), ("100+200=", "959"), ("1+1=", "2"), ("999+999=", "1998"),
         ("042+917=", "95999999")]


def test_reward_model_scores_are_the_models_logits_batched_and_normalised(rm_dir):
    expected = [float(x[0]) for x in reference_logits(rm_dir, [p + r for p, r in PAIRS])]
    conf = RewardModelJudgerConf(path=str(rm_dir), batch_size=4, reward_shift=0.5, reward_scale=-2.0)
    out = judge(build_judger(conf), group(PAIRS))
    assert all(s.status is not Status.FAILED for s in out), [s.extra for s in out]
    got = [s.reward["score"] for s in out]
    assert got == pytest.approx([(x + 0.5) * -2.0 for x in expected], rel=1e-5, abs=1e-6)
    assert len(set(round(x, 6) for x in expected)) == len(expected)  # the prompt matters: all differ


def test_max_length_keeps_the_end_and_label_index_picks_the_logit(tmp_path):
    two = save_classifier(tmp_path / "two", num_labels=2, seed=1)
    texts = [p + r for p, r in PAIRS]
    expected = [float(x[1]) for x in reference_logits(two, texts, max_length=5)]
    conf = RewardModelJudgerConf(path=str(two), label_index=1, max_length=5, batch_size=3)
    out = judge(RewardModelJudger(conf), group(PAIRS))
    assert [s.reward["score"] for s in out] == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_groups_that_arrive_together_share_forward_passes_and_score_as_alone(rm_dir):
    """8 groups of 3 rows judged concurrently with batch_size=12 go in 2 calls of 12 rows (one forward
    pass each, as the scorer's process counts them), not 8; every row scores as its group alone did
    (rows of different lengths: padded in other batches), and as the model scores the row unbatched."""
    from rlharness.judger.reward_model import _forward_passes

    texts = [f"{a}+{b}=" for a, b in zip(range(1, 25), range(100, 2500, 100))]
    groups = [[(texts[3 * g + i], "9" * (1 + (g + i) % 5)) for i in range(3)] for g in range(8)]
    j = build_judger(RewardModelJudgerConf(path=str(rm_dir), batch_size=12))

    async def go():
        try:
            alone = [await j.judge_group(group(pairs), HANG_S) for pairs in groups]
            scorer = (await j._scorer()).scorer
            passes = scorer._pool.schedule(_forward_passes).result(timeout=HANG_S)
            calls = j.stats()["scoring_calls"]
            together = await asyncio.gather(*(j.judge_group(group(pairs), HANG_S) for pairs in groups))
            passes = scorer._pool.schedule(_forward_passes).result(timeout=HANG_S) - passes
            return alone, together, passes, j.stats()["scoring_calls"] - calls
        finally:
            await j.close()

    alone, together, passes, calls = asyncio.run(go())
    assert (passes, calls) == (2, 2)  # 24 rows in calls of 12 (without coalescing: 8 calls, 8 passes)
    scores = [[s.reward["score"] for s in g] for g in together]
    assert scores == [[pytest.approx(s.reward["score"], rel=1e-5, abs=1e-6) for s in g] for g in alone]
    expected = [float(x[0]) for x in reference_logits(rm_dir, [p + r for pairs in groups for p, r in pairs])]
    assert sum(scores, []) == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("on_timeout", ["fail", "zero"])
def test_a_hung_reward_model_process_times_out_as_configured_and_is_replaced(rm_dir, on_timeout):
    """The scorer's process stops answering (SIGSTOP: a forward pass that never returns): the call ends
    at the judging timeout, judger.on_timeout applies (the group FAILED, or every member scored 0) and
    is counted, the stopped process is killed and a fresh one scores the next group. Two groups
    waiting together share the stopped call: both time out, one replacement."""
    import os
    import signal

    j = build_judger(RewardModelJudgerConf(path=str(rm_dir), on_timeout=on_timeout))
    states, beside = group(PAIRS[:3]), group(PAIRS[3:])

    async def go():
        try:
            first = await j.judge_group(group(PAIRS[:3]), HANG_S)
            scorer = (await j._scorer()).scorer
            pid = scorer._pool.schedule(os.getpid).result(timeout=HANG_S)  # the one worker process
            os.kill(pid, signal.SIGSTOP)
            hung_groups = await asyncio.gather(j.judge_group(states, 2.0), j.judge_group(beside, 2.0))
            assert j.stats()["scoring_calls"] == 2  # the first group's call, then one for both
            after = await j.judge_group(group(PAIRS[:3]), HANG_S)
            new_pid = scorer._pool.schedule(os.getpid).result(timeout=HANG_S)
            return first, hung_groups, after, pid, new_pid
        finally:
            await j.close()

    first, hung_groups, after, pid, new_pid = asyncio.run(go())
    hung = [s for g in hung_groups for s in g]
    stats = j.stats()
    assert stats["timeouts"] == 2 and stats["processes_replaced"] == 1, stats  # one per group, one process
    if on_timeout == "fail":
        assert all(s.status is Status.FAILED for s in hung) and all("timeout" in g.drop_reason for g in hung_groups)
        assert stats["groups_failed"] == 2 and stats["scored_zero_on_timeout"] == 0
    else:
        assert [s.reward for s in hung] == [{"score": 0.0}] * 6 and all(s.status is not Status.FAILED for s in hung)
        assert stats["groups_failed"] == 0 and stats["scored_zero_on_timeout"] == 6
    assert new_pid != pid
    assert [s.reward for s in after] == [s.reward for s in first]  # the new process scores as the old one did


def test_bad_reward_model_folders_are_refused(tmp_path, rm_dir, tiny_model_dir):
    with pytest.raises(ConfigError, match="judger.path=.* is not a sequence classifier.*no score/classifier head"):
        check_reward_model(RewardModelJudgerConf(path=tiny_model_dir))
    two = save_classifier(tmp_path / "two", num_labels=3)
    with pytest.raises(ConfigError, match=r"judger.label_index is not set: .* 3 labels"):
        check_reward_model(RewardModelJudgerConf(path=str(two)))
    with pytest.raises(ConfigError, match=r"judger.label_index=3 is not allowed"):
        check_reward_model(RewardModelJudgerConf(path=str(two), label_index=3))
    with pytest.raises(ConfigError, match="judger.path is not set"):
        check_reward_model(RewardModelJudgerConf())
    with pytest.raises(ConfigError, match=r"tasks.a.judger.reward_model.path='/nowhere'"):
        check_reward_model(RewardModelJudgerConf(path="/nowhere"), "tasks.a.judger.reward_model")
    check_reward_model(RewardModelJudgerConf(path=str(rm_dir)))  # a one-label head needs no label_index


def test_judge_template_must_show_the_response():
    with pytest.raises(ConfigError, match=r"judger.template=.* no \{\{ response \}\} placeholder"):
        LLMJudgerConf(path="x", template="Grade this: {{ prompt }}")
    with pytest.raises(ConfigError, match="not a Jinja template"):
        LLMJudgerConf(path="x", template="{{ response ")
    LLMJudgerConf(path="x", template="{{ prompt }} -> {{ response }} ({{ label.answer }})")


def test_llm_judger_parses_the_score_pattern():
    j = LLMJudger(LLMJudgerConf(path="x", score_pattern=r"Score: (\d+)/10", reward_scale=0.1, reward_shift=-0.5))
    assert j.parse("Reasoning... Score: 7/10. Later Score: 2/10") == pytest.approx(0.2)
    assert j.parse("Score: seven") is None and j.parse("") is None
    whole = LLMJudger(LLMJudgerConf(path="x", score_pattern=r"-?\d+", reward_scale=1.0))
    assert whole.parse("it is -3 then 4") == -3.0
    shown = LLMJudger(LLMJudgerConf(path="x", template="Q: {{ prompt }} A: {{ response }} ({{ label.answer }})"))
    assert shown.render("1+1=", "2", {"answer": "2"}) == "Q: 1+1= A: 2 (2)"


# The tiny arithmetic model as its own judge: shown "<response>+000=" it writes digits (greedy).
JUDGE = dict(template="{{ response }}+000=", max_tokens=4, temperature=0.0, reward_scale=1.0)


def judge_answers(model_dir: str, responses: list[str]) -> list[str]:
    """What the judge model writes for each rendered template (its own engine, greedy)."""
    from rlharness.model.load import text_codec
    from rlharness.engine import GenerateRequest, SamplingParams, build_engine
    from rlharness.model.load import load_tokenizer

    async def go():
        engine = build_engine(HFEngineConf(), ModelConf(path=model_dir), seed=0)
        encode = text_codec(load_tokenizer(ModelConf(path=model_dir)))[0]
        try:
            results = await engine.generate_many([
                GenerateRequest(str(i), encode(f"{r}+000="), SamplingParams(max_tokens=4, greedy=True))
                for i, r in enumerate(responses)])
        finally:
            await engine.close()
        return [r.text for r in results]

    return asyncio.run(go())


def test_llm_judger_scores_what_the_judge_wrote_and_counts_unparseable(tiny_model_dir):
    responses = ["959", "12", "500"]
    answers = judge_answers("assets/tiny-arith", responses)
    readable = [a for a in answers if any(c.isdigit() for c in a)]
    assert readable, answers  # the warmed-up model writes digits after '='
    conf = LLMJudgerConf(path="assets/tiny-arith", score_pattern=r"(\d+)", **JUDGE)
    j = build_judger(conf)
    out = judge(j, group([("p=", r) for r in responses]))
    for s, a in zip(out, answers):
        if any(c.isdigit() for c in a):
            assert s.status is not Status.FAILED and s.reward == {"score": j.parse(a)}
    assert j.stats()["unparseable"] == len(answers) - len(readable)

    never = replace(conf, score_pattern=r"SCORE=(\d+)")  # the judge never writes this: all unparseable
    failing = build_judger(never)
    out = judge(failing, group([("p=", r) for r in responses]))
    assert all(s.status is Status.FAILED for s in out) and "unparseable judgement" in out.drop_reason
    assert failing.stats()["unparseable"] >= 1 and failing.stats()["groups_failed"] == 1
    zero = build_judger(replace(never, on_timeout="zero"))
    out = judge(zero, group([("p=", r) for r in responses]))
    assert [s.reward for s in out] == [{"score": 0.0}] * 3
    assert zero.stats()["unparseable"] == 3 and zero.stats()["scored_zero_on_timeout"] == 3


def test_router_mixes_rules_with_a_reward_model_and_an_llm_judge(rm_dir):
    rm = RewardModelJudgerConf(path=str(rm_dir))
    llm = LLMJudgerConf(path="assets/tiny-arith", score_pattern=r"NEVER(\d)", on_timeout="zero", **JUDGE)
    router = build_judger(RouterJudgerConf(weights={"math": 0.5, "reward_model": 0.25, "llm": 3.0},
                                           reward_model=rm, llm=llm))
    # The last answer needs math-verify: the rule parts then run in the router's judging processes.
    answers = ["959", "958", r"\boxed{\frac{1918}{2}}"]
    states = group([("042+917=", a) for a in answers])
    expected_rm = [float(x[0]) for x in reference_logits(rm_dir, ["042+917=" + a for a in answers])]
    out = judge(router, states)
    for s, math, x in zip(out, [1.0, 0.0, 1.0], expected_rm):
        assert s.reward["math"] == math and s.reward["llm"] == 0.0
        assert s.reward["reward_model"] == pytest.approx(x, rel=1e-5)
        assert s.reward["score"] == pytest.approx(0.5 * math + 0.25 * x, rel=1e-5)
    assert router.stats()["unparseable"] == 3  # the llm part's counts show as the router's judge/* counts


@pytest.mark.parametrize("overrides, key", [
    (["judger=router", "judger.reward_model.max_length=1"], "judger.reward_model.max_length=1"),
    (["judger=router", "judger.reward_model.reward_scale=0"], "judger.reward_model.reward_scale=0.0"),
    (["judger=router", "judger.llm.max_tokens=0"], "judger.llm.max_tokens=0"),
    (["judger=router", "judger.llm.on_timeout=retry"], "judger.llm.on_timeout='retry'"),
    (["experiment=arith_mix", "+judger@tasks.unpadded.judger=reward_model", "tasks.unpadded.judger.batch_size=0"],
     "tasks.unpadded.judger.batch_size=0"),
    (["judger=reward_model", "judger.max_length=1"], "judger.max_length=1"),
])
def test_an_out_of_range_learned_judger_value_is_named_by_its_whole_key(overrides, key):
    """The nested confs know only "judger."; the refusal names where the value is (judger=router's
    judger.reward_model / judger.llm, a task's own judger)."""
    from rlharness.launch.preflight import compose_checked

    with pytest.raises(ConfigError) as err:
        compose_checked(overrides)
    assert str(err.value).startswith(key + " is not allowed"), str(err.value)


# ----------------------------------------------------------------------------- the real command line and a run
@pytest.mark.parametrize("args, expect", [
    (["judger=reward_model", "judger.path=assets/tiny-arith"], ["judger.path=assets/tiny-arith",
                                                                 "not a sequence classifier"]),
    (["judger=llm", "judger.template='Grade: {{ prompt }}'"], ["judger.template=", "{{ response }}"]),
])
def test_bad_learned_judgers_are_refused_in_one_line_before_work(tmp_path, args, expect):
    from tests.faults.test_refused_input import SIM, refused

    refused([*SIM, *args], tmp_path, expect)
    assert not (tmp_path / "outputs").exists()


def test_a_run_on_a_reward_model_logs_true_correctness_and_evaluates_with_the_verifier(tmp_path, rm_dir):
    import json

    from tests.helpers import QUICK, run_in_process

    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*QUICK, "batch_size=2", "eval.num_prompts=8", "total_steps=2", "eval_every=2",
                             "save_every=0", "experiment=arith_rm", f"judger.reward_model.path={rm_dir}"])
    rows = [json.loads(line) for line in RunDir(run_dir).metrics.read_text().splitlines()]
    trained = [r for r in rows if "rollout/reward_reward_model_mean" in r]
    assert len(trained) == 2 and all("rollout/reward_math_mean" in r for r in trained)
    # The trained reward is the reward model's alone (math and format weigh 0).
    assert all(r["rollout/reward_mean"] == pytest.approx(r["rollout/reward_reward_model_mean"], rel=1e-5)
               for r in trained)
    assert any("eval/accuracy" in r for r in rows)
    scores = [s["score"] for line in RunDir(run_dir).eval_file(2).read_text().splitlines()
              for s in json.loads(line)["samples"]]
    assert scores and set(scores) <= {0.0, 1.0}  # scored by the math judger, not the reward model's logits


def test_a_tasks_own_learned_judger_is_checked_under_its_key(tiny_model_dir, rm_dir):
    from rlharness.launch.build import verifiable_judgers
    from rlharness.judger import check_learned_judgers
    from rlharness.judger.math import MathJudger
    from rlharness.launch.preflight import compose_typed

    mix = ["experiment=arith_mix", "+judger@tasks.unpadded.judger=reward_model"]
    _, conf = compose_typed([*mix, f"tasks.unpadded.judger.path={tiny_model_dir}"])
    with pytest.raises(ConfigError, match=r"tasks.unpadded.judger.path=.* is not a sequence classifier"):
        check_learned_judgers(conf)
    _, conf = compose_typed([*mix, f"tasks.unpadded.judger.path={rm_dir}"])
    check_learned_judgers(conf)
    judgers = {name: build_judger(conf.judger_for(e)) for name, e in conf.task_entries().items()}
    evaluated = verifiable_judgers(conf, judgers)  # the reward-model task is evaluated by its own math judger
    assert isinstance(evaluated["unpadded"], MathJudger) and evaluated["padded"] is judgers["padded"]
