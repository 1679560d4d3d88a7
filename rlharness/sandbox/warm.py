"""Sandboxes started ahead of their calls (`SandboxConf.warm` per set of limits), so that a call does
not wait for bubblewrap's namespaces and the interpreter's start (about two thirds of a trivial
call's time: benchmarks/sandbox_throughput.py).

A warm sandbox is an ordinary one that has set itself up and waits for its program; it runs one
program and is discarded, like any other: nothing carries over from one call to the next. One
thread per pool starts them (bubblewrap's --die-with-parent follows the thread that started it, so
a sandbox must not be started from a caller's short-lived thread); a call takes a waiting sandbox
if one is alive, else starts its own. A forked child of this process starts with no pools.
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import astuple, replace

from rlharness.config.schema import SandboxConf
from rlharness.sandbox.call import Started, start


class WarmPool:
    def __init__(self, conf: SandboxConf) -> None:
        self.conf = conf
        self.ready: list[Started] = []
        self.wanted = threading.Condition()
        self.closed = False
        threading.Thread(target=self._fill, name="sandbox-warm", daemon=True).start()

    def _fill(self) -> None:
        while True:
            with self.wanted:
                self.wanted.wait_for(lambda: self.closed or len(self.ready) < self.conf.warm)
                if self.closed:
                    return
            started = start(self.conf)
            with self.wanted:
                if self.closed:
                    started.discard()
                    return
                self.ready.append(started)
                self.wanted.notify_all()  # a caller may wait for the pool to be full

    def take(self) -> Started | None:
        """A waiting sandbox that is still alive, or None (the caller starts one)."""
        with self.wanted:
            while self.ready:
                started = self.ready.pop(0)
                if started.alive():
                    self.wanted.notify_all()
                    return started
                started.discard()
            self.wanted.notify_all()
        return None

    def close(self) -> None:
        with self.wanted:
            self.closed = True
            ready, self.ready = self.ready, []
            self.wanted.notify_all()
        for started in ready:
            started.discard()


_pools: dict[tuple, WarmPool] = {}
_lock = threading.Lock()


def take(conf: SandboxConf) -> Started | None:
    """A warm sandbox for `conf` (its wall time is the caller's, not the sandbox's), or None."""
    if conf.warm == 0:
        return None
    key = astuple(replace(conf, wall_s=1.0))
    with _lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = WarmPool(conf)
    return pool.take()


def close_all() -> None:
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


def _forget_in_child() -> None:
    """A forked child has none of the pools' threads; its copies of their sandboxes are its parent's."""
    global _lock
    _pools.clear()
    _lock = threading.Lock()


atexit.register(close_all)
os.register_at_fork(after_in_child=_forget_in_child)
