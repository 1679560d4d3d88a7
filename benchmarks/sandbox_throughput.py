"""Start cost of one sandboxed Python call, and sandboxed calls per second with several at once.

For each way of running a program it times `--calls` calls of a trivial program one after the
other (the start cost: median and 90th percentile wall time of one call, as `rlharness.sandbox.run`
measures it) and then the same number of calls from a pool of 1, 2 and 4 threads (calls per second;
each call is a process, so on 2 cores more than 2 workers can only add overlap with waiting):

- `bare`: `python -I -c pass` as a plain subprocess (what any process per call costs: the floor);
- `rlimits`: the sandbox's weaker mode (the stub, rlimits, a seccomp filter loaded by the stub);
- `namespaces`: the default (bubblewrap: user, pid, net, ipc, uts and mount namespaces, seccomp);
each sandbox mode cold (`warm=0`: every call starts its sandbox) and warm (`warm=2`, the default:
sandboxes started ahead wait for their program; each still runs one call). A warm call's time is
from the hand-over of its program; the calls per second include starting the sandboxes.

It also times one typical tool program (`print(sum(i * i for i in range(10, 61)))`) and prints
the machine, the date and the load average before and after.

    python benchmarks/sandbox_throughput.py [--calls 60] [--workers 1,2,4]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

from rlharness.config.schema import SandboxConf
from rlharness.sandbox import check_available, run

TRIVIAL = "pass"
TYPICAL = "print(sum(i * i for i in range(10, 61)))"


def bare(code: str) -> float:
    started = time.monotonic()
    subprocess.run([SandboxConf().python, "-I", "-c", code], check=True, capture_output=True)
    return time.monotonic() - started


def sandboxed(isolation: str, warm: int):
    limits = SandboxConf(isolation=isolation, warm=warm)

    def call(code: str) -> float:
        result = run(code, limits=limits)
        assert result.ok, result
        return result.wall_s
    return call


def start_cost(call, calls: int, code: str) -> tuple[float, float]:
    call(code)  # warm the page cache and the filter
    times = sorted(call(code) for _ in range(calls))
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def calls_per_s(call, calls: int, workers: int) -> float:
    with ThreadPoolExecutor(workers) as pool:
        started = time.monotonic()
        list(pool.map(call, [TRIVIAL] * calls))
        return calls / (time.monotonic() - started)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args(argv)
    if args.calls < 2:
        parser.error(f"--calls={args.calls}: expected >= 2")
    workers = [int(w) for w in args.workers.split(",")]
    for isolation in ("namespaces", "rlimits"):
        check_available(SandboxConf(isolation=isolation))
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average before: {load()}")
    print("\n| mode | one call, median | p90 | typical program, median | " +
          " | ".join(f"calls/s, {w} worker{'s' if w > 1 else ''}" for w in workers) + " |")
    print("| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in workers) + " |")
    modes = [("bare", bare)] + [(f"{isolation}, warm={warm}", sandboxed(isolation, warm))
                                for isolation in ("rlimits", "namespaces") for warm in (0, 2)]
    for name, call in modes:
        median, p90 = start_cost(call, args.calls, TRIVIAL)
        typical, _ = start_cost(call, max(2, args.calls // 3), TYPICAL)
        rates = [calls_per_s(call, args.calls, w) for w in workers]
        print(f"| {name} | {1000 * median:.0f} ms | {1000 * p90:.0f} ms | {1000 * typical:.0f} ms | "
              + " | ".join(f"{r:.1f}" for r in rates) + " |", flush=True)
    print(f"\nload average after: {load()}")


if __name__ == "__main__":
    main()
