"""A remote judger's token stays out of every file: `judger.headers` values `env:NAME` are read
from the environment at request time. A real run (train.py, W&B offline, checkpoints) against
tests/faults/judge_server.py, which answers 401 unless the header carries the secret; then
every byte of the run directory (W&B's files included) is searched for the secret."""

from __future__ import annotations

import contextlib
from pathlib import Path
import secrets

import pytest

from rlharness.core.checkpoint import latest_checkpoint
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.faults.test_judging_faults import col, start_judge_server, stop_judge_server, write_task
from tests.faults.test_refused_input import refused
from tests.helpers import run_cli

pytestmark = [pytest.mark.timeout(300)]


@contextlib.contextmanager
def authorized_server(tmp_path: Path, mode: str):
    """tests/faults/judge_server.py in `mode`, requiring `Authorization: <a fresh secret>`; yields (url base,
    secret, stats reader). Waits for its port however slow the machine (the server's own --max-s bounds it)."""
    secret = "Bearer " + secrets.token_hex(16)
    proc, base, stats = start_judge_server(tmp_path, mode, env={"SERVER_TOKEN": secret, "PATH": "/usr/bin:/bin"},
                                           auth_env="SERVER_TOKEN")
    try:
        yield base, secret, stats
    finally:
        stop_judge_server(proc)


@pytest.fixture
def auth_server(tmp_path):
    with authorized_server(tmp_path, "ok") as served:
        yield served


def test_a_token_named_by_env_reaches_the_judge_and_no_file(tmp_path, auth_server):
    base, secret, stats = auth_server
    run_dir = tmp_path / "run"
    overrides = [o for o in write_task(tmp_path / "data", [str(i + i % 7) for i in range(16)])
                 if o not in ("logger=none", "save_every=0")]
    overrides += ["sampler.prompt_repeat_k=2", "total_steps=2", "save_every=1", "logger.mode=offline",
                  "judger=remote", f"judger.url={base}/judge", "+judger.headers.Authorization=env:JUDGE_TOKEN",
                  f"hydra.run.dir={run_dir}"]
    proc = run_cli(overrides, cwd=tmp_path, env={"JUDGE_TOKEN": secret})
    served = stats()
    # The server saw the header on every request (a missing or wrong one is a 401, which fails groups).
    assert served["requests"] > 0 and "unauthorized" not in served, served
    metrics = read_metrics(RunDir(run_dir).metrics)
    assert col(metrics, "judge/groups_failed") == 0 and col(metrics, "judge/requests") == served["requests"]
    assert latest_checkpoint(run_dir)[0] == 2
    # The config went to .hydra/ and W&B's offline file (where a resolved value would show up in plain bytes).
    assert "env:JUDGE_TOKEN" in RunDir(run_dir).config.read_text()  # the reference, not the value
    wandb_file = next((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert b"env:JUDGE_TOKEN" in wandb_file.read_bytes()
    token = secret.split()[1].encode()
    leaked = [str(p) for p in run_dir.rglob("*") if p.is_file() and token in p.read_bytes()]
    assert leaked == [], f"the secret was written to {leaked}"
    assert secret.split()[1] not in proc.stdout + proc.stderr


def test_a_header_naming_an_unset_variable_is_refused(tmp_path):
    overrides = write_task(tmp_path / "data", ["1"] * 8) + [
        "judger=remote", "judger.url=http://127.0.0.1:9/judge", "+judger.headers.Authorization=env:NOT_SET_ANYWHERE"]
    refused(overrides, tmp_path, ["judger.headers.Authorization=env:NOT_SET_ANYWHERE", "NOT_SET_ANYWHERE is not set"])


def test_a_url_with_credentials_is_refused_without_echoing_them(tmp_path):
    overrides = write_task(tmp_path / "data", ["1"] * 8) + [
        "judger=remote", "judger.url=http://judge:hunter2@127.0.0.1:9/judge"]
    line = refused(overrides, tmp_path, ["judger.url=http://127.0.0.1:9/judge", "user:password@", "judger.headers"])
    assert "hunter2" not in line
