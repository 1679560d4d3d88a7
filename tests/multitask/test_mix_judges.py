"""Judger metrics per task (`judge/<task>/<count>`) plus their total (`judge/<count>`) in a mixed run."""

from __future__ import annotations

import pytest

from rlharness.logging_utils.ledger import read_ledger
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.helpers import run_in_process
from tests.judger.test_remote_judger import server  # noqa: F401 - a real HTTP judge on 127.0.0.1
from tests.multitask.test_mix_runs import BASE


@pytest.mark.timeout(300)
def test_judge_counts_are_per_task_and_summed(tmp_path, server):  # noqa: F811
    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*BASE, "total_steps=4", "+judger@tasks.unpadded.judger=remote",
                             f"tasks.unpadded.judger.url=http://127.0.0.1:{server.server_port}/judge"])
    rows = [r for r in read_metrics(RunDir(run_dir).metrics) if "judge/requests" in r]
    trained, _ = read_ledger(run_dir)
    # Only the remote-judged task asks the server: every request (training and evaluation) is counted
    # once, under its name and in the total; the math judger makes none.
    assert sum(r["judge/unpadded/requests"] for r in rows) == len(server.seen)
    assert len(server.seen) > sum(r["task"] == "unpadded" for r in trained) > 0
    for r in rows:
        assert r["judge/requests"] == r["judge/unpadded/requests"]
        assert "judge/padded/requests" not in r
        assert r["judge/groups_failed"] == r["judge/padded/groups_failed"] + r["judge/unpadded/groups_failed"]
