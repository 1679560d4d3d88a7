"""benchmarks/disagg_vs_colocate.py --quick runs both modes end to end and writes its CSV (not speed)."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.helpers import HANG_S

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "disagg_vs_colocate.py"


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(HANG_S + 240)  # 70 s alone; a loaded box is 10x slower
def test_disagg_vs_colocate_quick_writes_both_runs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("disagg_vs_colocate_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    rows = module.main(["--quick", "--out-dir", str(tmp_path)])

    assert "ratio (disagg / colocate" in capsys.readouterr().out
    with (tmp_path / "disagg_vs_colocate_quick.csv").open() as f:
        written = list(csv.DictReader(f))
    assert [r["run"] for r in written] == ["colocate_sync", "disagg_async"] == [r["run"] for r in rows]
    for r in written:
        assert int(r["samples"]) == 3 * 4 * 4  # 3 measured steps x 4 prompts x 4 samples
        assert float(r["s_per_sample"]) > 0
    assert float(written[0]["staleness_mean"]) == 0.0  # colocated sync is on-policy
    assert float(written[1]["ratio_vs_colocate"]) == pytest.approx(
        float(written[1]["s_per_sample"]) / float(written[0]["s_per_sample"]))
