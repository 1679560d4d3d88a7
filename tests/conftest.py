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
