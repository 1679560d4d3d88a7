"""rlharness entry point: `python train.py [group=option ...] [key=value ...]`.

    python train.py                                   # tiny model, arithmetic, colocated, CPU, W&B offline
    python train.py strategy=async max_staleness=1    # async producer, at most 1 version stale
    python train.py mode=disagg cluster=local_ray     # rollout and training as Ray actors, concurrently
    python train.py -m strategy=sync,async max_staleness=0,1 hydra/launcher=submitit_local
    python train.py -m cluster=slurm algo.lr=1e-6,3e-6
    python train.py resume=outputs/2026-11-22/10-31-07

`python train.py --help` lists the config groups; `--cfg job` prints the composed config.
Refused input (config, data, model, checkpoint) prints one line `error: ...` and exits 2,
leaving no new directory and any existing run as it was (rlharness/launch/preflight.py).
"""

from __future__ import annotations

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlharness.config.run import adopt_strategy_max_staleness
from rlharness.config.store import register_configs
from rlharness.health.alarm import EXIT_HEALTH_STOP, HealthStop
from rlharness.launch.launcher import RefusedInput, run
from rlharness.launch.preflight import Explained, Finished, RunDirGuard, preflight
from rlharness.core.redaction import redact
from rlharness.trainer.nonfinite import NonFiniteTraining

log = logging.getLogger("rlharness")
register_configs()
_RESUME_OVERRIDES: list[str] = []
_GUARD: RunDirGuard | None = None
EXIT_REFUSED = 2
EXIT_FAILED = 1


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    cfg.run_dir = HydraConfig.get().runtime.output_dir
    adopt_strategy_max_staleness(cfg, HydraConfig.get().overrides.task)
    try:
        conf = OmegaConf.to_object(cfg)  # typed + validated (__post_init__) before anything starts
        if _RESUME_OVERRIDES:
            log.info("resuming %s with overrides: %s", conf.run_dir, " ".join(_RESUME_OVERRIDES))
        last = run(conf, OmegaConf.to_container(cfg, resolve=True))
    except RefusedInput as exc:  # found once the job runs (data, tokenizer, checkpoint files)
        if HydraConfig.get().mode == RunMode.MULTIRUN or _GUARD is None:
            raise exc.error from None  # the job's own error, as Hydra reports a job's
        _GUARD.rollback()
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    except (NonFiniteTraining, HealthStop) as exc:  # the run trained, then had to stop: one line, not a traceback
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        sys.exit(EXIT_HEALTH_STOP if isinstance(exc, HealthStop) else EXIT_FAILED)
    except RuntimeError as exc:  # production stalled (every recent group dropped, each in the ledger): one line
        from rlharness.producer.strategies import ProductionStalled  # imported by now: torch is loaded

        if not isinstance(exc, ProductionStalled) or HydraConfig.get().mode == RunMode.MULTIRUN:
            raise
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        sys.exit(EXIT_FAILED)
    # Returned to Hydra (sweepers may optimise it): final eval accuracy if any.
    return last.get("eval/accuracy") if last else None


if __name__ == "__main__":
    from rlharness.config.schema import ConfigError

    try:
        sys.argv, _RESUME_OVERRIDES, _GUARD = preflight(sys.argv)
    except ConfigError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    except Finished as exc:
        print(exc, file=sys.stderr)
        sys.exit(0)
    except Explained as exc:  # explain=true: what the config means per step; nothing started, nothing written
        print(exc)
        sys.exit(0)
    try:
        main()
    except (SystemExit, RuntimeError) as exc:  # a Slurm job whose node 0 left no result: its other nodes' word
        from rlharness.core.stopping import STOP_SIGNALS, exit_code
        from rlharness.launch.job_errors import other_tasks_errors
        from rlharness.sweep import summarize_failed_sweep

        # Hydra prints a job's exception and exits: the exception is the SystemExit's context.
        for line in other_tasks_errors(exc.__context__ if isinstance(exc, SystemExit) else exc):
            print(f"error: the job's {line}", file=sys.stderr)
        # Hydra raised a failed job's error (or a signal's exit) before its end-of-sweep summary.
        signals = {exit_code(s): s.name for s in STOP_SIGNALS}
        failed_sweep = summarize_failed_sweep(signals.get(exc.code) if isinstance(exc, SystemExit) else None)
        if failed_sweep is not None:
            print(f"error: {failed_sweep}", file=sys.stderr)
        raise
