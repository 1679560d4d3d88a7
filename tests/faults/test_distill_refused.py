"""On-policy distillation's bad input (issue 42): one `error:` line naming the key, exit 2, before anything
starts; a resumed run keeps its teacher."""

from __future__ import annotations

import json
import shutil

import pytest

from rlharness.config.schema import ConfigError
from rlharness.launch.preflight import compose_checked
from tests.faults.test_refused_input import SIM, refused
from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.timeout(600)]

TEACHER = str(ROOT / "assets" / "tiny-arith-teacher")


@pytest.mark.parametrize("overrides, expect", [
    (["algo=opd"], ["algo=opd needs a teacher", "algo.teacher.path"]),
    (["algo=opd", f"algo.teacher.path={TEACHER}", "algo.teacher.coef=0"], ["algo.teacher.coef=0", "> 0"]),
    ([f"algo.teacher.path={TEACHER}", "algo.teacher.coef=-0.5"], ["algo.teacher.coef=-0.5", ">= 0"]),
    ([f"algo.teacher.path={TEACHER}", "algo.teacher.coef=nan"], ["algo.teacher.coef=nan", "finite"]),
    ([f"algo.teacher.path={TEACHER}", "algo.teacher.coef=inf"], ["algo.teacher.coef=inf", "finite"]),
    ([f"algo.teacher.path={TEACHER}", "algo.teacher.dtype=float16"], ["algo.teacher.dtype=", "bfloat16"]),
    (["algo=ppo", f"algo.teacher.path={TEACHER}"], ["algo.teacher.path", "gae"]),
])
def test_refused_by_the_config(overrides, expect):
    with pytest.raises(ConfigError) as err:
        compose_checked(overrides)
    for word in expect:
        assert word in str(err.value), str(err.value)


def test_opd_allows_one_sample_per_prompt():
    """No group baseline: prompt_repeat_k=1 is fine with algo=opd (refused for grpo)."""
    compose_checked(["algo=opd", f"algo.teacher.path={TEACHER}", "sampler.prompt_repeat_k=1"])


def _folder_like_teacher(tmp_path, name: str, **config_changes):
    folder = tmp_path / name
    shutil.copytree(TEACHER, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("case", ["missing", "not_causal", "remote_code", "other_tokenizer", "opd_without",
                                  "coef_negative"])
def test_refused_on_the_command_line_with_exit_2_and_no_directory(tmp_path, case):
    work = tmp_path / "work"
    work.mkdir()
    if case == "missing":
        args, expect = ["algo=opd", "algo.teacher.path=no/such/teacher"], ["algo.teacher.path", "no/such/teacher"]
    elif case == "not_causal":
        folder = _folder_like_teacher(tmp_path, "cls", architectures=["LlamaForSequenceClassification"])
        args, expect = ["algo=opd", f"algo.teacher.path={folder}"], ["algo.teacher.path", "not a causal language model"]
    elif case == "remote_code":
        folder = _folder_like_teacher(tmp_path, "remote", model_type="my_teacher",
                                      auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
        args, expect = ["algo=opd", f"algo.teacher.path={folder}"], ["algo.teacher.trust_remote_code"]
    elif case == "other_tokenizer":
        args, expect = (["algo=opd", f"algo.teacher.path={ROOT / 'assets' / 'tiny-chat'}"],
                        ["algo.teacher.path=", "tokenizers differ"])
    elif case == "opd_without":
        args, expect = ["algo=opd"], ["algo=opd needs a teacher"]
    else:
        args, expect = [f"algo.teacher.path={TEACHER}", "algo.teacher.coef=-1"], ["algo.teacher.coef=-1"]
    refused(["logger.mode=disabled", *args], work, expect)
    assert not (work / "outputs").exists()


@pytest.mark.parametrize("mode", [[], ["mode=disagg", "cluster=local_ray"]], ids=["colocated", "disagg"])
def test_a_teacher_encoding_the_task_otherwise_is_refused_before_anything_starts(tmp_path, mode):
    """The same vocabulary at the same ids and the same special tokens (preflight passes), but the teacher's
    normaliser reads every 1 as a 2: refused once the task's prompts are read, before the engines, the
    trainer, the teacher or (mode=disagg) Ray and its actors start, and the run directory is taken back."""
    folder = tmp_path / "renormalised"
    shutil.copytree(TEACHER, folder)
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["normalizer"] = {"type": "Replace", "pattern": {"String": "1"}, "content": "2"}
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    work = tmp_path / "work"
    work.mkdir()
    proc = run_cli(["logger.mode=disabled", *mode, "algo=opd", f"algo.teacher.path={folder}"], cwd=work, check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and lines[-1].startswith("error: algo.teacher.path="), proc.stderr[-3000:]
    assert "tokenizer encodes" in lines[-1] and "Traceback" not in proc.stderr
    said = proc.stdout + proc.stderr  # the log lines: nothing was started
    assert "starting Ray" not in said and "loading" not in said, said[-3000:]
    assert list(work.iterdir()) == []  # no run directory left


def test_resume_with_another_teacher_is_refused_and_with_its_own_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    run_cli([*SIM, "algo=opd", f"algo.teacher.path={TEACHER}", "total_steps=2", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path)
    other = _folder_like_teacher(tmp_path, "other_teacher")
    refused([f"resume={run_dir}", f"algo.teacher.path={other}", "total_steps=3"], tmp_path,
            ["algo.teacher.path", "fixed for a run"], watch=run_dir)
    run_cli([f"resume={run_dir}", "total_steps=3"], cwd=tmp_path)  # its own teacher, reloaded from its path
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "distill/reverse_kl" in r] == [1, 2, 3]
