from fractions import Fraction

import pytest

from rlharness.config.schema import MathJudgerConf
from rlharness.judger.math import MathJudger, answers_match, as_plain_number, extract_final_answer
from tests.helpers import HANG_S

JUDGE = MathJudger()


@pytest.mark.parametrize("response, answer, expected", [
    # arithmetic task: bare digits, exact string label
    ("959", "959", 1.0),
    ("958", "959", 0.0),
    ("9591", "959", 0.0),
    ("", "959", 0.0),
    # commas in numbers, either side
    ("The total is 1,234.", "1234", 1.0),
    ("#### 1234", "1,234", 1.0),
    ("\\boxed{1,234,567}", "1234567", 1.0),
    ("#### 1,235", "1,234", 0.0),
    # negative answers (ASCII and unicode minus); "3-5" is a subtraction, not -5
    ("#### -5", "-5", 1.0),
    ("so x = -5", "-5", 1.0),
    ("answer: \u22127", "-7", 1.0),
    ("#### 5", "-5", 0.0),
    ("3-5", "-5", 0.0),
    # GSM8K delimiter: the text after the last ####, a unit after the number is fine
    ("2 + 3 = 5 #### 5", "5", 1.0),
    ("#### 72 dollars", "72", 1.0),
    ("#### 7\n#### 72", "72", 1.0),
    ("#### ", "3", 0.0),
    # \boxed{}, nested braces, math-verify equivalence
    ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("\\boxed{x+1}", "1+x", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("\\boxed{12", "12", 1.0),  # unclosed box: falls back to the last number
    # decimals compare as numbers
    ("959.0", "959", 1.0),
    ("0.50", "0.5", 1.0),
    # no final answer at all, unicode garbage
    ("I do not know", "3", 0.0),
    ("\u00f1\u2211\U0001f600\u0663", "3", 0.0),
    ("\x00\x01\ufffd", "0", 0.0),
])
def test_math_judger_cases(response, answer, expected):
    assert JUDGE.score(response, {"answer": answer}) == {"score": expected}


def test_label_with_boxed_solution_uses_the_box():
    assert JUDGE.score("#### 42", {"answer": "so the answer is \\boxed{42}"})["score"] == 1.0


def test_without_fallback_a_missing_final_answer_scores_zero():
    strict = MathJudger(MathJudgerConf(fallback_last_number=False))
    assert strict.score("The answer is 72", {"answer": "72"})["score"] == 0.0
    assert strict.score("The answer is #### 72", {"answer": "72"})["score"] == 1.0
    assert MathJudger().score("The answer is 72", {"answer": "72"})["score"] == 1.0


def test_extraction_order_delimiter_then_box_then_last_number():
    assert extract_final_answer("\\boxed{3} #### 4") == "4"
    assert extract_final_answer("\\boxed{3} then 4") == "3"
    assert extract_final_answer("3 then 4") == "4"
    assert extract_final_answer("nothing") is None


def test_fast_path_handles_plain_numbers_without_math_verify():
    assert as_plain_number("1,234") == 1234
    assert as_plain_number("-0.25") == Fraction(-1, 4)
    assert as_plain_number("1/2") is None
    assert answers_match("1/2", "0.5")  # not plain: goes to math-verify


def test_label_without_answer_key_raises():
    with pytest.raises(KeyError, match="answer"):
        JUDGE.score("1", {"target": 1})


def test_math_verify_path_runs_in_a_worker_thread():
    # Signal-based timeouts would raise outside the main thread; ours are disabled.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        got = pool.submit(JUDGE.score, "\\boxed{\\frac{2}{4}}", {"answer": "\\frac{1}{2}"}).result(timeout=HANG_S)
    assert got == {"score": 1.0}
