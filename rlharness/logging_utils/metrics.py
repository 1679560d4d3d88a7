"""`metrics.jsonl`: one JSON object per training step (and per eval), plus the console line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, run_dir: str | Path, resume_step: int = 0):
        self.path = Path(run_dir) / "metrics.jsonl"
        # After a resume, rows written past the checkpoint step were not kept by the
        # checkpoint; drop them so every step appears exactly once.
        if self.path.exists():
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            replace_text(self.path, "".join(json_line(r) + "\n" for r in kept))
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


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write
    return rows


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
