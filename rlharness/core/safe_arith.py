"""Exact arithmetic on untrusted text: + - * / and parentheses, by walking the tree from
`ast.parse(mode="eval")` — never `eval`. Shared by the calculator tool and the
countdown judger, which differ only in what they accept (decimals, unary signs, which
numbers may appear) and in the error they raise.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction
from typing import Callable

MAX_EXPRESSION_CHARS = 256  # also bounds the parser's recursion on deep nesting
_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
_UNARY = {ast.UAdd: lambda a: a, ast.USub: lambda a: -a}


class ArithError(ValueError):
    """The text is not an allowed expression (the message says why)."""


def evaluate(text: str, *, allow_decimals: bool = False, allow_unary: bool = False,
             on_constant: Callable[[Fraction], None] | None = None) -> Fraction:
    """Exact value of `text`. `on_constant` sees every literal (and may raise ArithError)."""
    chars = r"[0-9.+\-*/() ]+" if allow_decimals else r"[0-9+\-*/() ]+"
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ArithError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    if not re.fullmatch(chars, text, re.ASCII):
        raise ArithError("only digits, " + (". " if allow_decimals else "") + "+ - * / ( ) and spaces are allowed")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ArithError("not an expression") from None
    literal_types = (int, float) if allow_decimals else (int,)

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ArithError("division by zero")
            return _BINARY[type(node.op)](left, right)
        if allow_unary and isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.Constant) and type(node.value) in literal_types:
            value = Fraction(str(node.value)) if type(node.value) is float else Fraction(node.value)
            if on_constant is not None:
                on_constant(value)
            return value
        raise ArithError(f"not an expression: {type(node).__name__} is not allowed")

    try:
        return walk(tree.body)
    except RecursionError:
        raise ArithError("nested too deeply") from None
