"""One sandboxed call in two halves: `start(conf)` starts a sandbox that waits for its program (bubblewrap
or, in the rlimits mode, the interpreter alone), `finish(started, code, stdin, wall_s)` hands the program
over and reads the result. A sandbox runs one program only; the warm pool (warm.py) starts them ahead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from rlharness.config.schema import SandboxConf
from rlharness.sandbox import seccomp_filter
from rlharness.sandbox.command import ENV, MAX_CODE_BYTES, bwrap_argv, stub_argv
from rlharness.sandbox.process import Finished, collect, kill
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
    "code_refused": f"the code is longer than {MAX_CODE_BYTES} bytes (nothing ran)",
}


@dataclass(frozen=True)
class Result:
    stdout: str
    stderr: str
    exit_status: int | None  # the process's exit status; None when a signal ended it
    signal: int | None  # the signal that ended it, if one did
    wall_s: float  # from the program's hand-over to the sandbox's end
    reason: str  # a key of REASONS

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


@dataclass
class Started:
    """A sandbox waiting for its program on `code_w` (or None: it could not be started, `error` says why)."""

    proc: subprocess.Popen | None
    code_w: int = -1
    status_r: int = -1  # bubblewrap's --json-status-fd (namespaces mode)
    workdir: str | None = None  # the rlimits mode's working folder, removed at the end
    error: str = ""
    fds: list[int] = field(default_factory=list)  # closed at the end

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def discard(self) -> None:
        """Kill it and free what it holds (a started sandbox never used, or used up)."""
        if self.proc is not None:
            kill(self.proc)
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                stream.close()
            self.proc.wait()
        for fd in (self.code_w, self.status_r, *self.fds):
            if fd >= 0:
                os.close(fd)
        self.code_w = self.status_r = -1
        self.fds = []
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _as_user() -> dict:
    """Popen's user/group arguments: as root, the code runs as nobody (root's rights, and RLIMIT_NPROC's
    exemption for root, must not reach it); anyone else runs it as themselves."""
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}


def _spawn(argv: list[str], env: dict, cwd: str, pass_fds: tuple[int, ...]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=cwd, pass_fds=pass_fds, start_new_session=True, **_as_user())


def start(conf: SandboxConf) -> Started:
    """Start a sandbox for `conf`; it sets itself up while the caller goes on, then waits for its program."""
    code_r, code_w = os.pipe()
    try:
        if conf.isolation == "namespaces":
            return _start_namespaces(conf, code_r, code_w)
        return _start_rlimits(conf, code_r, code_w)
    finally:
        os.close(code_r)


def _start_namespaces(conf: SandboxConf, code_r: int, code_w: int) -> Started:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        os.close(code_w)
        return Started(None, error="bwrap not found: install bubblewrap (scripts/setup.sh)")
    bpf = os.memfd_create("seccomp-bpf")
    status_r, status_w = os.pipe()
    try:
        os.write(bpf, seccomp_filter.namespaces_filter())
        os.lseek(bpf, 0, os.SEEK_SET)
        argv = bwrap_argv(bwrap, conf, bpf, status_w) + stub_argv(conf, code_r, -1, in_namespace=True)
        proc = _spawn(argv, env={}, cwd="/", pass_fds=(bpf, status_w, code_r))
    except OSError as exc:
        os.close(status_r)
        os.close(code_w)
        return Started(None, error=f"cannot start {bwrap}: {exc}")
    finally:
        os.close(bpf)
        os.close(status_w)
    return Started(proc, code_w=code_w, status_r=status_r)


def _start_rlimits(conf: SandboxConf, code_r: int, code_w: int) -> Started:
    """The weaker mode: no namespaces. The stub loads a filter that forbids new processes, network
    sockets and signals to others; the code runs as nobody (when the run is root) in an empty folder."""
    workdir = tempfile.mkdtemp(prefix="rlharness-sandbox-")
    bpf_r, bpf_w = os.pipe()
    try:
        if _as_user():
            os.chown(workdir, NOBODY, NOBODY)
        env = {**ENV, "HOME": workdir, "TMPDIR": workdir}
        proc = _spawn(stub_argv(conf, code_r, bpf_r, in_namespace=False), env=env, cwd=workdir,
                      pass_fds=(bpf_r, code_r))
    except OSError as exc:
        os.close(bpf_w)
        os.close(code_w)
        shutil.rmtree(workdir, ignore_errors=True)
        return Started(None, error=f"cannot start agent.sandbox.python={conf.python}: {exc}")
    finally:
        os.close(bpf_r)
    try:  # the filter names the process's own pid, so it is built once the process exists
        os.write(bpf_w, seccomp_filter.build_filter(allow_fork=False, own_pid=proc.pid))
    except BrokenPipeError:
        pass
    finally:
        os.close(bpf_w)
    return Started(proc, code_w=code_w, workdir=workdir)


def hand_over(started: Started, code: bytes) -> bool:
    """Send the program (length first: the stub never waits for an end of file that a forked copy of
    this process could hold back); False if the sandbox is gone."""
    try:
        os.write(started.code_w, struct.pack("<Q", len(code)))
        view = memoryview(code)
        while view:
            view = view[os.write(started.code_w, view):]
    except BrokenPipeError:
        return False
    finally:
        os.close(started.code_w)
        started.code_w = -1
    return True


def finish(started: Started, code: str, stdin: str, wall_s: float, max_output_bytes: int) -> Result:
    """Run `code` in the started sandbox to its end (within `wall_s` of the hand-over) and discard it."""
    if started.proc is None:
        return Result("", started.error, None, None, 0.0, "sandbox_error")
    try:
        handed = time.monotonic()
        hand_over(started, code.encode("utf-8", errors="surrogatepass"))  # a gone sandbox shows below
        done = collect(started.proc, stdin.encode("utf-8", errors="replace"), wall_s, max_output_bytes, handed)
        status = b""
        if started.status_r >= 0:
            with os.fdopen(started.status_r, "rb") as fh:
                started.status_r = -1
                status = fh.read()
    finally:
        started.discard()
    if started.workdir is None:  # bubblewrap: did the program start, and its own exit status
        child_started = b'"child-pid"' in status
        if child_started and b'"exit-code"' in status and done.stopped_for is None:
            done.returncode = json.loads(status.strip().splitlines()[-1])["exit-code"]
    else:
        child_started = done.returncode != 125  # the stub's "cannot load the seccomp filter"
    return _result(done, child_started)


def _result(done: Finished, child_started: bool) -> Result:
    stdout = done.stdout.decode("utf-8", errors="replace")
    stderr = done.stderr.decode("utf-8", errors="replace")
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


def refused(code: str) -> Result | None:
    """A Result for code that cannot be handed over at all, else None."""
    if len(code.encode("utf-8", errors="surrogatepass")) > MAX_CODE_BYTES:
        return Result("", "", None, None, 0.0, "code_refused")
    return None
