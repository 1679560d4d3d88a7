"""Producer efficiency against the ideal bound, on a virtual clock.

What runs: the project's real producer (AgentLoopManager, Sync/AsyncProduceStrategy,
Sampler, ReplayBuffer, SingleTurnAgentLoop, build_train_batch) against `num_engines`
SimEngines behind an EngineRouter and a SimBackend trainer, all on aiotools'
`VirtualClock`: simulated time jumps ahead whenever every task waits, so hours of
simulated training take seconds and the schedule is deterministic. Only the judger
is benchmark-specific (see `_common.py` for why).

The training side mirrors `rlharness.trainer.trainer.Trainer`:
- colocated modes alternate: `produce_batch(step)` -> train -> weight sync;
- disaggregated modes consume concurrently: `produce_loop()` runs as a task while the
  trainer loops `get_batch(step)` -> `SimBackend.train_step` (a sleep of
  step_time + per_token * tokens) -> `pause()` -> sleep(weight_sync_s) ->
  `load_weights` -> `set_model_step` -> `resume()`.

Ideal bound (printed with the results). Assumptions: E engines with S slots each
generate independently (a slot is busy for prefill + length * t_tok per request);
lengths are i.i.d. L ~ lognormal(mean, cv), rounded, at least 1, capped at `cap`; one
trainer takes T_train(B) = step_time + per_token * B*K*E[len] per batch of B groups of
K samples; a weight sync takes T_sync during which the trainer is busy and the
engines are paused (the producer pauses every step). Then one step needs at least
T_sync + B*K / R_gen of engine time and T_train + T_sync of trainer time, so

    E[len]  = E[min(max(1, round(L)), cap)]              (exact sum over the lognormal CDF)
    tau     = prefill + E[len] * t_tok                   (slot-seconds per sample)
    R_gen   = E * S / tau                                (samples/s with every slot busy)
    T_train = step_time + per_token * B * K * E[len]
    X*      = B*K / (T_sync + max(T_train, B*K / R_gen)) (samples/s)

No schedule beats X* on average (it ignores the re-paid prefill of continued samples
and all waste). Sync and colocated modes run on the same simulated resources (they
would share devices in a real colocated run; the time costs here are the same).

Metrics per configuration, over steps warmup+1..N (steady state):
throughput (trained samples per simulated second), its ratio to X*, engine busy
fraction (busy slot-seconds / (E*S*window)), trainer idle fraction (time waiting for
a batch / window), token staleness mean and max, staleness at admission mean and max
(what `strategy.staleness_mode=admission` bounds), tokens wasted (expired or discarded
on restart) as a share of tokens generated, and the mean trained response length
(against E[len]: expiry re-draws long samples, a bias to watch).

Modes named `admission ...` run `strategy.staleness_mode=admission` (groups start only
within the admission room, nothing expires); the others the token rule. Each async mode
is compared with the ceiling of its own rule (STALENESS_CEILING / ADMISSION_CEILING).

    python benchmarks/producer_efficiency.py            # full run -> benchmarks/results/
    python benchmarks/producer_efficiency.py --quick    # seconds; used by the tests
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import logging
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from aiotools import VirtualClock

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Stack, async_conf, build_stack, capped_length_mean, length_pmf  # noqa: E402


from rlharness.backend.sim import SimBackend  # noqa: E402
from rlharness.config.schema import AlgoConf, SimBackendConf, SimEngineConf, StrategyConf, SyncStrategyConf  # noqa: E402
from rlharness.engine.sim import lognormal_params  # noqa: E402
from rlharness.trainer.batch import build_train_batch  # noqa: E402

log = logging.getLogger("producer_efficiency")

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# ----------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class Case:
    """One simulated cluster and workload (times in simulated seconds)."""

    num_engines: int = 2
    slots: int = 32  # concurrent requests per engine
    time_per_token_s: float = 0.04
    prefill_s: float = 0.2
    mean_len: float = 128.0
    cv: float = 1.0
    cap: int = 2048  # 16x the mean
    train_step_s: float = 2.0  # fixed part of a training step
    train_per_token_s: float = 5.9e-4
    weight_sync_s: float = 1.0
    batch_size: int = 32  # groups per step: B*K = 4 samples per slot per step
    group_size: int = 8  # samples per group

    def engine_conf(self) -> SimEngineConf:
        return SimEngineConf(num_engines=self.num_engines, mean_response_len=self.mean_len, cv=self.cv,
                             max_len=self.cap, time_per_token_s=self.time_per_token_s, prefill_s=self.prefill_s,
                             slots=self.slots)

    def backend_conf(self) -> SimBackendConf:
        return SimBackendConf(step_time_s=self.train_step_s, time_per_token_s=self.train_per_token_s)


@dataclass(frozen=True)
class Bound:
    mean_len: float
    tau_s: float
    gen_rate: float  # R_gen, samples/s
    train_s: float  # T_train(B)
    train_rate: float  # B*K / (T_train + T_sync)
    gen_rate_synced: float  # B*K / (B*K/R_gen + T_sync)
    ideal: float  # X*


def ideal_bound(c: Case) -> Bound:
    n = c.batch_size * c.group_size
    mean_len = capped_length_mean(c.mean_len, c.cv, c.cap)
    tau = c.prefill_s + mean_len * c.time_per_token_s
    gen_rate = c.num_engines * c.slots / tau
    train_s = c.train_step_s + c.train_per_token_s * n * mean_len
    train_rate = n / (train_s + c.weight_sync_s)
    gen_synced = n / (n / gen_rate + c.weight_sync_s)
    return Bound(mean_len, tau, gen_rate, train_s, train_rate, gen_synced, min(train_rate, gen_synced))


FORMULA = """\
E[len]  = E[min(max(1, round(L)), cap)], L ~ lognormal(mean, cv)   (exact sum over the CDF)
tau     = prefill + E[len] * t_tok                                  (slot-seconds per sample)
R_gen   = engines * slots / tau                                     (generation-bound samples/s)
T_train = step_time + per_token * B*K * E[len]                      (one training step)
X*      = B*K / (T_sync + max(T_train, B*K / R_gen))
        = min(B*K / (B*K/R_gen + T_sync), B*K / (T_train + T_sync))
