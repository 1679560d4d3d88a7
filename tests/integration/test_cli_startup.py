"""`train.py` and `evaluate.py` refuse bad input before they import torch: importing torch is
most of a refused start's CPU time (2.3 of 2.5 s), and the refusal tests start them dozens of
times (docs/notes/benchmarks-log.md, issue 21 CI). Modules the entry points import keep torch inside the
functions that need it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import HANG_S, ROOT

IMPORT_ONLY = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("entry_point", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


@pytest.mark.parametrize("script", ["train.py", "evaluate.py"])
def test_importing_an_entry_point_does_not_import_torch(script):
    proc = subprocess.run([sys.executable, "-c", IMPORT_ONLY, script], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", f"{script}'s imports pull in {proc.stdout.strip()}"
