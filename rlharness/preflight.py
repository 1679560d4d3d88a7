"""What `train.py` checks before Hydra creates or touches a run directory.

Hydra makes the run directory (and writes `.hydra/` and `train.log` into it) before the
task function runs, so anything refused there would leave a new directory behind or
change an existing run. `preflight(argv)` composes the same config first and refuses,
with one line naming key, value and what is allowed:

- a config that does not compose or validate (unknown keys, `+algo.lrr=...` typos
  included, bad values, impossible combinations), every point of a `-m` sweep;
- `cluster=slurm` without `-m` (hydra-submitit-launcher only launches multiruns), and a
  `cluster=slurm` request the partition can never hold (more nodes, GPUs or CPUs per node
  than it has: `rlharness.launch.slurm_capacity`, asked through sinfo);
- `resume=never` into a directory that holds a run;
- any start in a directory that holds a run (`hydra.run.dir=<run>`) is a resume: it is
  rewritten exactly as `resume=<dir>` and passes the same checks (model/task/seed fixed,
  `.hydra/` kept, the new config saved under `.hydra/resumed-<time>/`);
- a resume with nothing left to train (`total_steps` at or below the checkpoint's step)
  ends here with one line (`Finished`).

`RunDirGuard` covers what can only be found once the job runs (a data file, a
tokenizer, a checkpoint file): it puts the directory back as it was (a new directory is
removed; in an existing run the new `.hydra/resumed-*` and the appended log are undone).
"""

from __future__ import annotations

import difflib
import shutil
import sys
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from rlharness.config.schema import ConfigError, adopt_strategy_max_staleness
from rlharness.launch.slurm_capacity import check_capacity

# Flags after which Hydra does not run the job (help, printing the config, completion) or
# composes a config other than ours: nothing to check.
_NO_RUN_FLAGS = ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc",
                 "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun")
_MULTIRUN_FLAGS = ("-m", "--multirun")
# A directory holds a run once any of these exist (written by Hydra or the trainer).
RUN_MARKERS = (".hydra", "checkpoints", "metrics.jsonl", "rollouts")
# More sweep points than this are not each composed up front (each costs ~0.1 s).
MAX_SWEEP_POINTS_CHECKED = 64


class Finished(Exception):
    """Nothing to do (a resumed run is already at its total_steps); the message says so."""


def holds_run(run_dir: Path) -> bool:
    return run_dir.is_dir() and any((run_dir / m).exists() for m in RUN_MARKERS)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def preflight(argv: list[str]) -> tuple[list[str], list[str], RunDirGuard | None]:
    """Check the command line; returns (argv for Hydra, overrides applied on resume, guard)."""
    from rlharness.launcher import prepare_resume_argv

    args = argv[1:]
    if any(a.split("=", 1)[0] in _NO_RUN_FLAGS for a in args):
        return (*prepare_resume_argv(argv), None)
    multirun = any(a in _MULTIRUN_FLAGS for a in args)
    overrides = [a for a in args if not a.startswith("-")]
    if multirun:
        argv, applied = prepare_resume_argv(argv)
        asked: set[tuple] = set()
        for point in sweep_points([a for a in argv[1:] if not a.startswith("-")])[:MAX_SWEEP_POINTS_CHECKED]:
            cfg = compose_checked(point)
            if cfg.cluster.name == "slurm":
                c = cfg.cluster
                request = (c.partition, c.nodes, c.gpus_per_node, c.cpus_per_task, c.constraint)
                if request not in asked:  # one sinfo per distinct request
                    asked.add(request)
                    check_capacity(c)
        return argv, applied, None

    cfg = compose_checked(overrides)
    if cfg.cluster.name == "slurm":
        raise ConfigError("cluster=slurm without -m is not allowed: Slurm jobs are submitted by "
                          "hydra-submitit-launcher, which Hydra runs only for -m (--multirun); use "
                          "`python train.py -m cluster=slurm ...` (one job per sweep point)")
    run_dir = Path(str(cfg.hydra.run.dir)).expanduser().resolve()
    explicit_resume = any(_key(o) == "resume" and o.split("=", 1)[1] not in ("auto", "never") for o in overrides)
    if cfg.resume == "never" and holds_run(run_dir):
        raise ConfigError(f"resume=never with hydra.run.dir={run_dir} is not allowed: that directory holds a run; "
                          f"choose a new directory (or remove that run yourself)")
    if not explicit_resume and holds_run(run_dir) and not any(_key(o) == "hydra.run.dir" for o in overrides):
        raise ConfigError(f"hydra.run.dir={run_dir} is not allowed: the default directory of this start already "
                          f"holds a run (another run started in the same second?); start again, or pass "
                          f"resume=<that run> to continue it")
    if not explicit_resume and holds_run(run_dir):
        # Starting in a run's directory is a resume, whatever route led there.
        rest = [o for o in overrides if _key(o) not in ("hydra.run.dir", "resume")]
        new_argv, applied = prepare_resume_argv([argv[0], f"resume={run_dir}", *rest], require_checkpoint=False)
        print(f"note: hydra.run.dir={run_dir} holds a run: continuing it as resume={run_dir}", file=sys.stderr)
        argv = [*new_argv, *(a for a in args if a.startswith("-"))]
        cfg = compose_checked([a for a in argv[1:] if not a.startswith("-")])
    else:
        argv, applied = prepare_resume_argv(argv)
        if applied or explicit_resume:
            cfg = compose_checked([a for a in argv[1:] if not a.startswith("-")])
    run_dir = Path(str(cfg.hydra.run.dir)).expanduser().resolve()
    _refuse_if_finished(run_dir, cfg.total_steps)
    # Hydra names the job (and its log file) after the script.
    return argv, applied, RunDirGuard.record(run_dir, str(cfg.hydra.output_subdir), Path(argv[0]).stem)