Assumes: engines paused during each weight sync (the producer pauses every step), trainer busy
during it; i.i.d. lengths; no re-paid prefill, no waste. No schedule beats X* on average."""


CEILING_FORMULA = """\
Ceiling of async + partial rollout under max_staleness=s (per-token expiry of whole groups):
a group whose oldest token has version v is trained at step v+s+1 at the latest, and version v reaches
the engines T_busy = T_train + T_sync after the batch of step v was taken. At throughput F (one step
per T = B*K/F) a group has at most W(F) = (s+1)*T - T_busy from its first token to that batch. A member
of slot-cost c = prefill + n*t_tok fits if c <= W; a group fits if all K members do. A producer that
does not know lengths in advance does no better than starting every group at the start of its window,
never queueing, and dropping a group that cannot fit at W (members run at most W), so
  q = P(c <= W),  g(W) = q^K * tau / E[min(c, W)]          (trained share of generation)
  F <= min(B*K / (B*K/(R_gen*g(W)) + T_sync), B*K / (T_train(E[n | c <= W]) + T_sync))
The ceiling is the largest F meeting this (bisection); no schedule under that rule exceeds it."""


ADMISSION_FORMULA = """\
Ceiling of admission mode (strategy.staleness_mode=admission) under max_staleness=s. The rule admits the
n-th group produced (cumulative, consumed + waiting + in flight) only while n <= B*(v+s+1), v the engines'
weights: the room opens a batch at a time, cohort k+s+1 (groups B*(k+s)+1 .. B*(k+s+1)) when version k
reaches the engines, at sigma_k = tau_k + T_train + T_sync (tau_k: when step k's batch is taken). A group
holds its place from admission until its batch is taken, finished or not, so the ceiling is set by how
many admitted groups are still generating when a batch is due, not by the room alone. Idealized schedule:
every group starts the moment the rule admits it and never queues for a slot; it finishes
G = prefill + max_k(n_k)*t_tok later, plus T_sync + prefill for each weight sync it spans (the engines
pause, as for X*; partial rollout re-pays the prefill); step t's batch is the B admitted groups that finish
first, taken at tau_t = max(sigma_{t-1}, the B-th finish), trained in T_train(its tokens):
  tau_t = max(sigma_{t-1}, B-th smallest finish among admitted, untaken groups),  F = B*K / E[tau_t - tau_{t-1}]
Any producer under the rule starts each group no earlier and finishes it no sooner, so none trains faster.
Computed by running that schedule on lengths drawn from the engine's law (ADMISSION_CEILING_STEPS steps,
seeded: the same number on every run); the ceiling is min(X*, F). s=0 is the sync schedule."""

ADMISSION_CEILING_STEPS = 2000
ADMISSION_CEILING_WARMUP = 100


def admission_ceiling(c: Case, max_staleness: int, seed: int = 0) -> float:
    """Samples/s (ADMISSION_FORMULA): the most any producer trains under the admission rule."""
    return min(ideal_bound(c).ideal, admission_schedule_rate(c, max_staleness, seed=seed))


def admission_schedule_rate(c: Case, max_staleness: int, steps: int = ADMISSION_CEILING_STEPS,
                            warmup: int = ADMISSION_CEILING_WARMUP, seed: int = 0) -> float:
    """Samples/s of ADMISSION_FORMULA's idealized schedule (not capped at X*)."""
    s, B, K = max_staleness, c.batch_size, c.group_size
    rng = np.random.default_rng(seed)
    mu, sigma = lognormal_params(c.mean_len, c.cv)
    cohorts = steps + s + 1
    raw = np.full((cohorts * B, K), float(c.mean_len)) if c.cv == 0 else rng.lognormal(mu, sigma, (cohorts * B, K))
    lens = np.maximum(1.0, np.rint(raw))  # the SimEngine's law: max(1, round(L)), capped
    if c.cap > 0:
        lens = np.minimum(lens, c.cap)
    group_s = c.prefill_s + lens.max(axis=1) * c.time_per_token_s
    tokens = lens.sum(axis=1)
    # Admitted, untaken groups: when each finishes and its tokens. Versions 0 admits cohorts 1..s+1 at t=0.
    finish, toks = group_s[:B * (s + 1)].copy(), tokens[:B * (s + 1)].copy()
    free_s, ends = 0.0, []
    for t in range(1, steps + 1):
        pick = np.argpartition(finish, B - 1)[:B]
        tau = max(free_s, float(finish[pick].max()))
        train_s = c.train_step_s + c.train_per_token_s * float(toks[pick].sum())
        keep = np.ones(len(finish), bool)
        keep[pick] = False
        finish, toks = finish[keep], toks[keep]
        pause_s = tau + train_s  # the weight sync: whatever is still generating waits it out
        finish[finish > pause_s] += c.weight_sync_s + c.prefill_s
        free_s = pause_s + c.weight_sync_s  # sigma_t: version t admits cohort t+s+1
        new = slice(B * (t + s), B * (t + s + 1))
        finish = np.concatenate([finish, free_s + group_s[new]])
        toks = np.concatenate([toks, tokens[new]])
        ends.append(free_s)
    return B * K * (steps - warmup) / (ends[-1] - ends[warmup - 1])


