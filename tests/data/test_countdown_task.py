import random

import pytest

from rlharness.config.schema import ConfigError, CountdownTaskConf
from rlharness.data import build_task
from rlharness.data.countdown import generate_problem, generate_problems
from rlharness.judger.countdown import CountdownJudger, evaluate
from rlharness.model.tiny import DEFAULT_CHARS


def _conf(**kw):
    return CountdownTaskConf(**{"num_train": 300, "num_eval": 50, **kw})


def test_generated_problems_are_solved_by_their_expression():
    judger = CountdownJudger()
    for p in generate_problems(_conf(num_numbers=4, max_number=12)):
        assert evaluate(p.expression, list(p.numbers)) == p.target
        assert judger.score(p.expression, p.label)["score"] == 1.0
        assert p.target >= 1


def test_prompt_uses_only_tiny_model_characters_and_label_layout():
    task = build_task(_conf())
    for row in task.train + task.eval:
        assert set(row.prompt_text) <= set(DEFAULT_CHARS), row.prompt_text
        numbers, target = row.label["numbers"], row.label["target"]
        assert row.prompt_text == " ".join(map(str, numbers)) + f",{target}="
        assert len(numbers) == 3 and all(1 <= n <= 20 for n in numbers)


def test_same_seed_same_problems_other_seed_differs():
    a, b, c = build_task(_conf(seed=7)), build_task(_conf(seed=7)), build_task(_conf(seed=8))
    assert [r.prompt_text for r in a.train] == [r.prompt_text for r in b.train]
    assert [r.prompt_text for r in a.eval] == [r.prompt_text for r in b.eval]
    assert [r.prompt_text for r in a.train] != [r.prompt_text for r in c.train]


def test_train_and_eval_are_disjoint():
    task = build_task(_conf())
    key = lambda r: (tuple(sorted(r.label["numbers"])), r.label["target"])  # noqa: E731
    train, evl = {key(r) for r in task.train}, {key(r) for r in task.eval}
    assert len(train) == 300 and len(evl) == 50 and not train & evl
    assert [r.index for r in task.train] == list(range(300))


def test_too_small_problem_space_is_refused():
    with pytest.raises(ValueError, match="distinct countdown problems"):
        generate_problems(CountdownTaskConf(num_numbers=2, max_number=2, num_train=1000, num_eval=10))


def test_bad_conf_values_name_the_key():
    with pytest.raises(ConfigError, match="task.max_number"):
        CountdownTaskConf(max_number=0)


def test_single_problem_generator_is_deterministic_per_rng_state():
    assert generate_problem(random.Random(3), 5, 50) == generate_problem(random.Random(3), 5, 50)
