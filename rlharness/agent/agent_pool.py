"""Agent processes: where the user's agent programs run, so that none can stop the run.

An agent program is the user's code: it may raise, call `sys.exit` or `os._exit`, block its
thread in `time.sleep`, spin in a CPU loop or wait forever. Run in the trainer's event loop
(as it was), any of these ended or froze the whole run. Here each program runs in a process
of its own (`rlharness/agent/agent_worker.py`), one sample at a time, and reaches the gateway
over loopback; `run` returns its reply, or an error reply (`"died": True`) when the process died. Cancelling
`run` (the sample's `agent.timeout_s` passed, or its group was stopped) kills the process
with SIGKILL, which nothing in it can catch or ignore; the next sample gets a fresh one.

Processes are forked from the run's forkserver (`rlharness.core.forkserver`) with the client
packages already imported, so a replacement starts in milliseconds; idle ones are kept for
the next sample (at most `max_idle`). The pool belongs to one event loop (its sockets are the
loop's streams); `close` kills every process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
from dataclasses import dataclass
from typing import Any

from rlharness.agent.agent_worker import worker_main
from rlharness.core.forkserver import forkserver_context

log = logging.getLogger(__name__)

# Imported by the forkserver before it forks any process (a package that is not installed is skipped);
# "__main__" (train.py) once there, so that no process runs the script's top level again.
PRELOAD = ["__main__", "rlharness.agent.agent_worker", "httpx", "openai", "anthropic"]
_REPLY_LIMIT = 64 * 1024 * 1024  # the longest reply line read (an answer is returned whole)


@dataclass(eq=False)  # hashed by identity (a set of busy ones)
class AgentProcess:
    proc: Any  # multiprocessing.Process
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def kill(self) -> None:
        self.writer.close()
        if self.proc.is_alive():
            self.proc.kill()


def register_preload() -> None:
    """Name PRELOAD for the run's forkserver now (a loop is built before any pool starts it)."""
    forkserver_context(PRELOAD)


class AgentPool:
    def __init__(self, max_idle: int) -> None:
        self.max_idle = max_idle
        self._ctx = forkserver_context(PRELOAD)
        self._idle: list[AgentProcess] = []
        self._busy: set[AgentProcess] = set()
        self.started = 0  # processes started (replacements included)
        self.killed = 0  # processes killed or found dead (a timeout, a cancelled group, the program's exit)
        self._closed = False

    async def _start(self) -> AgentProcess:
        ours, theirs = socket.socketpair()
        proc = self._ctx.Process(target=worker_main, args=(theirs,), daemon=True, name="rlharness-agent")
        try:
            await asyncio.to_thread(proc.start)  # the first start launches the forkserver (seconds)
        finally:
            theirs.close()
        reader, writer = await asyncio.open_connection(sock=ours, limit=_REPLY_LIMIT)
        self.started += 1
        return AgentProcess(proc, reader, writer)

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """Run one job (agent_worker's format) in a process; its reply. Cancelling this kills the process."""
        if self._closed:
            raise RuntimeError("the agent pool is closed")
        worker = self._idle.pop() if self._idle else await self._start()
        self._busy.add(worker)
        healthy = False
        try:
            worker.writer.write(json.dumps({**job, "sys_path": sys.path}).encode() + b"\n")
            await worker.writer.drain()
            line = await worker.reader.readline()
            if line.endswith(b"\n"):
                healthy = True
                return json.loads(line)
            code = await asyncio.to_thread(self._exit_code, worker)
            return {"error": f"its process ended without answering (exit code {code}: os._exit, a crash in C "
                             f"code, or killed from outside)", "died": True}
        except (ConnectionError, OSError) as exc:
            return {"error": f"its process could not be reached: {exc}", "died": True}
        finally:
            self._busy.discard(worker)
            if not healthy:
                self.killed += 1
            if healthy and not self._closed and len(self._idle) < self.max_idle:
                self._idle.append(worker)
            else:
                self._kill(worker)

    @staticmethod
    def _exit_code(worker: AgentProcess) -> int | None:
        worker.proc.join(timeout=5)
        return worker.proc.exitcode

    @staticmethod
    def _kill(worker: AgentProcess) -> None:
        worker.kill()
        # Reaped off the loop (the forkserver reports its status through a pipe).
        asyncio.get_running_loop().run_in_executor(None, worker.proc.join, 10)

    async def close(self) -> None:
        self._closed = True
        workers = [*self._idle, *self._busy]
        self._idle.clear()
        for worker in workers:
            worker.kill()
        await asyncio.gather(*(asyncio.to_thread(w.proc.join, 10) for w in workers))