def staleness_ceiling(c: Case, max_staleness: int) -> float:
    """Samples/s (CEILING_FORMULA): the most any non-clairvoyant producer trains under the bound."""
    pmf = length_pmf(c.mean_len, c.cv, c.cap)
    n_samples = c.batch_size * c.group_size
    bound = ideal_bound(c)
    cost = [c.prefill_s + n * c.time_per_token_s for n in range(len(pmf))]

    def rate_and_busy(window_s: float) -> tuple[float, float]:
        q = sum(p for n, p in enumerate(pmf) if cost[n] <= window_s)
        if q <= 0.0:
            return 0.0, c.train_step_s + c.weight_sync_s
        fit_len = sum(n * p for n, p in enumerate(pmf) if cost[n] <= window_s) / q
        t_busy = c.train_step_s + c.train_per_token_s * n_samples * fit_len + c.weight_sync_s
        useful = q ** c.group_size * bound.tau_s / sum(p * min(cost[n], window_s) for n, p in enumerate(pmf))
        gen = n_samples / (n_samples / (bound.gen_rate * useful) + c.weight_sync_s) if useful > 0 else 0.0
        return min(gen, n_samples / t_busy), t_busy

    def reachable(rate: float) -> bool:
        t_busy = c.train_step_s + c.weight_sync_s  # the least it can be; grows with the window (fixed point)
        for _ in range(50):
            achievable, t_busy_next = rate_and_busy((max_staleness + 1) * n_samples / rate - t_busy)
            if abs(t_busy_next - t_busy) < 1e-9:
                break
            t_busy = t_busy_next
        return rate <= achievable

    lo, hi = 0.0, bound.ideal
    if reachable(hi):
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid > 0 and reachable(mid) else (lo, mid)
    return lo


