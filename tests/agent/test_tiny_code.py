"""The embedded code model `assets/tiny-code` through `train.py experiment=code_tools`: the python tool
runs its programs in the sandbox and the ledger keeps each call's outcome (its build script's
determinism: tests/agent/test_tiny_chat.py)."""

from __future__ import annotations

import pytest

from rlharness.core.run_dir import RunDir
from rlharness.sandbox import SandboxUnavailable, check_available

pytestmark = pytest.mark.timeout(600)
try:
    check_available()
except SandboxUnavailable as exc:
    pytest.skip(f"sandbox unavailable: {exc}", allow_module_level=True)


def test_train_py_experiment_code_tools_records_each_call_in_the_ledger(tmp_path):
    from rlharness.logging_utils.ledger import read_ledger
    from rlharness.logging_utils.metrics import read_metrics
    from tests.helpers import QUICK, run_in_process

    run_dir = tmp_path / "run"
    run_in_process(run_dir, ["experiment=code_tools", *QUICK, "total_steps=2", "eval_every=0", "eval.num_prompts=8"])
    metrics = read_metrics(RunDir(run_dir).metrics)
    trained_steps = [r for r in metrics if "train/loss" in r]
    assert [r["step"] for r in trained_steps] == [1, 2]
    assert all("agent/tool_calls_per_sample" in r and "agent/tool_failed_frac" in r for r in trained_steps)
    assert any("eval/tool_use_frac" in r for r in metrics)
    trained, _ = read_ledger(run_dir)
    called = [r for r in trained if r["tool_calls"]]
    assert called, "expected some samples to call the python tool"
    for row in called:
        tools = [t for t in row["turns"] if t["role"] == "tool"]
        assert len(tools) == row["tool_calls"] and all("stop" in t and "seconds" in t for t in tools)
        for tool in tools:
            assert tool["stop"] == "ok" or tool["text"].startswith("error: "), tool
