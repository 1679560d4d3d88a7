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

Protocol: one JSON request per line on stdin, one JSON reply per line on stdout:
- {"op": "start", "script", "args", "cwd", "env", "stdout", "stderr", "new_session"}: fork the
  child (its stdout and stderr into the named files, stderr into stdout's when null; a session of
  its own if new_session, as `Popen(start_new_session=True)`) -> {"pid"};
- {"op": "wait", "pid", "timeout_s"}: wait up to timeout_s (null: no limit; 0: a poll) for that
  child to end -> {"returncode": its exit status or null if still running, "cpu_s": its CPU seconds}.
The server reaps a child only when asked, so its pid stays its own until then (a signal sent after
a poll that saw it running reaches that child). Used by `tests.helpers.start_cli` and `run_cli`.
"""

from __future__ import annotations

import json
import os
import select
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("train.py", "evaluate.py")  # the command lines it stands in for: `python SCRIPT ARGS`
MODULES = ("rlharness.export",)  # and `python -m MODULE ARGS`


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

    import rlharness.launch.build  # noqa: F401
    import rlharness.launch.evaluate  # noqa: F401
    import rlharness.launch.launcher  # noqa: F401
    import rlharness.launch.preflight  # noqa: F401
    import rlharness.trainer.trainer  # noqa: F401


def _child(request: dict) -> None:
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
        for fd in [*_CHILDREN.values(), _REPLIES.fileno()]:  # the server's, not the child's
            os.close(fd)
        if request.get("new_session"):
            os.setsid()
        out = os.open(request["stdout"], os.O_WRONLY | os.O_TRUNC)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_TRUNC) if request["stderr"] else out
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {out, err}:
            os.close(fd)
        name, args = request["script"], request["args"]
        if name in SCRIPTS:
            sys.argv = [str(ROOT / name), *args]
            sys.path[0] = str(ROOT)  # as for `python train.py`
            runpy.run_path(sys.argv[0], run_name="__main__")
        elif name in MODULES:
            sys.argv = [name, *args]  # argv[0]: the module's file, once runpy has found it
            sys.path[0] = os.getcwd()  # as for `python -m`
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            raise ValueError(f"not one of {SCRIPTS + MODULES}: {name!r}")
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


_CHILDREN: dict[int, int] = {}  # pid -> its pidfd (readable once the child has ended)
_REPLIES = sys.stdout  # replaced in main() by a file of its own, so that a child's prints never mix in


def _start(request: dict) -> dict:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(request)
    _CHILDREN[pid] = os.pidfd_open(pid)
    return {"pid": pid}


def _wait(request: dict) -> dict:
    pid, timeout_s = request["pid"], request["timeout_s"]
    if pid not in _CHILDREN:
        return {"error": f"no child {pid} of this server"}
    select.select([_CHILDREN[pid]], [], [], timeout_s)
    done, status, usage = os.wait4(pid, os.WNOHANG)
    if not done:
        return {"returncode": None}
    os.close(_CHILDREN.pop(pid))
    return {"returncode": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime}


def main() -> None:
    global _REPLIES
    _preimport()
    _REPLIES = os.fdopen(os.dup(1), "w")
    print(json.dumps({"ready": True}), file=_REPLIES, flush=True)
    for line in sys.stdin:
        if line.strip():
            request = json.loads(line)
            reply = {"start": _start, "wait": _wait}[request["op"]](request)
            print(json.dumps(reply), file=_REPLIES, flush=True)


if __name__ == "__main__":
    main()
