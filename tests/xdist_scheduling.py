"""How `pytest -n 2` (pytest-xdist) shares the suite between its workers.

Each test file runs whole on one worker (its module fixtures are made once), and all of
tests/slurm/ on one worker (one local Slurm whose two nodes hold one job at a time, brought
up and down by those tests). Files go out slowest first, by tests/durations.json
(`scripts/test_durations.py --json`), so that no worker is left running a long file alone at
the end; a file not measured there counts `UNMEASURED_TEST_S` per test. The order is given
in each worker's collection (tests/conftest.py): the controller sends a worker the indexes
of tests in that worker's own list, so it must not reorder its copy.

Scopes are decided here, from node ids, on the controller: xdist's own `--dist loadgroup`
renames node ids with the group, which pytest 9.2 no longer lets it do (`Node.nodeid` reads
`_id`), so its groups silently fell apart.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

DURATIONS = Path(__file__).resolve().parent / "durations.json"
UNMEASURED_TEST_S = 5.0
ONE_WORKER_DIRS = ("tests/slurm/",)


def scope_of(nodeid: str) -> str:
    file = nodeid.split("::")[0]
    return next((d for d in ONE_WORKER_DIRS if file.startswith(d)), file)


def slowest_scopes_first(items: list) -> None:
    """Sort collected items (in place, stable within a scope) so the slowest scope comes first."""
    file_s = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    files = Counter(item.nodeid.split("::")[0] for item in items)
    scope_s: Counter[str] = Counter()
    for file, n in files.items():
        scope_s[scope_of(file)] += file_s.get(file, UNMEASURED_TEST_S * n)
    items.sort(key=lambda item: -scope_s[scope_of(item.nodeid)])


class GroupedScheduling(LoadScopeScheduling):
    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep the workers' slowest-first order

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)