@dataclass(frozen=True)
class Mode:
    name: str
    colocate: bool
    strategy: StrategyConf
    max_staleness: int
    partial: bool
    over_sample: float
    staleness_mode: str = "token"


def modes() -> list[Mode]:
    out = [Mode("sync", True, SyncStrategyConf(max_staleness=0), 0, False, 0.0)]
    for s in (0, 1, 2, 4):
        for partial in (False, True):
            name = f"async s={s}" + (" partial" if partial else "")
            out.append(Mode(name, False, async_conf(s, partial=partial), s, partial, 0.0))
    # strategy=async's defaults (partial rollout, 25% over-sampling) at max_staleness=2.
    out.append(Mode("async s=2 partial over-sample 0.25", False, async_conf(2, partial=True, over_sample=0.25), 2,
                    True, 0.25))
    out.append(Mode("over-sample 0.5 s=0", False, async_conf(0, partial=False, over_sample=0.5), 0, False, 0.5))
    out.append(Mode("colocate over-sample 0.5", True, async_conf(0, partial=False, over_sample=0.5), 0, False, 0.5))
    # Admission mode: the bound held where groups start; nothing expires (over-sampling has no room there).
    for s in (0, 1, 2, 3, 4):
        out.append(Mode(f"admission s={s} partial", False, async_conf(s, partial=True, staleness_mode="admission"),
                        s, True, 0.0, "admission"))
    out.append(Mode("admission s=2", False, async_conf(2, partial=False, staleness_mode="admission"), 2, False, 0.0,
                    "admission"))
    return out


# ----------------------------------------------------------------------------- one run
@dataclass
class StepRecord:
    step: int
    t_start: float
    t_batch: float
    t_trained: float
    t_end: float
    samples: int
    tokens: int
    staleness_mean: float
    staleness_max: float
    admission_mean: float
    admission_max: float
    token_hist: dict[int, float]  # trained tokens per staleness
    tokens_wasted: float
    busy_slot_s: float  # cumulative, all engines, at t_end
    tokens_generated: float  # cumulative, all engines, at t_end


@dataclass
class Result:
    case: str
    cv: float
    mode: str
    colocate: bool
    max_staleness: int
    partial: bool
    over_sample: float
    steps: int
    sim_s: float
    throughput: float
    ideal: float
    ratio: float
    engine_busy: float
    trainer_idle: float
    staleness_mean: float
    staleness_max: float
    admission_staleness_mean: float
    admission_staleness_max: float
    wasted_frac: float
    tokens_wasted: float
    trained_len_mean: float
    expected_len: float
    ceiling: float = float("nan")  # the ceiling of the mode's rule (async + partial rollout modes only)
    staleness_mode: str = "token"
    token_hist: dict[int, float] = field(default_factory=dict)  # trained tokens per staleness, steady state
    extra: dict[str, Any] = field(default_factory=dict)


async def _sync_weights(stack: Stack, backend: SimBackend, version: int, weight_sync_s: float) -> None:
    """As Trainer._sync_weights, plus the transfer time as a sleep on the (virtual) clock."""
    await stack.manager.pause()
    weights = await backend.get_weights()
    await asyncio.sleep(weight_sync_s)
    await stack.router.load_weights(weights, version)
    stack.manager.set_model_step(version)
    stack.manager.resume()


async def _train_steps(stack: Stack, backend: SimBackend, case: Case, colocate: bool, steps: int,
                       timeout_s: float) -> list[StepRecord]:
    loop = asyncio.get_running_loop()
    algo = AlgoConf(name="grpo")
    records: list[StepRecord] = []
    for step in range(1, steps + 1):
        t0 = loop.time()
        if colocate:
            produced = await stack.manager.produce_batch(step)
        else:
            produced = await stack.manager.get_batch(step, timeout_s=timeout_s)
        t1 = loop.time()
        batch, _ = build_train_batch(produced.groups, algo, pad_token_id=0, train_step=step,
                                     max_response_len=case.cap, temperature=1.0)
        await backend.train_step(batch)
        t2 = loop.time()
        await _sync_weights(stack, backend, step, case.weight_sync_s)
        t3 = loop.time()
        st = produced.stats
        records.append(StepRecord(
            step=step, t_start=t0, t_batch=t1, t_trained=t2, t_end=t3, samples=produced.num_samples,
            tokens=sum(len(s.response_ids) for g in produced.groups for s in g),
            staleness_mean=st["staleness/mean"], staleness_max=st["staleness/max"],
            admission_mean=st["staleness/admission_mean"], admission_max=st["staleness/admission_max"],
            token_hist={int(k.rsplit("_", 1)[1]): v for k, v in st.items() if k.startswith("staleness/tokens_at_")},
            tokens_wasted=st["rollout/tokens_wasted"],
            busy_slot_s=sum(e.busy_slot_s(t3) for e in stack.engines),
            tokens_generated=sum(e.stats()["tokens"] for e in stack.engines)))
    return records


