import pytest

from rlharness.config.schema import ArithmeticTaskConf, ConfigError, TaskConf
from rlharness.data import build_task


def test_arithmetic_through_build_task_is_seeded_and_disjoint():
    conf = ArithmeticTaskConf(num_train=500, num_eval=100, seed=5)
    a, b = build_task(conf), build_task(conf)
    assert [r.prompt_text for r in a.train] == [r.prompt_text for r in b.train]
    assert not {r.prompt_text for r in a.train} & {r.prompt_text for r in a.eval}
    row = a.eval[0]
    x, y = row.prompt_text.rstrip("=").split("+")
    assert len(x) == len(y) == 3 and row.label == {"answer": str(int(x) + int(y))}


def test_unknown_task_name_is_refused():
    with pytest.raises(ConfigError, match="task.name='nope'"):
        build_task(TaskConf(name="nope"))


def test_arithmetic_labels_score_through_the_math_judger():
    from rlharness.judger.math import MathJudger

    task = build_task(ArithmeticTaskConf(num_train=50, num_eval=50, operators=["+", "-", "*"]))
    judger = MathJudger()
    for row in task.eval:
        answer = row.label["answer"]
        assert judger.score(answer, row.label) == {"score": 1.0}
        assert judger.score(str(int(answer) + 1), row.label) == {"score": 0.0}
