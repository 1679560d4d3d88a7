"""Atomic, complete checkpoints under `<run_dir>/checkpoints/step_XXXXXXXX/`.

A checkpoint is written into a temporary sibling directory, a `DONE` marker is the
last file written, and only then is the directory renamed into place (rename is
atomic on one filesystem). A directory without `DONE` is never loaded; leftovers of a
write killed half-way are removed at the next save. The newest `keep` are kept.

Checkpoints are data, not code: state files are read with `torch.load(weights_only=True)`
(tensors, numbers, strings and containers only), so a crafted file cannot run anything
when a run is resumed (`load_state`); JSON and safetensors hold the rest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

from rlharness.core import fault_points
from rlharness.core.run_dir import DONE, RunDir, step_name

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the path and what is wrong."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (a full disk, a quota); the message names the file."""


@contextlib.contextmanager
def writing(path: str | Path):
    """Name the file being written when writing it fails: safetensors' and DeepSpeed's errors name
    none (`Error while serializing: IoError(Os { code: 28, kind: StorageFull, ...`)."""
    try:
        yield
    except CheckpointWriteError:
        raise
    except Exception as exc:  # noqa: BLE001 - any writer's failure, named
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, OSError) and exc.strerror:
            text = exc.strerror
        elif "StorageFull" in text or "No space left" in text:
            text = f"no space left on device ({text[:160]})"
        raise CheckpointWriteError(f"cannot write {path}: {text}") from exc


def error_line(exc: BaseException, limit: int = 400) -> str:
    """An error as one line: a Ray actor's error as its cause's, lines joined (a state dict's size mismatch
    lists its tensors on lines of their own), cut at `limit` characters."""
    exc = getattr(exc, "cause", None) or exc  # ray.exceptions.RayTaskError: the actor's own exception
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + " ..."


def complete_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    root = RunDir(run_dir).checkpoints
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / DONE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> tuple[int, Path] | None:
    ckpts = complete_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def begin_checkpoint(run_dir: str | Path, step: int) -> Path:
    """A fresh temporary directory to write checkpoint `step` into."""
    root = RunDir(run_dir).checkpoints
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # a write that was killed half-way
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{step_name(step)}-{os.getpid()}"
    tmp.mkdir()
    return tmp


def commit_checkpoint(run_dir: str | Path, step: int, tmp: Path, keep: int,
                      meta: dict[str, Any] | None = None) -> Path:
    """Publish what was written into `tmp`: fsync, `DONE` last, atomic rename, prune."""
    final = RunDir(run_dir).checkpoint(step)
    root = final.parent
    with writing(tmp / "meta.json"):
        (tmp / "meta.json").write_text(json.dumps({"step": step, **(meta or {})}, indent=1))
    with writing(tmp):
        _fsync_tree(tmp)
    fault_points.reach("checkpoint", step)  # the resume tests' kill inside a write
    with writing(tmp / DONE):
        (tmp / DONE).write_text("ok\n")
    if final.exists():  # same step saved again (e.g. final save right after a periodic one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(root, keep)
    log.info("checkpoint saved: %s", final)
    fault_points.reach("checkpoint_saved", step)
    return final


def save_state(state: dict[str, Any], path: str | Path) -> None:
    """Write plain data and tensors (what `load_state` accepts; no objects, no code)."""
    import torch  # not at import: the command line checks its input before paying for torch

    torch.save(state, path)


def load_state(path: str | Path, allow: tuple[type, ...] = ()) -> Any:
    """Read a state file without running code: only tensors and plain data are accepted, plus
    the classes in `allow` (plain-data classes a library saves, rebuilt without calling code).

    A file holding anything else (a pickled object, a function call) is refused with a
    CheckpointError naming the file and the refused global; nothing in it is executed.
    """
    import torch

    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch names the refused global in one of a few phrasings; keep just that name.
        refused = re.search(r"GLOBAL (\S+)|[Uu]nsupported operand (\S+)", str(exc))
        what = next((g for g in refused.groups() if g), "?") if refused else "an object torch refused"
        raise CheckpointError(
            f"checkpoint file {path} holds more than tensors and plain data ({what}): refusing to load it "
            f"(checkpoints are data, not code; was it written by rlharness?)") from exc
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file {path} is corrupted: cannot read it ({exc})") from exc


def check_state_files(directory: str | Path, allow: tuple[type, ...] = (), pattern: str = "*.pt") -> None:
    """Refuse a directory whose pickle-based files hold code, before a library that loads
    them without `weights_only` (DeepSpeed's checkpoint engine) ever reads them."""
    for f in sorted(Path(directory).rglob(pattern)):
        load_state(f, allow)


def read_meta(ckpt_dir: Path) -> dict[str, Any]:
    """The checkpoint's meta.json: {"step": its directory's step, "model_version": int, ...}."""
    path = ckpt_dir / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {ckpt_dir} is corrupted: cannot read {path.name} ({exc})") from exc
    check_fields(meta, {"step": int, "model_version": int}, path)
    m = _STEP_DIR.match(ckpt_dir.name)
    if m and meta["step"] != int(m.group(1)):
        raise CheckpointError(f"{path}: step is {meta['step']}, its directory says {int(m.group(1))}")
    return meta


def check_fields(state: Any, types: dict[str, type | tuple[type, ...]], path: Path) -> None:
    """A checkpoint file's top level holds these keys with these types: one line naming the file, else."""
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint file {path} holds a {type(state).__name__}, not the expected mapping "
                              f"with {', '.join(types)}")
    for key, kind in types.items():
        if key not in state:
            has = ", ".join(map(str, state)) or "nothing"
            raise CheckpointError(f"checkpoint file {path} lacks {key!r} (it has {has}): written by another program "
                                  f"or version?")
        value = state[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise CheckpointError(f"checkpoint file {path}: {key!r} is {repr(value)[:60]} ({type(value).__name__}), "
                                  f"expected {names}")


def _prune(root: Path, keep: int) -> None:
    ckpts = complete_checkpoints(root.parent)
    for _, path in ckpts[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


def _fsync_tree(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