async def _run_virtual(case: Case, mode: Mode, steps: int, seed: int) -> tuple[list[StepRecord], dict[str, Any]]:
    with VirtualClock().patch_loop():
        stack = build_stack(mode.strategy, engine_conf=case.engine_conf(), num_engines=case.num_engines,
                            batch_size=case.batch_size, group_size=case.group_size, max_tokens=case.cap, seed=seed)
        backend = SimBackend(case.backend_conf())
        timeout_s = 1e6  # simulated seconds; a stuck producer still ends the run with a TimeoutError
        producer = None if mode.colocate else asyncio.create_task(stack.manager.produce_loop())
        try:
            records = await _train_steps(stack, backend, case, mode.colocate, steps, timeout_s)
        finally:
            await stack.manager.close()
            if producer is not None:
                await asyncio.wait_for(producer, timeout=60)
        acc = stack.manager.accounting()
        if acc["unaccounted"] != 0:
            raise AssertionError(f"{mode.name}: prompts unaccounted for: {acc}")
        return records, {"accounting": acc, "max_pending": max(c.pending.max_count_seen
                                                                for c in stack.manager.contexts.values())}


def summarise(case_name: str, case: Case, mode: Mode, records: list[StepRecord], warmup: int,
              extra: dict[str, Any]) -> Result:
    if len(records) <= warmup:
        raise ValueError(f"steps={len(records)} must exceed warmup={warmup}")
    base, window = records[warmup - 1] if warmup > 0 else None, records[warmup:]
    t_from = base.t_end if base else 0.0
    span = window[-1].t_end - t_from
    samples = sum(r.samples for r in window)
    tokens = sum(r.tokens for r in window)
    busy = window[-1].busy_slot_s - (base.busy_slot_s if base else 0.0)
    generated = window[-1].tokens_generated - (base.tokens_generated if base else 0.0)
    wasted = sum(r.tokens_wasted for r in window)
    bound = ideal_bound(case)
    throughput = samples / span
    hist: dict[int, float] = {}
    for r in window:
        for k, v in r.token_hist.items():
            hist[k] = hist.get(k, 0.0) + v
    ceiling = float("nan")
    if mode.partial and not mode.colocate:
        rule = admission_ceiling if mode.staleness_mode == "admission" else staleness_ceiling
        ceiling = rule(case, mode.max_staleness)
    return Result(
        case=case_name, cv=case.cv, mode=mode.name, colocate=mode.colocate, max_staleness=mode.max_staleness,
        partial=mode.partial, over_sample=mode.over_sample, steps=len(window), sim_s=span,
        throughput=throughput, ideal=bound.ideal, ratio=throughput / bound.ideal,
        engine_busy=busy / (case.num_engines * case.slots * span),
        trainer_idle=sum(r.t_batch - r.t_start for r in window) / span,
        staleness_mean=sum(r.staleness_mean * r.tokens for r in window) / max(tokens, 1),
        staleness_max=max(r.staleness_max for r in window),
        admission_staleness_mean=sum(r.admission_mean * r.samples for r in window) / max(samples, 1),
        admission_staleness_max=max(r.admission_max for r in window),
        wasted_frac=wasted / max(generated, 1.0), tokens_wasted=wasted,
        trained_len_mean=tokens / max(samples, 1), expected_len=bound.mean_len,
        ceiling=ceiling, staleness_mode=mode.staleness_mode, token_hist=dict(sorted(hist.items())), extra=extra)


