"""One sandboxed call: build the command for the isolation mode, start it, read its result."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from rlharness.config.schema import SandboxConf
from rlharness.sandbox import seccomp_filter
from rlharness.sandbox.command import ENV, MAX_CODE_BYTES, bwrap_argv, stub_argv
from rlharness.sandbox.process import Finished, collect
from rlharness.sandbox.stub import MEMORY_EXIT

NOBODY = 65534  # a run as root gives the code this uid and gid, outside any namespace too
# Why a call stopped (Result.reason).
REASONS = {
    "ok": "exited with status 0",
    "error": "exited with another status (an uncaught exception, sys.exit(n))",
    "memory": "ran out of its address space (MemoryError)",
    "cpu_time": "used its CPU seconds (SIGXCPU, then SIGKILL)",
    "wall_time": "ran past its wall-clock time and was killed",
    "output_limit": "printed more than max_output_bytes on stdout or stderr and was killed",
    "signal": "was killed by another signal",
    "sandbox_error": "the sandbox could not be set up (nothing ran)",
    "code_refused": f"the code is longer than {MAX_CODE_BYTES} bytes or holds a NUL character (nothing ran)",
}


@dataclass(frozen=True)
class Result:
    stdout: str
    stderr: str
    exit_status: int | None  # the process's exit status; None when a signal ended it
    signal: int | None  # the signal that ended it, if one did
    wall_s: float
    reason: str  # a key of REASONS

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _as_user() -> dict:
    """Popen's user/group arguments: as root, the code runs as nobody (root's rights, and RLIMIT_NPROC's
    exemption for root, must not reach it); anyone else runs it as themselves."""
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}


def _spawn(argv: list[str], env: dict, cwd: str, pass_fds: tuple[int, ...]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=cwd, pass_fds=pass_fds, start_new_session=True, **_as_user())


def _not_started(why: str) -> Result:
    return Result("", why, None, None, 0.0, "sandbox_error")


def _result(done: Finished, child_started: bool) -> Result:
    stdout, stderr = _decode(done.stdout), _decode(done.stderr)
    code = done.returncode
    # bubblewrap exits 128 + N when the code was killed by signal N.
    sig = -code if code < 0 else (code - 128 if child_started and 128 < code < 160 else None)
    status = None if sig is not None else code
    if done.stopped_for:
        reason = done.stopped_for
    elif not child_started:
        reason = "sandbox_error"
    elif sig in (signal.SIGXCPU, signal.SIGKILL):
        reason = "cpu_time"  # only RLIMIT_CPU's hard limit sends SIGKILL in there (this module's kills are named)
    elif sig is not None:
        reason = "signal"
    elif status == MEMORY_EXIT:
        reason = "memory"
    else:
        reason = "ok" if status == 0 else "error"
    return Result(stdout, stderr, status, sig, done.wall_s, reason)


def _run_namespaces(code: str, stdin: bytes, conf: SandboxConf) -> Result:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return _not_started("bwrap not found: install bubblewrap (scripts/setup.sh)")
    bpf = os.memfd_create("seccomp-bpf")
    status_r, status_w = os.pipe()
    try:
        os.write(bpf, seccomp_filter.namespaces_filter())
        os.lseek(bpf, 0, os.SEEK_SET)
        argv = bwrap_argv(bwrap, conf, bpf, status_w) + stub_argv(conf, conf.python, code, -1, in_namespace=True)
        started = time.monotonic()
        try:
            proc = _spawn(argv, env={}, cwd="/", pass_fds=(bpf, status_w))
        except OSError as exc:
            return _not_started(f"cannot start {bwrap}: {exc}")
        os.close(status_w)
        status_w = -1
        done = collect(proc, stdin, conf.wall_s, conf.max_output_bytes, started)
        with os.fdopen(status_r, "rb") as fh:
            status_r = -1
            status = fh.read()
    finally:
        for fd in (bpf, status_r, status_w):
            if fd >= 0:
                os.close(fd)
    child_started = b'"child-pid"' in status
    if child_started and b'"exit-code"' in status and done.stopped_for is None:
        # The code's own status (bubblewrap's equals it, but a setup failure also exits 1).
        exit_code = json.loads(status.strip().splitlines()[-1])["exit-code"]
        done.returncode = exit_code
    return _result(done, child_started)


def _run_rlimits(code: str, stdin: bytes, conf: SandboxConf) -> Result:
    """The weaker mode: no namespaces. The stub loads a filter that forbids new processes, network
    sockets and signals to others; the code runs as nobody (when the run is root) in an empty folder."""
    workdir = tempfile.mkdtemp(prefix="rlharness-sandbox-")
    bpf_r, bpf_w = os.pipe()
    try:
        user = _as_user()
        if user:
            os.chown(workdir, NOBODY, NOBODY)
        env = {**ENV, "HOME": workdir, "TMPDIR": workdir}
        argv = stub_argv(conf, conf.python, code, bpf_r, in_namespace=False)
        started = time.monotonic()
        try:
            proc = _spawn(argv, env=env, cwd=workdir, pass_fds=(bpf_r,))
        except OSError as exc:
            return _not_started(f"cannot start sandbox.python={conf.python}: {exc}")
        os.close(bpf_r)
        bpf_r = -1
        try:  # the filter names the process's own pid, so it is built once the process exists
            os.write(bpf_w, seccomp_filter.build_filter(allow_fork=False, own_pid=proc.pid))
        except BrokenPipeError:
            pass
        os.close(bpf_w)
        bpf_w = -1
        done = collect(proc, stdin, conf.wall_s, conf.max_output_bytes, started)
    finally:
        for fd in (bpf_r, bpf_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
    return _result(done, child_started=done.returncode != 125)


def run(code: str, stdin: str = "", limits: SandboxConf | None = None) -> Result:
    """Run `code` with the Python of `limits.python` in a sandbox of its own; never raises for
    anything the code does (the Result says why it stopped)."""
    conf = limits if limits is not None else SandboxConf()
    if len(code.encode("utf-8", errors="surrogatepass")) > MAX_CODE_BYTES or "\0" in code:
        return Result("", "", None, None, 0.0, "code_refused")
    data = stdin.encode("utf-8", errors="replace")
    if conf.isolation == "namespaces":
        return _run_namespaces(code, data, conf)
    return _run_rlimits(code, data, conf)
