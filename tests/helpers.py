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


def run_in_process(run_dir: str | Path, overrides: list[str]) -> dict:
    from rlharness.launcher import RefusedInput, run

    conf, as_dict = compose_conf(overrides, run_dir)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    try:
        return run(conf, as_dict)
    except RefusedInput as exc:  # the error that refused the input (train.py prints its line)
        raise exc.error from None


def run_cli(args: list[str], cwd: str | Path, timeout_s: float = 600, check: bool = True,
            env: dict | None = None, fresh_interpreter: bool = False,
            script: str = "train.py") -> subprocess.CompletedProcess:
    """The real command line, `python train.py ARGS` (or `script`: evaluate.py): its exit status,
    stdout and stderr.

    The process is forked from `tests/cli_forkserver.py`, which has imported their dependencies
    once (about 8 s of CPU per start on a 2-core box), unless `fresh_interpreter` or the
    environment sets something the server's libraries read when they loaded (thread counts, the
    allocator): then it is a fresh interpreter."""
    import os

    full_env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", **(env or {})}
    server_env = _FORKSERVER_ENV if _forkserver_alive() else os.environ
    if fresh_interpreter or any(full_env.get(k) != server_env.get(k) for k in {*full_env, *server_env}
                                if k.startswith(LOAD_TIME_ENV)):
        proc = subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout_s, env=full_env)
    else:
        proc = _run_forked(script, args, cwd, timeout_s, full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


# Environment variables that libraries in the fork server (OpenMP, MKL, glibc's allocator, Python)
# read once, when they load: a child forked from it would not see a changed value.
LOAD_TIME_ENV = ("OMP_", "GOMP_", "KMP_", "MKL_", "MALLOC_", "LD_", "PYTHON")

_FORKSERVER: subprocess.Popen | None = None
_FORKSERVER_ENV: dict | None = None  # the environment it started with


def _forkserver_alive() -> bool:
    return _FORKSERVER is not None and _FORKSERVER.poll() is None


def _run_forked(script: str, args: list, cwd: str | Path, timeout_s: float, env: dict) -> subprocess.CompletedProcess:
    """One request to this worker's fork server (started on first use): the child's exit status,
    stdout and stderr; the interpreter's start and imports are shared."""
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
    _FORKSERVER.stdin.write(json.dumps({"script": script, "args": [str(a) for a in args], "cwd": str(cwd),
                                        "env": env, "timeout_s": timeout_s}) + "\n")
    _FORKSERVER.stdin.flush()
    reply = json.loads(_FORKSERVER.stdout.readline())
    if reply["returncode"] is None:
        raise subprocess.TimeoutExpired([script, *args], timeout_s, reply["stdout"], reply["stderr"])
    proc = subprocess.CompletedProcess([script, *args], reply["returncode"], reply["stdout"], reply["stderr"])
    proc.cpu_s = reply["cpu_s"]  # the child's own CPU seconds (a measure of what the start saved)
    return proc


def load_script(path: str | Path, name: str):
    """A script (benchmarks/, scripts/) imported as module `name`, registered in sys.modules
    before it runs: its dataclasses look their module up there."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
