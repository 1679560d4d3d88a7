"""Summary of a sweep (Hydra multirun) directory: one row per job.

Writes, into the sweep directory:
- `summary.csv`: job number, launcher job id (the Slurm id under cluster=slurm), the
  job's overrides, status, steps done, and the last train/loss, rollout/reward_mean
  and eval/accuracy from its `metrics.jsonl`;
- `summary.md`: the same as a markdown table;
- `summary.png`: every job's reward and eval-accuracy curves over steps.

A job is `ok` when its metrics reach its `total_steps`, `failed` otherwise (it crashed,
was cancelled, or never started). Runs at the end of every multirun as a Hydra callback
(`hydra.callbacks.sweep_summary` in conf/config.yaml; train.py, when a failed job's error ends the
multirun before it), or by hand:

    python -m rlharness.sweep multirun/2026-11-22/10-31-07
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rlharness.core.run_dir import HYDRA, HYDRA_YAML, OVERRIDES_YAML, RunDir

log = logging.getLogger(__name__)

FINAL_METRICS = ("train/loss", "rollout/reward_mean", "eval/accuracy")
CURVES = ("rollout/reward_mean", "eval/accuracy")
HIDDEN_OVERRIDE_PREFIXES = ("hydra.",)


@dataclass
class JobSummary:
    job: int
    job_id: str
    overrides: str
    status: str
    steps_done: int
    total_steps: Optional[int]
    final: dict[str, Optional[float]] = field(default_factory=dict)
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    label: str = ""  # the overrides that differ between the sweep's jobs

    def row(self) -> dict[str, Any]:
        row = {k: v for k, v in asdict(self).items() if k not in ("final", "curves", "label")}
        row.update({k: self.final.get(k) for k in FINAL_METRICS})
        return row


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; a line that does not parse (a job killed mid-write) is
    skipped with a warning naming the file and line."""
    rows = []
    if not path.is_file():
        return rows
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            log.warning("%s:%d: skipped, not JSON (%s)", path, number, exc)
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        else:
            log.warning("%s:%d: skipped, no integer 'step'", path, number)
    return rows


def _finite(value: Any) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def summarize_job(job_dir: Path) -> JobSummary:
    run = RunDir(job_dir)
    overrides = yaml.safe_load(run.overrides.read_text()) or []
    shown = [o for o in overrides if not o.lstrip("+~").startswith(HIDDEN_OVERRIDE_PREFIXES)]
    config = _load_yaml(run.config)
    hydra_conf = _load_yaml(run.hydra / HYDRA_YAML).get("hydra", {})
    job = hydra_conf.get("job", {})
    total_steps = config.get("total_steps")
    rows = read_metrics(run.metrics)
    final: dict[str, Optional[float]] = {}
    curves: dict[str, list[tuple[int, float]]] = {k: [] for k in CURVES}
    for row in sorted(rows, key=lambda r: r["step"]):
        for key in FINAL_METRICS:
            if _finite(row.get(key)) is not None:
                final[key] = _finite(row[key])
        for key in CURVES:
            if _finite(row.get(key)) is not None:
                curves[key].append((row["step"], _finite(row[key])))
    steps_done = max((r["step"] for r in rows), default=0)
    ok = isinstance(total_steps, int) and steps_done >= total_steps
    return JobSummary(
        job=int(job.get("num", job_dir.name if job_dir.name.isdigit() else -1)),
        job_id=str(job.get("id", "")), overrides=" ".join(shown),
        status="ok" if ok else "failed", steps_done=steps_done,
        total_steps=total_steps if isinstance(total_steps, int) else None,
        final=final, curves=curves)


def _load_yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    loaded = yaml.safe_load(path.read_text())
    return loaded if isinstance(loaded, dict) else {}


def find_job_dirs(sweep_dir: Path) -> list[Path]:
    """Directories under the sweep holding a Hydra job (`.hydra/overrides.yaml`)."""
    found = [p.parent.parent for p in sweep_dir.rglob(f"{HYDRA}/{OVERRIDES_YAML}")]
    return sorted((d for d in found if d != sweep_dir), key=lambda d: (len(d.parts), _num(d.name), str(d)))


def _num(name: str) -> int:
    return int(name) if name.isdigit() else 1 << 30


