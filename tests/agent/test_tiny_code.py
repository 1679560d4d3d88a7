"""The embedded code model `assets/tiny-code` through `train.py experiment=code_tools`: the python tool
runs its programs in the sandbox, the ledger keeps each call's outcome, and its build script is
deterministic."""

from __future__ import annotations

import json

import pytest

from rlharness.model import PROJECT_ROOT
from rlharness.run_dir import RunDir
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
        assert tools[0]["text"] == "" or tools[0]["stop"] == "ok" or tools[0]["text"].startswith("error: ")


@pytest.mark.slow
def test_make_tiny_code_model_is_deterministic_on_a_reduced_size(tmp_path):
    import subprocess
    import sys

    from tests.helpers import load_script

    script = PROJECT_ROOT / "scripts" / "make_tiny_code_model.py"
    small = ["--steps", "4", "--num-train", "40", "--num-eval", "4", "--vocab-size", "300", "--batch-size", "8"]
    for name in ("a", "b"):
        subprocess.run([sys.executable, str(script), "--out", str(tmp_path / name), *small], check=True,
                       capture_output=True, timeout=300)
    chat = load_script(PROJECT_ROOT / "scripts" / "make_tiny_chat_model.py", "make_tiny_chat_model")
    assert chat.digest(tmp_path / "a") == chat.digest(tmp_path / "b")
    assert json.loads((tmp_path / "a" / "warmup.json").read_text())["final"] == \
        json.loads((tmp_path / "b" / "warmup.json").read_text())["final"]
