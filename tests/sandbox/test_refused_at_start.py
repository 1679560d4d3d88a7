"""`agent.tools=[python]` input that cannot work is refused by `train.py` in one line naming the key,
exit 2, before a run directory exists: a model without a chat template, sandbox limits that are
zero, negative or not finite, a sandbox this machine cannot run."""

from __future__ import annotations

import pytest

from tests.faults.test_refused_input import SIM, refused
from tests.sandbox.test_hostile_code import needs_sandbox

pytestmark = [pytest.mark.timeout(600)]

PYTHON_TOOL = [*SIM, "agent=multi_turn_tool", "agent.tools=[python]"]


@pytest.mark.parametrize("args, expect", [
    (["agent.sandbox.cpu_s=0"], ["agent.sandbox.cpu_s=0.0", "> 0"]),
    (["agent.sandbox.wall_s=-5"], ["agent.sandbox.wall_s=-5.0", "> 0"]),
    (["agent.sandbox.wall_s=inf"], ["agent.sandbox.wall_s=inf", "finite"]),
    (["agent.sandbox.cpu_s=nan"], ["agent.sandbox.cpu_s=nan", "finite"]),
    (["agent.sandbox.memory_mb=0"], ["agent.sandbox.memory_mb=0", ">= 1"]),
    (["agent.sandbox.max_processes=-1"], ["agent.sandbox.max_processes=-1"]),
    (["agent.sandbox.max_output_bytes=0"], ["agent.sandbox.max_output_bytes=0"]),
    (["agent.sandbox.isolation=off"], ["agent.sandbox.isolation='off'", "namespaces, rlimits"]),
    (["agent.tool_budget_s=0"], ["agent.tool_budget_s=0.0", "> 0"]),
])
def test_bad_limits_are_refused_naming_the_key(tmp_path, args, expect):
    refused([*PYTHON_TOOL, *args], tmp_path, expect)
    assert not (tmp_path / "outputs").exists()


def test_the_python_tool_with_a_model_without_a_chat_template_is_refused(tmp_path):
    """The default model (assets/tiny-arith, a character model) has no chat template."""
    refused(PYTHON_TOOL, tmp_path, ["agent.tools=['python']", "model.path=", "no chat template"], spawn=True)
    assert not (tmp_path / "outputs").exists()


@needs_sandbox
def test_a_sandbox_that_cannot_run_here_is_refused_at_start(tmp_path):
    refused([*PYTHON_TOOL, "model=tiny_chat", "task=jsonl", "task.path=assets/tiny-chat/data/tools_train.jsonl",
             "agent.sandbox.python=/nonexistent/python3"], tmp_path,
            ["agent.sandbox.isolation=namespaces cannot run here", "agent.sandbox.python=/nonexistent/python3",
             "agent.sandbox.isolation=rlimits"])
    assert not (tmp_path / "outputs").exists()