def summarize_sweep(sweep_dir: Path) -> list[JobSummary]:
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep directory {sweep_dir} does not exist")
    job_dirs = find_job_dirs(sweep_dir)
    if not job_dirs:
        raise FileNotFoundError(f"{sweep_dir} holds no Hydra job directories (*/.hydra/overrides.yaml)")
    jobs = sorted((summarize_job(d) for d in job_dirs), key=lambda j: j.job)
    # Label each job by what differs between jobs; shared overrides would only add noise.
    common = set.intersection(*(set(j.overrides.split()) for j in jobs)) if len(jobs) > 1 else set()
    for job in jobs:
        job.label = " ".join(o for o in job.overrides.split() if o not in common) or job.overrides
    return jobs


# ----------------------------------------------------------------------------- writers
def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_csv(jobs: list[JobSummary], path: Path) -> None:
    rows = [j.row() for j in jobs]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)


def markdown_table(jobs: list[JobSummary]) -> str:
    rows = [{**j.row(), "overrides": j.label} for j in jobs]
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(r[k]).replace("|", "\\|") for k in header) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_plot(jobs: list[JobSummary], path: Path) -> None:
    # The object API with an Agg canvas: no global backend switch, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6 * len(CURVES), 4.5))
    FigureCanvasAgg(fig)
    for ax, key in zip(fig.subplots(1, len(CURVES)), CURVES):
        for job in jobs:
            points = job.curves.get(key, [])
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="." if len(points) < 30 else None,
                        label=f"#{job.job} {job.label}"[:60])
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_summary(sweep_dir: Path) -> list[JobSummary]:
    """Write summary.csv, summary.md and summary.png into `sweep_dir`; return the rows."""
    sweep_dir = Path(sweep_dir)
    jobs = summarize_sweep(sweep_dir)
    write_csv(jobs, sweep_dir / "summary.csv")
    table = markdown_table(jobs)
    common = sorted(set(jobs[0].overrides.split()) - set(jobs[0].label.split()))
    shared = f"Overrides shared by every job: `{' '.join(common)}`\n\n" if common else ""
    (sweep_dir / "summary.md").write_text(f"# Sweep {sweep_dir}\n\n{shared}{table}")
    write_plot(jobs, sweep_dir / "summary.png")
    return jobs


class SweepSummaryCallback(Callback):
    """Hydra callback: summarise the sweep directory when a multirun ends. Hydra raises a failed job's error
    before `on_multirun_end`; `sweep_dir` keeps the running sweep's directory so that train.py summarises it
    then (`summarize_failed_sweep`)."""

    sweep_dir: Optional[Path] = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        SweepSummaryCallback.sweep_dir = Path(str(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        summarize(Path(str(config.hydra.sweep.dir)))
        SweepSummaryCallback.sweep_dir = None


def summarize(sweep_dir: Path) -> list[JobSummary]:
    """Write the summary files and log the table and each job's status ([] when no job left a directory)."""
    try:
        jobs = write_summary(sweep_dir)
    except FileNotFoundError as exc:
        log.warning("no sweep summary: %s", exc)
        return []
    log.info("sweep summary (%s/summary.{csv,md,png}):\n%s", sweep_dir, markdown_table(jobs))
    for job in jobs:
        log.info("job #%d: id %s, %s, %d step(s)", job.job, job.job_id, job.status, job.steps_done)
    return jobs


def summarize_failed_sweep(stopped_by: Optional[str] = None) -> Optional[str]:
    """After a multirun ended early, by a failed job's error or by a signal (`stopped_by`, its name): the
    summary it did not reach, and one line saying what ended it (None outside a multirun)."""
    sweep_dir = SweepSummaryCallback.sweep_dir
    if sweep_dir is None:
        return None
    SweepSummaryCallback.sweep_dir = None
    jobs = summarize(sweep_dir)
    if stopped_by is not None:
        return (f"the sweep was stopped by {stopped_by} after {len(jobs)} job(s) had started; summary: "
                f"{sweep_dir}/summary.md; to continue it (each started job from its checkpoint, then the jobs "
                f"not started), run its command again with hydra.sweep.dir={sweep_dir}")
    failed = [f"#{j.job} ({j.label})" for j in jobs if j.status != "ok"]
    return (f"{len(failed)} of {len(jobs)} sweep job(s) did not finish: {', '.join(failed)}; each one's "
            f"train.log says why; summary: {sweep_dir}/summary.md")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlharness.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path, help="a Hydra multirun directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        jobs = write_summary(args.sweep_dir)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    log.info("%s", markdown_table(jobs))
    log.info("wrote %s/summary.csv, summary.md, summary.png", args.sweep_dir)
    return 0 if all(j.status == "ok" for j in jobs) else 1

