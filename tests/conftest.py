"""Shared fixtures. Heavy ones are session-scoped so the 2-core CI pays for them once."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised 2-layer character-level Llama in Hugging Face format."""
    from rlharness.tiny import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model", seed=0))


@pytest.fixture(scope="session")
def sync_reference_run(tmp_path_factory):
    """The kill test's sync run (tests/resume/test_kill_resume.py `SYNC`, 8 steps) left alone, as a
    process of its own: the reference that the killed run (tests/resume) and the signal-stopped run
    (tests/faults/test_signal_stop.py, which checkpoints every 3 steps instead of every step) must
    each train exactly like. One run for both: a sync run trains the same whatever its save_every,
    so sharing it asks no less of either test (the stopped run is held to a run that saved more
    often)."""
    from tests.resume.test_kill_resume import SYNC, run_to_the_end

    run_dir = tmp_path_factory.mktemp("sync_reference") / "reference"
    run_to_the_end(run_dir, SYNC)
    return run_dir


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config, items):
    """`vllm` tests need vLLM, which lives in .venv-vllm (scripts/setup_vllm.sh). In a Python
    without it they are deselected when that venv exists (the README's test command runs them
    there, where none skips) and skipped, naming the script, when it does not."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return
    vllm_items = [i for i in items if i.get_closest_marker("vllm")]
    if not vllm_items:
        return
    if os.path.exists(os.path.join(ROOT, ".venv-vllm", "bin", "python")):
        config.hook.pytest_deselected(items=vllm_items)
        items[:] = [i for i in items if not i.get_closest_marker("vllm")]
        return
    skip = pytest.mark.skip(reason="vLLM is not installed here: `bash scripts/setup_vllm.sh`, then "
                                   ".venv-vllm/bin/python -m pytest -m vllm")
    for item in vllm_items:
        item.add_marker(skip)
