"""Training-health monitors (docs/operations/health.md): every step, on what the run already has, each monitor
logs its numbers under `health/` and, when it fires, one warning line naming the step, the signal,
the evidence and what users usually do about it. `health.on_alarm` (or `health.<monitor>.on_alarm`)
says whether the run then goes on (warn) or stops keeping its last checkpoint (stop: `HealthStop`,
exit status 3).

Monitors read only the step's row (its metrics), so a run's `metrics.jsonl` can be replayed through
them (a resume does, to continue their windows; so can a test or `replay` on a recorded run). What the
row does not hold yet is added first as facts: the responses' shapes (`outputs.output_stats`) and the
host's memory (`memory.host_memory_mb`).
"""

from __future__ import annotations

import logging
from typing import Iterable

from rlharness.config.schema import HealthConf
from rlharness.health.alarm import EXIT_HEALTH_STOP, Alarm, HealthStop  # noqa: F401 - the package's API
from rlharness.health.learning_signal import RewardFrozen, ZeroSignal
from rlharness.health.memory import HostMemory, host_memory_mb
from rlharness.health.outputs import DegenerateOutputs, output_stats
from rlharness.health.policy import EntropyCollapse, KLAcceleration
from rlharness.health.reward_hacking import RewardHacking

log = logging.getLogger(__name__)


def build_monitors(conf: HealthConf, *, eval_independent: bool, eval_prompts: int, total_steps: int) -> list:
    """The monitors `conf.monitors` names, in that order."""
    make = {
        "reward_hacking": lambda: RewardHacking(conf.reward_hacking, eval_independent, eval_prompts),
        "entropy_collapse": lambda: EntropyCollapse(conf.entropy_collapse),
        "kl_acceleration": lambda: KLAcceleration(conf.kl_acceleration),
        "degenerate_outputs": lambda: DegenerateOutputs(conf.degenerate_outputs),
        "zero_signal": lambda: ZeroSignal(conf.zero_signal),
        "reward_frozen": lambda: RewardFrozen(conf.reward_frozen),
        "host_memory": lambda: HostMemory(conf.host_memory, total_steps),
    }
    return [make[name]() for name in conf.monitors]


class HealthMonitors:
    """The run's monitors. `check(row, groups)` each step (metrics for the row; alarms logged);
    `stop_if_asked()` after the row is written raises `HealthStop` for an alarm whose action is stop."""

    def __init__(self, conf: HealthConf, *, eval_independent: bool, eval_prompts: int, total_steps: int) -> None:
        self.conf = conf
        self.monitors = build_monitors(conf, eval_independent=eval_independent, eval_prompts=eval_prompts,
                                       total_steps=total_steps)
        self.alarms: list[Alarm] = []  # every alarm of this life, in order
        self._stop: Alarm | None = None
        self.stopped = False

    def facts(self, groups=None) -> dict[str, float]:
        """What the monitors need that the row does not hold: the responses' shapes and host memory."""
        if not self.monitors:
            return {}
        out = host_memory_mb() if "host_memory" in self.conf.monitors else {}
        if groups and "degenerate_outputs" in self.conf.monitors:
            c = self.conf.degenerate_outputs
            out.update(output_stats(groups, c.ngram, c.repeat_share))
        return out

    def check(self, row: dict, groups=None) -> dict[str, float]:
        """The step's `health/...` metrics (facts and monitors' numbers); each new alarm is logged."""
        facts = self.facts(groups)
        metrics, alarms = self.observe({**row, **facts})
        for alarm in alarms:
            action = self.conf.action(alarm.monitor)
            log.warning(alarm.line(action))
            self.alarms.append(alarm)
            if action == "stop" and self._stop is None:
                self._stop = alarm
        return {**facts, **metrics, "health/alarms": float(len(alarms))}

    def observe(self, row: dict) -> tuple[dict[str, float], list[Alarm]]:
        """Every monitor's numbers and new alarms for one row (nothing logged)."""
        metrics: dict[str, float] = {}
        alarms: list[Alarm] = []
        for monitor in self.monitors:
            m, a = monitor.observe(row)
            metrics.update(m)
            alarms += a
        return metrics, alarms

    def replay(self, rows: Iterable[dict]) -> list[Alarm]:
        """Feed recorded rows (a resumed run's metrics.jsonl up to its checkpoint) without logging; returns
        the alarms they raise (said in the life that wrote them)."""
        return [a for row in rows for a in self.observe(row)[1]]

    def stop_if_asked(self) -> None:
        if self._stop is not None:
            self.stopped = True
            raise HealthStop(self._stop.stop_line())
