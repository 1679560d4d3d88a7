"""Agent processes: where the user's agent programs run, so that none can stop the run.

An agent program is the user's code: it may raise, call `sys.exit` or `os._exit`, block its
thread in `time.sleep`, spin in a CPU loop or wait forever. Run in the trainer's event loop
(as it was), any of these ended or froze the whole run. Here each program runs in a process
of its own (`rlharness/agent/agent_worker.py`), one sample at a time, and reaches the gateway
over loopback; `run` returns its reply, or an error reply (`"died": True`) when the process
died. Cancelling `run` (the sample's `agent.timeout_s` passed, or its group was stopped) kills
the process with SIGKILL, which nothing in it can catch or ignore; the next sample gets another.

Processes are forked by the pool's own fork server (`agent_spawner`, started at the first
`run`, with the client packages imported), so a replacement starts in milliseconds; idle ones
are kept for the next sample (at most `max_idle`). The pool belongs to one event loop (its
sockets are the loop's); `close` kills every process and the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger(__name__)

_REPLY_LIMIT = 64 * 1024 * 1024  # the longest reply line read (an answer is returned whole)
_EXIT_WAIT_S = 5.0  # how long a dead process's exit status is waited for (the server reports it)


@dataclass(eq=False)  # hashed by identity (a set of busy ones)
class AgentProcess:
    pid: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


class AgentPool:
    def __init__(self, max_idle: int) -> None:
        self.max_idle = max_idle
        self._idle: list[AgentProcess] = []
        self._busy: set[AgentProcess] = set()
        self._closed = False
        self._server: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._starting: asyncio.Task | None = None
        self._forks: deque[asyncio.Future] = deque()  # fork requests waiting for their pid, in order
        self._exits: dict[int, int] = {}  # pid -> exit code, reported by the server
        self._exit_waiters: dict[int, asyncio.Future] = {}
        self._buffer = b""

    # ------------------------------------------------------------------ the fork server
    async def _start_server(self) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's rlharness
        self._server = subprocess.Popen([sys.executable, "-m", "rlharness.agent.agent_spawner", str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, env=env)
        theirs.close()
        ours.setblocking(False)
        self._control = ours
        asyncio.get_running_loop().add_reader(ours.fileno(), self._on_control)

    def _on_control(self) -> None:
        try:
            data = self._control.recv(65536)
        except BlockingIOError:
            return
        if not data:  # the server is gone: every fork waiting fails
            asyncio.get_running_loop().remove_reader(self._control.fileno())
            while self._forks:
                fut = self._forks.popleft()
                if not fut.done():
                    fut.set_exception(ConnectionError("the agent processes' fork server ended"))
            return
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            kind, *values = line.decode().split()
            if kind == "pid":
                fut = self._forks.popleft()
                if not fut.done():
                    fut.set_result(int(values[0]))
            elif kind == "exit":
                pid, code = int(values[0]), int(values[1])
                self._exits[pid] = code
                waiter = self._exit_waiters.pop(pid, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(code)

    async def _fork(self) -> AgentProcess:
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start_server())
        await asyncio.shield(self._starting)
        ours, theirs = socket.socketpair()
        fut = asyncio.get_running_loop().create_future()
        self._forks.append(fut)
        try:
            socket.send_fds(self._control, [b"fork\n"], [theirs.fileno()])
        finally:
            theirs.close()
        pid = await fut
        reader, writer = await asyncio.open_connection(sock=ours, limit=_REPLY_LIMIT)
        return AgentProcess(pid, reader, writer)

    async def _exit_code(self, pid: int) -> int | None:
        if pid not in self._exits:
            waiter = self._exit_waiters.setdefault(pid, asyncio.get_running_loop().create_future())
            try:
                await asyncio.wait_for(asyncio.shield(waiter), _EXIT_WAIT_S)
            except asyncio.TimeoutError:
                return None
        return self._exits.pop(pid, None)

    def _kill(self, worker: AgentProcess) -> None:
        worker.writer.close()
        if worker.pid not in self._exits:
            try:
                os.kill(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._exits.pop(worker.pid, None)

    # ------------------------------------------------------------------ jobs
    async def run(self, job: dict[str, Any], on_start: Callable[[], None] | None = None) -> dict[str, Any]:
        """Run one job (agent_worker's format) in a process; its reply. Cancelling this kills the process.
        `on_start` is called when the job has been handed to a running process (starting one is not its time)."""
        if self._closed:
            raise RuntimeError("the agent pool is closed")
        try:
            worker = self._idle.pop() if self._idle else await self._fork()
        except (ConnectionError, OSError) as exc:
            return {"error": f"no agent process could be started: {exc}", "died": True}
        self._busy.add(worker)
        healthy = False
        try:
            worker.writer.write(json.dumps({**job, "sys_path": sys.path}).encode() + b"\n")
            await worker.writer.drain()
            if on_start is not None:
                on_start()
            line = await worker.reader.readline()
            if line.endswith(b"\n"):
                healthy = True
                return json.loads(line)
            code = await self._exit_code(worker.pid)
            return {"error": f"its process ended without answering (exit code {code}: os._exit, a crash in C "
                             f"code, or killed from outside)", "died": True}
        except (ConnectionError, OSError) as exc:
            return {"error": f"its process could not be reached: {exc}", "died": True}
        finally:
            self._busy.discard(worker)
            if healthy and not self._closed and len(self._idle) < self.max_idle:
                self._idle.append(worker)
            else:
                self._kill(worker)

    async def close(self) -> None:
        """Kill every process and the fork server."""
        self._closed = True
        for worker in [*self._idle, *self._busy]:
            self._kill(worker)
        self._idle.clear()
        if self._control is not None:
            asyncio.get_running_loop().remove_reader(self._control.fileno())
            self._control.close()  # the server kills its processes and exits
        if self._server is not None:
            try:
                await asyncio.to_thread(self._server.wait, 10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                await asyncio.to_thread(self._server.wait)
