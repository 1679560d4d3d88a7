"""A clean stop on SIGTERM / SIGINT (and submitit's preemption signal), within a time bound.

The first signal asks the trainer to stop: production is cancelled (in-flight groups go
back to the buffer as ABORTED, nothing is lost), a training step already running is
finished, a checkpoint is written if it fits in the time left (else skipped: the
previous one stays valid, checkpoints are atomic), W&B is finished, Ray actors are shut
down, one line is printed and the process exits with 128 + signum. A watchdog ends the
process at `stop_timeout_s` whatever it is doing; a second signal ends it at once.

Under submitit (Slurm or local), its preemption signal (USR2) stops the run the same
way and then hands over to submitit's own handler, which requeues the job; the
requeued job resumes from the checkpoint just written (`resume=auto`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(signum: int) -> int:
    """The shell's convention for a process ended by a signal."""
    return 128 + signum


class StopController:
    def __init__(self, timeout_s: float, hard_exit: Callable[[int], None] = os._exit):
        self.timeout_s = timeout_s
        self.signum: int | None = None
        self.received_at = 0.0
        self._hard_exit = hard_exit
        self._previous: dict[int, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._done = threading.Event()

    # ------------------------------------------------------------------ installing
    def install(self) -> "StopController":
        """Take over SIGTERM/SIGINT (and submitit's preemption signal when submitit handles it).

        Call again after `ray.init`: Ray's C++ failure handler takes SIGTERM and aborts (rc 134)."""
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only; whoever runs us there handles them
        signals = list(STOP_SIGNALS)
        preempt = _submitit_preemption_signal()
        if preempt is not None:
            signals.append(preempt)
        for sig in signals:
            previous = signal.signal(sig, self._on_signal)
            self._previous.setdefault(sig, previous)  # installed again: keep the first previous handler
        return self

    def uninstall(self) -> None:
        self._done.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def attach(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """An event in `loop` that is set when a stop is requested."""
        self._loop, self._event = loop, asyncio.Event()
        if self.requested:
            self._event.set()
        return self._event

    # ------------------------------------------------------------------ state
    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def time_left_s(self) -> float:
        return self.timeout_s - (time.monotonic() - self.received_at) if self.requested else self.timeout_s

    # ------------------------------------------------------------------ handling
    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second signal: the user means it
            _say(f"{signal.Signals(signum).name} again: exiting now without a final checkpoint")
            self._hard_exit(exit_code(self.signum))
            return
        self.signum = signum
        self.received_at = time.monotonic()
        _say(f"{self.signal_name}: stopping (checkpoint if it fits in stop_timeout_s={self.timeout_s:g}; "
             f"send it again to exit at once)")
        threading.Thread(target=self._watchdog, name="stop-watchdog", daemon=True).start()
        if self._loop is not None and self._event is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    def _watchdog(self) -> None:
        if not self._done.wait(self.timeout_s):
            _say(f"stop_timeout_s={self.timeout_s:g} passed while stopping: exiting now "
                 f"(the last complete checkpoint stays valid)")
            self._hard_exit(exit_code(self.signum or signal.SIGTERM))

    @property
    def requeues(self) -> bool:
        """The signal was submitit's preemption signal: its handler requeues the job after the stop."""
        return self.signum != signal.SIGTERM and _is_submitit_handler(self._previous.get(self.signum))

    def finish(self) -> None:
        """The stop is complete: hand over to submitit's requeue where it sent the signal, else exit."""
        self._done.set()
        previous, requeues = self._previous.get(self.signum), self.requeues
        self.uninstall()
        if requeues:
            previous(self.signum, None)  # checkpoint_and_try_requeue: requeues, then exits
        raise SystemExit(exit_code(self.signum))


def _say(message: str) -> None:
    """Straight to stderr (a signal handler must not take the logging lock)."""
    try:
        os.write(sys.stderr.fileno(), f"rlharness: {message}\n".encode())
    except (OSError, ValueError):
        pass


def _is_submitit_handler(handler: Any) -> bool:
    return callable(handler) and type(getattr(handler, "__self__", None)).__module__.startswith("submitit")


def _submitit_preemption_signal() -> int | None:
    """The signal submitit requeues on (USR2 by default), when this process is a submitit job."""
    try:
        from submitit.core.job_environment import JobEnvironment
    except ImportError:
        return None
    sig = JobEnvironment._usr_sig()
    return sig if _is_submitit_handler(signal.getsignal(sig)) else None
