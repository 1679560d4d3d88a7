"""Orchestration overhead of the producer: microseconds per group with an engine that costs nothing.

The project's real producer (Sampler, ReplayBuffer, SingleTurnAgentLoop, AgentLoopManager,
strategies) runs against `InstantEngine`, a RolloutEngine that answers without doing any
work, so the wall time measured is the producer's own: drawing prompts, spawning and
tracking tasks, cloning groups, judging (inline, `PureAsyncJudger`; a real judger's
thread hop is judging cost, not orchestration), collecting, buffering, taking batches.

Two completion patterns:
- `burst`: every request completes on its first turn of the event loop (the whole batch
  finishes at once; the fewest producer wake-ups);
- `staggered`: requests complete one per event-loop iteration, in arrival order, like a
  real engine whose responses arrive one by one. Every completion wakes the producer, so
  any O(in-flight) work per wake-up shows up here as quadratic growth.

For each number of groups in flight N (the batch: N groups launched together), it times
`steps` training steps of the colocated path (`produce_batch`) and of the disaggregated
path (`produce_loop` + `get_batch` + pause/resume around each weight sync) and reports
microseconds per group. The share of a real training step is computed against
`perf/train_s` (and `perf/step_s`) of a metrics.jsonl from `python train.py total_steps=3`
(the default tiny-model run), given with `--metrics`.

    python benchmarks/overhead.py [--metrics outputs/<date>/<time>/metrics.jsonl]
    python benchmarks/overhead.py --quick      # seconds; used by the tests
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import decode_len, encode_prompt, TASK  # noqa: E402

from rlharness.agent.single_turn import SingleTurnAgentLoop  # noqa: E402
from rlharness.config.schema import SamplerConf, SamplingConf, SingleTurnAgentConf, StrategyConf  # noqa: E402
from rlharness.config.schema import AsyncStrategyConf, SyncStrategyConf  # noqa: E402
from rlharness.data.base import PromptRow  # noqa: E402
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine  # noqa: E402
from rlharness.core.gc_tuning import tune_gc, untune_gc  # noqa: E402
from rlharness.judger.base import Judger  # noqa: E402
from rlharness.producer.manager import AgentLoopManager  # noqa: E402
from rlharness.producer.staleness import StalenessPolicy  # noqa: E402
from rlharness.producer.strategies import build_strategy  # noqa: E402
from rlharness.producer.replay_buffer import ReplayBuffer  # noqa: E402
from rlharness.producer.sampler import Sampler  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TARGET_US = 100.0


class InstantEngine(RolloutEngine):
    """Answers every request with `num_tokens` fixed tokens, doing no work (benchmark engine)."""

    def __init__(self, num_tokens: int = 8, staggered: bool = False) -> None:
        self.num_tokens = num_tokens
        self.staggered = staggered
        self._version = 0
        self._queue: collections.deque[asyncio.Future] = collections.deque()
        self._pumping = False
        self._answer_lists: tuple | None = None

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return (await self.generate_many([request]))[0]

    async def generate_many(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """One call per group (natively batched): staggered, the call waits for its turn."""
        if self.staggered:  # wait for our turn: one completion per event-loop iteration
            fut = asyncio.get_running_loop().create_future()
            self._queue.append(fut)
            if not self._pumping:
                self._pumping = True
                asyncio.get_running_loop().call_soon(self._pump)
            await fut
        return [self._answer(r) for r in requests]

    def _answer(self, request: GenerateRequest) -> GenerateResult:
        # The token lists are shared between answers (callers copy them; `append_tokens` extends
        # from them): the engine's own cost stays out of the orchestration measured.
        n = min(self.num_tokens, request.sampling.max_tokens)
        if self._answer_lists is None or self._answer_lists[0] != (n, self._version):
            self._answer_lists = ((n, self._version), [1] * n, [-1.0] * n, [self._version] * n)
        _, ids, logprobs, steps = self._answer_lists
        return GenerateResult(request.request_id, ids, logprobs, steps, "length")

    def _pump(self) -> None:
        while self._queue:
            fut = self._queue.popleft()
            if not fut.done():
                fut.set_result(None)
                break
        if self._queue:
            asyncio.get_running_loop().call_soon(self._pump)
        else:
            self._pumping = False

    async def abort_all(self) -> int:
        return 0  # nothing is ever left running long enough to abort

    async def load_weights(self, state: dict[str, Any], version: int) -> None:
        self._version = version


class ParityJudger(Judger):
    """Reward = parity of the response length (the text is its length, `decode_len`).

    A rule that costs nothing, judged through the library's `Judger.judge_group` (its
    inline path: `score_inline` answers, no worker thread): what is timed is the judging
    machinery, not a particular rule (the math judger's exact-number path costs ~9 us a
    response on top, a judging cost of the arithmetic task)."""

    name = "bench_parity"

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        return {"score": float(int(response_text or "0") % 2 == 0)}

    def score_inline(self, response_text: str, label: dict[str, Any]) -> dict[str, float] | None:
        return self.score(response_text, label)


def build(strategy: StrategyConf, groups: int, group_size: int, staggered: bool) -> AgentLoopManager:
    staleness = StalenessPolicy(max_staleness=strategy.max_staleness, mode=strategy.staleness_mode)
    rb = ReplayBuffer(staleness)
    rows = [PromptRow(index=i, prompt_text=str(i), label={"answer": "8"}) for i in range(max(groups * 4, 1000))]
    sampler = Sampler(SamplerConf(prompt_repeat_k=group_size), TASK, rows,
                      encode_prompt, rb, seed=0)
    agent = SingleTurnAgentLoop(SingleTurnAgentConf(sampling=SamplingConf(max_tokens=8)),
                                InstantEngine(staggered=staggered), ParityJudger(), decode_len)
    return AgentLoopManager(tasks={TASK: (sampler, agent)}, strategy=build_strategy(strategy, staleness),
                            replay_buffer=rb, batch_size=groups)


async def _colocated(mgr: AgentLoopManager, steps: int) -> list[tuple[float, float]]:
    engine = mgr.contexts[TASK].agent_loop.engine
    times = []
    for step in range(1, steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        batch = await mgr.produce_batch(step)
        times.append((time.perf_counter() - t0, time.process_time() - c0))
        assert len(batch.groups) == mgr.batch_size
        await mgr.pause()
        await engine.load_weights({}, step)
        mgr.set_model_step(step)
        mgr.resume()
    return times


async def _disaggregated(mgr: AgentLoopManager, steps: int) -> list[tuple[float, float]]:
    engine = mgr.contexts[TASK].agent_loop.engine
    producer = asyncio.create_task(mgr.produce_loop())
    times = []
    try:
        for step in range(1, steps + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            batch = await mgr.get_batch(step, timeout_s=600)
            assert len(batch.groups) == mgr.batch_size
            await mgr.pause()
            await engine.load_weights({}, step)
            mgr.set_model_step(step)
            mgr.resume()
            times.append((time.perf_counter() - t0, time.process_time() - c0))
    finally:
        await mgr.close()
        await asyncio.wait_for(producer, timeout=600)
    return times


GC_MODES = ("default", "tuned", "off")


def measure(path: str, groups: int, group_size: int, steps: int, staggered: bool,
            gc_off: bool = False, gc_mode: str | None = None) -> dict[str, Any]:
    """Microseconds per group under one setting of Python's cyclic GC (`gc_mode`):
    - "default": Python's own thresholds (700, 10, 10), nothing frozen;
    - "tuned": what a training run uses (`rlharness.core.gc_tuning.tune_gc`, called by the launcher
      once the run is built): start-up objects frozen, thresholds (50000, 20, 10);
    - "off": frozen and disabled, the producer's own cost without any collector pass.
    `gc_off=True` is `gc_mode="off"` (older callers)."""
    mode = gc_mode or ("off" if gc_off else "default")
    if mode not in GC_MODES:
        raise ValueError(f"gc_mode={mode!r} is not one of {GC_MODES}")
    previous = gc.get_threshold()
    if mode == "tuned":
        tune_gc()
    elif mode == "off":
        gc.collect()
        gc.freeze()
        gc.disable()
    try:
        return _measure(path, groups, group_size, steps, staggered) | {"gc": mode}
    finally:
        if mode == "tuned":
            untune_gc(previous)
        elif mode == "off":
            gc.enable()
            gc.unfreeze()


def _measure(path: str, groups: int, group_size: int, steps: int, staggered: bool) -> dict[str, Any]:
    if path == "colocate":
        mgr = build(SyncStrategyConf(max_staleness=0), groups, group_size, staggered)
        times = asyncio.run(_colocated(mgr, steps))
    else:
        # No over-sampling, no partial rollout: exactly the batch in flight, as in the colocated path
        # (the async defaults over-sample 25%, which would put 1.25 N in flight).
        mgr = build(AsyncStrategyConf(max_staleness=0, over_sample_threshold=0.0, enable_partial_rollout=False),
                    groups, group_size, staggered)
        times = asyncio.run(_disaggregated(mgr, steps))
    acc = mgr.accounting()
    if acc["unaccounted"]:
        raise AssertionError(f"prompts unaccounted for: {acc}")
    # The first step pays one-off costs (lazy permutation, first allocations): report the rest.
    steady = times[1:] if len(times) > 1 else times
    per_group_us = 1e6 * sum(w for w, _ in steady) / (len(steady) * groups)
    # CPU time of this process over the same spans: on a loaded machine the wall time also
    # holds the time the OS gave to other processes; the producer is single-threaded.
    cpu_per_group_us = 1e6 * sum(c for _, c in steady) / (len(steady) * groups)
    return {"path": path, "completions": "staggered" if staggered else "burst", "groups_in_flight": groups,
            "group_size": group_size, "steps": len(steady), "us_per_group": per_group_us,
            "us_per_sample": per_group_us / group_size, "cpu_us_per_group": cpu_per_group_us,
            "step_s": sum(w for w, _ in steady) / len(steady),
            "max_in_flight": mgr.contexts[TASK].pending.max_count_seen}


def read_step_times(path: Path) -> dict[str, float]:
    """Mean perf/train_s and perf/step_s over the training rows of a metrics.jsonl."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("step", 0) >= 1 and "perf/train_s" in r]
    if not train:
        raise ValueError(f"{path}: no training rows with perf/train_s")
    return {"train_s": sum(r["perf/train_s"] for r in train) / len(train),
            "step_s": sum(r["perf/step_s"] for r in train) / len(train),
            "batch_groups": None, "rows": len(train)}


