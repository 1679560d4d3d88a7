"""Samples for people: W&B tables of a step's samples and of each eval's completions (read back
from W&B's offline files under files/media/table/), evals/step_N.jsonl, and the resume rule
(eval files past the checkpoint are redone); the bound keeps whole groups; the tool agent's
turns are columns; a run's first lines say where it is and how to follow it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlharness.core.checkpoint import complete_checkpoints
from rlharness.logging_utils.samples import eval_table, sample_table
from rlharness.core.run_dir import RunDir
from rlharness.core.types import Status, make_group
from tests.helpers import run_cli

pytestmark = [pytest.mark.timeout(600)]

K = 4  # sampler.prompt_repeat_k
RUN = ["total_steps=4", "batch_size=4", f"sampler.prompt_repeat_k={K}", "eval.num_prompts=6", "eval_every=1",
       "eval.num_samples=2", "save_every=2", "logger.mode=offline", "logger.log_samples_every=2",
       "logger.max_sample_rows=10"]


def group(i: int, k: int, turns: bool = False):
    g = make_group(task="t", prompt_index=i, epoch=0, prompt_text=f"p{i}", prompt_ids=[1], label={"answer": "1"},
                   k=k)
    for m, s in enumerate(g):
        s.response_text, s.reward, s.status, s.finish_reason = f"r{m}", {"score": float(m % 2)}, Status.COMPLETED, "stop"
        s.response_model_steps = [2, 3]
        if turns:
            s.extra.update(tool_calls=1, turns=[{"role": "model", "text": "<tool>1+1</tool>"},
                                                {"role": "tool", "text": "2"}])
    return g


def test_the_bound_keeps_whole_groups_and_tool_turns_are_columns():
    columns, rows = sample_table(7, [group(i, 3) for i in range(5)], max_rows=10)
    assert len(rows) == 9 and [r[columns.index("prompt")] for r in rows] == ["p0"] * 3 + ["p1"] * 3 + ["p2"] * 3
    assert rows[0][:2] == [7, "t"] and rows[0][columns.index("min_policy_version")] == 2
    assert "turns" not in columns
    columns, rows = sample_table(1, [group(0, 2, turns=True)], max_rows=10)
    assert rows[0][columns.index("tool_calls")] == 1
    assert json.loads(rows[0][columns.index("turns")])[1] == {"role": "tool", "text": "2"}
    # A group larger than the bound is cut rather than left out.
    assert len(sample_table(1, [group(0, 8)], max_rows=5)[1]) == 5
    prompt_rows = [{"task": "t", "prompt_index": i, "prompt": "q", "answer": 3,
                    "samples": [{"kind": "greedy", "response": "3", "extracted": "3", "judgement": "correct",
                                 "score": 1.0, "finish_reason": "stop"}] * 3} for i in range(4)]
    assert len(eval_table(0, prompt_rows, max_rows=7)[1]) == 6


def tables(run_dir: Path, key: str) -> dict[int, tuple[list, list]]:
    """step -> (columns, rows) of every table W&B wrote for `key` (e.g. rollout/samples)."""
    found = {}
    for f in (run_dir / "wandb").glob(f"offline-run-*/files/media/table/{key}_*.table.json"):
        t = json.loads(f.read_text())
        steps = {r[t["columns"].index("step")] for r in t["data"]}
        assert len(steps) == 1
        found[steps.pop()] = (t["columns"], t["data"])
    return found


def test_a_run_logs_sample_tables_and_eval_files_and_a_resume_redoes_them(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli([*RUN, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    first = RunDir(run_dir).log().read_text().splitlines()[0]
    assert f"run directory: {run_dir}" in first and f"tail -f {run_dir / 'train.log'}" in first
    offline = next((run_dir / "wandb").glob("offline-run-*"))
    assert f"wandb sync {offline}" in RunDir(run_dir).log().read_text()
    assert "Traceback" not in proc.stderr

    samples = tables(run_dir, "rollout/samples")
    assert sorted(samples) == [2, 4]  # every logger.log_samples_every steps
    for step, (columns, rows) in samples.items():
        assert columns[:6] == ["step", "task", "group_id", "prompt", "response", "reward"]
        assert len(rows) == 8  # whole groups of 4 within 10 rows
        per_group: dict[str, int] = {}
        for r in rows:
            per_group[r[2]] = per_group.get(r[2], 0) + 1
        assert set(per_group.values()) == {K}
        trained = [json.loads(ln) for ln in RunDir(run_dir).rollout(step).read_text().splitlines()]
        by_uid = {(t["group_id"], t["response"]): t for t in trained}
        for r in rows:  # what the table shows is what was trained
            t = by_uid[(r[2], r[4])]
            assert (r[3], r[5], r[6], r[7], r[8]) == (t["prompt"], t["reward"], t["finish_reason"],
                                                      t["min_policy_version"], t["max_policy_version"])

    evals = tables(run_dir, "eval/samples")
    assert sorted(evals) == [0, 1, 2, 3, 4]
    for step, (columns, rows) in evals.items():
        assert len(rows) == 9 and {"judgement", "extracted", "answer"} <= set(columns)  # 3 prompts x (1 + 2)
        on_disk = [json.loads(ln) for ln in RunDir(run_dir).eval_file(step).read_text().splitlines()]
        assert len(on_disk) == 6 and all(len(r["samples"]) == 3 for r in on_disk)
        disk_rows = [(r["prompt"], s["response"], s["judgement"]) for r in on_disk for s in r["samples"]]
        j = columns.index
        assert [(r[j("prompt")], r[j("response")], r[j("judgement")]) for r in rows] == disk_rows[:9]
    metrics = [json.loads(ln) for ln in RunDir(run_dir).metrics.read_text().splitlines()]
    for row in metrics:  # the file's judgements add up to the step's accuracy
        on_disk = [json.loads(ln) for ln in RunDir(run_dir).eval_file(row['step']).read_text().splitlines()]
        greedy = [r["samples"][0]["judgement"] == "correct" for r in on_disk]
        assert row["eval/accuracy"] == pytest.approx(sum(greedy) / len(greedy))

    # A crash after step 4's eval but before its checkpoint: resume from step 2 to total_steps=3.
    shutil.rmtree(complete_checkpoints(run_dir)[-1][1])
    kept = {p.name: p.read_bytes() for p in RunDir(run_dir).evals.glob("*.jsonl") if int(p.stem[5:]) <= 2}
    run_cli([*RUN, "total_steps=3", f"resume={run_dir}"], cwd=tmp_path)
    names = sorted(p.name for p in RunDir(run_dir).evals.glob("*.jsonl"))
    assert names == [f"step_{s:08d}.jsonl" for s in range(4)]  # step 4's file is gone, step 3 redone
    assert all((RunDir(run_dir).evals / n).read_bytes() == b for n, b in kept.items())
