"""What a health monitor says when it fires, and the stop it may ask for."""

from __future__ import annotations

from dataclasses import dataclass

# train.py's exit status when a monitor with on_alarm=stop stopped the run (2 is refused input, 1 a failure).
EXIT_HEALTH_STOP = 3


@dataclass(frozen=True)
class Alarm:
    """One firing: the monitor, the step, what went wrong (`signal`), the numbers (`evidence`) and what
    users usually do about it (`advice`)."""

    monitor: str
    step: int
    signal: str
    evidence: str
    advice: str

    def stop_line(self) -> str:
        """The one line a stop ends the run with (the alarm's own line, with its evidence, is logged above it)."""
        return (f"step {self.step}: stopped by health.{self.monitor}.on_alarm=stop: {self.signal} (the alarm line "
                f"in train.log has the evidence); no checkpoint of step {self.step} was written, the last one is kept")

    def line(self, action: str) -> str:
        then = ("the run stops, keeping its last checkpoint" if action == "stop" else "the run goes on")
        return (f"step {self.step}: health alarm {self.monitor}: {self.signal}: {self.evidence}; usually: "
                f"{self.advice} (health.{self.monitor}.on_alarm={action}: {then})")


class HealthStop(RuntimeError):
    """A monitor with on_alarm=stop fired; the message is `Alarm.stop_line`. The run ends without writing a
    checkpoint of the alarming step: the last checkpoint is the one to resume or to go back to."""


class Latch:
    """True on the step a condition becomes true; again only after it was false in between (one line
    per episode, not one per step while it lasts)."""

    def __init__(self) -> None:
        self.on = False

    def __call__(self, condition: bool) -> bool:
        fired = condition and not self.on
        self.on = condition
        return fired
