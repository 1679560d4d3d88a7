"""Where the engines' idle time goes in admission mode (`strategy.staleness_mode=admission`).

Runs one configuration of `producer_efficiency.py` (same producer, engines, trainer and
virtual clock) with a probe that samples, every `--dt` simulated seconds, the running
and queued requests of every engine, the groups in flight, the COMPLETED groups waiting
for the trainer, the admission room and whether the producer is paused for a weight
sync. Idle slot-time (slots without a running request) is attributed to one cause:

- `weight sync`: the producer is paused (the engines wait for new weights; X* has it too);
- `room full`: the groups produced beyond consumption (waiting COMPLETED + in flight) fill
  the admission room, so no group may start; nothing is queued;
- `queued`: requests wait for a slot on one engine while another has free ones (the router's
  balance);
- `room free`: a group could start but none did (a producer fault if large).

The probe only reads state, so the schedule is the benchmark's (same numbers).

    python benchmarks/admission_idle.py                      # whole-batch, cv 1.0, admission s=2 partial
    python benchmarks/admission_idle.py --case slot-limited --staleness 4
    python benchmarks/admission_idle.py --quick             # producer_efficiency's quick case (the tests)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from aiotools import VirtualClock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import producer_efficiency as pe  # noqa: E402

from rlharness.core.types import Status  # noqa: E402


async def _probe(stack: pe.Stack, dt_s: float, out: list[dict]) -> None:
    loop = asyncio.get_running_loop()
    manager = stack.manager
    ctx = next(iter(manager.contexts.values()))
    while True:
        stats = [e.stats() for e in stack.engines]
        running = sum(int(st["running"]) for st in stats)
        requests = sum(int(st["in_flight"]) for st in stats)
        out.append({"t": loop.time(), "running": running, "queued": requests - running,
                    "in_flight": ctx.pending.count(), "room": ctx.admission_room(),
                    "waiting": stack.replay_buffer.count(ctx.task, Status.COMPLETED),
                    "paused": manager._paused})  # noqa: SLF001
        await asyncio.sleep(dt_s)


async def _run(case: pe.Case, mode: pe.Mode, steps: int, dt_s: float) -> tuple[list[pe.StepRecord], list[dict]]:
    samples: list[dict] = []
    with VirtualClock().patch_loop():
        stack = pe.build_stack(mode.strategy, engine_conf=case.engine_conf(), num_engines=case.num_engines,
                               batch_size=case.batch_size, group_size=case.group_size, max_tokens=case.cap)
        backend = pe.SimBackend(case.backend_conf())
        producer = asyncio.create_task(stack.manager.produce_loop())
        probe = asyncio.create_task(_probe(stack, dt_s, samples))
        try:
            records = await pe._train_steps(stack, backend, case, False, steps, 1e6)  # noqa: SLF001
        finally:
            probe.cancel()
            await stack.manager.close()
            await asyncio.wait_for(producer, timeout=60)
    return records, samples


def breakdown(samples: list[dict], slots: int) -> dict[str, float]:
    """Shares of all slot-time: busy, and idle by cause (module docstring); plus mean occupancy."""
    idle: Counter = Counter()
    for s in samples:
        free = slots - s["running"]
        if s["paused"]:
            idle["weight sync"] += free
        elif s["queued"] > 0:
            idle["queued"] += free
        elif s["in_flight"] >= s["room"]:
            idle["room full"] += free
        else:
            idle["room free"] += free
    n = len(samples)
    out = {"busy": sum(s["running"] for s in samples) / (n * slots)}
    out.update({f"idle: {k}": v / (n * slots) for k, v in idle.items()})
    unpaused = [s for s in samples if not s["paused"]] or samples
    m = len(unpaused)
    out["groups in flight (mean)"] = sum(s["in_flight"] for s in unpaused) / m
    out["COMPLETED groups waiting (mean)"] = sum(s["waiting"] for s in unpaused) / m
    out["running requests per group in flight"] = (sum(s["running"] for s in unpaused)
                                                   / max(1, sum(s["in_flight"] for s in unpaused)))
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="whole-batch", choices=list(pe.CASES))
    ap.add_argument("--cv", type=float, default=1.0)
    ap.add_argument("--staleness", type=int, default=2, choices=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--dt", type=float, default=0.05, help="probe interval, simulated seconds")
    ap.add_argument("--quick", action="store_true", help="producer_efficiency's quick case and steps (for tests)")
    args = ap.parse_args(argv)
    if not 0 < args.warmup < args.steps:
        ap.error(f"--steps={args.steps} must exceed --warmup={args.warmup} (> 0)")
    case = replace(pe.CASES[args.case], cv=args.cv)
    if args.quick:
        case, args.case, args.steps, args.warmup = pe.QUICK, "quick", pe.QUICK_STEPS, pe.QUICK_WARMUP
    mode = next(m for m in pe.modes() if m.name == f"admission s={args.staleness} partial")
    records, samples = asyncio.run(_run(case, mode, args.steps, args.dt))
    result = pe.summarise(args.case, case, mode, records, args.warmup, {})
    start = records[args.warmup - 1].t_end
    shares = breakdown([s for s in samples if s["t"] >= start], case.num_engines * case.slots)
    print(f"{args.case} cv={args.cv:g} {mode.name}: {100 * result.ratio:.1f}% of X* "
          f"(ceiling of the rule {100 * pe.admission_ceiling(case, args.staleness) / result.ideal:.1f}%), "
          f"steps {args.warmup + 1}..{args.steps}")
    for k, v in shares.items():
        print(f"  {k}: {100 * v:.1f}%" if k.startswith(("busy", "idle")) else f"  {k}: {v:.1f}")
    return {"ratio": result.ratio, **shares}


if __name__ == "__main__":
    main()
