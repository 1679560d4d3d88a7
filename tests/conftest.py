"""Shared fixtures. Heavy ones are session-scoped so the 2-core CI pays for them once."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """RLH_JUNIT_DIR (set by benchmarks/ci_fresh_clone.sh): each pytest run of `.ci/run` writes its
    JUnit XML there, named after its venv, for scripts/test_durations.py (tests/durations.json)."""
    folder = os.environ.get("RLH_JUNIT_DIR")
    if folder and not config.option.xmlpath:
        config.option.xmlpath = os.path.join(folder, f"junit-{Path(sys.prefix).name}.xml")


@pytest.fixture(scope="session")
def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


@pytest.fixture(autouse=True)
def _torch_threads_restored(_torch_threads):
    """A test that runs a disaggregated run in-process leaves torch on the driver's one thread
    (rlharness.distributed); the next test must get the process's own count back."""
    yield
    import torch

    if torch.get_num_threads() != _torch_threads:
        torch.set_num_threads(_torch_threads)


@pytest.fixture(autouse=True)
def _logged_metrics_are_in_the_catalog(request):
    """Every key of every `metrics.jsonl` a test's runs wrote under its `tmp_path` is in the metrics
    catalog (rlharness/logging_utils/metric_catalog.py, which docs/reference/metrics.md is made from):
    a metric added without its entry fails the tests that run it."""
    # Asked for here, before the test, so that it is torn down after this check.
    tmp_path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp_path is not None:
        from tests.helpers import uncataloged_metrics

        unknown = uncataloged_metrics(tmp_path)
        assert unknown == {}, (f"metric keys that rlharness/logging_utils/metric_catalog.py does not list: {unknown}; "
                               f"add them there and run python scripts/gen_reference.py")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised 2-layer character-level Llama in Hugging Face format."""
    from rlharness.model.tiny import save_tiny_model

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
    _deselect_or_skip_vllm(config, items)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the order xdist hands tests out in: slowest files first
        from tests.xdist_scheduling import slowest_scopes_first

        slowest_scopes_first(items)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: pytest would refuse it without xdist (or with -p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """`pytest -n 2`: tests/xdist_scheduling.py keeps each file (and all of tests/slurm/) on one
    worker, slowest first; another `--dist` asked for by name is xdist's own."""
    if config.getvalue("dist") == "load":
        from tests.xdist_scheduling import GroupedScheduling

        return GroupedScheduling(config, log)
    return None


def _deselect_or_skip_vllm(config, items) -> None:
    """`vllm` tests need vLLM, which lives in .venv-vllm (scripts/setup_vllm.sh). In a Python
    without it they are deselected when that venv exists (the README's test command runs them
    there, where none skips) and skipped, naming the script, when it does not."""
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
