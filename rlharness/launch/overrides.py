"""Command-line overrides as text: their keys and values, paths written so Hydra reads them back,
and `resume=<run dir>` rewritten (before Hydra starts) into "compose that run's saved overrides
plus the new ones, in that directory", refusing overrides that would make its checkpoint unusable.
Used by train.py's preflight, the launcher and evaluate.py."""

from __future__ import annotations

import re
import time
from pathlib import Path

import yaml

from rlharness.core.checkpoint import latest_checkpoint
from rlharness.config.schema import ConfigError
from rlharness.core.run_dir import (HYDRA, OVERRIDES_YAML, RESUMED_PREFIX, RunDir, checkpoint_folder_of,
                                    not_a_run_hint)


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge_overrides(old: list[str], new: list[str]) -> list[str]:
    """A saved command line with new overrides on top: an old override whose key is given again goes."""
    new_keys = {override_key(o) for o in new}
    return [o for o in old if override_key(o) not in new_keys] + new


def override_value(override: str) -> str:
    """An override's value as Hydra reads it (quotes removed); the raw text if it does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return str(OverridesParser.create().parse_override(override).value())
    except HydraException:
        return override.split("=", 1)[1]


def path_override(key: str, path: Path) -> str:
    """`key=path` as Hydra's override parser reads it back (quoted when the path has spaces, commas...)."""
    text = str(path)
    if re.fullmatch(r"[\w/.\-:+@~]+", text):
        return f"{key}={text}"
    return f"{key}='" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Changing these makes a checkpoint unusable (other weights, vocabulary, data or data order:
# `sampler.shuffle` changes the order of the epoch under way, whose position the checkpoint holds;
# `batch_size` the producer's saved split of the data into steps, which the checkpoint refuses anyway;
# `algo.teacher.path` the teacher whose scores the saved groups carry and the run distils from).
FROZEN_ON_RESUME = ("model", "task", "tasks", "sampler.prompt_repeat_k", "sampler.shuffle", "batch_size", "seed",
                    "algo.teacher.path")


def _frozen(key: str) -> bool:
    """Whether an override key touches a frozen part; `group@package` counts both (e.g.
    `task@tasks.extra.task` adds a task)."""
    return any(k == f or k.startswith(f + ".") for k in key.split("@") for f in FROZEN_ON_RESUME)


def prepare_resume_argv(argv: list[str], require_checkpoint: bool = True) -> tuple[list[str], list[str]]:
    """Rewrite `resume=<dir>` into overrides Hydra understands. Returns (argv, applied new overrides).

    `require_checkpoint=False` (a start in a run directory that has no checkpoint yet) still
    refuses changed fixed keys and keeps `.hydra/`; the run then starts from step 0."""
    resume_args = [a for a in argv[1:] if override_key(a) == "resume"]
    if not resume_args:
        return argv, []
    value = resume_args[-1].split("=", 1)[1]
    if value in ("auto", "never"):
        return argv, []
    run_dir, old = read_run_overrides(value)
    if require_checkpoint and latest_checkpoint(run_dir) is None:
        raise ConfigError(f"resume={value}: holds no complete checkpoint (checkpoints/step_*/DONE)")
    new = [a for a in argv[1:] if override_key(a) != "resume"]
    old_values = {override_key(o): o for o in old}
    for o in new:
        k = override_key(o)
        if _frozen(k) and old_values.get(k) != o:
            raise ConfigError(
                f"resume={value}: override {o!r} would make the checkpoint unusable ({k} is fixed "
                f"for a run; start a new run instead)")
    merged = merge_overrides(old, new)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return ([argv[0], *merged, "resume=auto", path_override("hydra.run.dir", run_dir),
             f"hydra.output_subdir={HYDRA}/{RESUMED_PREFIX}{stamp}"], new)


def read_run_overrides(value: str) -> tuple[Path, list[str]]:
    """(run dir, the overrides its newest life ran with) for `resume=<value>`, less where it ran
    and how it resumed; refused unless it is a run directory."""
    run_dir = Path(value).expanduser().resolve()
    if not run_dir.is_dir():
        raise ConfigError(f"resume={value}: no such directory")
    if not RunDir(run_dir).overrides.is_file():
        folder = checkpoint_folder_of(run_dir)
        if folder is not None and RunDir(folder[0]).overrides.is_file():
            raise ConfigError(
                f"resume={value}: a checkpoint folder, not a run directory; resume={folder[0]} continues that run "
                f"from its newest checkpoint (a new run can start from this one's model: python -m "
                f"rlharness.export {run_dir} <dir>, then model.path=<dir>)")
        raise ConfigError(f"resume={value}: {not_a_run_hint(run_dir) or 'not a run directory'} "
                          f"(no {HYDRA}/{OVERRIDES_YAML})")
    saved = RunDir(run_dir).newest_hydra() / OVERRIDES_YAML  # the run as its last life had it
    return run_dir, [o for o in (yaml.safe_load(saved.read_text()) or [])
                     if override_key(o) not in ("resume", "hydra.run.dir", "hydra.output_subdir")]
