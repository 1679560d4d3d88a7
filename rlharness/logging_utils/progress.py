"""Start and end lines, with the time taken, for the long phases outside the step loop (loading a
model, starting an engine, loading a checkpoint, an evaluation pass), so a person sees what the
process is doing while the step bar is not moving."""

from __future__ import annotations

import contextlib
import logging
import time

log = logging.getLogger("rlharness")


@contextlib.contextmanager
def phase(what: str, logger: logging.Logger = log):
    logger.info("%s ...", what)
    t0 = time.monotonic()
    yield
    logger.info("%s: done in %.1fs", what, time.monotonic() - t0)


class Progress:
    """For a loop that may run long (generating a task's rows at the start): a line every `every_s` seconds
    saying how far it is, so a large `task.num_train` shows it is working and how long it will take."""

    def __init__(self, what: str, total: int, every_s: float = 10.0, logger: logging.Logger = log):
        self.what, self.total, self.every_s, self.logger = what, total, every_s, logger
        self.t0 = time.monotonic()
        self._next = self.t0 + every_s

    def update(self, done: int) -> None:
        """Cheap to call per item: it looks at the clock every 1024th call."""
        if not done or done & 1023 or time.monotonic() < self._next:
            return
        elapsed = time.monotonic() - self.t0
        left = elapsed / max(done, 1) * (self.total - done)
        self.logger.info("%s: %d of %d (%.0f%%) in %.0f s, about %.0f s left", self.what, done, self.total,
                         100.0 * done / max(self.total, 1), elapsed, left)
        self._next = time.monotonic() + self.every_s
