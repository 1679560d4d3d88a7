"""Every file a command reads, refused in one line naming the file and what is wrong, exit 2, nothing
written: a checkpoint (truncated or another model's weights, a meta.json or trainer.pt without its keys or
with wrong types, a missing critic file) for `train.py resume=`, `evaluate.py resume=` and
`python -m rlharness.export`; an output path that is a file or a dangling symbolic link (all three), or
inside the run's checkpoints/ (export); a reward-model folder with a truncated safetensors file or a
pickle `.bin` that holds code, or one that needs its own code (the line names the key that allows it).

One real run (tiny model, torch backend, algo=ppo so that it has a critic, simulated engine) is copied
and damaged per case; `refused` (tests/faults/test_refused_input.py) checks the line, the exit status
and that the damaged run is byte for byte as it was."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlharness.config.schema import ConfigError, RewardModelJudgerConf
from rlharness.judger.reward_model import check_reward_model
from tests.faults.test_refused_input import snapshot
from tests.helpers import ROOT, run_cli
from tests.judger.test_learned_judgers import save_classifier

pytestmark = [pytest.mark.timeout(600)]

RUN = ["engine=sim", "backend=torch", "algo=ppo", "total_steps=2", "save_every=1", "eval_every=0", "batch_size=4",
       "sampler.prompt_repeat_k=2", "logger=none", "eval.num_prompts=4", "engine.time_per_token_s=0.0002"]
STEP = "checkpoints/step_00000002"


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("corrupt") / "run"
    run_cli([*RUN, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    assert (run_dir / STEP / "backend" / "critic" / "critic.safetensors").is_file()
    return run_dir


def refused_by(script: str, args: list[str], cwd: Path, expect: list[str], watch: Path | None = None) -> str:
    """`script` (train.py, evaluate.py or the export module) exits 2 with one `error:` line holding every
    `expect`, without a traceback; `watch` (a run) is unchanged and `cwd` has nothing new."""
    before = snapshot(watch) if watch is not None else None
    before_cwd = sorted(p.name for p in cwd.iterdir())
    proc = run_cli(args, cwd=cwd, check=False, timeout_s=300, script=script)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert lines and lines[-1].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for word in expect:
        assert word in lines[-1], lines[-1]
    if watch is not None:
        assert snapshot(watch) == before, "a refused command changed the run directory"
    assert sorted(p.name for p in cwd.iterdir()) == before_cwd, "a refused command left something behind"
    return lines[-1]


def damaged(ppo_run: Path, tmp_path: Path, damage) -> Path:
    run = tmp_path / "damaged"
    shutil.copytree(ppo_run, run)
    damage(run / STEP)
    return run


def _truncate(ckpt: Path) -> None:
    f = ckpt / "backend" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:3000])


def _foreign_weights(ckpt: Path) -> None:
    shutil.copy(ROOT / "assets" / "tiny-chat" / "model.safetensors", ckpt / "backend" / "model.safetensors")


@pytest.mark.parametrize("damage, expect", [
    (_truncate, ["backend/model.safetensors is not a readable safetensors file", "truncated"]),
    (_foreign_weights, ["backend/model.safetensors does not fit its config.json", "model.embed_tokens.weight",
                        "[512, 128]", "another model's weights"]),
])
def test_a_damaged_checkpoint_is_refused_by_resume_evaluate_and_export(ppo_run, tmp_path, damage, expect):
    run = damaged(ppo_run, tmp_path, damage)
    refused_by("train.py", [f"resume={run}", "total_steps=3"], tmp_path, expect, watch=run)
    refused_by("evaluate.py", [f"resume={run}"], tmp_path, [f"resume={run}", *expect], watch=run)
    refused_by("rlharness.export", [str(run), str(tmp_path / "exported")], tmp_path, expect, watch=run)


def _rewrite_meta(meta: dict):
    return lambda ckpt: (ckpt / "meta.json").write_text(json.dumps(meta))


def _trainer_state(change):
    def damage(ckpt: Path) -> None:
        state = torch.load(ckpt / "trainer.pt", weights_only=True)
        change(state)
        torch.save(state, ckpt / "trainer.pt")
    return damage


@pytest.mark.parametrize("damage, expect", [
    (_rewrite_meta({}), ["meta.json lacks 'step'"]),
    (_rewrite_meta({"step": "two", "model_version": 2}), ["meta.json: 'step' is 'two' (str), expected int"]),
    (_rewrite_meta({"step": 5, "model_version": 2}), ["meta.json: step is 5, its directory says 2"]),
    (lambda ckpt: (ckpt / "meta.json").write_text("[1, 2]"), ["meta.json holds a list"]),
    (_trainer_state(lambda s: s.pop("producer")), ["trainer.pt lacks 'producer'"]),
    (_trainer_state(lambda s: s.update(step="x")), ["trainer.pt: 'step' is 'x' (str), expected int"]),
    (_trainer_state(lambda s: s["rng"].pop("torch")), ["trainer.pt lacks 'torch'"]),
    (lambda ckpt: (ckpt / "backend" / "critic" / "critic.safetensors").unlink(),
     ["critic.safetensors is missing"]),
    (lambda ckpt: (ckpt / "backend" / "critic" / "critic.safetensors").write_bytes(b"\x00" * 10),
     ["critic/critic.safetensors is not a readable safetensors file"]),
])
def test_a_checkpoint_whose_state_files_are_not_ours_is_refused_on_resume(ppo_run, tmp_path, damage, expect):
    """Keys missing or of the wrong type were a KeyError after `.hydra/resumed-*` and the log were written
    (exit 1, a traceback); a meta.json of another layout was not read at all."""
    run = damaged(ppo_run, tmp_path, damage)
    refused_by("train.py", [f"resume={run}", "total_steps=3"], tmp_path, [str(run / STEP), *expect], watch=run)


def test_output_paths_that_cannot_be_folders_are_refused(ppo_run, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder\n")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "x")
    for path, what in ((a_file, "is a file"), (a_file / "sub", "is a file"),
                       (dangling, "is a symbolic link to")):
        for script, args in (("train.py", ["engine=sim", "backend=sim", "logger=none"]),
                             ("evaluate.py", ["engine=sim"])):
            refused_by(script, [*args, f"hydra.run.dir={path}"], tmp_path, [f"hydra.run.dir={path}", what])
        refused_by("rlharness.export", [str(ppo_run), str(path)], tmp_path, ["output folder", what], watch=ppo_run)
    assert not (tmp_path / "nowhere").exists()  # nothing made where the link points
    for inside in (ppo_run / "checkpoints" / "exported", ppo_run / STEP / "exported"):
        refused_by("rlharness.export", [str(ppo_run), str(inside)], tmp_path, ["inside the run's", "checkpoints"],
                   watch=ppo_run)


# ----------------------------------------------------------------------------- reward-model folders
def test_a_reward_model_folder_with_unreadable_or_unsafe_weights_is_refused(tmp_path):
    truncated = save_classifier(tmp_path / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ConfigError, match=r"judger.path=.*truncated/model.safetensors is not a readable safetensors"):
        check_reward_model(RewardModelJudgerConf(path=str(truncated)))

    # A pickle .bin whose unpickling would run a command: refused, and the command never runs.
    unsafe = save_classifier(tmp_path / "unsafe")
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    (unsafe / "model.safetensors").unlink()
    torch.save({"score.weight": Payload()}, unsafe / "pytorch_model.bin")
    with pytest.raises(ConfigError, match=r"pytorch_model.bin holds more than tensors and plain data"):
        check_reward_model(RewardModelJudgerConf(path=str(unsafe)))
    assert not marker.exists()

    foreign = save_classifier(tmp_path / "foreign")
    shutil.copy(save_classifier(tmp_path / "three", num_labels=3) / "model.safetensors", foreign / "model.safetensors")
    with pytest.raises(ConfigError, match=r"foreign/model.safetensors does not fit its config.json: score.weight"):
        check_reward_model(RewardModelJudgerConf(path=str(foreign)))


def test_a_reward_model_that_needs_its_own_code_names_the_judgers_key(tmp_path):
    folder = save_classifier(tmp_path / "custom")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="custom_llama_rm", auto_map={
        "AutoConfig": "configuration_custom.CustomConfig",
        "AutoModelForSequenceClassification": "modeling_custom.CustomForSequenceClassification"})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as err:
        check_reward_model(RewardModelJudgerConf(path=str(folder)))
    assert "judger.trust_remote_code=true" in str(err.value) and "model.trust_remote_code" not in str(err.value)
    assert "AutoModelForSequenceClassification -> modeling_custom" in str(err.value)
    with pytest.raises(ConfigError, match=r"judger\.reward_model\.trust_remote_code=true"):
        check_reward_model(RewardModelJudgerConf(path=str(folder)), "judger.reward_model")
    from tests.faults.test_refused_input import SIM, refused

    refused([*SIM, "judger=reward_model", f"judger.path={folder}"], tmp_path, ["judger.trust_remote_code=true"])


def test_the_export_module_refuses_in_its_own_process_too(ppo_run, tmp_path):
    """The plain `python -m rlharness.export` (not forked from the test's CLI server)."""
    proc = subprocess.run([sys.executable, "-m", "rlharness.export", str(ppo_run), str(ppo_run / "checkpoints" / "x")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: output folder")


# ----------------------------------------------------------------------------- data rows, found once the job runs
def test_a_corrupt_row_leaves_no_outputs_folder_and_no_change_to_a_run(tmp_path):
    """A data row is read once the job runs (Hydra has made outputs/<date>/<time>/ by then): the refusal
    takes back every folder the start made, outputs/ and outputs/<date>/ included, and a resumed run whose
    data file went bad is left as it was."""
    from tests.faults.test_judging_faults import write_task

    data = tmp_path / "data"
    task = [o for o in write_task(data, [str(i) for i in range(16)]) if o != "save_every=0"]
    run_dir = tmp_path / "run"
    run_cli([*task, "total_steps=2", "save_every=1", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    with open(data / "train.jsonl", "a") as fh:
        fh.write('{"question": "1+1=", "answer": NaN}\n')
    line = f"{data / 'train.jsonl'}:17"
    refused_by("train.py", task, tmp_path, [line, "NaN"])  # default directory: outputs/<date>/<time>
    assert not (tmp_path / "outputs").exists()
    refused_by("train.py", [f"resume={run_dir}", "total_steps=3"], tmp_path, [line, "NaN"], watch=run_dir)
