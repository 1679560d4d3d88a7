"""`python train.py ...` (or evaluate.py) without paying the interpreter's start each time: a fork
server for tests.

Each `python train.py` first imports Hydra, torch and transformers: about 8 s of CPU on this box's
2 cores before a run's first step, 1 s before a config refusal. This server imports them once, then
forks one child per request; the child runs `train.py` exactly as `python train.py ARGS` does
(`runpy` as `__main__`, the request's argv, cwd and environment, stdin from /dev/null, its stdout
and stderr captured from file descriptors 1 and 2, exit handlers run), and its real exit status is
returned. So what a test checks (exit code, the one `error:` line, the run directory) is the
process's own; only the imports are shared. The server itself never runs torch work, so no thread
pool exists before a fork; what its libraries read from the environment when they loaded (thread
counts) is the server's, so `tests.helpers.run_cli` starts a fresh interpreter for a run that sets it.

Protocol: one JSON request per line on stdin ({"script", "args", "cwd", "env", "timeout_s"}), one
JSON reply per line on stdout ({"returncode", "cpu_s", "stdout", "stderr"}; cpu_s: the child's CPU
seconds). Used by `tests.helpers.run_cli`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("train.py", "evaluate.py")  # the command lines it stands in for


def _preimport() -> None:
    # What train.py reaches: its own imports, the launcher's build path, a tokenizer and a Llama
    # model (transformers imports those lazily, at several seconds of CPU each), the end's plots.
    import hydra  # noqa: F401
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401
    from transformers.models.llama import configuration_llama, modeling_llama  # noqa: F401

    import rlharness.build  # noqa: F401
    import rlharness.evaluation  # noqa: F401
    import rlharness.launcher  # noqa: F401
    import rlharness.preflight  # noqa: F401
    import rlharness.trainer.trainer  # noqa: F401


def _child(request: dict, out_path: str, err_path: str) -> None:
    """In the forked child: become `python SCRIPT ARGS` and exit with its status."""
    import atexit
    import runpy
    import traceback

    code: object = 0
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        for fd, path in ((1, out_path), (2, err_path)):
            f = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        if request["script"] not in SCRIPTS:
            raise ValueError(f"not one of {SCRIPTS}: {request['script']!r}")
        script = str(ROOT / request["script"])
        sys.argv = [script, *request["args"]]
        sys.path[0] = str(ROOT)  # as for `python train.py`
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:  # the interpreter's own rules for an exit code
        code = exc.code
    except BaseException:  # noqa: BLE001 - an uncaught exception: traceback, status 1
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code & 0xFF)


def _serve_one(request: dict) -> dict:
    with tempfile.NamedTemporaryFile(delete=False) as out, tempfile.NamedTemporaryFile(delete=False) as err:
        out_path, err_path = out.name, err.name
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, out_path, err_path)
        deadline = time.monotonic() + float(request.get("timeout_s", 600))
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"returncode": None, "stdout": "", "stderr": f"timed out after {request['timeout_s']} s"}
            time.sleep(0.01)
        rc = os.waitstatus_to_exitcode(status)
        read = lambda path: Path(path).read_text(errors="replace")  # noqa: E731
        return {"returncode": rc, "cpu_s": usage.ru_utime + usage.ru_stime, "stdout": read(out_path),
                "stderr": read(err_path)}
    finally:
        os.unlink(out_path)
        os.unlink(err_path)


def main() -> None:
    _preimport()
    replies = os.fdopen(os.dup(1), "w")
    print(json.dumps({"ready": True}), file=replies, flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(_serve_one(json.loads(line))), file=replies, flush=True)


if __name__ == "__main__":
    main()
