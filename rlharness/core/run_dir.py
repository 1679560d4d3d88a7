"""A run directory's layout: every file and folder of one, named here once (the README's table).

    .hydra/                         Hydra's composed config: config.yaml, overrides.yaml, hydra.yaml;
      resumed-<time>/               a resumed life's (rlharness/launch/launcher.py)
      evaluate-<time>/              evaluate.py's, when it writes beside a run (rlharness/launch/evaluate.py)
    train.log                       the log (Hydra names it after the script)
    .lock                           one live process per run directory (rlharness/launch/run_lock.py)
    metrics.jsonl                   one row per step and eval (rlharness/logging_utils/metrics.py)
    checkpoints/step_XXXXXXXX/      complete checkpoints, DONE last (rlharness/core/checkpoint.py)
    rollouts/step_XXXXXXXX.jsonl    the ledger, and rollouts/dropped.jsonl (rlharness/logging_utils/ledger.py)
    evals/step_XXXXXXXX.jsonl       eval completions (rlharness/logging_utils/samples.py)
    diagnostics/onpolicy_step_XXXXXXXX.pt   an on-policy step the guard warned about: its batch and both
                                    sides' weight checksums (rlharness/trainer/onpolicy_guard.py)
    plots/*.png                     (rlharness/logging_utils/plots.py)
    wandb/                          W&B's own files
    .slurm-<job id>-run-ended       multi-node Slurm: node 0's run ended (rlharness/cluster/ray_cluster.py)

evaluate.py's output directory has `evals/<model or step>.jsonl`, `summary.json` and `summary.md`.

A directory holds a run once any of `RUN_MARKERS` exists: Hydra's `.hydra/` (a start's first
write: its config is the run's, fixed keys included) or anything the trainer writes
(`RUN_OUTPUTS`). `.lock` and `train.log` are no sign: a refused start may leave both.
"""

from __future__ import annotations

import re
from pathlib import Path

HYDRA = ".hydra"
CONFIG_YAML = "config.yaml"
OVERRIDES_YAML = "overrides.yaml"
HYDRA_YAML = "hydra.yaml"
RESUMED_PREFIX = "resumed-"
EVALUATE_PREFIX = "evaluate-"
LOCK = ".lock"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
MULTIRUN_YAML = "multirun.yaml"  # Hydra's, in a sweep's directory: the sweep's own overrides
DONE = "DONE"  # a checkpoint's last file: without it the directory is never loaded
ROLLOUTS = "rollouts"
DROPPED = "dropped.jsonl"
EVALS = "evals"
DIAGNOSTICS = "diagnostics"
PLOTS = "plots"
WANDB = "wandb"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
# Written by the trainer, never by Hydra: a start whose own Hydra has already written `.hydra/` (the job's
# `launcher.run`) can still tell a run's directory by these.
RUN_OUTPUTS = (CHECKPOINTS, METRICS, ROLLOUTS)
RUN_MARKERS = (HYDRA, *RUN_OUTPUTS)


def output_path_problem(path: Path) -> str | None:
    """Why `path` cannot be an output folder (None: it can): it or a folder above it is a file or a
    symbolic link to nothing, or the nearest existing folder is not writable. A symbolic link to an
    existing folder (outputs -> /scratch/...) is fine; a dangling one would make a folder somewhere else."""
    import os

    path = Path(path).expanduser()
    for p in (path, *path.parents):
        if p.is_symlink() and not p.exists():
            return f"{p} is a symbolic link to {os.readlink(p)}, which does not exist"
        if p.exists():
            if not p.is_dir():
                return f"{p} is a file, not a folder"
            if p != path and not os.access(p, os.W_OK | os.X_OK):
                return f"cannot create folders in {p} (no write permission)"
            return None
    return None


def first_missing(path: Path) -> Path | None:
    """The first folder that making `path` would create (None: it exists): what a refused start removes."""
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def step_name(step: int) -> str:
    """`step_XXXXXXXX`: a checkpoint's folder, and the stem of a step's ledger and eval file."""
    return f"step_{step:08d}"


def step_of(name: str) -> int:
    """The step a `step_XXXXXXXX[.jsonl]` name is for."""
    return int(name.split(".", 1)[0].split("_")[1])