def _refuse_if_finished(run_dir: Path, total_steps: int) -> None:
    from rlharness.checkpoint import latest_checkpoint

    found = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if found is not None and found[0] >= total_steps:
        raise Finished(f"{run_dir} is already at step {found[0]} (total_steps={total_steps}): nothing to train; "
                       f"pass total_steps=N with N > {found[0]} to extend it")


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """Every point of a `-m` sweep (Hydra's basic sweeper's expansion), or the overrides as one point
    when the sweep syntax is one only another sweeper understands."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        return BasicSweeper.split_arguments(parsed, None)[0]
    except HydraException:
        return []


def compose_checked(overrides: list[str]):
    """Compose and validate like the job will; every failure is one ConfigError line."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from rlharness.config.store import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent.parent / "conf"),
                                   version_base=None):
            cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
        job = cfg.copy()
        with open_dict(job):
            del job["hydra"]
        check_known_keys(job)
        job.run_dir = "preflight"
        adopt_strategy_max_staleness(job, overrides)  # as train.py
        conf = OmegaConf.to_object(job)  # the schemas' __post_init__ checks
        if conf.model.lora.enabled:  # its targets exist in model.path (reads the model's layout)
            from rlharness.lora import check_model_conf

            check_model_conf(conf.model)
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException, ValueError, TypeError) as exc:
        raise ConfigError(one_line(exc, list(overrides))) from None
    finally:
        GlobalHydra.instance().clear()
    return cfg


def check_known_keys(cfg) -> None:
    """Refuse keys a schema does not have (`+algo.lrr=1e-6` adds one; OmegaConf would keep it)."""
    from omegaconf import DictConfig, OmegaConf

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, DictConfig):
            return
        schema = OmegaConf.get_type(node)
        allowed = {f.name for f in fields(schema)} if schema is not None and is_dataclass(schema) else None
        for key in node.keys():
            path = f"{prefix}{key}"
            if allowed is not None and key not in allowed:
                close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
                value = OmegaConf.to_container(node, resolve=False).get(key)
                raise ConfigError(f"{path}={value!r} is not allowed: {schema.__name__} has no key {key!r}"
                                  + (f" (did you mean {prefix}{close[0]}?)" if close else
                                     f"; its keys are {', '.join(sorted(allowed))}"))
            walk(node._get_node(key), path + ".")

    walk(cfg, "")


def one_line(exc: BaseException, overrides: list[str]) -> str:
    """Hydra/OmegaConf errors span lines and hide the cause: say key, value and what is allowed."""
    import re

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    cause_line = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
    if isinstance(exc, OverrideParseException):
        for o in overrides:
            try:
                OverridesParser.create().parse_overrides([o])
            except OverrideParseException as bad:
                return f"{o!r} is not a valid override: {str(bad).splitlines()[0]} (expected key=value)"
    missing = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
    if missing:
        group, option = missing.groups()
        options = re.findall(r"^\t(\S+)$", text.split(f"Available options in '{group}':", 1)[-1], re.M)
        return f"{group}={option} is not allowed: expected one of {', '.join(options) or '(none found)'}"
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown:
        key = unknown.group(1)
        value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key), "?")
        where, _, name = key.rpartition(".")
        schema = re.search(r"object_type=(\w+)", str(cause)) if cause is not None else None
        cls = getattr(_schema_module(), schema.group(1), None) if schema else None
        if cls is not None and is_dataclass(cls):
            allowed = sorted(f.name for f in fields(cls))
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f"did you mean {where + '.' if where else ''}{close[0]}?" if close else f"its keys are {', '.join(allowed)}"
            return f"{key}={value} is not allowed: {cls.__name__} has no key {name!r} ({hint})"
        return f"{key}={value} is not allowed: no such key"
    dotted = re.search(r"full_key: tasks\.([^.\s)]+)\.([^.\s)]+)", text)
    schema_module = _schema_module()
    if dotted and dotted.group(2) not in {f.name for f in fields(schema_module.TaskEntryConf)}:
        name = f"{dotted.group(1)}.{dotted.group(2)}"
        return (f"tasks.{name}: a task name cannot contain '.' (task names may use only "
                f"{schema_module.TASK_NAME_CHARS})")
    merging = re.search(r"Error merging override (\S+)", text)
    if merging:
        return f"{merging.group(1)} is not allowed: {cause_line or text}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(exc).__name__
    key = next((ln for ln in lines[1:] if ln.startswith("full_key:")), None)
    return f"{head} ({key})" if key else head


def _schema_module():
    from rlharness.config import schema

    return schema


@dataclass
class RunDirGuard:
    """What this start may add to a run directory, so a refused start can take it back."""

    run_dir: Path
    existed: bool
    output_subdir: str
    log_name: str
    log_size: int | None

    @classmethod
    def record(cls, run_dir: Path, output_subdir: str, job_name: str) -> RunDirGuard:
        log = run_dir / f"{job_name}.log"
        return cls(run_dir, run_dir.exists(), output_subdir, log.name,
                   log.stat().st_size if log.is_file() else None)

    def rollback(self) -> None:
        """Undo this start's traces: a directory it created goes; an existing run is left as it was."""
        if not self.existed:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return
        if self.output_subdir.startswith(".hydra/resumed-"):
            shutil.rmtree(self.run_dir / self.output_subdir, ignore_errors=True)
        log = self.run_dir / self.log_name
        if self.log_size is None:
            log.unlink(missing_ok=True)
        elif log.is_file():
            with open(log, "r+b") as fh:
                fh.truncate(self.log_size)
