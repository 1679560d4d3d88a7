import pytest

from rlharness.judger.countdown import CountdownJudger, InvalidExpression, evaluate

JUDGE = CountdownJudger()
LABEL = {"numbers": [3, 5, 7], "target": 15}


@pytest.mark.parametrize("response, expected", [
    ("3*5", 1.0),                # a subset of the numbers is allowed
    ("(7-5)*3+5+4", 0.0),        # 4 is not given
    (" 3 * 5 = 15 ", 1.0),       # claimed result equal to the target
    ("3*5=16", 0.0),             # claimed result wrong
    ("3*5=", 0.0),
    ("(3+5)*7-41", 0.0),         # 41 is not given
    ("7+5+3", 1.0),
    ("(7+5)+3", 1.0),
    ("((7+5))+3", 1.0),
    ("7*5/3", 0.0),              # 35/3 is not 15: division is exact, not floor
    ("3*5*1", 0.0),
    ("5*3+7-7", 0.0),            # 7 reused
    ("3*5+3-3", 0.0),            # 3 reused
    ("15", 0.0),                 # the target is not a given number
    ("3*5+(7-7", 0.0),           # malformed
    ("3**5", 0.0),               # power is not an operator here
    ("-3+18", 0.0),              # unary minus not allowed
    ("3.0*5", 0.0),              # floats not allowed
    ("__import__('os')", 0.0),   # never evaluated
    ("", 0.0),
    ("\u0663*\u0665", 0.0),      # Arabic-Indic digits
    ("\U0001f600 3*5", 0.0),
    ("03*5", 0.0),               # leading zero: not an integer literal
    ("(" * 200 + "3" + ")" * 200, 0.0),
])
def test_countdown_cases(response, expected):
    assert JUDGE.score(response, LABEL) == {"score": expected}


def test_division_is_exact_and_division_by_zero_scores_zero():
    assert JUDGE.score("7/(5-5)", {"numbers": [7, 5, 5], "target": 1}) == {"score": 0.0}
    assert JUDGE.score("(8/3)*6", {"numbers": [8, 3, 6], "target": 16}) == {"score": 1.0}
    with pytest.raises(InvalidExpression, match="division by zero"):
        evaluate("7/(5-5)", [7, 5, 5])


def test_repeated_given_numbers_may_each_be_used_once():
    label = {"numbers": [4, 4, 2], "target": 16}
    assert JUDGE.score("4*4", label) == {"score": 1.0}
    assert JUDGE.score("4*4*2/2", label) == {"score": 0.0}  # 2 given once


def test_pathological_nesting_does_not_raise():
    assert JUDGE.score("(" * 5000 + "3" + ")" * 5000, LABEL) == {"score": 0.0}
    assert JUDGE.score("3" + "+3" * 10000, LABEL) == {"score": 0.0}
