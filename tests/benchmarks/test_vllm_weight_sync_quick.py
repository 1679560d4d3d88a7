"""benchmarks/vllm_weight_sync.py --quick runs end to end (in .venv-vllm) and reports both routes (not speed)."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_weight_sync.py"


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_vllm_weight_sync_quick_reports(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("vllm_weight_sync_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    out = module.main(["--quick", "--out-dir", str(tmp_path)])

    assert "## Weight sync" in capsys.readouterr().out
    with (tmp_path / "vllm_sync_quick.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["params_m"]) > 0 and float(row["collective_s"]) > 0 and float(row["disk_s"]) > 0
    engines = {r["engine"]: r for r in out["engines"]}
    assert engines["vllm"]["tokens"] == engines["hf"]["tokens"] == 8 * 16  # EOS off on both sides
