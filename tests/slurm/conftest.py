"""A real two-node Slurm for the `slurm` tests (nodes rlh-node1 and rlh-node2, two
count-only GPUs each), brought up once per session by `scripts/slurm_local.sh up --nodes 2`.
Tests skip (with the script's reason) only when it cannot run here, e.g. no root to
install or start the daemons."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm_local.sh"
UP_TIMEOUT_S = 600  # includes apt-get install on a fresh machine: only a hang reaches it
NODES = 2
GPUS_PER_NODE = 2


def _parse_env(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            env[key] = value.replace("$PATH", os.environ.get("PATH", ""))
    return env


@pytest.fixture(scope="session")
def slurm_env() -> dict[str, str]:
    """Environment variables a Slurm client needs (SLURM_CONF, PATH with the sacct shim);
    also exported into this process so submitit, called in-process, finds the cluster."""
    if shutil.which("bash") is None:
        pytest.skip("scripts/slurm_local.sh needs bash")
    try:
        out = subprocess.run(["bash", str(SCRIPT), "up", "--nodes", str(NODES), "--gpus", str(GPUS_PER_NODE)], capture_output=True, text=True, timeout=UP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"scripts/slurm_local.sh up did not finish in {UP_TIMEOUT_S} s")
    if out.returncode != 0:
        reason = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        if "needs root" in reason or "no apt-get" in reason:
            pytest.skip(f"no local Slurm possible here: {reason}")
        pytest.fail(f"scripts/slurm_local.sh up failed: {out.stderr}")
    env = _parse_env(out.stdout)
    assert "SLURM_CONF" in env, out.stdout
    os.environ.update(env)
    return env
