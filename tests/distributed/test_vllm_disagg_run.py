"""`train.py engine=vllm mode=disagg cluster=local_ray strategy=async max_staleness=1` for real (in .venv-vllm):
training rank 0 (a Ray actor) broadcasts each version to the vLLM worker of the engine actor (gloo on CPU)."""

from __future__ import annotations

import json
import subprocess

import pytest

from rlharness.core.run_dir import RunDir
from tests.distributed.test_disagg_run import MAX_STALENESS, check_ledger, env, train_cmd

pytestmark = [pytest.mark.vllm, pytest.mark.ray, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_vllm_disagg_run_advances_versions_within_the_staleness_bound(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run(train_cmd(run_dir, "engine=vllm", "total_steps=3", "timeout_s=300"), cwd=tmp_path,
                         env=env(), capture_output=True, text=True, timeout=580)
    assert out.returncode == 0, out.stderr[-4000:]
    check_ledger(run_dir, 3)  # every sample within max_staleness, no prompt lost or repeated
    steps = [r for r in map(json.loads, RunDir(run_dir).metrics.read_text().splitlines()) if r["step"] > 0]
    assert [r["perf/engine_version"] for r in steps] == [1, 2, 3]  # each version reached vLLM's worker
    assert all(r["staleness/max"] <= MAX_STALENESS for r in steps)
    assert "weight group (gloo) formed" in RunDir(run_dir).log().read_text()
