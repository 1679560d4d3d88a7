"""Judging processes that can be killed: a pebble ProcessPool whose worker is replaced on timeout.

Why processes: math-verify on a tower of exponents (`\\boxed{9^{9^9}}`) computes a
huge integer in C while holding the interpreter lock, so neither a thread timeout
nor Ctrl-C can interrupt it in the trainer's process. In a worker process it costs
at most its timeout: pebble kills the worker (SIGTERM is left at its default action,
so it ends at once, even inside C code) and starts a new one, and the trainer's
interpreter is never blocked by CPU-bound judging.

Workers start from a forkserver that has already imported the judgers (a replaced
worker is ready in milliseconds, and none is forked from the multi-threaded trainer).
Each worker limits its address space (`RLIMIT_AS`, a runaway allocation raises
MemoryError instead of swapping the machine) and dies with the forkserver (Linux
`PR_SET_PDEATHSIG`), which itself exits with the trainer: a killed run leaves no
judging process spinning.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import logging
import multiprocessing
import resource
import signal
import sys
import threading
from typing import Any

log = logging.getLogger(__name__)

# Imported once by the forkserver, so every worker starts with them loaded.
_PRELOAD = ["rlharness.judger.pool", "rlharness.judger.math", "rlharness.judger.router", "rlharness.judger.llm",
            "math_verify", "jinja2.sandbox", "regex"]
_preload_lock = threading.Lock()
_preload_done = False


class JudgeLimitExceeded(RuntimeError):
    """Scoring one response ran past its timeout or memory limit, or killed its process.
    `kind`: "timeout" | "memory" | "died"."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


# ----------------------------------------------------------------------------- in the worker
_judger: Any = None


def _init_worker(judger: Any, memory_mb: int) -> None:
    global _judger
    _judger = judger
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # pebble's handler cannot run while C code computes
    # The limits are enforced from outside; math-verify's "timeout is disabled" notice would repeat per worker.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    limit = memory_mb * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _call(method: str, args: tuple) -> Any:
    return getattr(_judger, method)(*args)


def _ready() -> bool:
    return _judger is not None


# ----------------------------------------------------------------------------- in the trainer
def _forkserver_context():
    global _preload_done
    ctx = multiprocessing.get_context("forkserver")
    with _preload_lock:
        if not _preload_done:
            ctx.set_forkserver_preload(_PRELOAD)
            _preload_done = True
    return ctx


def forkserver_pool(max_workers: int, initializer: Any, initargs: tuple):
    """A pebble ProcessPool on the judging forkserver that stops its workers before it removes their
    channel. pebble (5.x) unlinks the channel's semaphores first: a worker still starting (a replacement,
    or one of several when the first answered) then fails to unpickle them and prints a traceback into
    the run's stderr."""
    import pebble

    class ProcessPool(pebble.ProcessPool):
        def _stop_pool(self):
            if self._pool_manager_loop is not None:
                self._pool_manager_loop.join()  # no worker is started after this
            self._pool_manager.worker_manager.force_stop_workers()
            super()._stop_pool()

    return ProcessPool(max_workers=max_workers, initializer=initializer, initargs=initargs,
                       context=_forkserver_context())


class JudgePool:
    """`num_workers` processes, each holding a pickled copy of `judger` (a rule judger, or what an llm
    judger runs there: its template and score pattern) and calling its methods."""

    def __init__(self, judger: Any, num_workers: int, memory_mb: int):
        self.num_workers = num_workers
        self._pool = forkserver_pool(num_workers, _init_worker, (judger, memory_mb))
        self.workers_replaced = 0

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the forkserver and the workers and wait until one answers (blocking: call it off the
        event loop; the first start imports the judgers, ~2 s)."""
        self._pool.schedule(_ready).result(timeout=timeout_s)

    async def score(self, response_text: str, label: dict[str, Any], timeout_s: float) -> dict[str, float]:
        """The judger's `score` in a worker (see `call`)."""
        return await self.call("score", (response_text, label), timeout_s)

    async def call(self, method: str, args: tuple, timeout_s: float) -> Any:
        """`judger.<method>(*args)` in a worker; JudgeLimitExceeded past `timeout_s` (counted from its start
        on a worker, not while queued) or the memory limit. Cancelling the await kills that worker too.
        An exception the method raises is raised here."""
        future = self._pool.schedule(_call, args=(method, args), timeout=timeout_s)
        try:
            return await asyncio.wrap_future(future)
        except concurrent.futures.TimeoutError:
            self.workers_replaced += 1
            raise JudgeLimitExceeded(f"timeout after {timeout_s:g} s (judging process replaced)", "timeout") from None
        except MemoryError:
            raise JudgeLimitExceeded("memory limit (judger.worker_memory_mb) exceeded", "memory") from None
        except Exception as exc:
            import pebble

            if isinstance(exc, pebble.ProcessExpired):  # killed from outside, or crashed in C
                self.workers_replaced += 1
                raise JudgeLimitExceeded(f"judging process died (exit code {exc.exitcode})", "died") from None
            raise

    def call_blocking(self, method: str, args: tuple, timeout_s: float) -> Any:
        """`call` for code that is not on an event loop (checks before a run starts)."""
        async def once() -> Any:
            return await self.call(method, args, timeout_s)

        return asyncio.run(once())

    def close(self) -> None:
        self._pool.stop()
        self._pool.join(timeout=10)
