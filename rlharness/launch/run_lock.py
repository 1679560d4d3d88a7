"""One live process per run directory: an OS lock on `<run_dir>/.lock`, held for the whole run.

`fcntl.flock` locks belong to the open file, so the kernel drops them when the process ends
however it ends (SIGKILL, OOM, a node reboot): a lock is never stale. The file holds the
PID of the process that took it, so a second start can say who holds the directory. The
file itself stays in the run directory (deleting a lock file while another process may be
opening it would let two processes lock two different files); it is not a sign of a run.

`train.py` takes the lock before Hydra writes anything into the directory
(`rlharness.launch.preflight`); `launcher.run` takes it too (a no-op when this process holds it
already), which covers jobs that never pass through `train.py`'s preflight: multirun
points, submitit and Slurm jobs, and their requeued lives.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from rlharness.config.schema import ConfigError
from rlharness.core.run_dir import RunDir

_HELD: dict[Path, int] = {}  # run directory -> file descriptor of its lock, for this process


class RunDirLocked(ConfigError):
    """Another live process holds the run directory."""


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"PID {pid}" if pid.isdigit() else "a process that has not written its PID yet"


def acquire(run_dir: str | Path) -> bool:
    """Lock `run_dir` for this process (creating the directory if needed). Returns False when this
    process held it already. Raises RunDirLocked, naming the holder's PID, when another one does;
    the directory is then not written to (the lock file is only opened, never truncated)."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _HELD:
        return False
    path = RunDir(run_dir).lock
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirLocked(f"{run_dir} is in use by {_holder(path)} (one live process per run directory; "
                           f"{path} is locked until that process ends): wait for it, stop it, or choose "
                           f"another directory") from None
    except OSError as exc:  # a filesystem without flock: say so rather than run unprotected unknowingly
        os.close(fd)
        raise ConfigError(f"cannot lock {path} ({exc}): the run directory's filesystem does not support "
                          f"flock") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[run_dir] = fd
    return True


def release(run_dir: str | Path) -> None:
    """Give the lock back (the process goes on; e.g. the next point of an in-process sweep)."""
    fd = _HELD.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor of the open file drops the flock


def holds(run_dir: str | Path) -> bool:
    return Path(run_dir).resolve() in _HELD
