"""A teacher that fails while a run goes on (issue 42): a scoring call that raises and one that blocks
past `algo.teacher.timeout_s` each fail the groups they carry, with the reason in rollouts/dropped.jsonl;
the prompts are sampled again and every step trains on a full batch of scored groups.

The real producer, teacher (the tiny teacher model, colocated) and trainer (engine=sim, backend=sim).
The faults are injected into the teacher's forward pass: the first call raises; the second blocks until
the teacher is called again, which happens only once the blocked call has timed out (one call at a time,
rlharness/teacher/client.py), so its timeout does not depend on the machine's speed."""

from __future__ import annotations

import json
import threading

import pytest

from rlharness.core.run_dir import RunDir
from rlharness.teacher.model import TeacherModel
from tests.helpers import ROOT, run_in_process

pytestmark = [pytest.mark.timeout(600)]

TEACHER = ROOT / "assets" / "tiny-arith-teacher"
BATCH = 4


def test_a_raising_and_a_timing_out_teacher_fail_their_groups_and_lose_nothing(tmp_path, monkeypatch):
    real = TeacherModel.logprobs
    calls = []
    released = threading.Event()  # the blocked (second) call waits for the third call

    def faulty(self, rows, temperature):
        calls.append(len(rows))
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (injected)")
        if len(calls) == 2:
            released.wait()
            return [[0.0] * (len(ids) - prompt_len) for ids, prompt_len in rows]
        released.set()
        return real(self, rows, temperature)

    monkeypatch.setattr(TeacherModel, "logprobs", faulty)
    run_dir = tmp_path / "run"
    run_in_process(run_dir, ["engine=sim", "backend=sim", "engine.time_per_token_s=0.0002", "eval_every=0",
                             "logger=none", "save_every=0", f"batch_size={BATCH}", "sampler.prompt_repeat_k=2",
                             "total_steps=2", "algo=opd", f"algo.teacher.path={TEACHER}", "algo.teacher.timeout_s=2"])
    assert released.is_set()
    run = RunDir(run_dir)
    dropped = [json.loads(line) for line in run.dropped.read_text().splitlines()]
    reasons = {r["group_id"]: r["reason"] for r in dropped}
    assert any("RuntimeError: CUDA out of memory (injected)" in why for why in reasons.values()), reasons
    assert any("timed out" in why for why in reasons.values()), reasons
    assert all(r["status"] == "failed" and str(TEACHER) in r["reason"] for r in dropped), dropped
    trained = [json.loads(line) for f in sorted(run.rollouts.glob("step_*.jsonl")) for line in f.read_text().splitlines()]
    groups = {r["group_id"] for r in trained}
    assert len(groups) == 2 * BATCH and not groups & set(reasons)  # full batches, none of them a failed group
    assert all(isinstance(r["reverse_kl"], float) for r in trained)  # every trained sample was scored
    rows = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    assert [r["step"] for r in rows if "distill/reverse_kl" in r] == [1, 2]
    assert sum(r.get("rollout/groups_failed", 0) for r in rows) == len(reasons)  # each failed group counted
