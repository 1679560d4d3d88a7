"""An attention implementation a model cannot run where the run puts it is refused before anything starts:
one `error:` line naming the key, exit 2, no directory left (a resume cannot change model.attn_implementation:
the key is fixed for a run). Without
the check, transformers found out when it loaded the model, after the run directory, the engine and the
trainer existed (a flash package missing: a traceback; flex_attention on a CPU: a torch compile error of
several hundred lines)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlharness.config.schema import ConfigError
from rlharness.launch import devices
from rlharness.launch.preflight import compose_typed
from rlharness.model.attention import attention_problem, unknown_attention
from tests.faults.test_refused_input import refused
from tests.helpers import ROOT, run_cli

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


@pytest.mark.parametrize("args, expect", [
    (["backend.device=cuda"], ["backend.device=cuda", "CPU build"]),
    (["engine.device=cuda:1"], ["engine.device=cuda:1", "CPU build"]),
    (["backend.device=gpu"], ["backend.device='gpu'", "cpu, cuda or cuda:N"]),
    (["algo=opd", "algo.teacher.path=assets/tiny-arith-teacher", "algo.teacher.device=cuda"],
     ["algo.teacher.device=cuda", "CPU build"]),
    (["backend=deepspeed", "cluster=local_ray", "backend.device=cuda"], ["backend.device=cuda", "CPU build"]),
])
def test_a_device_this_machine_lacks_is_one_line_exit_2(tmp_path, args, expect):
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    refused([*HF, *args], tmp_path, expect)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this Python")
@pytest.mark.parametrize("args, expect", [
    (["engine=vllm"], ["engine=vllm: vLLM is not installed", "setup_vllm.sh"]),
    (["judger=llm", "judger.engine=vllm"], ["judger.engine=vllm: vLLM is not installed"]),
])
def test_vllm_asked_of_a_python_without_it_is_one_line_exit_2(tmp_path, args, expect):
    refused([*HF, *args], tmp_path, expect)


def test_evaluate_refuses_them_too_but_not_a_trainer_device_it_does_not_use(tmp_path):
    evaluate = ["model.path=" + str(ROOT / "assets" / "tiny-arith"), "eval.num_prompts=4", "logger.mode=disabled"]
    for arg, expect in (("engine.device=cuda", "engine.device=cuda"), ("model.attn_implementation=flex_attention",
                                                                         "cannot decode")):
        proc = run_cli([*evaluate, arg], cwd=tmp_path, check=False, script="evaluate.py")
        assert proc.returncode == 2 and expect in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
        assert list(tmp_path.iterdir()) == []
    run_cli([*evaluate, "backend.device=cuda", f"hydra.run.dir={tmp_path / 'eval'}"], cwd=tmp_path,
            script="evaluate.py")


def test_ray_actors_ask_for_no_more_gpus_than_the_machine_has(monkeypatch):
    """With cluster=local_ray, Ray would wait timeout_s for GPUs the machine lacks. (The machine's count is
    given here: this one has no GPU; everything else is the real check.)"""
    _, conf = compose_typed(["backend=deepspeed", "cluster=local_ray", "backend.device=cuda", "backend.num_workers=2"])
    assert devices.ray_gpus(conf) == (2.0, "2 training actor(s): 2")
    monkeypatch.setattr(devices, "cuda_devices", lambda: (1, ""))
    with pytest.raises(ConfigError, match=r"^mode=colocate with cluster=local_ray asks Ray for 2 GPUs \(2 training"):
        devices.check_devices(conf)
    _, conf = compose_typed(["mode=disagg", "cluster=local_ray", "engine.device=cuda", "backend.device=cuda:0"])
    assert devices.ray_gpus(conf)[0] == 2.0  # an engine actor and a training actor, a GPU each
    monkeypatch.setattr(devices, "cuda_devices", lambda: (2, ""))
    devices.check_devices(conf)


def test_a_slurm_job_is_checked_on_its_node_not_where_it_is_submitted(monkeypatch):
    _, conf = compose_typed(["cluster=slurm", "backend.device=cuda"])
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    devices.check_devices(conf)  # this host submits it: its node may have the GPU
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    with pytest.raises(ConfigError, match="backend.device=cuda is not allowed: torch .* CPU build"):
        devices.check_devices(conf)  # on the node (launcher.run): this one has none


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
    # a model with code of its own may register the attention it names as it loads: not refused for its name
    _, conf = compose_typed(["model.attn_implementation=attention_of_its_code", "model.trust_remote_code=true"])
    devices.check_attention(conf)
    _, conf = compose_typed(["model.attn_implementation=attention_of_its_code"])
    with pytest.raises(ConfigError, match="is not an attention transformers has"):
        devices.check_attention(conf)


def test_the_premise_flex_attention_cannot_train_on_a_cpu():
    """What the trainer would meet: torch's FlexAttention refuses a backward pass on a CPU."""
    model = AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-arith", attn_implementation="flex_attention")
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        model(torch.randint(0, 20, (2, 8))).logits.sum().backward()
