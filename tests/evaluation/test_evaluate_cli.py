"""`python evaluate.py`: the base model and a trained run's checkpoints on the same held-out set,
each into a directory of its own (never the run's), with evals/*.jsonl and a summary; refused
input in one line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rlharness.core.checkpoint import complete_checkpoints
from rlharness.core.run_dir import RunDir
from tests.faults.test_refused_input import snapshot
from tests.helpers import run_cli

pytestmark = [pytest.mark.timeout(600)]

RUN = ["total_steps=2", "save_every=1", "batch_size=4", "eval.num_prompts=8", "eval_every=0",
       "logger.mode=disabled"]
EVAL = ["eval.num_prompts=12", "eval.num_samples=3", "eval.pass_k=2", "eval.temperature=0.8"]


def evaluate(args: list, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return run_cli(args, cwd, check=check, fresh_interpreter=True, script="evaluate.py")


def only_dir(root: Path) -> Path:
    (d,) = [p for p in root.glob("*/*") if p.is_dir()]
    return d


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("evaluate") / "run"
    run_cli([*RUN, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    assert [s for s, _ in complete_checkpoints(run_dir)] == [1, 2]
    return run_dir


def read_rows(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_base_and_trained_model_on_the_same_set(run, tmp_path):
    before = snapshot(run)
    base_cwd, trained_cwd = tmp_path / "base", tmp_path / "trained"
    base_cwd.mkdir()
    trained_cwd.mkdir()
    evaluate(["model.path=assets/tiny-arith", *EVAL], base_cwd)
    evaluate([f"resume={run}", "eval.checkpoint_step=1", *EVAL], trained_cwd)
    assert snapshot(run) == before, "evaluate.py wrote into the training run"
    base_out, trained_out = only_dir(base_cwd / "outputs" / "evaluate"), only_dir(trained_cwd / "outputs" / "evaluate")
    base_sum = json.loads(RunDir(base_out).summary.read_text())
    trained_sum = json.loads(RunDir(trained_out).summary.read_text())
    assert trained_sum["run_dir"] == str(run) and trained_sum["checkpoint_step"] == 1
    assert trained_sum["model"] == str(complete_checkpoints(run)[0][1] / "backend")
    for s in (base_sum, trained_sum):
        m = s["tasks"]["arithmetic"]
        assert set(m) == {"accuracy", "avg@n", "pass@k", "judge_failed"} and m["judge_failed"] == 0
        assert all(0.0 <= m[k] <= 1.0 for k in ("accuracy", "avg@n", "pass@k")) and m["pass@k"] >= m["avg@n"] - 1e-9
    assert "| arithmetic |" in (base_out / "summary.md").read_text()
    base_rows = read_rows(RunDir(base_out).eval_file("model"))
    trained_rows = read_rows(RunDir(trained_out).eval_file(1))
    # The same 12 prompts, each with 1 greedy + 3 sampled samples, judged.
    assert [r["prompt"] for r in base_rows] == [r["prompt"] for r in trained_rows] and len(base_rows) == 12
    for r in base_rows + trained_rows:
        assert [s["kind"] for s in r["samples"]] == ["greedy"] + ["sampled"] * 3
        for s in r["samples"]:
            assert s["judgement"] == ("correct" if s["score"] == 1.0 else "wrong")
            assert s["extracted"] is None or s["extracted"] in s["response"]
    # The summary's accuracy is the greedy samples' share judged correct.
    greedy = [r["samples"][0]["score"] for r in trained_rows]
    assert trained_sum["tasks"]["arithmetic"]["accuracy"] == pytest.approx(sum(greedy) / len(greedy))


def test_into_a_run_directory_only_when_asked_and_beside_its_files(run, tmp_path):
    before = snapshot(run)
    evaluate([f"resume={run}", "eval.num_prompts=4", f"hydra.run.dir={run}"], tmp_path)
    after = snapshot(run)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing of the run changed
    (out,) = run.glob("evaluate-*")
    assert RunDir(out).summary.is_file() and RunDir(out).eval_file(2).is_file()
    assert json.loads(RunDir(out).summary.read_text())["checkpoint_step"] == 2  # the newest by default
    for p in [out, *run.glob(".hydra/evaluate-*"), run / "evaluate.log"]:  # leave the module's run as it was
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def refused(args: list, cwd: Path, expect: list[str], spawn: bool = False) -> None:
    """evaluate.py refuses in one line, exit 2, nothing written. Forked from the tests' CLI server
    (tests/cli_forkserver.py: the process's own status and stderr) unless `spawn`."""
    before = sorted(p.name for p in cwd.iterdir())
    proc = run_cli(args, cwd, check=False, fresh_interpreter=spawn, script="evaluate.py")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert lines and lines[-1].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for word in expect:
        assert word in lines[-1], lines[-1]
    assert sorted(p.name for p in cwd.iterdir()) == before, "a refused evaluation left something behind"


def test_refused_input(run, tmp_path):
    no_ckpt = tmp_path / "no_ckpt"
    shutil.copytree(RunDir(run).hydra, RunDir(no_ckpt).hydra)
    refused([f"resume={no_ckpt}"], tmp_path, ["no complete checkpoint"], spawn=True)
    refused([f"resume={run}", "eval.checkpoint_step=5"], tmp_path, ["step 5", "the steps there are: 1, 2"])
    not_a_model = tmp_path / "not_a_model"
    not_a_model.mkdir()
    (not_a_model / "notes.txt").write_text("hello")
    refused([f"model.path={not_a_model}"], tmp_path, [f"model.path='{not_a_model}'", "no Hugging Face checkpoint"])
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n')
    (data / "eval.jsonl").write_text("")
    refused(["task=jsonl", f"task.path={data / 'train.jsonl'}", f"task.eval_path={data / 'eval.jsonl'}",
             "task.apply_chat_template=false", "eval.num_prompts=1", "task.num_eval=1"], tmp_path,
            [str(data / "eval.jsonl"), "no rows"])
    # A task that training would train without evaluating has nothing to evaluate here.
    refused(["experiment=arith_mix", "tasks.unpadded.task.num_eval=0", "eval.num_prompts=4"], tmp_path,
            ["tasks.unpadded", "eval split is empty"])
