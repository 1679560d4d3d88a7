"""An attention implementation a model cannot run where the run puts it is refused before anything starts:
one `error:` line naming the key, exit 2, no directory left (a resume cannot change model.attn_implementation:
the key is fixed for a run). Without
the check, transformers found out when it loaded the model, after the run directory, the engine and the
trainer existed (a flash package missing: a traceback; flex_attention on a CPU: a torch compile error of
several hundred lines)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlharness.model.attention import attention_problem, unknown_attention
from tests.faults.test_refused_input import refused
from tests.helpers import ROOT

pytestmark = [pytest.mark.timeout(600)]

HF = ["engine=hf", "backend=torch", "eval_every=0", "logger.mode=disabled", "batch_size=4",
      "sampler.prompt_repeat_k=2", "total_steps=1"]


@pytest.mark.parametrize("args, expect", [
    (["model.attn_implementation=spda"], ["model.attn_implementation=spda", "did you mean sdpa?"]),
    (["model.attn_implementation=flash_attention_2"],
     ["model.attn_implementation=flash_attention_2", "CUDA devices only", "backend.device=cpu"]),
    (["model.attn_implementation=flash_attention_4", "backend=sim"],
     ["model.attn_implementation=flash_attention_4", "CUDA devices only", "engine.device=cpu"]),
    (["model.attn_implementation=flex_attention"], ["model.attn_implementation=flex_attention", "backward",
                                                   "backend.device=cpu"]),
    (["algo=opd", "algo.teacher.path=assets/tiny-arith-teacher", "algo.teacher.attn_implementation=flash_attention_3"],
     ["algo.teacher.attn_implementation=flash_attention_3", "algo.teacher.device=cpu"]),
    (["algo=opd", "algo.teacher.path=assets/tiny-arith-teacher", "algo.teacher.attn_implementation=eagr"],
     ["algo.teacher.attn_implementation=eagr", "did you mean eager?"]),
])
def test_an_attention_that_cannot_run_is_one_line_exit_2(tmp_path, args, expect):
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    refused([*HF, *args], tmp_path, expect)


def test_where_each_attention_can_run():
    # flex_attention's generation on a CPU is refused, its teacher-style forward (no backward, no decoding) is not
    assert "decode" in attention_problem("flex_attention", "engine.device", "cpu", trains=False, generates=True)
    assert attention_problem("flex_attention", "algo.teacher.device", "cpu", trains=False, generates=False) is None
    assert attention_problem("flex_attention", "backend.device", "cuda", trains=True, generates=False) is None
    for attention in ("eager", "sdpa", "paged|eager"):
        assert attention_problem(attention, "backend.device", "cpu", trains=True, generates=True) is None
    # on a GPU, flash needs its package, or `kernels` to fetch it (this machine has neither)
    assert "flash-attn package" in attention_problem("flash_attention_2", "backend.device", "cuda", True, False)
    assert "flash-attn-3 package" in attention_problem("flash_attention_3", "engine.device", "cuda:1", False, True)


def test_an_attention_the_users_code_registers_or_a_hub_kernel_is_known():
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    assert "AttentionInterface" in unknown_attention("sdpa_of_my_own")
    AttentionInterface.register("sdpa_of_my_own", sdpa_attention_forward)
    assert unknown_attention("sdpa_of_my_own") is None
    assert unknown_attention("kernels-community/flash-attn3") is None


def test_the_premise_flex_attention_cannot_train_on_a_cpu():
    """What the trainer would meet: torch's FlexAttention refuses a backward pass on a CPU."""
    model = AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-arith", attn_implementation="flex_attention")
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        model(torch.randint(0, 20, (2, 8))).logits.sum().backward()