def read_results(path: Path, steps: int) -> dict[tuple[str, float, str], Result]:
    """Rows of a results CSV (seed 0) with `steps` steady-state steps, as Results keyed by (case, cv, mode).
    Columns an older CSV lacks are NaN (admission staleness) or empty (histogram)."""
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            if int(row["steps"]) != steps:
                continue
            mode = next((m for m in modes() if m.name == row["mode"]), None)
            if mode is None:
                continue
            num = lambda key: float(row[key]) if row.get(key) not in (None, "") else float("nan")  # noqa: E731
            hist = {int(k): float(v) for k, v in (kv.split(":") for kv in (row.get("token_hist") or "").split())}
            out[(row["case"], float(row["cv"]), row["mode"])] = Result(
                case=row["case"], cv=float(row["cv"]), mode=row["mode"], colocate=mode.colocate,
                max_staleness=mode.max_staleness, partial=mode.partial, over_sample=mode.over_sample,
                steps=int(row["steps"]), sim_s=num("sim_s"), throughput=num("throughput"), ideal=num("ideal"),
                ratio=num("ratio"), engine_busy=num("engine_busy"), trainer_idle=num("trainer_idle"),
                staleness_mean=num("staleness_mean"), staleness_max=num("staleness_max"),
                admission_staleness_mean=num("admission_staleness_mean"),
                admission_staleness_max=num("admission_staleness_max"), wasted_frac=num("wasted_frac"),
                tokens_wasted=float("nan"), trained_len_mean=num("trained_len_mean"),
                expected_len=num("expected_len"), ceiling=num("ceiling"), staleness_mode=mode.staleness_mode,
                token_hist=hist, extra={"reused": str(path)})
    return out


def run_one(case_name: str, case: Case, mode: Mode, steps: int, warmup: int, seed: int = 0) -> Result:
    records, extra = asyncio.run(_run_virtual(case, mode, steps, seed))
    return summarise(case_name, case, mode, records, warmup, extra)


# ----------------------------------------------------------------------------- output
COLUMNS = ["case", "cv", "mode", "staleness_mode", "max_staleness", "partial", "over_sample", "steps", "sim_s",
           "throughput", "ideal", "ratio", "speedup_vs_sync", "engine_busy", "trainer_idle", "staleness_mean",
           "staleness_max", "admission_staleness_mean", "admission_staleness_max", "wasted_frac", "trained_len_mean",
           "expected_len", "ceiling", "token_hist"]


