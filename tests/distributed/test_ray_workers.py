"""The Ray that a run starts (`connect_ray`): its workers run at the driver's priority."""

from __future__ import annotations

import os

import pytest

from tests.helpers import HANG_S

pytestmark = [pytest.mark.ray, pytest.mark.timeout(HANG_S + 60)]


def test_workers_run_at_the_drivers_niceness(ray_session):
    """Ray's default puts workers at nice +15: beside any busy process the run's engines and
    trainers then get a few percent of a core (a run's actor start took 66 s instead of 8 s in CI)."""

    @ray_session.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray_session.get(niceness.remote(), timeout=HANG_S) == os.nice(0)
