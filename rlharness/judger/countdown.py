"""Countdown judger: does the response's expression reach the target?

The response is an expression over the given numbers with + - * / and parentheses,
optionally followed by "=<target>" ("(3+5)*7" or "3*5=15"). It is parsed with
`ast.parse(mode="eval")` and walked; only BinOp (Add, Sub, Mult, Div), integer
Constants and parentheses are accepted — no names, calls, unary minus or powers, and
never `eval`. Number rule: each given number may be used at most as many times as it
appears in `label["numbers"]` (a multiset); numbers need not all be used. Division is
exact (Fraction). Score 1 when the value equals the target; anything malformed,
a number not given or reused, division by zero, or a wrong value scores 0. Bad text
never raises.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from typing import Any

from rlharness.core import safe_arith

from rlharness.config.schema import CountdownJudgerConf
from rlharness.judger.base import Judger

class InvalidExpression(ValueError):
    pass


def evaluate(expression: str, numbers: list[int]) -> Fraction:
    """Exact value of `expression`; InvalidExpression if it breaks any rule above."""
    available = Counter(numbers)

    def use(value: Fraction) -> None:
        if available[int(value)] <= 0:
            raise safe_arith.ArithError(f"{value} is not among the numbers or is used too often")
        available[int(value)] -= 1

    try:
        return safe_arith.evaluate(expression, on_constant=use)
    except safe_arith.ArithError as exc:
        raise InvalidExpression(str(exc)) from None


def split_response(text: str) -> tuple[str, str | None]:
    """("expression", claimed result or None) from "expr" or "expr=result"."""
    expr, sep, claimed = text.strip().partition("=")
    return expr.strip(), (claimed.strip() if sep else None)


class CountdownJudger(Judger):
    name = "countdown"
    label_keys = ("target", "numbers")

    def __init__(self, conf: CountdownJudgerConf | None = None):
        self.conf = conf or CountdownJudgerConf()

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        for key in ("numbers", "target"):
            if key not in label:
                raise KeyError(f"countdown judger: label has no {key!r} key (keys: {sorted(label)})")
        expr, claimed = split_response(response_text)
        # "expr=15" must claim the target itself; "expr=" and "expr=junk" are malformed.
        if claimed is not None and claimed != str(label["target"]):
            return {"score": 0.0}
        try:
            value = evaluate(expr, [int(n) for n in label["numbers"]])
        except InvalidExpression:
            return {"score": 0.0}
        return {"score": 1.0 if value == int(label["target"]) else 0.0}

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        # Cheap and bounded (MAX_EXPRESSION_CHARS, an AST walk): always scored on the event loop.
        return self.score(response_text, label)
