"""Tools the multi-turn agent loop can run: pure functions `argument text -> output text`.

A tool raises `ToolError` for bad input; the loop shows the model "error: <message>"
instead of an output (a model learns from that), while any other exception is a bug
and propagates. `calculator` evaluates + - * / with parentheses, unary signs, integer
and decimal literals, exactly (Fraction), by walking the tree from
`ast.parse(mode="eval")` — never `eval` (`rlharness.core.safe_arith`, shared with the
countdown judger).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable

from rlharness.core import safe_arith

Tool = Callable[[str], str]

class ToolError(ValueError):
    """Bad tool input; the message is shown to the model."""


def _evaluate(expression: str) -> Fraction:
    text = expression.strip()
    if not text:
        raise ToolError("empty expression")
    try:
        return safe_arith.evaluate(text, allow_decimals=True, allow_unary=True)
    except safe_arith.ArithError as exc:
        raise ToolError(str(exc)) from None


def format_number(value: Fraction) -> str:
    """Integers exactly ("12"); other values as a short decimal ("0.3333333333")."""
    if value.denominator == 1:
        return str(value.numerator)
    return format(float(value), ".10g")


def calculator(expression: str) -> str:
    """'2 + 3*(4-1)' -> '11'; '7/2' -> '3.5'. ToolError on anything else."""
    return format_number(_evaluate(expression))


TOOLS: dict[str, Tool] = {"calculator": calculator}


def build_tools(names: list[str]) -> dict[str, Tool]:
    """The named tools, in order (the first is the default); a clear error for an unknown name."""
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise ValueError(f"agent.tools={names!r}: unknown tool(s) {unknown} (available: {', '.join(TOOLS)})")
    return {n: TOOLS[n] for n in names}
