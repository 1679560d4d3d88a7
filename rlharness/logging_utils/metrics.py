"""`metrics.jsonl`: one JSON object per training step (and per eval), plus the console line."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Iterator

from rlharness.core.run_dir import RunDir

log = logging.getLogger(__name__)


class MetricsWriter:
    def __init__(self, run_dir: str | Path, resume_step: int = 0):
        self.path = RunDir(run_dir).metrics
        # After a resume, rows written past the checkpoint step were not kept by the
        # checkpoint; drop them so every step appears exactly once. A line that does not
        # read is said (file:line) and left out; the rest is kept.
        if self.path.exists():
            kept = [raw for row, raw in jsonl_rows(self.path, warn=True) if row["step"] <= resume_step]
            replace_text(self.path, "".join(raw + "\n" for raw in kept))
        elif resume_step > 0:
            log.warning("%s is missing (deleted?): the rows of steps 0-%d are lost; the resumed run writes "
                        "its steps from %d on", self.path, resume_step, resume_step + 1)
        self._fh = open(self.path, "a", buffering=1)

    def write(self, row: dict[str, Any]) -> None:
        self._fh.write(json_line(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def replace_text(path: Path, text: str) -> None:
    """Rewrite a file so a kill at any moment leaves the old or the new text, never a cut one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def jsonl_rows(path: str | Path, step_key: str = "step", warn: bool = False) -> Iterator[tuple[dict[str, Any], str]]:
    """(row, line as written) for every line of a run's JSON-lines file that is a JSON object with
    an integer `step_key`. Any other line (cut by a kill mid-write, or changed by hand) is skipped,
    with a warning naming file and line when `warn`."""
    p = Path(path)
    if not p.exists():
        return
    lines = p.read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
            problem = None if isinstance(row, dict) and type(row.get(step_key)) is int else f"no integer {step_key!r}"
        except json.JSONDecodeError as exc:
            problem = f"not JSON ({exc})"
        if problem is None:
            yield row, line
        elif warn:
            cut = " (cut by a kill mid-write?)" if number == len(lines) else ""
            log.warning("%s:%d: %s%s: left out, the other lines are kept", p, number, problem, cut)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [row for row, _ in jsonl_rows(path)]


def json_line(obj: Any) -> str:
    """`obj` as one line of strict JSON, for every run file (metrics.jsonl, rollouts/*.jsonl).

    Python writes NaN and Infinity as bare words that JSON readers refuse: a non-finite
    number is written as null here (the one place this is decided), at any depth."""
    return json.dumps(_jsonable(obj), allow_nan=False)


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item"):  # NumPy / torch scalars
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def format_step_line(row: dict[str, Any], total_steps: int) -> str:
    """One readable line per step for train.log and the console."""

    def f(key: str, fmt: str) -> str | None:
        v = row.get(key)
        return None if v is None else format(v, fmt)

    parts = [f"step {row['step']:>{len(str(total_steps))}}/{total_steps}"]
    for label, key, fmt in (
        ("reward", "rollout/reward_mean", ".3f"),
        ("eval", "eval/accuracy", ".3f"),
        ("loss", "train/loss", "+.4f"),
        ("kl", "train/kl", ".4f"),
        ("rkl", "distill/reverse_kl", ".4f"),  # with a teacher: the reverse KL to it
        ("ent", "train/entropy", ".3f"),
        ("gnorm", "train/grad_norm", ".3f"),
        ("len", "rollout/response_len_mean", ".1f"),
        ("stale", "staleness/mean", ".2f"),
        ("filt", "rollout/groups_filtered", ".0f"),
        ("tok/s", "perf/tokens_per_s", ".0f"),
        ("step_s", "perf/step_s", ".2f"),
    ):
        s = f(key, fmt)
        if s is not None:
            parts.append(f"{label} {s}")
        if key == "eval/accuracy":  # a multi-task run: each task's accuracy after the weighted mean
            per_task = [(k.split("/")[1], v) for k, v in row.items()
                        if k.startswith("eval/") and k.endswith("/accuracy") and k.count("/") == 2]
            if per_task:
                parts.append(" ".join(f"{t} {v:.3f}" for t, v in per_task))
    return " | ".join(parts)
