"""Input refused at the door: one line `error: ...` naming key, value and what is allowed, exit 2,
no new directory, and an existing run byte-identical before and after (the real command line).

`refused` runs `train.py` as a process forked from a server that has imported its dependencies
(tests/cli_forkserver.py: the process's own exit status and stderr, without 1-7 s CPU of imports
per refusal); the config refusals below and the first data refusal start `python train.py` afresh,
so the plain command line is proven too."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch

from rlharness.core.checkpoint import CheckpointError, check_state_files, latest_checkpoint, load_state
from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.timeout(600)]

SIM = ["engine=sim", "backend=sim", "eval_every=0", "logger.mode=disabled", "batch_size=8",
       "sampler.prompt_repeat_k=2", "engine.time_per_token_s=0.0002", "save_every=2"]


def snapshot(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()} | {str(p.relative_to(d)) + "/": ""
                                                             for p in d.rglob("*") if p.is_dir()}


def refused(args: list[str], cwd: Path, expect: list[str], watch: Path | None = None, spawn: bool = False) -> str:
    """Run train.py, expect exit 2 with one `error:` line holding every `expect`; nothing changed.
    spawn: a fresh `python train.py` instead of a process forked from the test's CLI server."""
    before_cwd = sorted(p.name for p in cwd.iterdir())
    before = snapshot(watch) if watch is not None else None
    proc = run_cli(args, cwd=cwd, check=False, fresh_interpreter=spawn)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert lines and lines[-1].startswith("error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for word in expect:
        assert word in lines[-1], lines[-1]
    assert sorted(p.name for p in cwd.iterdir()) == before_cwd, "a refused start left a new directory"
    if watch is not None:
        assert snapshot(watch) == before, "a refused start changed the run directory"
    return lines[-1]


@pytest.mark.parametrize("args, expect", [
    (["+algo.lrr=1e-6"], ["algo.lrr=1e-06", "did you mean algo.lr?"]),
    (["algo.lrr=1e-6"], ["algo.lrr=1e-6", "did you mean algo.lr?"]),
    (["seed=-1"], ["seed=-1", ">= 0"]),
    (["seed=abc"], ["seed=abc", "Integer"]),
    (["strategy=asnc"], ["strategy=asnc", "async, sync"]),
    (["cluster=slurm"], ["cluster=slurm", "-m"]),
    (["mode=disagg", "cluster=local"], ["mode=disagg", "cluster=local_ray"]),
    (["-m", "cluster=slurm", "cluster.nodes=2"], ["cluster.nodes=2", "mode=colocate", "idle"]),
    (["-m", "seed=1,-2"], ["seed=-2"]),
])
def test_config_errors_are_one_line_exit_2_and_leave_no_directory(tmp_path, args, expect):
    refused([*SIM, *args], tmp_path, expect, spawn=True)
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


@pytest.mark.parametrize("args, expect", [
    (["seed=5"], ["seed=5", "fixed"]),  # a start in a run's directory is a resume
    (["resume=never"], ["resume=never", "holds a run"]),
    (["model.path=/elsewhere"], ["model.path=/elsewhere"]),
])
def test_a_start_in_a_run_directory_passes_the_resume_checks(finished_run, args, expect):
    refused([*SIM, "total_steps=6", f"hydra.run.dir={finished_run}", *args], finished_run.parent, expect,
            watch=finished_run)


def test_resume_with_a_changed_task_is_refused(finished_run):
    refused([f"resume={finished_run}", "task=countdown"], finished_run.parent, ["task=countdown"], watch=finished_run)


def test_resuming_a_finished_run_says_so_in_one_line(finished_run):
    before = snapshot(finished_run)
    for args in ([f"resume={finished_run}"], [*SIM, "total_steps=3", f"hydra.run.dir={finished_run}"]):
        proc = run_cli(args, cwd=finished_run.parent, check=False)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 0 and len(lines) <= 2, proc.stderr[-2000:]
        assert "already at step 4" in lines[-1] and "total_steps" in lines[-1], lines
    assert snapshot(finished_run) == before


def _jsonl(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_data_and_model_errors_name_the_file_and_leave_no_directory(tmp_path):
    good = b'{"question": "1+1", "answer": "#### 2"}\n'
    empty = _jsonl(tmp_path / "empty.jsonl", b"")
    latin1 = _jsonl(tmp_path / "latin1.jsonl", good * 2 + '{"question": "caf\xe9", "answer": "1"}\n'.encode("latin-1"))
    task = ["task=jsonl", "task.num_eval=1", "eval.num_prompts=1"]
    new = tmp_path / "new_run"
    refused([*SIM, *task, f"task.path={empty}", f"hydra.run.dir={new}"], tmp_path, [str(empty), "no rows"],
            spawn=True)
    refused([*SIM, *task, f"task.path={latin1}", f"hydra.run.dir={new}"], tmp_path, [f"{latin1}:3", "UTF-8"])
    model = tmp_path / "model_without_tokenizer"
    shutil.copytree(ROOT / "assets" / "tiny-arith", model)
    for f in model.glob("tokenizer*"):
        f.unlink()
    refused([*SIM, f"model.path={model}", f"hydra.run.dir={new}"], tmp_path, [f"model.path='{model}'", "no tokenizer"])


def test_a_missing_or_unreadable_data_file_is_refused_before_hydra_makes_the_run_directory(tmp_path):
    """Checked by the preflight (not when the job loads its data), for every task and every sweep point."""
    from rlharness.config.schema import ConfigError
    from rlharness.launch.preflight import preflight

    csv = tmp_path / "rows.csv"
    csv.write_text("question,answer\n1+1,2\n")
    shipped = "task.path=assets/tiny-chat/data/math_train.jsonl"
    cases = [
        (["task=jsonl", f"task.path={tmp_path / 'missing.jsonl'}"], r"^task.path='.*missing.jsonl': no such file"),
        (["task=jsonl", f"task.path={csv}"], r"^task.path='.*rows.csv': unknown file type '.csv'"),
        (["task=jsonl", shipped, f"task.eval_path={tmp_path / 'held_out.jsonl'}"], r"^task.eval_path='.*held_out"),
        (["experiment=arith_mix", "task@tasks.unpadded.task=jsonl", f"tasks.unpadded.task.path={csv}"],
         r"^tasks.unpadded.task.path='.*rows.csv': unknown file type"),
        (["-m", "task=jsonl", f"task.path={csv}", "seed=1,2"], r"^task.path='.*rows.csv'"),
    ]
    for args, match in cases:
        with pytest.raises(ConfigError, match=match):
            preflight(["train.py", *args, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv"]


class Payload:
    """What an attacker would plant: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_checkpoint_does_not_execute(finished_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    marker = tmp_path / "pwned"
    trainer_pt = latest_checkpoint(run_dir)[1] / "trainer.pt"
    torch.save({"step": 4, "producer": Payload(marker)}, trainer_pt)
    # The payload is real: an unrestricted load runs it (proved on a copy, then the marker removed).
    probe = tmp_path / "probe.pt"
    shutil.copy(trainer_pt, probe)
    torch.load(probe, weights_only=False)
    assert marker.exists()
    marker.unlink()

    line = refused([f"resume={run_dir}", "total_steps=6"], tmp_path, [str(trainer_pt), "posix.system"],
                   watch=run_dir)
    assert "not code" in line
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="posix.system"):
        load_state(trainer_pt)
    # DeepSpeed's files are screened the same way before DeepSpeed (weights_only=False) reads them.
    ds_dir = tmp_path / "ds"
    ds_dir.mkdir()
    torch.save({"module": {}, "client": Payload(marker)}, ds_dir / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointError, match="mp_rank_00_model_states.pt"):
        check_state_files(ds_dir)
    assert not marker.exists()


def test_every_shipped_config_passes_the_preflight():
    """The checks refuse typos, never the project's own groups and experiments."""
    from rlharness.launch.preflight import compose_checked

    choices = [f"{d.name}={f.stem}" for d in sorted((ROOT / "conf").iterdir()) if d.is_dir()
               for f in sorted(d.glob("*.yaml"))]
    for choice in choices:
        extra = ["cluster=local_ray"] if choice.startswith(("backend=deepspeed", "backend=fsdp2", "experiment=")) else []
        try:
            compose_checked([choice, *extra])
        except Exception as exc:  # noqa: BLE001 - report which choice
            # A choice that is refused on its own for a stated reason (e.g. it needs another group) is fine;
            # an unknown-key refusal of a shipped file is not.
            assert "has no key" not in str(exc) and "could not" not in str(exc).lower(), (choice, str(exc))


# ----------------------------------------------------------------------------- models that cannot run
def _model_copy(tmp_path: Path, name: str, source: str = "tiny-arith") -> Path:
    model = tmp_path / name
    shutil.copytree(ROOT / "assets" / source, model)
    return model


def test_a_task_asking_for_a_chat_template_refuses_a_model_without_one(tmp_path):
    # chat_math's task asks for the template (task.apply_chat_template: true); tiny-arith has none.
    refused([*SIM, "experiment=chat_math", "model=default", f"hydra.run.dir={tmp_path / 'new'}"], tmp_path,
            ["task.apply_chat_template=true", "model.path='assets/tiny-arith'", "no chat template"])
    # In a multi-task run the key is the task's own.
    data = ROOT / "assets" / "tiny-chat" / "data" / "math_train.jsonl"
    refused([*SIM, "+task@tasks.chat.task=jsonl", f"tasks.chat.task.path={data}",
             "tasks.chat.task.apply_chat_template=true", "+task@tasks.sums.task=arithmetic",
             f"hydra.run.dir={tmp_path / 'new'}"], tmp_path,
            ["tasks.chat.task.apply_chat_template=true", "assets/tiny-arith", "no chat template"])


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused_before_work(tmp_path):
    # tiny-arith's weights (24 embedding rows) with tiny-chat's byte-level BPE tokenizer (512 tokens):
    # the arithmetic prompts encode to ids the embedding does not have.
    model = _model_copy(tmp_path, "mismatched")
    for f in model.glob("tokenizer*"):
        f.unlink()
    for f in (ROOT / "assets" / "tiny-chat").glob("tokenizer*"):
        shutil.copy(f, model / f.name)
    line = refused([*SIM, f"model.path={model}", f"hydra.run.dir={tmp_path / 'new'}"], tmp_path,
                   [f"model.path='{model}'", "vocabulary has 24 tokens", "task=arithmetic prompt 0",
                    "512 tokens"])
    assert "token id" in line


def test_a_gguf_file_as_model_path_names_the_conversion(tmp_path):
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))  # the format's magic and version
    refused([*SIM, f"model.path={gguf}", f"hydra.run.dir={tmp_path / 'new'}"], tmp_path,
            [f"model.path='{gguf}'", "GGUF file", f"scripts/fetch_smollm2.py --gguf {gguf}"])
    # A folder holding only a GGUF file is named the same way.
    folder = tmp_path / "gguf_folder"
    folder.mkdir()
    shutil.copy(gguf, folder / gguf.name)
    refused([*SIM, f"model.path={folder}", f"hydra.run.dir={tmp_path / 'new'}"], tmp_path,
            ["GGUF file", str(folder / gguf.name)])


CUSTOM_CONFIG = '''from transformers import LlamaConfig


class CustomLlamaConfig(LlamaConfig):
    model_type = "custom_llama"
'''
CUSTOM_MODEL = '''from transformers import LlamaForCausalLM

from .configuration_custom import CustomLlamaConfig


class CustomLlamaForCausalLM(LlamaForCausalLM):
    config_class = CustomLlamaConfig
'''


def test_a_model_with_its_own_code_needs_trust_remote_code(tmp_path):
    import json

    from rlharness.config.schema import ModelConf
    from rlharness.model.load import check_model_files, load_model_config

    model = _model_copy(tmp_path, "custom")
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="custom_llama", architectures=["CustomLlamaForCausalLM"],
                  auto_map={"AutoConfig": "configuration_custom.CustomLlamaConfig",
                            "AutoModelForCausalLM": "modeling_custom.CustomLlamaForCausalLM"})
    (model / "config.json").write_text(json.dumps(config))
    (model / "configuration_custom.py").write_text(CUSTOM_CONFIG)
    (model / "modeling_custom.py").write_text(CUSTOM_MODEL)
    refused([*SIM, f"model.path={model}", f"hydra.run.dir={tmp_path / 'new'}"], tmp_path,
            [f"model.path='{model}'", "auto_map", "AutoModelForCausalLM -> modeling_custom.CustomLlamaForCausalLM",
             "model.trust_remote_code=true"])
    # With the flag the folder passes, and its own config class is what loads.
    trusted = ModelConf(path=str(model), trust_remote_code=True)
    assert check_model_files(trusted) == model.resolve()
    assert type(load_model_config(trusted)).__name__ == "CustomLlamaConfig"
    # A folder whose auto_map names a class transformers has built in runs without the flag.
    plain = _model_copy(tmp_path, "plain_with_auto_map")
    config = json.loads((plain / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_custom.CustomLlamaConfig"}
    (plain / "config.json").write_text(json.dumps(config))
    assert check_model_files(ModelConf(path=str(plain))) == plain.resolve()
