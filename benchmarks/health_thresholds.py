"""Where healthy and unhealthy runs sit on each health monitor's statistic, and what fires on them.

    python benchmarks/health_thresholds.py outputs/health/default outputs/health/chat_tools ...
    python benchmarks/health_thresholds.py benchmarks/results/health/*.jsonl          # the recorded runs
    python benchmarks/health_thresholds.py RUN ... --set health.entropy_collapse.min_ratio=0.3
    python benchmarks/health_thresholds.py RUN --record benchmarks/results/health/NAME.jsonl

Each run (a run directory's `metrics.jsonl`, or a run recorded with `--record`) is replayed through
the monitors (rlharness/health/) with the
thresholds of `health.*` (defaults, or `--set key=value`), as the run's own config had them wired
(eval independent of the trained reward where a learned reward trains, its eval prompts and total
steps from `.hydra/config.yaml`). Prints one Markdown table of each statistic's extreme over the run
(the side that alarms) and the alarms with their steps, then what `trainer.probe_longest` cost at the start
of each run that probed (`perf/probe_s`, against the median step's `perf/step_s`);
docs/operations/health.md holds the measured figures.
`--record FILE` keeps a run for replays (tests/health/test_recorded_runs.py): its first line is the
wiring, then each row with only the keys the monitors read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omegaconf import OmegaConf  # noqa: E402

from rlharness.config.schema import HealthConf  # noqa: E402
from rlharness.health import HealthMonitors  # noqa: E402
from rlharness.judger.router import LEARNED  # noqa: E402
from rlharness.logging_utils.metrics import read_metrics  # noqa: E402
from rlharness.core.run_dir import RunDir  # noqa: E402

# (statistic, extreme that alarms, format)
STATISTICS = [
    ("health/eval_drop_z", max, ".1f"), ("health/reward_rise_t", max, ".1f"),
    ("health/part_rise_t", max, ".1f"), ("health/part_fall_t", min, ".1f"),
    ("health/entropy_ratio", min, ".3f"), ("health/kl_accel", max, ".2f"),
    ("health/degenerate_frac", max, ".3f"), ("health/degenerate_rise", max, ".3f"),
    ("health/truncated_rise", max, ".3f"), ("health/zero_signal_steps", max, ".0f"),
    ("health/reward_frozen_ratio", min, ".3f"), ("health/rss_mb_per_step", max, ".2f"),
]


def wiring(run_dir: Path) -> dict:
    """What the monitors are built with, from the run's composed config."""
    cfg = OmegaConf.load(RunDir(run_dir).config)
    judgers = [cfg.judger] + [t.judger for t in (cfg.get("tasks") or {}).values() if t.get("judger")]
    learned = any(j.name in LEARNED or (j.name == "router" and set(j.get("weights", {})) & set(LEARNED))
                  for j in judgers)
    return {"eval_independent": learned, "eval_prompts": int(cfg.eval.num_prompts),
            "total_steps": int(cfg.total_steps)}


# The keys the monitors read (rlharness/health/), the step, and the probe's cost against a step's.
READ = re.compile(r"^(step|perf/(probe_s|step_s)|probe/(peak_mb|rows|tokens)|eval/accuracy|train/(entropy|kl)|"
                  r"rollout/(reward_mean|reward_std|num_samples|"
                  r"groups_zero_signal_frac|truncated_frac|reward_[^/]+_mean)|health/(rss_mb|available_mb|"
                  r"[a-z_]+_frac))$")


def record(run_dir: Path, path: Path) -> None:
    rows = read_metrics(RunDir(run_dir).metrics)
    lines = [json.dumps({"wiring": wiring(run_dir), "run": str(run_dir)})]
    lines += [json.dumps({k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in r.items() if READ.match(k)})
              for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def health_conf(settings: list[str]) -> HealthConf:
    base = OmegaConf.structured(HealthConf)
    for item in settings:
        key, value = item.split("=", 1)
        OmegaConf.update(base, key.removeprefix("health."), OmegaConf.create({"v": value}).v
                         if value in ("null", "warn", "stop") else float(value) if "." in value or "e" in value
                         else int(value))
    return OmegaConf.to_object(base)


def load(run: Path) -> tuple[dict, list[dict]]:
    """(wiring, rows) of a run directory or of a file `--record` wrote."""
    if run.is_dir():
        return wiring(run), read_metrics(RunDir(run).metrics)
    lines = run.read_text().splitlines()
    return json.loads(lines[0])["wiring"], [json.loads(line) for line in lines[1:]]


def replay(run: Path, conf: HealthConf) -> tuple[list[dict], list]:
    """Every row with the monitors' numbers, and the alarms, as the run would have had them with `conf`."""
    run_wiring, rows = load(run)
    monitors = HealthMonitors(conf, **run_wiring)
    out, alarms = [], []
    for row in rows:
        metrics, fired = monitors.observe(row)
        out.append({**row, **metrics})
        alarms += fired
    return out, alarms


def probe_cost(rows: list[dict]) -> str | None:
    """What `trainer.probe_longest` cost at the run's start, against a step, or None if it did not probe."""
    probe = next((r for r in rows if "perf/probe_s" in r), None)
    if probe is None:
        return None
    steps = sorted(r["perf/step_s"] for r in rows if "perf/step_s" in r)
    step = f"; the median step took {steps[len(steps) // 2]:.1f} s" if steps else ""
    return (f"trainer.probe_longest took {probe['perf/probe_s']:.1f} s ({probe['probe/rows']:.0f} rows x "
            f"{probe['probe/tokens']:.0f} tokens, peak {probe['probe/peak_mb']:.0f} MB){step}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--set", action="append", default=[], help="health.<key>=<value>")
    ap.add_argument("--record", type=Path, help="keep the (one) run's rows the monitors read in this file")
    args = ap.parse_args()
    if args.record:
        record(args.runs[0], args.record)
    conf = health_conf(args.set)
    print("| run | steps | " + " | ".join(f"{k.split('/', 1)[1]} ({f.__name__})" for k, f, _ in STATISTICS) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in STATISTICS) + " |")
    fired, probes = [], []
    for run in args.runs:
        rows, alarms = replay(run, conf)
        probes += [f"- {run}: {cost}" for cost in [probe_cost(rows)] if cost]
        cells = []
        for key, extreme, fmt in STATISTICS:
            values = [r[key] for r in rows if r.get(key) is not None]
            cells.append(format(extreme(values), fmt) if values else "-")
        print(f"| {run} | {max(r['step'] for r in rows)} | " + " | ".join(cells) + " |")
        fired += [(run, a) for a in alarms]
    print()
    for run, alarm in fired:
        print(f"- {run}: {alarm.line(conf.action(alarm.monitor))}")
    if not fired:
        print("no alarm fired")
    if probes:
        print("\n" + "\n".join(probes))


if __name__ == "__main__":
    main()
