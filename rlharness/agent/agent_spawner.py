"""The agent processes' fork server: `python -m rlharness.agent.agent_spawner <fd>`.

Started once per pool (rlharness/agent/agent_pool.py) with the client packages imported, it
forks one agent process per request, so a new or replacement process starts in milliseconds,
from a process that never ran torch or the trainer's threads. (multiprocessing's forkserver
would do the forking, but in Python 3.11 each of its children imports the run's main script
again, `train.py` and what it imports: seconds per process.)

Protocol on the control socket (fd `<fd>`, a Unix stream socket to the pool), one line each:
- pool -> here: `fork\\n` with one file descriptor attached (SCM_RIGHTS): the new process's end
  of its job socket; here -> pool: `pid <pid>\\n`.
- here -> pool: `exit <pid> <code>\\n` when a process ended (code: its exit status, or minus
  the signal that ended it), so the pool can say why a process stopped answering.
The server and its processes get SIGKILL when their parent dies (Linux `PR_SET_PDEATHSIG`); the
server also ends, killing its processes, when the control socket closes.
"""

from __future__ import annotations

import importlib
import os
import selectors
import signal
import socket
import sys

from rlharness.agent.agent_worker import die_with_parent, worker_main

# Imported here once, so that every agent process starts with them (one not installed is skipped).
PRELOAD = ("httpx", "openai", "anthropic")


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def serve(control: socket.socket) -> None:
    children: set[int] = set()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the wakeup fd
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, "control")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "child":
                    os.read(wake_r, 4096)
                    while children:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                        if pid == 0:
                            break
                        children.discard(pid)
                        control.sendall(f"exit {pid} {_exit_code(status)}\n".encode())
                    continue
                data, fds, _, _ = socket.recv_fds(control, 4096, 16)
                if not data:
                    return  # the pool is gone
                for fd in fds:  # one per `fork` line
                    pid = os.fork()
                    if pid == 0:  # the agent process
                        try:
                            selector.close()
                            control.close()
                            os.close(wake_r)
                            os.close(wake_w)
                            signal.set_wakeup_fd(-1)
                            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                            worker_main(socket.socket(fileno=fd))
                        finally:
                            os._exit(0)
                    os.close(fd)
                    children.add(pid)
                    control.sendall(f"pid {pid}\n".encode())
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main() -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's to handle; it closes us itself
    control = socket.socket(fileno=int(sys.argv[1]))
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    try:
        serve(control)
    except OSError:  # the pool closed its end while a line was on its way: the run is done with us
        pass


if __name__ == "__main__":
    main()
