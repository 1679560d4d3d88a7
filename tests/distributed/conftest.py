"""One local Ray session for all tests in this directory (starting Ray costs ~5 s)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The producer tests' harness builds a real manager on any engine; the restart test reuses it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "producer"))


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """Local Ray with 4 logical CPUs (oversubscribes a 2-core machine: actors mostly wait)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from rlharness.config.schema import LocalRayClusterConf
    from rlharness.cluster import connect_ray

    if ray.is_initialized():
        yield ray
        return
    connect_ray(LocalRayClusterConf(num_cpus=4, object_store_memory_mb=256))
    yield ray
    ray.shutdown()
