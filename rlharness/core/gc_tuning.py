"""Python's cyclic garbage collector, set for a long-running producer.

With Python's default thresholds (700, 10, 10) the collector's passes took more than
half of the producer's time at 10,000 groups in flight (benchmarks/overhead.py): every
group in flight is a hundred-odd container objects (states, token lists, requests)
that outlive a young collection, so they are walked again by every older one, and a
full collection runs each time the old generation grows by a quarter, which it does
several times per step while a batch is in flight.

`tune_gc` (called by the launcher once the run is built):
- `gc.freeze()`: what start-up built (modules, model wrappers, config, datasets) moves
  to a permanent generation that no collection walks; it lives for the run anyway.
- `gc.set_threshold(50_000, 20, 10)`: a young collection every 50,000 net container
  allocations instead of 700, so a group's objects are walked far fewer times.
Reference counting still frees every object not in a reference cycle the moment it
is dropped, exactly as before; only cyclic garbage waits longer for its collection
(a young one within 50,000 allocations, milliseconds of producer work).
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

GC_THRESHOLDS = (50_000, 100, 10)


def tune_gc(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> tuple[int, int, int]:
    """Freeze the objects alive now and set the collection thresholds; returns the previous thresholds."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    log.info("gc: %d start-up objects frozen; thresholds %s (were %s)", gc.get_freeze_count(), thresholds, previous)
    return previous  # type: ignore[return-value]


def untune_gc(previous: tuple[int, int, int]) -> None:
    """Undo `tune_gc` (tests, benchmarks): unfreeze and restore the thresholds."""
    gc.unfreeze()
    gc.set_threshold(*previous)