def checkpoint_folder_of(path: str | Path) -> tuple[Path, int] | None:
    """(run dir, step) when `path` names a run's checkpoint folder (`<run>/checkpoints/step_XXXXXXXX`),
    which users pass where a run directory is asked for; else None."""
    p = Path(path).expanduser().resolve()
    if p.parent.name == CHECKPOINTS and re.fullmatch(r"step_\d{8}", p.name):
        return p.parent.parent, step_of(p.name)
    return None


def sweep_of(run_dir: str | Path) -> Path | None:
    """The sweep (Hydra multirun) directory a run directory is a job of, else None."""
    parent = Path(run_dir).parent
    return parent if (parent / MULTIRUN_YAML).is_file() else None


def not_a_run_hint(path: str | Path) -> str:
    """What a directory that is not a run directory is, when users take it for one: a sweep's own directory
    (naming its jobs); "" otherwise."""
    p = Path(path).expanduser().resolve()
    if (p / MULTIRUN_YAML).is_file():
        jobs = sorted((d.name for d in p.iterdir() if (d / HYDRA / OVERRIDES_YAML).is_file()),
                      key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))
        return (f"a sweep's directory, whose jobs are the run directories {', '.join(str(p / j) for j in jobs[:4])}"
                + (", ..." if len(jobs) > 4 else ""))
    return ""


class RunDir:
    """The paths of one run directory (nothing is created or read here)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ------------------------------------------------------------------ Hydra's
    @property
    def hydra(self) -> Path:
        return self.path / HYDRA

    @property
    def config(self) -> Path:
        """The first life's composed config: what fixed keys are compared with."""
        return self.hydra / CONFIG_YAML

    @property
    def overrides(self) -> Path:
        return self.hydra / OVERRIDES_YAML

    def resumed_lives(self) -> list[Path]:
        """Each resumed life's Hydra output (`.hydra/resumed-<time>/` with its overrides), oldest first."""
        return sorted(p for p in self.hydra.glob(RESUMED_PREFIX + "*") if (p / OVERRIDES_YAML).is_file())

    def newest_hydra(self) -> Path:
        """The newest life's Hydra output: `.hydra/resumed-<time>/` (each holds that life's whole
        config and overrides, the run's saved ones included), else the first life's `.hydra/`."""
        lives = self.resumed_lives()
        return lives[-1] if lives else self.hydra

    def log(self, job_name: str = "train") -> Path:
        return self.path / f"{job_name}.log"

    @property
    def lock(self) -> Path:
        return self.path / LOCK

    # ------------------------------------------------------------------ the trainer's
    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / step_name(step)

    @property
    def rollouts(self) -> Path:
        return self.path / ROLLOUTS

    def rollout(self, step: int) -> Path:
        """The ledger of train step `step`."""
        return self.rollouts / f"{step_name(step)}.jsonl"

    @property
    def dropped(self) -> Path:
        return self.rollouts / DROPPED

    @property
    def evals(self) -> Path:
        return self.path / EVALS

    def eval_file(self, step_or_label: int | str) -> Path:
        """A training eval's completions (by step), or evaluate.py's (by its label)."""
        stem = step_name(step_or_label) if isinstance(step_or_label, int) else step_or_label
        return self.evals / f"{stem}.jsonl"

    def onpolicy_evidence(self, step: int) -> Path:
        """What the on-policy guard keeps of a step it warned about (rlharness/trainer/onpolicy_guard.py)."""
        return self.path / DIAGNOSTICS / f"onpolicy_{step_name(step)}.pt"

    @property
    def plots(self) -> Path:
        return self.path / PLOTS

    @property
    def wandb(self) -> Path:
        return self.path / WANDB

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_JSON

    @property
    def summary_md(self) -> Path:
        return self.path / SUMMARY_MD

    def run_ended(self, job_id: str) -> Path:
        return self.path / f".slurm-{job_id}-run-ended"

    # ------------------------------------------------------------------ what it holds
    def holds_run(self) -> bool:
        """A run was started here (before this start's Hydra wrote anything)."""
        return self.path.is_dir() and any((self.path / m).exists() for m in RUN_MARKERS)

    def has_run_outputs(self) -> bool:
        """The trainer wrote here (asked once this start's Hydra has written `.hydra/`)."""
        return any((self.path / m).exists() for m in RUN_OUTPUTS)
