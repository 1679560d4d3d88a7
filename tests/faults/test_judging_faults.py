"""Judging faults in real runs: a judging process stuck on a pathological answer, and a real HTTP
judge (tests/faults/judge_server.py, a separate process on 127.0.0.1 that lives as long as the
test) that holds replies until a whole group asks, is flaky, redirects, answers garbage or is down.

Every run is the real producer and trainer (engine=sim, backend=sim: the judging is what is
under test); checks are counts in metrics.jsonl, rollouts/ and the server's own counts.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlharness.logging_utils.ledger import read_ledger
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.helpers import run_cli, run_in_process

SERVER = Path(__file__).with_name("judge_server.py")
TOWER = "9^{9^{9}}"  # math-verify computes a 370-million-digit integer holding the GIL: minutes


def write_task(d: Path, answers: list[str]) -> list[str]:
    """train.jsonl with these answers (questions the tiny tokenizer can encode), eval.jsonl normal."""
    d.mkdir(parents=True, exist_ok=True)
    rows = [{"question": f"{i:03d}+{i % 7:03d}=", "answer": a} for i, a in enumerate(answers)]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "eval.jsonl").write_text("".join(json.dumps({"question": f"{i:03d}+001=", "answer": str(i + 1)}) + "\n"
                                          for i in range(8)))
    return ["engine=sim", "backend=sim", "task=jsonl", f"task.path={d / 'train.jsonl'}",
            f"task.eval_path={d / 'eval.jsonl'}", "task.num_eval=8", "eval.num_prompts=8", "batch_size=4",
            "logger=none", "save_every=0"]


def col(rows: list[dict], key: str) -> float:
    return sum(r.get(key, 0.0) for r in rows)


def dropped_groups(dropped: list[dict]) -> dict[str, dict]:
    return {r["group_id"]: r for r in dropped}


# ----------------------------------------------------------------------------- judging processes
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stuck_judging_process_costs_its_timeout_and_the_run_goes_on(tmp_path):
    """Labels that are towers of exponents: each member times out at agent.judge_timeout_s (its process
    killed and replaced) and failed for a reason that is not the policy's; its group, with no valid member
    left, is FAILED, counted, ledgered with the reason; every other group trains."""
    answers = [TOWER if i % 4 == 1 else str(i + i % 7) for i in range(16)]
    tower_rows = {i for i, a in enumerate(answers) if a == TOWER}
    overrides = write_task(tmp_path, answers) + [
        "sampler.prompt_repeat_k=2", "total_steps=3", "agent.judge_timeout_s=1", "judger.num_workers=1",
        f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_cli(overrides, cwd=tmp_path)
    run = tmp_path / "run"
    metrics = read_metrics(RunDir(run).metrics)
    trained, dropped = read_ledger(run)
    groups = dropped_groups(dropped)
    assert metrics[-1]["step"] == 3  # the run finished
    assert groups, "no tower label was drawn: the test data no longer exercises the fault"
    assert {r["prompt_index"] for r in dropped} <= tower_rows
    assert all("timeout after 1 s (judging process replaced)" in r["reason"] for r in dropped)
    assert not {r["prompt_index"] for r in trained} & tower_rows  # none trained with a bogus reward
    # Both members of a failed group time out (each is judged), all of them counted.
    assert col(metrics, "judge/timeouts") == col(metrics, "rollout/members_failed_infra") == 2 * len(groups)
    assert col(metrics, "rollout/groups_failed") == len(groups)
    assert col(metrics, "judge/processes_replaced") >= len(groups)
    assert len(trained) == 3 * 4 * 2
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(300)
def test_on_timeout_zero_scores_the_stuck_member_zero_and_trains_the_group(tmp_path):
    answers = [TOWER if i % 4 == 1 else str(i + i % 7) for i in range(16)]
    tower_rows = {i for i, a in enumerate(answers) if a == TOWER}
    overrides = write_task(tmp_path, answers) + [
        "sampler.prompt_repeat_k=2", "total_steps=2", "agent.judge_timeout_s=1", "judger.num_workers=2",
        "judger.on_timeout=zero"]
    run_in_process(tmp_path / "run", overrides)
    metrics = read_metrics(RunDir(tmp_path / "run").metrics)
    trained, dropped = read_ledger(tmp_path / "run")
    assert dropped == [] and col(metrics, "rollout/groups_failed") == 0
    tower_trained = [r for r in trained if r["prompt_index"] in tower_rows]
    assert tower_trained, "no tower label was drawn"
    assert all(r["reward"] == 0.0 for r in tower_trained)
    assert col(metrics, "judge/scored_zero_on_timeout") == col(metrics, "judge/timeouts") == len(tower_trained)


# ----------------------------------------------------------------------------- HTTP judge
def start_judge_server(tmp_path: Path, mode: str, env: dict | None = None, **opts) -> tuple[subprocess.Popen, str, callable]:
    """tests/faults/judge_server.py in `mode`, listening: (its process, url base, stats reader)."""
    stats_file = tmp_path / f"{mode}.stats.json"
    args = [sys.executable, str(SERVER), "--mode", mode, "--stats-file", str(stats_file)]
    for k, v in opts.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    # Its stdin stays open while the test runs (it stops when it closes); its port comes on stdout.
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    port = proc.stdout.readline().strip()  # once it listens: a wait on the server, not on a clock
    assert port.isdigit(), f"judge_server.py did not start (exit {proc.wait()})"
    return proc, f"http://127.0.0.1:{port}", lambda: json.loads(stats_file.read_text())


def stop_judge_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait()
    proc.stdin.close()
    proc.stdout.close()


@pytest.fixture
def judge_server(tmp_path):
    """Start tests/faults/judge_server.py in `mode`; yields (url base, stats reader)."""
    procs = []

    def start(mode: str, **opts) -> tuple[str, callable]:
        proc, base, stats = start_judge_server(tmp_path, mode, **opts)
        procs.append(proc)
        return base, stats

    yield start
    for p in procs:
        stop_judge_server(p)


@pytest.mark.timeout(240)
def test_group_members_are_judged_concurrently(tmp_path, judge_server):
    """8 members per group, and the judge answers a group's requests only once all 8 are waiting:
    members judged one after another would never be answered (each group FAILED at
    agent.judge_timeout_s); judged concurrently, nothing fails, on any machine."""
    base, stats = judge_server("together", together=8)
    overrides = write_task(tmp_path, [f"G{i}" for i in range(16)]) + [
        "sampler.prompt_repeat_k=8", "total_steps=2", "judger=remote", f"judger.url={base}/judge"]
    run_in_process(tmp_path / "run", overrides)
    metrics = read_metrics(RunDir(tmp_path / "run").metrics)
    trained, dropped = read_ledger(tmp_path / "run")
    assert dropped == [] and col(metrics, "judge/groups_failed") == 0 and col(metrics, "judge/timeouts") == 0
    # eval 8 + 2 steps x 4 groups x 8 members + eval 8, each exactly once, no retry needed.
    assert col(metrics, "judge/requests") == stats()["requests"] == 8 + 2 * 4 * 8 + 8
    assert col(metrics, "judge/retries") == 0
    assert stats()["together"] == 2 * 4  # every training group answered as a whole
    assert all(r["eval/judge_failed"] == 0 and "eval/accuracy" in r for r in metrics if "eval/judge_failed" in r)


@pytest.mark.timeout(240)
def test_flaky_judge_500s_are_retried_and_counted(tmp_path, judge_server):
    base, stats = judge_server("flaky")
    overrides = write_task(tmp_path, [str(i + i % 7) for i in range(16)]) + [
        "sampler.prompt_repeat_k=4", "total_steps=3", "judger=remote", f"judger.url={base}/judge",
        "judger.backoff_s=0.05"]
    run_in_process(tmp_path / "run", overrides)
    metrics = read_metrics(RunDir(tmp_path / "run").metrics)
    trained, dropped = read_ledger(tmp_path / "run")
    served = stats()
    assert served["http_500"] >= 5  # 1 in 10 of >= 64 requests
    assert dropped == [] and col(metrics, "judge/groups_failed") == 0
    assert len(trained) == 3 * 4 * 4
    # Every 500 the server sent was retried once, and every request it saw was counted.
    assert col(metrics, "judge/retries") == served["http_500"]
    assert col(metrics, "judge/requests") == served["requests"]


@pytest.mark.timeout(240)
def test_redirects_and_malformed_replies_fail_their_groups_and_nothing_else(tmp_path, judge_server):
    """Labels "R.." get a 302 to ftp://, "M.." a reply that is not JSON: those groups are FAILED with
    the reason (never scored 0, never followed: the server sees POST /judge only), the rest train."""
    base, stats = judge_server("by_label")
    answers = ["R1" if i % 5 == 2 else "M1" if i % 5 == 4 else str(i + i % 7) for i in range(20)]
    bad = {i: a[0] for i, a in enumerate(answers) if a[0] in "RM"}
    overrides = write_task(tmp_path, answers) + [
        "sampler.prompt_repeat_k=2", "total_steps=3", "judger=remote", f"judger.url={base}/judge"]
    run_in_process(tmp_path / "run", overrides)
    metrics = read_metrics(RunDir(tmp_path / "run").metrics)
    trained, dropped = read_ledger(tmp_path / "run")
    groups = dropped_groups(dropped)
    served = stats()
    assert groups and metrics[-1]["step"] == 3
    assert set(served) <= {"requests", "POST /judge", "redirects", "malformed"}  # no GET: nothing followed
    assert {r["prompt_index"] for r in dropped} <= set(bad)
    assert not {r["prompt_index"] for r in trained} & set(bad)
    for r in dropped:
        expected = "redirect to 'ftp://127.0.0.1:9/x' refused" if bad[r["prompt_index"]] == "R" else "not JSON"
        assert expected in r["reason"], r["reason"]
    assert col(metrics, "rollout/groups_failed") == col(metrics, "judge/groups_failed") == len(groups)
    redirect_groups = sum(1 for r in groups.values() if bad[r["prompt_index"]] == "R")
    assert redirect_groups <= col(metrics, "judge/redirects_refused") <= served.get("redirects", 0)


@pytest.mark.timeout(240)
def test_batch_endpoint_judges_a_group_in_one_request(tmp_path, judge_server):
    base, stats = judge_server("ok")
    overrides = write_task(tmp_path, [str(i + i % 7) for i in range(16)]) + [
        "sampler.prompt_repeat_k=4", "total_steps=2", "judger=remote", f"judger.url={base}/judge",
        f"judger.batch_url={base}/batch"]
    run_in_process(tmp_path / "run", overrides)
    metrics = read_metrics(RunDir(tmp_path / "run").metrics)
    served = stats()
    assert col(metrics, "judge/groups_failed") == 0
    # One request per group: 8 eval prompts + 2 steps x 4 groups + 8 eval prompts.
    assert served["POST /batch"] == col(metrics, "judge/requests") == 8 + 2 * 4 + 8
    assert "POST /judge" not in served


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(300)
def test_judge_down_fails_eval_and_production_and_the_message_names_the_judger(tmp_path):
    """Nobody listens: eval reports every judgement failed (no accuracy of 0.000), production stops
    after the failure limit with a message that names the judger, every dropped group is ledgered."""
    url = f"http://127.0.0.1:{_free_port()}/judge"
    overrides = write_task(tmp_path, [str(i + i % 7) for i in range(16)]) + [
        "sampler.prompt_repeat_k=2", "total_steps=3", "judger=remote", f"judger.url={url}",
        "judger.max_retries=1", "judger.backoff_s=0.01", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_cli(overrides, cwd=tmp_path, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in proc.stderr  # one line says why, not a traceback
    assert proc.stderr.strip().splitlines()[-1].startswith("error: task jsonl: production cannot make progress")
    stop = re.search(r"run stopped at step 0: ProductionStalled: task jsonl: production cannot make progress: "
                     r"the last (\d+) generated groups were all dropped \(\d+ judging;", out)
    assert stop, out[-3000:]
    assert "the judger is failing" in out and "weights" not in stop.group(0)
    metrics = read_metrics(RunDir(tmp_path / "run").metrics)
    assert metrics[0]["step"] == 0 and metrics[0]["eval/judge_failed"] == 8 and "eval/accuracy" not in metrics[0]
    _, dropped = read_ledger(tmp_path / "run")
    # The groups counted in the message, plus those still in flight then (at most a batch), which fail too.
    assert 2 * int(stop.group(1)) <= len(dropped) <= 2 * (int(stop.group(1)) + 4)
    assert len(dropped_groups(dropped)) * 2 == len(dropped)
    assert all(r["reason"].startswith(f"judger remote: RemoteJudgeError: {url}: ConnectError") for r in dropped)
    assert all("(after 2 attempts)" in r["reason"] for r in dropped)
