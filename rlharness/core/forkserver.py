"""The process's one multiprocessing forkserver, shared by every pool of killable workers.

Workers forked from a server that has already imported what they need start in milliseconds
(and none is forked from the multi-threaded trainer). Python keeps one forkserver per
process, started by the first process created through it, with the preload list set by
then: each pool names its modules here when it is built, before any pool starts, and the
union is preloaded. A module named after the server started is imported by each worker
itself (slower, still correct). A module that fails to import is skipped by the server.
"""

from __future__ import annotations

import multiprocessing
import threading

_lock = threading.Lock()
_preload: list[str] = []


def forkserver_context(preload: list[str]):
    """The forkserver context, with `preload` added to the modules the server imports when it starts."""
    ctx = multiprocessing.get_context("forkserver")
    with _lock:
        added = [m for m in preload if m not in _preload]
        if added:
            _preload.extend(added)
            ctx.set_forkserver_preload(list(_preload))
    return ctx
