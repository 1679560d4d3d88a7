"""Warm sandboxes (rlharness/sandbox/warm.py): started ahead, each runs one call only, none outlives
its pool, and a dead one is replaced rather than used."""

from __future__ import annotations

import pytest

from rlharness.config.schema import SandboxConf
from rlharness.sandbox import run, warm
from tests.helpers import HANG_S
from tests.sandbox.test_hostile_code import live_processes_with, needs_sandbox, wait_until_none

pytestmark = [pytest.mark.timeout(300), needs_sandbox]


def marker(conf: SandboxConf) -> str:
    """A string only this conf's sandboxes have on their command line (bubblewrap's --size of /tmp)."""
    return f"--size\0{conf.tmp_mb << 20}\0"


@pytest.mark.parametrize("isolation", ["namespaces", "rlimits"])
def test_each_warm_sandbox_runs_one_call_and_none_outlives_the_pool(isolation):
    conf = SandboxConf(isolation=isolation, warm=2, tmp_mb=37 if isolation == "namespaces" else 64)
    first = run("import os\nopen(os.environ['TMPDIR'] + '/left', 'w').write('x')\nprint(os.getpid())", limits=conf)
    second = run("import os\nprint(os.path.exists(os.environ['TMPDIR'] + '/left'), os.getpid())", limits=conf)
    assert first.ok and second.ok, (first, second)
    assert second.stdout.split()[0] == "False"  # nothing carries over from one call to the next
    pool = next(p for p in warm._pools.values() if p.conf.tmp_mb == conf.tmp_mb)
    with pool.wanted:  # the pool refills in its own thread: wait for it, not for a moment
        assert pool.wanted.wait_for(lambda: len(pool.ready) == conf.warm, timeout=HANG_S)
    if isolation == "namespaces":
        assert live_processes_with(marker(conf))  # two wait for their program
    warm.close_all()
    if isolation == "namespaces":
        assert wait_until_none(marker(conf)) == []


def test_a_dead_warm_sandbox_is_replaced_not_used():
    conf = SandboxConf(warm=1, tmp_mb=41)
    assert run("print(1)", limits=conf).ok
    pool = next(p for p in warm._pools.values() if p.conf.tmp_mb == 41)
    with pool.wanted:
        assert pool.wanted.wait_for(lambda: pool.ready, timeout=HANG_S)
        for started in pool.ready:
            started.proc.kill()
            started.proc.wait()
    result = run("print(2)", limits=conf)
    assert (result.reason, result.stdout) == ("ok", "2\n")
    warm.close_all()
