"""From a composed Hydra config to a finished run: validate, build, fit.

`run(cfg)` is what `train.py` calls in every launcher (basic, submitit local or
Slurm). Resuming: `resume=auto` continues from the newest complete checkpoint in
the run directory; `resume=<run dir>` was rewritten before Hydra started
(`rlharness.launch.overrides.prepare_resume_argv`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any


from rlharness.launch import run_lock
from rlharness.core.checkpoint import CheckpointError
from rlharness.config.run import RunConf
from rlharness.config.schema import ConfigError
from rlharness.data.jsonl import DataFileError
from rlharness.core.redaction import install_log_redaction
from rlharness.core.run_dir import RunDir, sweep_of
from rlharness.launch.preflight import check_installed

log = logging.getLogger(__name__)


def set_threads_from_env() -> None:
    """Slurm's task/none plugin lets a job see all cores; use what it was given."""
    import torch

    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus:
        torch.set_num_threads(int(cpus))
        os.environ.setdefault("OMP_NUM_THREADS", cpus)


# Bad input (config, checkpoint, data file). Found while building or resuming, before training starts,
# it is a RefusedInput; found later (the run directory is being written), it is the run's failure.
REFUSED_ERRORS = (ConfigError, CheckpointError, DataFileError)


class RefusedInput(Exception):
    """`run` refused its input before the run wrote anything: the run directory is as this start found it.

    Raised in place of the error that refused it (`error`, also the `__cause__`: a ConfigError, a
    CheckpointError, a DataFileError, a RunDirLocked) and says the same line; train.py prints it as
    `error: ...`, puts the directory back and exits 2. Not a ConfigError: a ConfigError says what is
    wrong, wherever it is found; this says when it was found (a ConfigError raised once training has
    started stays what it is, and the run directory is not touched)."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def uses_ray(conf: RunConf) -> bool:
    """Engines or training workers run as Ray actors (else everything runs in this process)."""
    return conf.cluster.name in ("local_ray", "slurm") and (conf.mode == "disagg" or conf.backend.ranked)


def run(conf: RunConf, config_dict: dict[str, Any]) -> dict[str, Any]:
    """Build, fit, close. SIGTERM/SIGINT stop it cleanly (rlharness/core/stopping.py): it then raises
    SystemExit(128 + signum) after the final checkpoint, W&B and the actors are done."""
    from rlharness.core.stopping import StopController

    if int(os.environ.get("SLURM_NODEID") or 0) > 0 and conf.cluster.name == "slurm":
        # Node k > 0 of a multi-node job: a Ray worker until the head (node 0, which trains) is gone.
        from rlharness.cluster.ray_cluster import serve_worker_node

        return serve_worker_node(conf.cluster, uses_ray(conf), conf.run_dir)
    run_dir = Path(conf.run_dir)
    install_log_redaction()  # train.log and the console: no secret, whatever error quotes one
    try:
        # What train.py's preflight checked, again for jobs that never pass through it: a sweep's or
        # Slurm's jobs and their requeued lives.
        check_installed(conf)
        if conf.resume == "never" and RunDir(run_dir).has_run_outputs():  # .hydra/ is this start's own
            raise ConfigError(f"resume=never with run directory {run_dir} is not allowed: it holds a run; "
                              f"choose a new directory")
    except ConfigError as exc:
        raise RefusedInput(exc) from exc
    # One live process per run directory: train.py took it already; a sweep's or Slurm's job (and its
    # requeued lives, which never pass through train.py's preflight) takes it here, before writing.
    try:
        locked_here = run_lock.acquire(run_dir)
    except run_lock.RunDirLocked as exc:
        raise RefusedInput(exc) from exc
    multi_node = conf.cluster.name == "slurm" and conf.cluster.nodes > 1 and "SLURM_JOB_ID" in os.environ
    if multi_node:  # the other nodes' Ray workers tell a finished run from a dead node 0 by this marker
        from rlharness.cluster.ray_cluster import mark_run_ended

        mark_run_ended(conf.run_dir, os.environ["SLURM_JOB_ID"], ended=False)
    stop = StopController(conf.stop_timeout_s).install()
    try:
        last, trainer = _build_and_fit(conf, config_dict, run_dir, stop)
    except BaseException as exc:
        stop.uninstall()
        if isinstance(exc, Exception):  # why the run ended, in train.log too (not only on stderr)
            cause = exc.error if isinstance(exc, RefusedInput) else exc
            log.error("run failed: %s: %s", type(cause).__name__, cause)
        raise
    finally:
        if multi_node:
            mark_run_ended(conf.run_dir, os.environ["SLURM_JOB_ID"], ended=True)
        if locked_here:  # the next job of an in-process sweep; train.py's own lock lasts the process
            run_lock.release(run_dir)
    if not stop.requested:
        stop.uninstall()
        return last
    where = trainer.stop_report if trainer is not None else "stopped before training started"
    sweep = sweep_of(run_dir)  # a sweep continues as a whole: its points not started yet too
    again = (f"continue with: python train.py resume={run_dir}" if sweep is None else
             f"continue the sweep with its command and hydra.sweep.dir={sweep}")
    print(f"rlharness: stopped by {stop.signal_name} at step {trainer.step if trainer else 0}/{conf.total_steps}: "
          f"{where}; " + ("submitit requeues the job" if stop.requeues else again), file=sys.stderr, flush=True)
    stop.finish()  # raises SystemExit (or hands over to submitit's requeue)
    return last


def _build_and_fit(conf: RunConf, config_dict: dict[str, Any], run_dir: Path, stop):
    from rlharness.launch.build import build_components, load_checked_data
    from rlharness.core.gc_tuning import tune_gc, untune_gc
    from rlharness.trainer.trainer import Trainer, seed_everything

    set_threads_from_env()
    # The first lines a person sees: where the run is and how to follow it.
    log.info("run directory: %s (follow it with: tail -f %s)", run_dir, RunDir(run_dir).log())
    os.environ.setdefault("WANDB_MODE", getattr(conf.logger, "mode", "disabled"))
    seed_everything(conf.seed)
    remote = components = trainer = None
    try:
        loaded = load_checked_data(conf)  # bad data or a teacher that cannot read it: refused before Ray starts
        if uses_ray(conf):
            from rlharness.distributed.remote_parts import start_remote_parts
            from rlharness.logging_utils.progress import phase

            with phase("starting Ray and its actors (engines, training workers)"):
                remote = start_remote_parts(conf)
            stop.install()  # ray.init installed its own SIGTERM handler (abort with a C++ stack)
        components = build_components(conf, remote, loaded)
        if stop.requested:
            return {}, None
        trainer = Trainer(conf, components, run_dir, config_dict, stop=stop)
        gc_thresholds = tune_gc()  # start-up is done: freeze it, collect less often (rlharness/core/gc_tuning.py)
        try:
            return asyncio.run(trainer.fit()), trainer
        finally:
            untune_gc(gc_thresholds)  # a process that runs again (tests, in-process sweeps) starts afresh
    except REFUSED_ERRORS as exc:
        if trainer is None or not trainer.started:
            raise RefusedInput(exc) from exc
        raise
    finally:
        # Engines and training workers (Ray actors too) are shut down however the run ended.
        if components is not None:
            for teacher in components.distinct_teachers():
                try:
                    teacher.close()
                except Exception:  # noqa: BLE001 - the engines and trainer must still be shut down
                    log.exception("closing the teacher %s failed", teacher.conf.path)
            asyncio.run(_close(components.engine, components.backend,
                               [*components.judgers.values(), *components.eval_judgers.values()]))
        elif remote is not None:
            asyncio.run(_close(remote.engine, remote.backend))


async def _close(engine, backend, judgers=()) -> None:
    try:
        for judger in judgers:
            await judger.close()  # its judging processes
    finally:
        try:
            if engine is not None:
                await engine.close()
        finally:
            if backend is not None:
                await backend.close()
