"""`backend.packing=true` with an attention that lets packed samples see each other is refused on the real
command line: one `error:` line naming the model and the key, exit 2, nothing new written and an existing
run byte-identical (the check runs when the trainer loads the model; the launcher removes a new run
directory on a refusal and a resumed run writes nothing before its trainer is up)."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from rlharness.backend.packing import honours_packing
from tests.faults.test_refused_input import refused
from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.timeout(600)]

# transformers' paged eager attention (for continuous batching) reads no packed-sequence bounds.
CROSSING = "model.attn_implementation=paged|eager"
RUN = ["engine=sim", "backend=torch", "eval_every=0", "logger.mode=disabled", "batch_size=4",
       "sampler.prompt_repeat_k=2", "save_every=1", CROSSING]
EXPECT = ["backend.packing=true", "assets/tiny-arith", CROSSING, "attend to each other"]


def test_the_attention_crosses_packed_samples():
    """The premise: this attention does let one packed sample see another (the start-up probe says so)."""
    model = AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-arith", attn_implementation="paged|eager")
    assert not honours_packing(model.eval(), model.config.vocab_size, "cpu")


def test_packing_such_an_attention_is_one_line_exit_2(tmp_path):
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    refused([*RUN, "total_steps=1", "backend.packing=true"], tmp_path, EXPECT)
    assert not (tmp_path / "outputs").exists()
    run_dir = tmp_path / "run"  # packing=null: the same attention trains on padded rows
    run_cli([*RUN, "total_steps=1", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert "training on padded rows" in (run_dir / "train.log").read_text()
    refused([*RUN, "total_steps=2", f"hydra.run.dir={run_dir}", "backend.packing=true"], tmp_path, EXPECT,
            watch=run_dir)
