"""Least-squares trends of a metric over steps: the slope and how sure it is (pure functions)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def slope_t(values: Sequence[float], steps: Sequence[float] | None = None) -> tuple[float, float]:
    """(slope per step, t statistic = slope / its standard error) of `values` against `steps` (0, 1, ...
    when not given). Fewer than 3 points: (0, 0). Points on an exact line: t is +-inf (0 for a flat one)."""
    y = np.asarray(values, dtype=float)
    if y.size < 3:
        return 0.0, 0.0
    x = np.arange(y.size, dtype=float) if steps is None else np.asarray(steps, dtype=float)
    xc = x - x.mean()
    sxx = float((xc * xc).sum())
    if sxx == 0:
        return 0.0, 0.0
    slope = float((xc * (y - y.mean())).sum() / sxx)
    resid = y - y.mean() - slope * xc
    se = math.sqrt(float((resid * resid).sum()) / (y.size - 2) / sxx)
    if se == 0 or se < 1e-12 * abs(slope):
        return slope, (math.copysign(math.inf, slope) if slope else 0.0)
    return slope, slope / se


def mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def finite_or(value: float, cap: float = 1e6) -> float:
    """A statistic for metrics.jsonl: +-inf becomes +-cap (JSON has no infinity), NaN stays NaN (null)."""
    return max(-cap, min(cap, value)) if not math.isnan(value) else value
