"""Fixtures shared by the fault tests' modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlharness.core.checkpoint import latest_checkpoint
from tests.faults.test_refused_input import SIM
from tests.helpers import run_cli


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A 4-step run made by `train.py` (so it has .hydra/), checkpoints at steps 2 and 4. Shared by
    every module that refuses starts into it or resumes a copy: each such test asserts the run is
    byte-identical afterwards (`refused(..., watch=)`) or works on a copy."""
    run_dir = tmp_path_factory.mktemp("faults") / "run"
    run_cli([*SIM, "total_steps=4", f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    assert latest_checkpoint(run_dir)[0] == 4
    return run_dir
