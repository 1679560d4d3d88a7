"""`logger.mode=online` as a user without W&B, or without a network, meets it: no credentials is refused at
the door (one line, exit 2, nothing written); a server that does not answer leaves the run logging offline,
its W&B files kept for `wandb sync`, and a resumed run continues the same W&B run id the same way."""

from __future__ import annotations

import socket

from rlharness.core.checkpoint import latest_checkpoint
from tests.helpers import run_cli

SHORT = ["total_steps=1", "batch_size=2", "sampler.prompt_repeat_k=2", "eval.num_prompts=2", "eval_every=0"]
FAKE_KEY = "a" * 40  # the shape of a W&B API key; no server ever sees it


def no_credentials(tmp_path) -> dict[str, str]:
    """An environment without W&B credentials: no key, a home without the netrc `wandb login` writes."""
    return {"WANDB_API_KEY": "", "HOME": str(tmp_path / "home"), "NETRC": str(tmp_path / "home" / ".netrc"),
            "WANDB_MODE": "online", "WANDB_CONFIG_DIR": str(tmp_path / "home" / ".config" / "wandb")}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_online_without_credentials_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "home").mkdir()
    run = tmp_path / "run"
    proc = run_cli([*SHORT, "logger.mode=online", f"hydra.run.dir={run}"], cwd=tmp_path, check=False,
                   env=no_credentials(tmp_path))
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: logger.mode=online is not allowed without W&B credentials") and "wandb login" in last
    assert "Traceback" not in proc.stderr and not run.exists()


def offline_run_ids(run) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[1] for p in (run / "wandb").glob("offline-run-*"))


def test_an_unreachable_server_leaves_the_run_logging_offline(tmp_path):
    """No connection (a cluster node without network): offline at once, a resume continuing the same W&B run."""
    (tmp_path / "home").mkdir()
    env = {**no_credentials(tmp_path), "WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port()}"}
    run = tmp_path / "run"
    run_cli([*SHORT, "logger.mode=online", f"hydra.run.dir={run}"], cwd=tmp_path, env=env)
    assert "W&B online: cannot reach 127.0.0.1:" in (run / "train.log").read_text()
    [run_id] = offline_run_ids(run)
    run_cli([f"resume={run}", "total_steps=2"], cwd=tmp_path, env=env)
    assert latest_checkpoint(run)[0] == 2 and offline_run_ids(run) == [run_id, run_id]


def test_a_server_that_never_answers_leaves_the_run_logging_offline(tmp_path):
    """Connected, never answered: after logger.init_timeout_s the run logs offline; a resume too, under a new
    W&B run id (wandb's service still holds the one it tried), said in the warning."""
    (tmp_path / "home").mkdir()
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        env = {**no_credentials(tmp_path), "WANDB_API_KEY": FAKE_KEY,
               "WANDB_BASE_URL": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        run = tmp_path / "run"
        online = ["logger.mode=online", "logger.init_timeout_s=2"]
        run_cli([*SHORT, *online, f"hydra.run.dir={run}"], cwd=tmp_path, env=env)
        assert "W&B online: the server did not answer within logger.init_timeout_s=2s" in (run / "train.log").read_text()
        [first] = offline_run_ids(run)
        run_cli([f"resume={run}", "total_steps=2"], cwd=tmp_path, env=env)
    assert latest_checkpoint(run)[0] == 2
    assert f"under a new run id (wandb still holds {first})" in (run / "train.log").read_text()
    assert len(offline_run_ids(run)) == 2
