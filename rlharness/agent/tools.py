"""Tools the multi-turn agent loop can run: `tool(argument text, timeout_s) -> ToolOutput`.

A tool raises `ToolError` for bad input; the loop shows the model "error: <message>"
instead of an output (a model learns from that), while any other exception is a bug
and propagates. `calculator` evaluates + - * / with parentheses, unary signs, integer
and decimal literals, exactly (Fraction), by walking the tree from
`ast.parse(mode="eval")` — never `eval` (`rlharness.core.safe_arith`, shared with the
countdown judger). `python` runs the argument as a Python program in the sandbox
(`rlharness.sandbox`, a process of its own per call): the model sees what it printed,
or an error line; `ToolOutput.stop` says why the call ended (the ledger keeps it).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Callable

from rlharness import sandbox as code_sandbox
from rlharness.config.schema import SandboxConf
from rlharness.core import safe_arith

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolOutput:
    text: str  # what the model is shown
    stop: str = "ok"  # why the call ended: "ok", or a failure ("error", a sandbox reason, "timeout", ...)
    seconds: float = 0.0  # the call's wall time


Tool = Callable[[str, float], ToolOutput]

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


def calculator_tool(expression: str, timeout_s: float) -> ToolOutput:
    return ToolOutput(calculator(expression))


def sandbox_output(result) -> str:
    """What the model sees of a sandboxed run: its stdout (trailing whitespace dropped), after one line
    `error: ...` unless it ended well (the exception's last line, or why the sandbox stopped it; first,
    so that cutting a long output to agent.max_tool_output_chars keeps it)."""
    text = result.stdout.rstrip()
    if result.ok:
        return text
    last = (result.stderr.strip().splitlines() or [""])[-1].strip()
    if result.reason in ("error", "memory") and last:
        why = last  # the exception, as Python names it
    else:
        why = f"{result.reason} ({code_sandbox.REASONS[result.reason]})"
    return f"error: {why}" + ("\n" + text if text else "")


class PythonTool:
    """`<tool>print(47 * 382)</tool>` -> `17954`: the argument runs as a Python program in the sandbox,
    with the sandbox's limits and at most `timeout_s` of wall time. Built once per loop: it checks at
    start that this machine can run the sandbox (SandboxUnavailable otherwise) and says how it isolates."""

    grace_s = 5.0  # the sandbox enforces timeout_s itself; the loop's own timer only backs it up

    def __init__(self, conf: SandboxConf) -> None:
        code_sandbox.check_available(conf)
        self.conf = conf
        if conf.isolation == "rlimits":
            log.warning("python tool: agent.sandbox.isolation=rlimits, the weaker mode: the code runs without "
                        "namespaces (no child processes, no network sockets, rlimits), but it sees the file system "
                        "with the rights of %s (docs/concepts/sandbox.md)", "nobody" if os.geteuid() == 0 else "this user")
        else:
            log.info("python tool: each call in bubblewrap namespaces, %s", conf)

    def __call__(self, code: str, timeout_s: float) -> ToolOutput:
        result = code_sandbox.run(code, limits=replace(self.conf, wall_s=min(self.conf.wall_s, timeout_s)))
        return ToolOutput(sandbox_output(result), result.reason, result.wall_s)


TOOLS: dict[str, Callable[[SandboxConf], Tool]] = {
    "calculator": lambda sandbox: calculator_tool,
    "python": PythonTool,
}


def build_tools(names: list[str], sandbox: SandboxConf | None = None) -> dict[str, Tool]:
    """The named tools, in order (the first is the default); a clear error for an unknown name.
    `sandbox`: the limits of the python tool."""
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise ValueError(f"agent.tools={names!r}: unknown tool(s) {unknown} (available: {', '.join(TOOLS)})")
    return {n: TOOLS[n](sandbox if sandbox is not None else SandboxConf()) for n in names}
