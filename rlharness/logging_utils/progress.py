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
