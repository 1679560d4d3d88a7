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