def _loadavg() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 and 1,000 groups, 3 steps (for tests)")
    ap.add_argument("--groups", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per point; the best is reported (as timeit does: slower runs are interference "
                         "from the shared machine), the median beside it")
    ap.add_argument("--metrics", type=Path, default=None,
                    help="metrics.jsonl of `python train.py total_steps=3` for the share of a real step")
    ap.add_argument("--default-batch-groups", type=int, default=64,
                    help="groups per step of that run (the default batch_size)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = ap.parse_args(argv)
    # Checked before anything runs (the full run takes minutes), each naming the option.
    for name, value, least in (("--group-size", args.group_size, 1), ("--steps", args.steps, 2),
                               ("--repeats", args.repeats, 1), ("--default-batch-groups", args.default_batch_groups, 1)):
        if value < least:
            ap.error(f"{name}={value} must be >= {least}" + (" (the first step is excluded)" if name == "--steps" else ""))
    if min(args.groups) < 1:
        ap.error(f"--groups={args.groups}: groups in flight must be >= 1")
    if args.metrics is not None:
        try:
            read_step_times(args.metrics)
        except (OSError, ValueError, KeyError) as exc:
            ap.error(f"--metrics={args.metrics}: {exc}")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    groups, steps, repeats = args.groups, args.steps, args.repeats
    if args.quick:
        groups, steps, repeats = [100, 1000], 3, 1

    load_before = _loadavg()
    results = []
    # GC off only for the staggered pattern (the realistic one): it shows the producer's own growth.
    for staggered, gc_mode in ((False, "default"), (False, "tuned"), (True, "default"), (True, "tuned"),
                               (True, "off")):
        for path in ("colocate", "disagg"):
            for n in groups:
                runs = [measure(path, n, args.group_size, steps, staggered, gc_mode=gc_mode) for _ in range(repeats)]
                r = min(runs, key=lambda x: x["us_per_group"]) | {
                    "repeats": repeats, "median_us_per_group": statistics.median(x["us_per_group"] for x in runs)}
                results.append(r)
                print(f"{r['completions']:9s} gc {r['gc']:7s} {path:8s} {n:6d} groups in flight: "
                      f"{r['us_per_group']:8.1f} us/group best of {repeats} (median {r['median_us_per_group']:8.1f}; "
                      f"cpu {r['cpu_us_per_group']:8.1f}; {r['step_s'] * 1e3:8.1f} ms/step)", flush=True)

    lines = [f"# Orchestration overhead ({'quick' if args.quick else 'full'} run)", "",
             f"InstantEngine, K={args.group_size} samples per group, {steps} steps per run (first step excluded), "
             f"best of {repeats} runs per point (median beside it); "
             f"target < {TARGET_US:g} us per group at 10,000 in flight. Load average (1, 5, 15 min) "
             f"before: {load_before}, after: {_loadavg()} on {os.cpu_count()} cores. `cpu us` is this "
             f"process's CPU time over the same spans (the wall time minus what the OS gave others).", "",
             "| completions | Python GC | path | groups in flight | us per group | median | cpu us per group | "
             "us per sample | ms per step | per-group growth vs smallest N |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        base = next(b for b in results if b["path"] == r["path"] and b["completions"] == r["completions"]
                    and b["gc"] == r["gc"])
        lines.append(f"| {r['completions']} | {r['gc']} | {r['path']} | {r['groups_in_flight']:,} | "
                     f"{r['us_per_group']:.1f} | {r['median_us_per_group']:.1f} | {r['cpu_us_per_group']:.1f} | "
                     f"{r['us_per_sample']:.1f} | {r['step_s'] * 1e3:.1f} | "
                     f"{r['us_per_group'] / base['us_per_group']:.2f}x |")
    if args.metrics is not None:
        st = read_step_times(args.metrics)
        lines += ["", f"Share of a real training step (`{args.metrics}`: mean over {st['rows']} rows of the default "
                  f"tiny-model run, {args.default_batch_groups} groups per step): perf/train_s = {st['train_s']:.3f} s, "
                  f"perf/step_s = {st['step_s']:.3f} s.", "",
                  "| completions | path | us per group | orchestration per step | share of perf/train_s | "
                  "share of perf/step_s |", "| --- | --- | --- | --- | --- | --- |"]
        for r in results:
            if r["groups_in_flight"] != min(groups) or r["gc"] != "tuned":  # what a training run uses
                continue
            per_step_s = r["us_per_group"] * 1e-6 * args.default_batch_groups
            lines.append(f"| {r['completions']} | {r['path']} | {r['us_per_group']:.1f} | {per_step_s * 1e3:.2f} ms | "
                         f"{100 * per_step_s / st['train_s']:.2f}% | {100 * per_step_s / st['step_s']:.2f}% |")
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    prefix = "overhead_quick" if args.quick else "overhead"
    (args.out / f"{prefix}.md").write_text(text)
    (args.out / f"{prefix}.json").write_text(json.dumps(results, indent=1))
    print("\n" + text)
    return results


if __name__ == "__main__":
    main()
