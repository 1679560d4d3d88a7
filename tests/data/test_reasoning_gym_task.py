"""task=reasoning_gym: seeded, disjoint splits, chat-template prompts, refusals naming the valid values,
and the dataset's own score_answer (partial credit kept) in the judging processes."""

from __future__ import annotations

import asyncio

import pytest

from rlharness.config.schema import ConfigError, ModelConf, ReasoningGymJudgerConf, ReasoningGymTaskConf
from rlharness.data import build_task
from rlharness.judger.reasoning_gym import ReasoningGymJudger, extract_answer
from rlharness.model.load import load_tokenizer
from rlharness.core.types import Status, make_group
from tests.helpers import HANG_S

# Two one-digit terms: 200 distinct questions (+ and -), so items repeat within a few hundred draws.
SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _conf(**kw) -> ReasoningGymTaskConf:
    return ReasoningGymTaskConf(**{"dataset": "chain_sum", "dataset_config": SMALL, "num_eval": 100,
                                   "num_train": 300, **kw})


def test_same_seed_same_rows_other_seed_differs():
    a, b, c = build_task(_conf(seed=3)), build_task(_conf(seed=3)), build_task(_conf(seed=4))
    assert [(r.prompt_text, r.label) for r in a.train + a.eval] == [(r.prompt_text, r.label) for r in b.train + b.eval]
    assert [r.prompt_text for r in a.eval] != [r.prompt_text for r in c.eval]


def test_eval_questions_are_distinct_and_never_in_train_although_the_generator_repeats():
    import reasoning_gym

    raw = [x["question"] for x in reasoning_gym.create_dataset("chain_sum", size=400, seed=3, **SMALL)]
    assert len(set(raw)) < len(raw)  # the generator does repeat: a second seed alone would overlap
    task = build_task(_conf(seed=3))
    eval_q = [r.label["entry"]["question"] for r in task.eval]
    assert len(eval_q) == len(set(eval_q)) == 100
    assert len(task.train) == 300
    assert not set(eval_q) & {r.label["entry"]["question"] for r in task.train}


def test_a_space_smaller_than_the_eval_set_is_refused():
    with pytest.raises(ConfigError, match="only 200 distinct questions .* task.num_eval=250"):
        build_task(_conf(num_eval=250))


def test_prompt_is_the_question_and_instruction_in_the_models_chat_template():
    tokenizer = load_tokenizer(ModelConf(path="assets/tiny-chat"))
    task = build_task(_conf(instruction="Give only the final number."), tokenizer)
    row = task.eval[0]
    question = row.label["entry"]["question"]
    assert row.prompt_text == tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{question} Give only the final number."}], tokenize=False,
        add_generation_prompt=True)
    assert "<|im_start|>user\n" in row.prompt_text and row.prompt_text.endswith("<|im_start|>assistant\n")
    plain = build_task(_conf(apply_chat_template=False), tokenizer)
    assert plain.eval[0].prompt_text == question


@pytest.mark.parametrize("kw, expect", [
    ({"dataset": "chain_summ"}, ["task.dataset='chain_summ'", "valid: ", "basic_arithmetic", "chain_sum",
                                 "gsm_symbolic"]),
    ({"dataset_config": {"min_term": 2}}, ["unknown key(s) min_term", "valid: min_terms, max_terms, min_digits"]),
    ({"dataset_config": {"seed": 2}}, ["unknown key(s) seed"]),  # set by task.seed, not here
    ({"dataset_config": {"min_terms": 3, "max_terms": 2}}, ["rejected by dataset 'chain_sum'", "max_terms"]),
])
def test_unknown_dataset_or_config_key_is_refused_listing_the_valid_ones(kw, expect):
    with pytest.raises(ConfigError) as err:
        build_task(_conf(**kw))
    assert "\n" not in str(err.value)
    for word in expect:
        assert word in str(err.value)


@pytest.mark.parametrize("how, response, expect", [
    ("last_number", "5 + 7 = 12", "12"),
    ("last_number", "x = -5", "-5"),
    ("answer_tag", "think <answer>12</answer> <answer> 13 </answer>", "13"),
    ("boxed", "so \\boxed{12}.", "12"),
    ("response", "  12 \n", "12"),
    ("auto", "<answer>7</answer> then 9", "7"),
    ("auto", "\\boxed{8} then 9", "8"),
    ("auto", "it is 9", "9"),
    ("last_number", "no digits", None),
])
def test_answer_extraction(how, response, expect):
    assert extract_answer(response, how, "12") == expect


def test_auto_takes_the_whole_response_when_the_answer_is_not_a_number():
    assert extract_answer("olleh 2", "auto", "olleh") == "olleh 2"


def _addition_label() -> dict:
    """A basic_arithmetic item: reasoning-gym's default scorer, len(oracle) / len(answer) when the
    answer contains the oracle."""
    task = build_task(ReasoningGymTaskConf(dataset="basic_arithmetic", num_eval=5, num_train=5,
                                           dataset_config={"min_terms": 2, "max_terms": 2, "min_digits": 2,
                                                           "max_digits": 2, "operators": ["+"]}))
    return task.eval[0].label


def test_the_datasets_own_score_answer_with_partial_credit():
    label = _addition_label()
    answer = label["entry"]["answer"]
    response = ReasoningGymJudger(ReasoningGymJudgerConf(extract="response"))
    assert response.score(answer, label) == {"score": 1.0}
    partial = response.score(f"{answer} is it", label)["score"]
    assert partial == pytest.approx(len(answer) / len(f"{answer} is it")) and 0 < partial < 1
    assert ReasoningGymJudger().score("no idea", label) == {"score": 0.0}
    assert ReasoningGymJudger().score(f"it is {answer}", label) == {"score": 1.0}


def test_judging_runs_in_the_judging_processes_and_keeps_partial_credit():
    label = _addition_label()
    answer = label["entry"]["answer"]
    judger = ReasoningGymJudger(ReasoningGymJudgerConf(extract="response", num_workers=1))
    group = make_group(task="t", prompt_index=0, epoch=0, prompt_text="p", prompt_ids=[1], label=label, k=3)
    for s, text in zip(group, [answer, f"{answer}!!", "7 7"]):
        s.response_text, s.status = text, Status.COMPLETED

    async def main():
        try:
            return await judger.judge_group(group, timeout_s=HANG_S), judger.__dict__.get("_pool")
        finally:
            await judger.close()

    judged, pool = asyncio.run(main())
    assert pool is not None  # scored in a judging process, not inline
    assert [s.reward["score"] for s in judged] == [1.0, pytest.approx(len(answer) / (len(answer) + 2)), 0.0]
