"""`train.py` refuses bad input before it imports torch: importing torch is most of a refused
start's CPU time (2.3 of 2.5 s), and the refusal tests start train.py dozens of times
(docs/benchmarks.md, issue 21 CI). Modules train.py imports keep torch inside the functions
that need it."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT


def test_importing_train_py_does_not_import_torch():
    code = "import sys; import train; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", f"train.py's imports pull in {proc.stdout.strip()}"
