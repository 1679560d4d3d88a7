"""A secret cannot leak through an error. A header value that is no legal HTTP header value (a token
ending in `\\r`, from a file edited on Windows) is refused at the start, naming the variable and never
its value; and every error text the run writes (train.log, the console, rollouts/dropped.jsonl, evals/,
W&B's files) has header values and URL credentials masked, whatever quotes them: the HTTP client's
own error, a judge that echoes the header back, a redirect whose Location carries credentials."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
from pathlib import Path

import pytest

from rlharness.config.schema import ConfigError, RemoteJudgerConf
from rlharness.judger.remote import RemoteJudger
from rlharness.core.redaction import MASK, redact, register_secret
from rlharness.core.run_dir import RunDir
from rlharness.core.types import Status, make_group
from tests.faults.test_judge_secrets import authorized_server
from tests.helpers import run_cli

pytestmark = [pytest.mark.timeout(300)]


def secret_token() -> str:
    return "Bearer " + secrets.token_hex(16)


# ----------------------------------------------------------------------------- refused at the start
@pytest.mark.parametrize("value, what", [
    ("{token}\r", "is a carriage return"), ("{token}\n", "is a line feed"), (" {token}", "a space at its start"),
    ("{token}\x1b", "a control character (U+001B)"), ("{token}é", "a non-ASCII character (U+00E9)"),
])
def test_an_illegal_header_value_is_refused_naming_the_variable_not_the_value(value, what, monkeypatch):
    token = secret_token()
    monkeypatch.setenv("JUDGE_TOKEN", value.format(token=token))
    with pytest.raises(ConfigError) as err:
        RemoteJudgerConf(headers={"Authorization": "env:JUDGE_TOKEN"})
    line = str(err.value)
    assert "judger.headers.Authorization=env:JUDGE_TOKEN" in line and "JUDGE_TOKEN holds" in line and what in line
    assert token.split()[1] not in line and "\n" not in line


def test_the_command_line_refuses_a_token_with_a_carriage_return(tmp_path):
    token = secret_token()
    proc = run_cli(["judger=remote", "judger.headers.Authorization=env:JUDGE_TOKEN", "engine=sim", "backend=sim",
                    "logger=none"], cwd=tmp_path, check=False, env={"JUDGE_TOKEN": token + "\r"})
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and line.startswith("error: judger.headers.Authorization=env:JUDGE_TOKEN"), proc.stderr
    assert "carriage return" in line and token.split()[1] not in proc.stderr + proc.stdout
    assert not (tmp_path / "outputs").exists()


def test_a_token_that_turns_illegal_while_running_fails_groups_without_showing_it(monkeypatch):
    """The variable is read at each request (a rotated token is used): one rotated to an illegal value fails
    the group with a reason naming the variable, and the HTTP client never sees (or quotes) it."""
    token = secret_token()
    monkeypatch.setenv("JUDGE_TOKEN", token)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    judger = RemoteJudger(RemoteJudgerConf(url=f"http://127.0.0.1:{listener.getsockname()[1]}/judge",
                                           headers={"Authorization": "env:JUDGE_TOKEN"}, max_retries=0))
    monkeypatch.setenv("JUDGE_TOKEN", token + "\r")
    group = make_group(task="t", prompt_index=0, epoch=0, prompt_text="1+0=", prompt_ids=[], label={"answer": "1"},
                       k=2)
    for s in group:
        s.response_text = "1"

    async def go():
        try:
            return await judger.judge_group(group, 5.0)
        finally:
            await judger.close()

    out = asyncio.run(go())
    listener.close()
    reason = out.drop_reason
    assert out.status is Status.FAILED and "JUDGE_TOKEN holds no legal HTTP header value" in reason
    assert token.split()[1] not in reason


# ----------------------------------------------------------------------------- redaction
def test_redaction_masks_every_spelling_of_a_registered_secret_and_any_url_credentials():
    import httpx

    token = secret_token()
    register_secret(token + "\r")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    with pytest.raises(httpx.LocalProtocolError) as err:  # the HTTP client's own error quotes the value
        httpx.post(f"http://127.0.0.1:{listener.getsockname()[1]}/", headers={"Authorization": token + "\r"},
                   timeout=5)
    listener.close()
    assert token.split()[1] in str(err.value)
    for text in (str(err.value), repr(token), json.dumps({"reason": token}), f"got {token.encode()!r}",
                 f"token rejected: {token}"):
        clean = redact(text)
        assert token.split()[1] not in clean and MASK in clean, clean
    assert redact("Bearer is a word") == "Bearer is a word"  # the scheme word alone is not the secret
    # Credentials nobody registered: a URL's user:password@ and credential-named query values.
    assert redact("302 to 'https://bob:hunter2@judge.example/x?api_key=abc123&n=2'") == \
        f"302 to 'https://{MASK}@judge.example/x?api_key={MASK}&n=2'"
    assert redact("GET http://h/p?token=t0k&access_token=zz#f ok") == f"GET http://h/p?token={MASK}&access_token={MASK}#f ok"
    assert redact("x=1 and 1+1=2") == "x=1 and 1+1=2"


@pytest.fixture
def echoing_server(tmp_path):
    """The judge server requiring `Authorization: <secret>` and quoting it back for answers E* and C*."""
    with authorized_server(tmp_path, "by_label") as served:
        yield served


def _task(d: Path) -> list[str]:
    """Train and eval rows whose answers make the judge quote the secret (E*, C*) or score normally."""
    d.mkdir(parents=True, exist_ok=True)
    answers = ["E1", "C1", "7", "8"]
    for name, n in (("train", 16), ("eval", 8)):
        rows = [{"question": f"{i:03d}+{i % 7:03d}=", "answer": answers[i % 4]} for i in range(n)]
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["engine=sim", "backend=sim", "task=jsonl", f"task.path={d / 'train.jsonl'}",
            f"task.eval_path={d / 'eval.jsonl'}", "task.num_eval=8", "eval.num_prompts=8", "batch_size=4",
            "sampler.prompt_repeat_k=2", "total_steps=2", "eval_every=1", "save_every=1", "logger.mode=offline",
            "logger.log_samples_every=1"]


def test_a_judge_that_quotes_the_secret_back_leaks_it_to_no_file_and_no_console(tmp_path, echoing_server):
    base, secret, stats = echoing_server
    run_dir = tmp_path / "run"
    proc = run_cli([*_task(tmp_path / "data"), "judger=remote", f"judger.url={base}/judge", "judger.max_retries=0",
                    "judger.headers.Authorization=env:JUDGE_TOKEN", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                   env={"JUDGE_TOKEN": secret})
    served = stats()
    assert served.get("echoed", 0) > 0 and served.get("redirects", 0) > 0 and "unauthorized" not in served, served
    token = secret.split()[1]
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.parent.name == "evals" for p in written) and any(".wandb" in p.name for p in written)
    leaked = [str(p) for p in written if token.encode() in p.read_bytes()]
    assert leaked == [], f"the secret was written to {leaked}"
    assert token not in proc.stdout + proc.stderr
    # The reasons are still there, masked: what failed and why stays readable.
    dropped = [json.loads(ln) for ln in RunDir(run_dir).dropped.read_text().splitlines()]
    reasons = {r["reason"] for r in dropped}
    assert any("reply is not JSON" in r and f"token rejected: {MASK}" in r for r in reasons), reasons
    assert any("redirect to 'http://***@127.0.0.1:9/x?api_key=***&n=1' refused" in r for r in reasons), reasons
    evals = RunDir(run_dir).eval_file(2).read_text()
    assert "failed: judger remote" in evals and MASK in evals
    assert MASK in RunDir(run_dir).log().read_text()
