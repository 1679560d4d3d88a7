"""On-policy distillation in the modes issue 42 names, each for real on the tiny model, a few steps:
- `mode=disagg strategy=async max_staleness=1` with a LoRA student: the teacher is a Ray actor of its
  own, scoring while the trainer trains; the adapters train, the teacher stays as its folder has it,
  samples a version old are scored and trained on;
- `backend=deepspeed` (ZeRO, a Ray training actor) on a two-task mix: one task distils from the run's
  teacher (algo.teacher, float32), the other from a teacher of its own (tasks.unpadded.teacher, bfloat16).
Asserted what shows the feature worked (metrics, the ledger, the log, the checkpoint), never a time."""

from __future__ import annotations

import hashlib
import json
import logging
import math

import pytest

from rlharness.core.run_dir import RunDir
from rlharness.logging_utils.metrics import read_metrics
from tests.helpers import ROOT, run_in_process

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

TEACHER = ROOT / "assets" / "tiny-arith-teacher"
SMALL = ["batch_size=4", "sampler.prompt_repeat_k=2", "eval_every=0", "logger=none", "algo=opd",
         f"algo.teacher.path={TEACHER}"]
DISTILL = ("distill/reverse_kl", "distill/reverse_kl_max", "distill/teacher_logprob_mean", "perf/teacher_s")


def folder_digest(folder) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())).hexdigest()


def trained_rows(run_dir) -> list[dict]:
    return [json.loads(line) for f in sorted(RunDir(run_dir).rollouts.glob("step_*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]


def check_distilled(run_dir, steps: int) -> list[dict]:
    rows = [r for r in read_metrics(RunDir(run_dir).metrics) if "distill/reverse_kl" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(math.isfinite(r[k]) for r in rows for k in DISTILL), rows
    trained = trained_rows(run_dir)
    assert trained and all(math.isfinite(r["reverse_kl"]) for r in trained)
    return trained


def test_disagg_async_lora_student_with_the_teacher_on_its_own_actor(ray_session, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    run_dir, before = tmp_path / "run", folder_digest(TEACHER)
    run_in_process(run_dir, [*SMALL, "mode=disagg", "cluster=local_ray", "strategy=async", "max_staleness=1",
                             "strategy.enable_partial_rollout=true", "total_steps=2", "save_every=2",
                             "model.lora.rank=4", "algo.lr=3e-3"])
    trained = check_distilled(run_dir, 2)
    assert f"loading the teacher {TEACHER} (float32, Ray actor): done" in caplog.text  # the teacher on an actor of its own
    # Structural, not a race: async keeps batch + ceil(0.25 * batch) = 5 groups in flight from the start, all
    # begun on version 0, and step 1 takes 4: the fifth is trained at step 2, a version old (max_staleness=1).
    stale = [r for r in trained if r["train_step"] - r["min_policy_version"] - 1 >= 1]
    assert stale, "no sample a version old was trained"  # and each was scored (check_distilled)
    ckpt = RunDir(run_dir).checkpoint(2) / "backend"
    assert (ckpt / "adapter_config.json").is_file()  # the student's adapters trained and saved
    assert folder_digest(TEACHER) == before  # the teacher frozen: its folder as it was


@pytest.mark.deepspeed
def test_deepspeed_multitask_run_with_a_teacher_of_its_own_for_one_task(ray_session, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*SMALL, "experiment=arith_mix", "backend=deepspeed", "cluster=local_ray",
                             "total_steps=2", "save_every=0", f"tasks.unpadded.teacher.path={TEACHER}",
                             "tasks.unpadded.teacher.dtype=bfloat16"])
    trained = check_distilled(run_dir, 2)
    assert {r["task"] for r in trained} == {"padded", "unpadded"}
    assert f"loading the teacher {TEACHER} (float32, cpu): done" in caplog.text  # the run's, for padded
    assert f"loading the teacher {TEACHER} (bfloat16, cpu): done" in caplog.text  # unpadded's own
