"""Tools the multi-turn agent loop can run: pure functions `argument text -> output text`.

A tool raises `ToolError` for bad input; the loop shows the model "error: <message>"
instead of an output (a model learns from that), while any other exception is a bug
and propagates. `calculator` evaluates + - * / with parentheses, unary signs, integer
and decimal literals, exactly (Fraction), by walking the tree from
`ast.parse(mode="eval")` — never `eval`. (The countdown judger's `evaluate` also
enforces which numbers may appear, so it does not fit a general calculator.)
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction
from typing import Callable

Tool = Callable[[str], str]

MAX_EXPRESSION_CHARS = 256  # also bounds the parser's recursion on deep nesting
_ALLOWED_CHARS_RE = re.compile(r"[0-9.+\-*/() ]+", re.ASCII)
_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
_UNARY = {ast.UAdd: lambda a: a, ast.USub: lambda a: -a}


class ToolError(ValueError):
    """Bad tool input; the message is shown to the model."""


def _evaluate(expression: str) -> Fraction:
    text = expression.strip()
    if not text:
        raise ToolError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    if not _ALLOWED_CHARS_RE.fullmatch(text):
        raise ToolError("only digits, . + - * / ( ) and spaces are allowed")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError("not an expression") from None

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ToolError("division by zero")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(str(node.value)) if type(node.value) is float else Fraction(node.value)
        raise ToolError("not an expression")

    try:
        return walk(tree.body)
    except RecursionError:
        raise ToolError("nested too deeply") from None


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