def rows_with_speedup(results: list[Result]) -> list[dict[str, Any]]:
    sync = {(r.case, r.cv): r.throughput for r in results if r.mode == "sync"}
    rows = []
    for r in results:
        d = asdict(r)
        d.pop("extra")
        d["token_hist"] = " ".join(f"{k}:{v:g}" for k, v in r.token_hist.items())
        d["speedup_vs_sync"] = r.throughput / sync[(r.case, r.cv)] if (r.case, r.cv) in sync else float("nan")
        rows.append({k: d[k] for k in COLUMNS})
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = ("| case | cv | mode | samples/s | X* | % of X* | ceiling of its rule (% of X*) | x sync | engine busy | "
            "trainer idle | token staleness mean / max | staleness at admission mean / max | wasted tokens | "
            "trained len / E[len] |")
    lines = [head, "|" + " --- |" * 14]
    for r in rows:
        ceiling = "" if r["ceiling"] != r["ceiling"] else f"{100 * r['ceiling'] / r['ideal']:.1f}%"
        admitted = ("n/a" if r["admission_staleness_mean"] != r["admission_staleness_mean"]  # a reused older row
                    else f"{r['admission_staleness_mean']:.2f} / {r['admission_staleness_max']:g}")
        lines.append(
            f"| {r['case']} | {r['cv']:g} | {r['mode']} | {r['throughput']:.3f} | {r['ideal']:.3f} | "
            f"{100 * r['ratio']:.1f}% | {ceiling} | {r['speedup_vs_sync']:.2f} | {100 * r['engine_busy']:.1f}% | "
            f"{100 * r['trainer_idle']:.1f}% | {r['staleness_mean']:.2f} / {r['staleness_max']:g} | "
            f"{admitted} | {100 * r['wasted_frac']:.1f}% | {r['trained_len_mean']:.0f} / {r['expected_len']:.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({(r["case"], r["cv"]) for r in rows})
    fig, axes = plt.subplots(2, len(cases), figsize=(4.2 * len(cases), 6.8), squeeze=False)
    for ax, hax, (case, cv) in zip(axes[0], axes[1], cases):
        sub = [r for r in rows if r["case"] == case and r["cv"] == cv]
        for partial, style in ((False, "o--"), (True, "s-")):
            pts = sorted((r["max_staleness"], r["throughput"]) for r in sub
                         if r["mode"].startswith("async") and r["partial"] == partial and r["over_sample"] == 0)
            if pts:
                ax.plot(*zip(*pts), style, label="async" + (" + partial" if partial else ""))
        pts = sorted((r["max_staleness"], r["throughput"]) for r in sub
                     if r["staleness_mode"] == "admission" and r["partial"])
        if pts:
            ax.plot(*zip(*pts), "D-", color="tab:orange", label="admission + partial")
        # Per-token staleness of what was trained, at max_staleness=2 with partial rollout, under each rule.
        for name, color in (("async s=2 partial", "tab:blue"), ("admission s=2 partial", "tab:orange")):
            row = next((r for r in sub if r["mode"] == name and r["token_hist"]), None)
            if row is None:
                continue
            hist = dict((int(k), float(v)) for k, v in (kv.split(":") for kv in row["token_hist"].split()))
            total = sum(hist.values())
            offset = -0.2 if color == "tab:blue" else 0.2
            hax.bar([k + offset for k in hist], [v / total for v in hist.values()], width=0.4, color=color,
                    label=f"{name} (mean {row['staleness_mean']:.2f})")
        hax.set_xlabel("per-token staleness of trained tokens")
        hax.set_ylabel("share of trained tokens")
        hax.legend(fontsize=7)
        for r in sub:
            if r["staleness_mode"] == "admission":
                continue
            if r["mode"].startswith("async") and r["over_sample"] > 0:
                ax.plot([r["max_staleness"]], [r["throughput"]], "*", ms=9, color="tab:purple",
                        label=f"async + partial + over-sample {r['over_sample']:g}")
            elif not r["mode"].startswith("async"):
                ax.axhline(r["throughput"], lw=1, ls=":", color={"sync": "k"}.get(r["mode"], "tab:green"))
                ax.annotate(r["mode"], (0, r["throughput"]), fontsize=7, va="bottom")
        ax.axhline(sub[0]["ideal"], color="tab:red", lw=1.5, label="ideal X*")
        ax.set_title(f"{case}, cv={cv:g}", fontsize=9)
        ax.set_xlabel("max_staleness")
        ax.set_ylabel("trained samples / simulated s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- cases
# Both cases are balanced: generating a batch at full occupancy and training it take the same
# time. They differ in how long a step is against the length tail, which decides whether the
# staleness rule can be met at all (`staleness_ceiling`).
# Whole batch in the slots (2 x 128 = B*K = 256, as vLLM/SGLang do with a large KV cache):
# sync waits for the slowest of 256 samples; B*K/R_gen = 5.32 s = T_train, so a step lasts
# about one mean sample and at s=2 the tail outlives the window (ceiling 83% of X* at CV 1.0).
WHOLE_BATCH = Case(slots=128, train_step_s=1.0, train_per_token_s=1.32e-4)
# Slot-limited (the case the targets are judged on): 2 x 32 slots, each serving 4 samples per
# step; training 2 s + 5.9e-4 s/token (21.3 s per batch for both). Steps are 4x longer than a
# typical sample, so the window holds the tail (ceiling 99.6% of X* at s=2, CV 1.0).
SLOT_LIMITED = Case(slots=32, train_step_s=2.0, train_per_token_s=5.9e-4)
CASES = {"whole-batch": WHOLE_BATCH, "slot-limited": SLOT_LIMITED}
# --quick (the tests): small and short, but still balanced (gen 2.76 s per batch, train 2.75 s).
QUICK = replace(SLOT_LIMITED, num_engines=2, slots=8, batch_size=4, group_size=8, mean_len=32, cap=512,
                time_per_token_s=0.04, prefill_s=0.1, train_step_s=0.5, train_per_token_s=2.2e-3, weight_sync_s=0.2)
QUICK_STEPS, QUICK_WARMUP = 16, 4
# The slot-limited case runs at cv=1.0 only (the whole-batch case at every cv).
OTHER_CASE_CVS = [1.0]


def describe(name: str, c: Case) -> str:
    b = ideal_bound(c)
    return (f"{name}: engines={c.num_engines} slots={c.slots} t_tok={c.time_per_token_s}s prefill={c.prefill_s}s "
            f"len~lognormal(mean={c.mean_len:g}, cv={c.cv:g}) cap={c.cap} | train={c.train_step_s}s + "
            f"{c.train_per_token_s}s/token, weight sync={c.weight_sync_s}s | B={c.batch_size} K={c.group_size}\n"
            f"  E[len]={b.mean_len:.1f} tau={b.tau_s:.2f}s R_gen={b.gen_rate:.3f}/s "
            f"(with sync {b.gen_rate_synced:.3f}/s) T_train={b.train_s:.2f}s train-bound={b.train_rate:.3f}/s "
            f"-> X*={b.ideal:.3f} samples/s\n"
            f"  staleness ceiling (async + partial): "
            + ", ".join(f"s={s} {100 * staleness_ceiling(c, s) / b.ideal:.1f}%" for s in (1, 2, 4)) + " of X*\n"
            "  admission ceiling (admission + partial): "
            + ", ".join(f"s={s} {100 * admission_ceiling(c, s) / b.ideal:.1f}%" for s in (0, 1, 2, 3, 4)) + " of X*")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few steps of a small case, cv=1.0 only (for tests)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--cvs", type=float, nargs="+", default=[0.5, 1.0, 1.5])
    ap.add_argument("--modes", nargs="*", default=None, choices=[m.name for m in modes()],
                    help="subset of mode names (default: all)")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    ap.add_argument("--reuse", type=Path, default=None,
                    help="a results CSV: rows of the same case, cv and mode measured with the same --steps, "
                         "--warmup and --seed are taken from it instead of re-run (the clock is virtual, so a "
                         "re-run of unchanged code gives the same numbers); the rest are run")
    args = ap.parse_args(argv)
    if not 0 <= args.warmup < args.steps:  # checked before anything runs, not after the last case
        ap.error(f"--steps={args.steps} must exceed --warmup={args.warmup} (>= 0): the steady state is steps after warm-up")
    if any(cv < 0 for cv in args.cvs):
        ap.error(f"--cvs={args.cvs}: a coefficient of variation is >= 0")
    if args.reuse is not None and not args.reuse.is_file():
        ap.error(f"--reuse={args.reuse}: no such file")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    steps, warmup = args.steps, args.warmup
    plan = [(name, cv, [m for m in modes() if args.modes is None or m.name in args.modes])
            for name in args.cases for cv in (args.cvs if name == "whole-batch" else OTHER_CASE_CVS)]
    cases = dict(CASES)
    if args.quick:
        cases = {"quick": QUICK}
        steps, warmup = QUICK_STEPS, QUICK_WARMUP
        plan = [("quick", 1.0, [m for m in modes() if args.modes is None or m.name in args.modes])]
    args.out.mkdir(parents=True, exist_ok=True)
    prefix = "producer_efficiency_quick" if args.quick else "producer_efficiency"

    header = [f"# Producer efficiency ({'quick' if args.quick else 'full'} run)", "", "```", FORMULA, "```", "",
              "```", CEILING_FORMULA, "```", "", "```", ADMISSION_FORMULA, "```", ""]
    results: list[Result] = []
    reused = read_results(args.reuse, steps - warmup) if args.reuse is not None and args.seed == 0 else {}
    wall0 = time.perf_counter()
    for name, cv, chosen in plan:
        case = replace(cases[name], cv=cv)
        header += ["```", describe(f"{name} cv={cv:g}", case), "```"]
        for mode in chosen:
            t = time.perf_counter()
            if (name, cv, mode.name) in reused:
                results.append(reused[(name, cv, mode.name)])
                continue
            r = run_one(name, case, mode, steps, warmup, seed=args.seed)
            results.append(r)
            print(f"{name} cv={cv:g} {mode.name:26s} {r.throughput:8.3f}/s  {100 * r.ratio:5.1f}% of X*  "
                  f"busy {100 * r.engine_busy:5.1f}%  idle {100 * r.trainer_idle:5.1f}%  "
                  f"stale {r.staleness_mean:.2f}/{r.staleness_max:g}  wasted {100 * r.wasted_frac:4.1f}%  "
                  f"({time.perf_counter() - t:.1f}s wall)", flush=True)
    rows = rows_with_speedup(results)
    table = markdown_table(rows)
    text = "\n".join(header) + "\n\n" + table + f"\n\nsteps={steps} (warm-up {warmup} excluded), seed={args.seed}, " \
        f"wall time {time.perf_counter() - wall0:.0f}s\n"
    (args.out / f"{prefix}.md").write_text(text)
    write_csv(rows, args.out / f"{prefix}.csv")
    plot(rows, args.out / f"{prefix}.png")
    print("\n" + text)
    return rows


if __name__ == "__main__":
    main()
