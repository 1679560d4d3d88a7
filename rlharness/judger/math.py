"""Math-answer judger: the response's final answer against `label["answer"]`.

The final answer is, in order: the text after the last `####` (GSM8K), the content of
the last `\\boxed{...}`, or (when `fallback_last_number`) the last number in the
text. No final answer scores 0.

Comparison: a fast exact path first — both sides plain integers/decimals after
dropping thousands commas and `$` — compared as Fractions (microseconds; the
arithmetic task judges hundreds of responses per step, and math-verify costs ~2 ms a
call); `score_inline` answers from it on the event loop. Anything else goes to math-verify (the parser/verifier TRL and open-r1 use),
with its signal-based timeouts disabled (`parsing_timeout=None`,
`timeout_seconds=None`): signals only work in the main thread and judgers run in
worker threads; `Judger.judge_group` enforces the overall timeout instead.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from rlharness.config.schema import MathJudgerConf
from rlharness.judger.base import Judger

# A number: thousands groups ("1,234") or plain digits, an optional decimal part, and a
# minus sign only where it cannot be a binary minus ("x=-5" is -5, "3-5" holds 3 and 5).
_NUMBER_RE = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?", re.ASCII)
_PLAIN_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?", re.ASCII)
_THOUSANDS_COMMA_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))", re.ASCII)
_BOXED = "\\boxed{"


def _normalise(text: str) -> str:
    text = text.replace("\u2212", "-").replace("$", "").strip()
    return _THOUSANDS_COMMA_RE.sub("", text).rstrip(".").strip()


def as_plain_number(text: str) -> Fraction | None:
    """The exact value of a plain integer/decimal ("1,234", "-5", "0.50"), else None."""
    t = _normalise(text)
    return Fraction(t) if _PLAIN_NUMBER_RE.fullmatch(t) else None


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}`, braces balanced; None if absent or unclosed."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def last_number(text: str) -> str | None:
    found = _NUMBER_RE.findall(text.replace("\u2212", "-"))
    return found[-1] if found else None


def extract_final_answer(text: str, fallback_last_number: bool = True) -> str | None:
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        tail = tail.splitlines()[0].strip() if tail else ""
        # "#### 72 dollars" -> "72": a leading number followed by words only.
        head, _, rest = tail.partition(" ")
        if as_plain_number(head) is not None and not re.search(r"\d", rest):
            return head
        return tail or None
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed or None
    return last_number(text) if fallback_last_number else None


def _mv_parse(text: str) -> list:
    from math_verify import parse

    # math-verify finds LaTeX inside $...$ or \boxed{}; a bare answer gets both chances.
    if "$" not in text and _BOXED not in text:
        parsed = parse(f"${text}$", parsing_timeout=None)
        if parsed:
            return parsed
    return parse(text, parsing_timeout=None)


def answers_match(gold: str, pred: str) -> bool:
    """`pred` equals `gold` as a number or, via math-verify, as a mathematical expression."""
    g, p = as_plain_number(gold), as_plain_number(pred)
    if g is not None and p is not None:
        return g == p
    from math_verify import verify

    gold_parsed, pred_parsed = _mv_parse(gold), _mv_parse(pred)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


class MathJudger(Judger):
    name = "math"
    label_keys = ("answer",)

    def __init__(self, conf: MathJudgerConf | None = None):
        self.conf = conf or MathJudgerConf()

    def _gold_and_pred(self, response_text: str, label: dict[str, Any]) -> tuple[str, str | None]:
        if "answer" not in label:
            raise KeyError(f"math judger: label has no 'answer' key (keys: {sorted(label)})")
        gold_text = str(label["answer"])
        gold = last_boxed(gold_text) or gold_text.strip()
        return gold, extract_final_answer(response_text, self.conf.fallback_last_number)

    def extract_answer(self, response_text: str) -> str | None:
        return extract_final_answer(response_text, self.conf.fallback_last_number)

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        """No answer, or two plain numbers: decided here; anything else needs math-verify (None)."""
        gold, pred = self._gold_and_pred(response_text, label)
        if pred is None or not gold:
            return {"score": 0.0}
        g, p = as_plain_number(gold), as_plain_number(pred)
        if g is not None and p is not None:
            return {"score": 1.0 if g == p else 0.0}
        return None

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        fast = self.score_inline(response_text, label)
        if fast is not None:
            return fast
        gold, pred = self._gold_and_pred(response_text, label)
        return {"score": 1.0 if answers_match(gold, pred) else 0.0}  # type: ignore[arg-type]
