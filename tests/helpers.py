"""Compose and run configs in-process (the same path as train.py, minus Hydra's job setup)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlharness.config.run import adopt_strategy_max_staleness
from rlharness.config.store import register_configs

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = str(ROOT / "conf")

# Small, quick settings for real-model runs in tests.
QUICK = ["batch_size=8", "sampler.prompt_repeat_k=4", "eval.num_prompts=16", "logger.mode=disabled"]


def compose_conf(overrides: list[str], run_dir: str | Path = ""):
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides))
    cfg.run_dir = str(run_dir)
    adopt_strategy_max_staleness(cfg, overrides)  # as train.py
    return OmegaConf.to_object(cfg), OmegaConf.to_container(cfg, resolve=True)


# A bound that only a hang reaches: a success that takes a minute on a loaded 2-core box (ten
# times its idle time) is far inside it. Tests wait on conditions under this bound, never on a
# duration that a slow machine could also take.
HANG_S = 600.0


def wait_until(ready, what: str, timeout_s: float = HANG_S, poll_s: float = 0.2) -> None:
    """Poll `ready()` until it is true; fail naming `what` if it is still false after `timeout_s`
    (a hang: the deadline is not what a test passes or fails by on a slow machine)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(poll_s)


def run_on_virtual_clock(coro):
    """`asyncio.run(coro)` on a virtual clock (aiotools): sleeps and timeouts take no real time and
    every timer fires in its order of virtual time, whatever the machine's speed. Only for code that
    waits on the loop's timers, never on a thread or a process (their real time would race it)."""
    import asyncio

    from aiotools import VirtualClock

    async def main():
        with VirtualClock().patch_loop():
            return await coro

    return asyncio.run(main())


def run_in_process(run_dir: str | Path, overrides: list[str]) -> dict:
    from rlharness.launch.launcher import RefusedInput, run

    conf, as_dict = compose_conf(overrides, run_dir)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    try:
        return run(conf, as_dict)
    except RefusedInput as exc:  # the error that refused the input (train.py prints its line)
        raise exc.error from None


def uncataloged_metrics(folder: str | Path) -> dict[str, list[str]]:
    """metrics.jsonl under `folder` -> its keys that the metrics catalog does not list (files with none left out)."""
    from rlharness.logging_utils.metric_catalog import unknown_keys
    from rlharness.logging_utils.metrics import read_metrics

    found = {}
    for path in sorted(p for p in Path(folder).rglob("metrics.jsonl") if p.is_file()):
        unknown = unknown_keys({k for row in read_metrics(path) for k in row})
        if unknown:
            found[str(path)] = unknown
    return found


def run_cli(args: list[str], cwd: str | Path, timeout_s: float = HANG_S, check: bool = True,
            env: dict | None = None, fresh_interpreter: bool = False,
            script: str = "train.py") -> subprocess.CompletedProcess:
    """The real command line, `python train.py ARGS` (or `script`: evaluate.py, or a module run as
    `python -m`: rlharness.export), run to its end:
    its exit status, stdout and stderr (started as by `start_cli`)."""
    proc = start_cli(args, cwd, env=env, fresh_interpreter=fresh_interpreter, script=script)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise subprocess.TimeoutExpired(proc.args, timeout_s, proc.stdout_text(), proc.stderr_text()) from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout_text(), proc.stderr_text())
    done.cpu_s = proc.cpu_s  # the child's own CPU seconds (a measure of what the start saved), if forked
    if check and done.returncode != 0:
        raise AssertionError(f"{script} {' '.join(map(str, args))} failed ({done.returncode}):\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def start_cli(args: list, cwd: str | Path, env: dict | None = None, fresh_interpreter: bool = False,
              script: str = "train.py", merge_stderr: bool = False, new_session: bool = False) -> "CliProcess":
    """Start the real command line, `python train.py ARGS` (or `script`), and return at once: a
    handle with what tests use of `subprocess.Popen` (pid, poll, wait, send_signal, kill, and the
    output once it has ended). `env` adds to this process's environment (W&B offline, Hydra's short
    errors); `merge_stderr` writes stderr into stdout, `new_session` gives it a session (process
    group) of its own, as Popen's `stderr=STDOUT` and `start_new_session=True`.

    The process is forked from `tests/cli_forkserver.py`, which has imported its dependencies once
    (about 8 s of CPU per start on a 2-core box), unless `fresh_interpreter` or the environment
    sets something the server's libraries read when they loaded (thread counts, the allocator):
    then it is a fresh interpreter."""
    import os
    import tempfile

    full_env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", **(env or {})}
    argv = [*(["-m", script] if not script.endswith(".py") else [str(ROOT / script)]), *map(str, args)]
    out_path = tempfile.mkstemp(prefix="cli-out-", dir=_output_dir())[1]
    err_path = None if merge_stderr else tempfile.mkstemp(prefix="cli-err-", dir=_output_dir())[1]
    server_env = _FORKSERVER_ENV if _forkserver_alive() else os.environ
    if fresh_interpreter or any(full_env.get(k) != server_env.get(k) for k in {*full_env, *server_env}
                                if k.startswith(LOAD_TIME_ENV)):
        with open(out_path, "wb") as out, open(err_path or os.devnull, "wb") as err:
            popen = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT if merge_stderr else err,
                                     start_new_session=new_session)
        return CliProcess([sys.executable, *argv], popen.pid, out_path, err_path, popen)
    reply = _ask_forkserver({"op": "start", "script": script, "args": list(map(str, args)), "cwd": str(cwd), "env": full_env,
                             "stdout": out_path, "stderr": err_path, "new_session": new_session})
    return CliProcess([sys.executable, *argv], reply["pid"], out_path, err_path)


