"""Slurm job states that survive a requeue, for hydra-submitit-launcher's sweeps.

A preempted (or timed-out) job stops cleanly, writes its checkpoint, and submitit's
handler runs `scontrol requeue` and exits; Slurm then shows the job PENDING again. In
between, a state poll (`sacct`, or scripts/sacct_shim on a Slurm without accounting) can
read the attempt that just ended as FAILED. submitit caches any state outside its
"incomplete" list as final, finds no result file and raises `UncompletedJobError`: the
sweep fails although its job is queued again and will resume from its checkpoint. Seen
in CI on a loaded machine; a real cluster under load is as slow.

`RequeueAwareWatcher` takes a failure state (anything but COMPLETED or CANCELLED) as final
only once it has read it again for `cluster.requeue_grace_s` seconds, counted between
state reads that answered (a poll that failed or timed out, as a busy controller's do, reads
nothing and keeps the last state; the grace does not run out on a stale reading): a job being
requeued reads PENDING (or REQUEUED, RUNNING) within that time and is waited for as
before. `cluster=slurm` installs it for the sweep's process through the Hydra callback
`RequeueAwareWatching` (Hydra accepts launchers only from its plugin package; submitit polls
every Slurm job through one class attribute, `SlurmJob.watcher`). A job that failed with a Python exception is unaffected (its result file ends the
wait at once); one killed without a result is reported that much later.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from submitit.slurm import slurm as submitit_slurm

log = logging.getLogger(__name__)

# States that end a job for good whatever happens next.
FINAL_STATES = ("COMPLETED", "CANCELLED")
# How often a suspect failure state is read again (seconds).
RECHECK_S = 3.0


class RequeueAwareWatcher(submitit_slurm.SlurmInfoWatcher):
    def __init__(self, delay_s: int = 60, grace_s: float = 120.0) -> None:
        super().__init__(delay_s=delay_s)
        self.grace_s = grace_s
        self._suspect_since: dict[str, float] = {}  # job id -> when a failure state was first read
        self._read_at: dict[str, float] = {}  # job id -> when a poll last answered for it
        self._history: dict[str, list[str]] = {}  # job id -> the states read, changes only (for the log)

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        info = super().read_info(string)
        now = time.monotonic()
        for job_id in self._registered - self._finished:  # the poll answered for each (absent: purged)
            self._read_at[job_id] = now
        for job_id, fields in info.items():
            states = self._history.setdefault(job_id, [])
            state = fields.get("State", "UNKNOWN")
            if not states or states[-1] != state:
                states.append(state)
        return info

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        if not super().is_done(job_id, mode=mode):
            self._suspect_since.pop(job_id, None)  # pending or running (again): not done
            return False
        state = self.get_state(job_id, mode="cache").upper()
        if state.startswith(FINAL_STATES):
            return True
        read_at = self._read_at.get(job_id, time.monotonic())
        first = self._suspect_since.setdefault(job_id, read_at)
        if read_at - first >= self.grace_s:
            log.warning("Slurm job %s read %s for %.0f s of answered polls (states read: %s): taken as final",
                        job_id, state, read_at - first, " -> ".join(self._history.get(job_id, [])))
            return True
        # Read it again soon, whatever submitit's polling delay has grown to (it doubles up to
        # delay_s=600: a job that failed minutes after it started would be read again only
        # minutes later, and Slurm may purge it first). submitit stamps its polls with time.time().
        if mode != "cache" and time.time() - self._last_status_check >= RECHECK_S:
            self.update()
        return False


class RequeueAwareWatching(Callback):
    """Hydra callback (conf/cluster/slurm.yaml): before the sweep's jobs are submitted, submitit's
    Slurm jobs get a `RequeueAwareWatcher` with `cluster.requeue_grace_s`."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        submitit_slurm.SlurmJob.watcher = RequeueAwareWatcher(
            delay_s=submitit_slurm.SlurmJob.watcher._delay_s, grace_s=float(config.cluster.requeue_grace_s))
