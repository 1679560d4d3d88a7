"""benchmarks/engine_throughput.py --quick runs end to end and reports both sides (not speed)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_throughput.py"


def _load_script():
    return load_script(SCRIPT, "engine_throughput_bench")


@pytest.mark.timeout(180)
def test_engine_throughput_quick_reports(tmp_path, capsys):
    module = _load_script()
    rows = module.main(["--quick", "--threads", "1", "--out-dir", str(tmp_path)])

    out = capsys.readouterr().out
    assert "| config |" in out and "speedup" in out
    with (tmp_path / "engine_throughput_quick.csv").open() as f:
        written = list(csv.DictReader(f))
    assert len(written) == len(rows) >= 1
    for row in written:
        assert int(row["tokens"]) > 0
        assert float(row["engine_tok_s"]) > 0 and float(row["generate_tok_s"]) > 0
        assert float(row["speedup"]) == pytest.approx(float(row["generate_s"]) / float(row["engine_s"]), rel=0.05)


def test_lognormal_lengths_have_a_long_tail():
    module = _load_script()
    import random
    import statistics

    lengths = module.lognormal_lengths(4000, mean=64, cv=1.0, max_len=10_000, rng=random.Random(0))
    mean = statistics.fmean(lengths)
    assert 58 < mean < 70
    assert 0.8 < statistics.pstdev(lengths) / mean < 1.2
    assert min(lengths) >= 1