class CliProcess:
    """A command line started by `start_cli`: forked by the CLI server (which waits on it, when
    asked) or, `popen` given, a fresh interpreter."""

    def __init__(self, args: list[str], pid: int, out_path: str, err_path: str | None,
                 popen: subprocess.Popen | None = None):
        self.args, self.pid, self.returncode, self.cpu_s = args, pid, None, None
        self._out_path, self._err_path, self._popen = out_path, err_path, popen

    def wait(self, timeout: float | None = None) -> int:
        if self._wait(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def poll(self) -> int | None:
        return self._wait(0)

    def _wait(self, timeout_s: float | None) -> int | None:
        if self.returncode is None and self._popen is not None:
            try:
                self.returncode = self._popen.wait(timeout_s) if timeout_s != 0 else self._popen.poll()
            except subprocess.TimeoutExpired:
                pass
        elif self.returncode is None:
            reply = _ask_forkserver({"op": "wait", "pid": self.pid, "timeout_s": timeout_s})
            self.returncode, self.cpu_s = reply["returncode"], reply.get("cpu_s")
        return self.returncode

    def send_signal(self, sig: int) -> None:
        import os

        if self.poll() is None:  # not yet reaped: the pid is still this process's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def stdout_text(self) -> str:
        return Path(self._out_path).read_text(errors="replace")

    def stderr_text(self) -> str:
        """Its stderr (with merge_stderr: its stdout, where stderr went)."""
        return Path(self._err_path or self._out_path).read_text(errors="replace")

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """As Popen's with text=True: (stdout, stderr; None with merge_stderr) once it has ended."""
        self.wait(timeout)
        return self.stdout_text(), (None if self._err_path is None else self.stderr_text())


# Environment variables that libraries in the fork server (OpenMP, MKL, glibc's allocator, Python)
# read once, when they load: a child forked from it would not see a changed value.
LOAD_TIME_ENV = ("OMP_", "GOMP_", "KMP_", "MKL_", "MALLOC_", "LD_", "PYTHON")

_FORKSERVER: subprocess.Popen | None = None
_FORKSERVER_ENV: dict | None = None  # the environment it started with
_OUTPUT_DIR: str | None = None  # the started command lines' stdout and stderr files, removed at exit


def _forkserver_alive() -> bool:
    return _FORKSERVER is not None and _FORKSERVER.poll() is None


def _output_dir() -> str:
    global _OUTPUT_DIR
    if _OUTPUT_DIR is None:
        import atexit
        import shutil
        import tempfile

        _OUTPUT_DIR = tempfile.mkdtemp(prefix="rlh-cli-")
        atexit.register(shutil.rmtree, _OUTPUT_DIR, True)
    return _OUTPUT_DIR


def _ask_forkserver(request: dict) -> dict:
    """One request to this worker's fork server (started on first use) and its reply. A request
    interrupted before its reply (a test's timeout) leaves the conversation out of step: that
    server is stopped, and the next request starts another."""
    import atexit
    import json
    import os

    global _FORKSERVER, _FORKSERVER_ENV
    if not _forkserver_alive():
        _FORKSERVER_ENV = dict(os.environ)
        _FORKSERVER = subprocess.Popen([sys.executable, "-m", "tests.cli_forkserver"], cwd=ROOT, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        atexit.register(_FORKSERVER.kill)
        assert json.loads(_FORKSERVER.stdout.readline()) == {"ready": True}
    try:
        _FORKSERVER.stdin.write(json.dumps(request) + "\n")
        _FORKSERVER.stdin.flush()
        reply = json.loads(_FORKSERVER.stdout.readline())
    except BaseException:
        _FORKSERVER.kill()
        raise
    if "error" in reply:
        raise RuntimeError(f"tests/cli_forkserver.py: {reply['error']}")
    return reply


def load_script(path: str | Path, name: str):
    """A script (benchmarks/, scripts/) imported as module `name`, registered in sys.modules
    before it runs: its dataclasses look their module up there."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
