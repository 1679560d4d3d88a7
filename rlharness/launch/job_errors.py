"""Why a multi-node Slurm job failed, when its first node left no result.

hydra-submitit-launcher reads only task 0's result: when node 0 dies without writing one
(Ray ends a driver whose node's object store is gone at once), the submitter raises
submitit's `UncompletedJobError` "has not produced any output" and a log tail. The other
nodes' tasks may know why (`RayHeadLost` names node 0 and the checkpoint to resume
from): `other_tasks_errors(exc)` reads their result files (Hydra's `JobReturn`).
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

_RESULT = re.compile(r"with path (\S+?)_(\d+)_result\.pkl")


def other_tasks_errors(exc: BaseException) -> list[str]:
    """"task k: Name: message" for each other task of the job named in `exc` that failed with an exception."""
    found = _RESULT.search(str(exc))
    if not found:
        return []
    prefix, task = Path(found.group(1)), int(found.group(2))
    errors = []
    for path in sorted(prefix.parent.glob(f"{prefix.name}_*_result.pkl")):
        k = int(path.name[len(prefix.name) + 1:].split("_", 1)[0])
        if k == task:
            continue
        try:
            outcome, value = pickle.loads(path.read_bytes())
        except Exception:  # unreadable or from another Python: nothing to add
            continue
        error = getattr(value, "_return_value", None) if outcome == "success" else value
        if isinstance(error, BaseException):
            errors.append(f"task {k}: {type(error).__name__}: {error}")
        elif outcome == "error":
            errors.append(f"task {k}: {str(value).strip().splitlines()[-1]}")
    return errors
