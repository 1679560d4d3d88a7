"""benchmarks/logprob_gap_rescore.py re-scores a run's prompts in one process: on the embedded chat
model in float32 the hf engine agrees with the trainer's scoring to rounding, with the shorter
prompt left-padded in the engine's batch and alone, and the trainer's log-probs of a row do not
depend on the micro-batch it is scored in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlharness.core.run_dir import RunDir
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "logprob_gap_rescore.py"


def _load_script():
    return load_script(SCRIPT, "logprob_gap_rescore_bench")


def _run_dir(tmp_path: Path) -> Path:
    """What the script reads of a run: its config and one step's rollouts (two prompts of other lengths)."""
    run = tmp_path / "run"
    RunDir(run).hydra.mkdir(parents=True)
    RunDir(run).rollouts.mkdir()
    conf = {"model": {"path": str(ROOT / "assets" / "tiny-chat"), "dtype": "float32"},
            "sampler": {"prompt_repeat_k": 2}, "agent": {"sampling": {"max_tokens": 12, "temperature": 1.0}}}
    RunDir(run).config.write_text(yaml.safe_dump(conf))
    prompts = ["Max had 47 beads and gave away 11. How many beads are left?", "Raj had 74 marbles."]
    rows = [{"group_id": f"g{i}", "prompt": p} for i, p in enumerate(prompts) for _ in range(2)]
    RunDir(run).rollout(1).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


@pytest.mark.timeout(180)
def test_float32_engine_matches_trainer_padded_or_not(tmp_path, capsys):
    rows = _load_script().main([str(_run_dir(tmp_path)), "--steps", "1"])

    assert "| step | prompt |" in capsys.readouterr().out
    assert [r["prompt"] for r in rows] == [0, 1]
    assert rows[0]["left_pad"] == 0 and rows[1]["left_pad"] > 0  # the short prompt waits behind pad tokens
    for r in rows:
        assert r["batched"] < 1e-5 and r["alone"] < 1e-5 and r["worst"] < 1e-4, r
        assert r["trainer_self"] < 1e-5, r
