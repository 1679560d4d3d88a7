"""scripts/gpu_check.sh: without a GPU it stops at once, non-zero, with one line saying why; its phases
that need no GPU (rollout, trainer, the colocated sync, full and delta) run on vLLM's CPU build."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def _run_sh(tmp_path: Path, path_dirs: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": os.pathsep.join(path_dirs)}
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "out.json")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def _fake_nvidia_smi(folder: Path, script: str) -> str:
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\n{script}\n")
    tool.chmod(0o755)
    return str(folder)


@pytest.mark.parametrize("nvidia_smi", ["absent", "lists none", "fails"])
def test_without_a_gpu_it_fails_at_once_with_one_line(tmp_path, nvidia_smi):
    system = [d for d in os.environ["PATH"].split(os.pathsep) if d]
    if nvidia_smi == "absent":
        if shutil.which("nvidia-smi"):
            pytest.skip("nvidia-smi is installed here")
        dirs = system
    else:
        dirs = [_fake_nvidia_smi(tmp_path / "bin", "exit 0" if nvidia_smi == "lists none" else "exit 9"), *system]
    done = _run_sh(tmp_path, dirs)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: FAILED: no NVIDIA GPU here"), done.stderr
    assert not (tmp_path / "out.json").exists() and "set-up" not in done.stdout  # nothing installed, nothing run


def test_the_check_itself_refuses_a_torch_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch sees a GPU")
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("gpu_check:")]
    assert len(lines) == 1 and "sees no CUDA device" in lines[0], done.stderr
    assert json.loads(out.read_text())["ok"] is False


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_the_phases_rehearse_on_vllms_cpu_build(tmp_path):
    """The rollout, the trainer's step and bfloat16 gap, the group sync (gloo here) and the colocated
    sync (full, then delta) run through the script's own code on the embedded chat model; what only a
    GPU can show (sleep mode, NCCL, CUDA training) it cannot."""
    gpu_check = load_script(ROOT / "scripts" / "gpu_check.py", "gpu_check")
    args = argparse.Namespace(model=ROOT / "assets" / "tiny-chat", prompts=4, samples=2, max_tokens=48, train_steps=1,
                              lr=1e-4, gpu_memory_utilization=0.3)
    report = gpu_check.Report(tmp_path / "out.json")
    check = gpu_check.Check(args, gpu=False)
    try:
        for name, phase in (("vllm_start", check.start_vllm), ("rollout", check.first_rollout),
                            ("trainer", check.train), ("group_sync", check.group_sync),
                            ("colocated_sync", check.colocated_sync)):
            assert report.phase(name, phase), report.data["errors"]
    finally:
        check.close()
    phases = json.loads((tmp_path / "out.json").read_text())["phases"]
    assert phases["rollout"]["requests"] == 8 and phases["rollout"]["tokens_per_s"] > 0
    assert phases["trainer"]["train_tokens_per_s"] > 0 and phases["trainer"]["logprob_gap_bf16_mean"] < 0.5
    assert phases["trainer"]["packed_rows"]  # SmolLM2 with sdpa or eager keeps packed samples apart
    group = phases["group_sync"]
    assert group["backend"] == "gloo" and 0 < group["delta"]["bytes"] < group["full"]["bytes"]
    assert group["delta"]["gap_after_sync"] < group["delta"]["gap_before_sync"]
    sync = phases["colocated_sync"]
    assert 0 < sync["delta"]["bytes"] < sync["full"]["bytes"]
    assert sync["gap_after_sync"] < 0.5


@pytest.mark.timeout(600)
def test_the_packed_rows_phases_rehearse_on_the_cpu(tmp_path):
    """The packed-rows phases and their summary through the script's own code, on the CPU, where only eager
    and sdpa can train (flex_attention has no backward pass on a CPU; flash needs CUDA); no rollout ran, so
    only the lognormal lengths."""
    gpu_check = load_script(ROOT / "scripts" / "gpu_check.py", "gpu_check")
    args = argparse.Namespace(model=ROOT / "assets" / "tiny-chat", prompts=4, samples=2, lr=1e-4, packed_budget=2048,
                              packed_steps=1)
    check = gpu_check.Check(args, gpu=False)
    assert check.packing_attentions() == ["eager", "sdpa"]
    sizes = check.packing_sizes()
    assert list(sizes) == ["lognormal"] and len(sizes["lognormal"]) == 8
    report = gpu_check.Report(tmp_path / "out.json")
    for attention in check.packing_attentions():
        assert report.phase(f"packed_rows_{attention}_lognormal",
                            lambda: check.packed_rows(attention, sizes["lognormal"])), report.data["errors"]
        phase = report.data["phases"][f"packed_rows_{attention}_lognormal"]
        assert phase["loss_rel_diff"] < 1e-4 and phase["budget"] == 2048
    summary = gpu_check.packing_summary(report.data["phases"])["lognormal"]
    assert summary["packed"]["padding_frac"] < summary["padded"]["padding_frac"]
    assert summary["packed"]["attention"] in ("eager", "sdpa") and summary["packed_over_padded"] > 0
