"""Named points where the fault tests stop a run: a signal delivered at a chosen place, not a time.

`RLHARNESS_TEST_SIGNAL_AT="SIGKILL@checkpoint:2"` makes the process send itself SIGKILL when it
reaches the point `checkpoint` with number 2 (the step being written, before its DONE marker).
Points, and what their number is:

- `checkpoint:<step>`: inside that checkpoint's write, after its files, before DONE;
- `checkpoint_saved:<step>`: that checkpoint complete and in place (a life resumed from it never
  saves it again: a signal here reaches only the life that wrote it);
- `group_put:<n>`: the n-th group this process puts into the replay buffer (mid-production);
- `step_trained:<step>`: that optimizer step taken, before its weight sync, ledger and checkpoint.

A test that kills or signals a run at such a point kills it the same way on any machine, however
fast: a life cannot finish before the signal, nor be killed before it made progress. SIGSTOP
holds a run at a point (alive, its run directory locked) until the test continues or kills it. Several
specs may be given, separated by commas; unset (every real run), `reach` is one dict look-up.

`RLHARNESS_TEST_LEAK_MB_PER_STEP=N` makes the process keep N MB more (written, so resident) at each
`step_trained`: the leak the host-memory health monitor must catch (tests/health/).
"""

from __future__ import annotations

import os
import signal
from collections import Counter

SIGNAL_AT_ENV = "RLHARNESS_TEST_SIGNAL_AT"
LEAK_ENV = "RLHARNESS_TEST_LEAK_MB_PER_STEP"
POINTS = ("checkpoint", "checkpoint_saved", "group_put", "step_trained")

_counts: Counter[str] = Counter()
_leaked: list[bytearray] = []


def signal_at(sig: str | int, point: str, number: int) -> dict[str, str]:
    """The environment that makes a run signal itself at `point:number` (for tests and benchmarks)."""
    name = signal.Signals(sig).name if isinstance(sig, int) else sig
    return {SIGNAL_AT_ENV: f"{name}@{point}:{number}"}


def _parse(spec: str) -> list[tuple[signal.Signals, str, int]]:
    out = []
    for part in spec.split(","):
        try:
            name, where = part.strip().split("@")
            point, number = where.split(":")
            sig = signal.Signals[name]
            number_i = int(number)
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{SIGNAL_AT_ENV}={spec!r}: expected SIGNAME@point:number, e.g. SIGKILL@checkpoint:2") from exc
        if point not in POINTS:
            raise ValueError(f"{SIGNAL_AT_ENV}={spec!r}: no point {point!r}; points: {', '.join(POINTS)}")
        out.append((sig, point, number_i))
    return out


def reach(point: str, number: int | None = None) -> None:
    """This process is at `point`; `number` defaults to how many times it got here (1-based)."""
    leak_mb = os.environ.get(LEAK_ENV)
    if leak_mb and point == "step_trained":
        _leaked.append(bytearray(b"\x01") * (int(leak_mb) * 2**20))
    spec = os.environ.get(SIGNAL_AT_ENV)
    if not spec:
        return
    _counts[point] += 1
    number = _counts[point] if number is None else number
    for sig, at, n in _parse(spec):
        if at == point and n == number:
            os.kill(os.getpid(), sig)
