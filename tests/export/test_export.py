"""`python -m rlharness.export <run dir> [--step N] <out dir>` (or `<run>/checkpoints/step_N`): a real run's checkpoint becomes an
ordinary HF folder (weights equal to the checkpoint's, tokenizer with its chat template, generation
config, no training state) that `AutoModelForCausalLM.from_pretrained` loads and that generates what
the checkpoint's model generates; torch and DeepSpeed checkpoints; refusals in one line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from rlharness.core.checkpoint import complete_checkpoints
from tests.helpers import HANG_S, ROOT, run_cli

pytestmark = [pytest.mark.timeout(3 * HANG_S)]  # a training run and one or two exports, each bounded by HANG_S

# The embedded chat model (ChatML template), 2 steps, a checkpoint at each.
CHAT_RUN = ["experiment=chat_math", "total_steps=2", "save_every=1", "batch_size=2", "sampler.prompt_repeat_k=2",
            "eval.num_prompts=4", "eval_every=0", "agent.sampling.max_tokens=24", "logger.mode=disabled"]
HF_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja"}


def export(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = run_cli(args, cwd=ROOT, check=False, script="rlharness.export")
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("export") / "run"
    run_cli([*CHAT_RUN, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    assert [s for s, _ in complete_checkpoints(run_dir)] == [1, 2]
    return run_dir


def check_export(out: Path, ckpt: Path) -> None:
    """Only the model's files; its weights and tokenizer are the checkpoint's; it generates the same."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert {p.name for p in out.iterdir()} <= HF_FILES and {"config.json", "model.safetensors"} <= {
        p.name for p in out.iterdir()}, sorted(p.name for p in out.iterdir())
    src = ckpt / "backend"
    exported, saved = load_file(str(out / "model.safetensors")), load_file(str(src / "model.safetensors"))
    # DeepSpeed's save also writes a tied output layer's copy; the export keeps it once, as HF does.
    assert exported.keys() <= saved.keys() and all(torch.equal(exported[k], saved[k]) for k in exported)
    model = AutoModelForCausalLM.from_pretrained(str(out))
    reference = AutoModelForCausalLM.from_pretrained(str(src))
    mine, theirs = model.state_dict(), reference.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in theirs)
    tok, ref_tok = AutoTokenizer.from_pretrained(str(out)), AutoTokenizer.from_pretrained(str(src))
    assert tok.get_vocab() == ref_tok.get_vocab() and tok.chat_template == ref_tok.chat_template
    ids = torch.tensor([ref_tok.encode("12+34=")])
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=ref_tok.eos_token_id)
    assert torch.equal(model.generate(ids, **kw), reference.generate(ids, **kw))


def test_export_of_a_torch_run_is_an_hf_folder(chat_run, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "model"
    proc = export(chat_run, out)
    assert "step 2" in proc.stderr
    check_export(out, complete_checkpoints(chat_run)[-1][1])
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.chat_template and "<|im_start|>" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False)
    out1 = tmp_path / "model1"
    out1.mkdir()  # an empty folder is fine
    export(chat_run, "--step", 1, out1)
    check_export(out1, complete_checkpoints(chat_run)[0][1])


def test_export_refuses_a_missing_step_and_a_non_empty_folder(chat_run, tmp_path):
    proc = export(chat_run, "--step", 7, tmp_path / "x", check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {chat_run} has no complete checkpoint at step 7; the steps there are: 1, 2"]
    assert not (tmp_path / "x").exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    proc = export(chat_run, full, check=False)
    assert proc.returncode == 2 and "not empty" in proc.stderr and "Traceback" not in proc.stderr
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    proc = export(tmp_path / "nothing", tmp_path / "y", check=False)
    assert proc.returncode == 2 and "no such directory" in proc.stderr


def test_a_checkpoint_folder_where_a_run_directory_is_asked_for(chat_run, tmp_path):
    """Export and evaluate.py take `<run>/checkpoints/step_N` as that run at step N; train.py's resume=
    (which continues a run from its newest checkpoint) names the run directory to pass instead."""
    import json

    step1 = complete_checkpoints(chat_run)[0][1]
    export(step1, tmp_path / "model1")
    check_export(tmp_path / "model1", step1)
    proc = export(step1, "--step", 2, tmp_path / "x", check=False)
    assert proc.returncode == 2 and "is the checkpoint of step 1, not of --step 2" in proc.stderr
    run_cli([f"resume={step1}", "eval.num_prompts=2", f"hydra.run.dir={tmp_path / 'eval'}"], cwd=tmp_path,
            script="evaluate.py")
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert (summary["run_dir"], summary["checkpoint_step"]) == (str(chat_run), 1)
    proc = run_cli([f"resume={step1}", "total_steps=3"], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and f"a checkpoint folder, not a run directory; resume={chat_run} " in proc.stderr
    assert [s for s, _ in complete_checkpoints(chat_run)] == [1, 2]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.deepspeed
def test_export_of_a_deepspeed_run(tmp_path):
    """A backend=deepspeed checkpoint (ZeRO shards beside the gathered HF files) exports the same way,
    without its DeepSpeed state."""
    run_dir = tmp_path / "run"
    run_cli(["backend=deepspeed", "cluster=local_ray", "total_steps=1", "batch_size=4", "eval.num_prompts=8",
             "eval_every=0", "logger.mode=disabled", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    (step, ckpt), = complete_checkpoints(run_dir)
    assert (ckpt / "backend" / "deepspeed").is_dir()
    export(run_dir, tmp_path / "model")
    check_export(tmp_path / "model", ckpt)


def test_a_lora_run_exports_its_merged_model(tmp_path):
    """A LoRA checkpoint holds only the adapter: the export is the base with it merged, an ordinary folder
    whose logits are the PeftModel's (base + adapter); evaluate.py resume= says to export it first."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    run_cli([*CHAT_RUN, "total_steps=1", "model.lora.rank=4", "algo.lr=5e-2", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path)
    (step, ckpt), = complete_checkpoints(run_dir)
    assert not (ckpt / "backend" / "model.safetensors").exists()  # the adapter only
    out = tmp_path / "merged"
    export(run_dir, out)
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    base = AutoModelForCausalLM.from_pretrained(str(ROOT / "assets" / "tiny-chat"))
    peft = PeftModel.from_pretrained(base, str(ckpt / "backend")).eval()
    ids = torch.tensor([[1, 5, 9, 42, 17, 3]])
    with torch.no_grad():
        want, got = peft(input_ids=ids).logits, merged(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(str(ROOT / "assets" / "tiny-chat"))(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, plain, atol=1e-4)
    proc = run_cli([f"resume={run_dir}"], cwd=ROOT, check=False, script="evaluate.py")
    assert proc.returncode == 2 and "holds a LoRA adapter: export the merged model first" in proc.stderr
