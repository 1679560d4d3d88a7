"""Run one sandbox process to its end: feed stdin, read stdout and stderr under their size cap, stop
it at its wall-clock deadline, and kill what is left.

Output is read as it comes, never more than `cap + 64 KiB` per stream: a program that prints 100 MB
is stopped once it passes the cap (the run's memory never holds it). The process starts a session
of its own; the whole process group is killed at the end, whatever happened (bubblewrap's pid
namespace takes everything inside with it: `--die-with-parent` and the namespace's init).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

CHUNK = 65536


@dataclass
class Finished:
    stdout: bytes
    stderr: bytes
    returncode: int  # Popen's: negative for a signal
    wall_s: float
    stopped_for: str | None  # "wall_time" | "output_limit" when this module stopped it, else None


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL to its process group and to itself, unless it has been reaped (its pid may be another's now)."""
    if proc.returncode is not None:
        return
    for send in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
        try:
            send()
        except (ProcessLookupError, PermissionError):
            pass


def collect(proc: subprocess.Popen, stdin: bytes, wall_s: float, max_output_bytes: int,
            started: float) -> Finished:
    """Drive `proc` (stdin, stdout, stderr are pipes) to its end; `started`: time.monotonic() when its
    program was handed over, from which `wall_s` counts."""
    deadline = started + wall_s
    sel = selectors.DefaultSelector()
    buffers = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    for stream in buffers:
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    stopped_for = None
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                stopped_for = "wall_time"
                break
            for key, _ in sel.select(left):
                stream = key.fileobj
                if stream is proc.stdin:
                    try:
                        pending = pending[os.write(stream.fileno(), pending[:CHUNK]):]
                    except BrokenPipeError:  # the code stopped reading: the rest of stdin is dropped
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(stream)
                        stream.close()
                    continue
                data = os.read(stream.fileno(), CHUNK)
                if not data:
                    sel.unregister(stream)
                    continue
                buffers[stream] += data
                if len(buffers[stream]) > max_output_bytes:
                    stopped_for = "output_limit"
                    break
            if stopped_for:
                break
        if stopped_for is None:
            # Both pipes closed: everything in the sandbox has ended (or let go of them); wait for the process.
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stopped_for = "wall_time"
    finally:
        kill(proc)
        sel.close()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
        proc.wait()
    wall = time.monotonic() - started
    out, err = (bytes(buffers[s][:max_output_bytes]) for s in (proc.stdout, proc.stderr))
    return Finished(out, err, proc.returncode, wall, stopped_for)
