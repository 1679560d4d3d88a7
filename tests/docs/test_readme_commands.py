"""Every command line the README shows still runs.

The README's quickstart and "Command lines" blocks are read from the README itself. Each
`train.py`, `evaluate.py` and `python -m rlharness.export` line runs for real through the real
command line, shortened (`SHORT`: 2 steps of 4 groups, 4 eval prompts); the README's example run
directories become this test's short default run. A line that needs what this test cannot have
(a Slurm cluster, vLLM's venv, a model fetched from PyPI, a GPU) is composed and validated
instead, and the test file that runs that part for real must exist (`ELSEWHERE`).
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest

from rlharness.logging_utils.metrics import read_metrics
from tests.helpers import compose_conf, run_cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHORT = {"total_steps": "2", "batch_size": "4", "sampler.prompt_repeat_k": "4", "eval.num_prompts": "4",
         "eval_every": "0", "save_every": "0", "logger": "none"}
# The README's example run directories (stand-ins for the user's own).
EXAMPLE_RUNS = ("outputs/2026-11-22/10-31-07", "outputs/arith80")
# What a line needs that this test does not run, and the test file that runs it for real.
ELSEWHERE = {
    "slurm": ("tests/slurm/test_train_on_slurm.py", lambda argv: "cluster=slurm" in argv),
    "vllm": ("tests/engine/test_vllm_engine.py",
             lambda argv: argv[0].startswith(".venv-vllm") or "engine=vllm" in argv),
    "a fetched model": ("tests/integration/test_real_model.py",
                        lambda argv: any(a in argv for a in ("experiment=smollm2_arith", "model=smollm2"))),
    "a GPU and your own checkpoint": ("tests/integration/test_real_model.py",
                                      lambda argv: any(a.endswith("device=cuda") for a in argv)),
}


def readme_section(text: str, title: str) -> str:
    """The body of the README's `## title` section."""
    return re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M).group(1)


def readme_blocks(text: str) -> dict[str, str]:
    """The fenced code of each `## ` section (sections without one are left out)."""
    blocks = {}
    for title, body in re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.S | re.M):
        code = re.findall(r"```(?:bash)?\n(.*?)```", body, re.S)
        if code:
            blocks[title.strip()] = "\n".join(code)
    return blocks


def commands(block: str) -> list[list[str]]:
    """Each command of a block as argv (comments dropped, `&&` chains split)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words or not words[0].endswith(("python", "bash")):
            continue  # log lines shown as output
        chain = [list(g) for sep, g in itertools.groupby(words, lambda w: w == "&&") if not sep]
        out += chain
    return out


def readme_commands() -> list[list[str]]:
    blocks = readme_blocks(README.read_text())
    found = commands(blocks["Quickstart (fresh machine, Python 3.11)"]) + commands(blocks["Command lines"])
    assert len(found) > 15, found
    return found


def needs(argv: list[str]) -> str | None:
    return next((what for what, (_, test) in ELSEWHERE.items() if test(argv)), None)


def shortened(args: list[str], **more: str) -> list[str]:
    """`args` with SHORT's values in place of theirs (and `more`), the rest kept in order."""
    want = {**SHORT, **more}
    kept = [a for a in args if a.split("=", 1)[0] not in want]
    return kept + [f"{k}={v}" for k, v in want.items()]


def test_the_readme_is_a_screen_not_a_manual():
    text = README.read_text()
    assert len(text.splitlines()) <= 250 and len(text.encode()) <= 20_000


def test_the_readme_test_line_is_what_ci_runs():
    """`.ci/run` runs the README's test command (as two streams): each of its parts is there."""
    test_line = next(c for c in readme_blocks(README.read_text())["Quickstart (fresh machine, Python 3.11)"]
                     .splitlines() if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    for part in shlex.split(test_line, comments=True):
        if part != "&&":
            assert part in ci, f"{part!r} of the README's test line is not in .ci/run"


def test_every_line_that_is_not_run_here_composes_and_is_run_by_its_own_test():
    composed = 0
    for argv in readme_commands():
        what = needs(argv)
        if what is None:
            continue
        assert (ROOT / ELSEWHERE[what][0]).exists(), ELSEWHERE[what][0]
        if "train.py" in argv:
            args = [a for a in argv[argv.index("train.py") + 1:] if a != "-m"]
            sweeps = [[f"{k}={v}" for v in vs.split(",")] for k, _, vs in (a.partition("=") for a in args)]
            for overrides in itertools.product(*sweeps):  # every point of a sweep
                compose_conf(list(overrides))
                composed += 1
    assert composed >= 4


def test_the_config_groups_table_lists_every_option_in_conf():
    """The README's table names each group of `conf/` once, with exactly the options it holds."""
    table = readme_section(README.read_text(), "Config groups")
    rows = dict(re.findall(r"^\| `([\w/]+)` \| (.+?) \|", table, re.M))
    groups = sorted(d.name for d in (ROOT / "conf").iterdir() if d.is_dir())
    assert sorted(rows) == groups
    for group in groups:
        options = {f.stem for f in (ROOT / "conf" / group).glob("*.yaml")}
        assert set(re.findall(r"`([\w.-]+)`", rows[group])) == options, f"README's {group} row"


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The README's first command, shortened: the run its example run directories stand for."""
    run_dir = tmp_path_factory.mktemp("readme") / "default"
    argv = readme_commands()[1]  # `bash scripts/setup.sh && .venv/bin/python train.py`: its train.py
    assert argv[-1] == "train.py", argv
    run_cli(shortened([]) + [f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    return run_dir


def local_lines(script: str) -> list[list[str]]:
    """The README's lines of `script` that run here, as the arguments after it."""
    return [argv[argv.index(script) + 1:] for argv in readme_commands() if needs(argv) is None and script in argv]


def localised(args: list[str], run: Path, out: Path) -> list[str]:
    """The README's example paths replaced: its run directories by `run`, `exported/...` by `out`."""
    def one(a: str) -> str:
        key, eq, value = a.rpartition("=") if a.startswith("resume=") else ("", "", a)
        if value in EXAMPLE_RUNS:
            value = str(run)
        elif value.startswith("exported/"):
            value = str(out)
        return f"{key}{eq}{value}"
    return [one(a) for a in args]


def test_the_readme_shows_the_lines_users_type_most():
    lines = [" ".join(a) for a in local_lines("train.py")]
    assert len(lines) >= 12, lines
    for shown in ("strategy=async", "mode=disagg", "-m strategy", "resume=", "model.lora.rank", "gateway_tools"):
        assert any(shown in line for line in lines), shown


@pytest.mark.slow
@pytest.mark.parametrize("args", local_lines("train.py"), ids=lambda a: " ".join(a)[:60] or "default")
def test_the_train_line_runs_shortened(args, default_run, tmp_path):
    if not args:
        return  # the default run: `default_run` itself
    if args == ["--help"]:
        assert "strategy" in run_cli(args, cwd=tmp_path).stdout
        return
    if "explain=true" in args:  # prints what the config means per step and starts nothing
        where = tmp_path / "run"
        assert run_cli([*args, f"hydra.run.dir={where}"], cwd=tmp_path).stdout.startswith("per step:")
        assert not where.exists()
        return
    if any(a.startswith("resume=") for a in args):  # continue the short default run one step further
        run_cli(shortened(localised(args, default_run, tmp_path), total_steps="3"), cwd=tmp_path)
        assert read_metrics(default_run / "metrics.jsonl")[-1]["step"] == 3
        return
    where = tmp_path / "run"
    placement = f"hydra.sweep.dir={where}" if "-m" in args else f"hydra.run.dir={where}"
    run_cli([*shortened(args), placement], cwd=tmp_path, timeout_s=900)
    runs = [p.parent for p in where.rglob("metrics.jsonl")]
    assert runs, f"train.py {' '.join(args)} wrote no run"
    for run in runs:
        assert read_metrics(run / "metrics.jsonl")[-1]["step"] == 2, run


@pytest.mark.slow
def test_the_evaluate_and_export_lines_run(default_run, tmp_path):
    evaluate = local_lines("evaluate.py")
    export = [argv[argv.index("rlharness.export") + 1:] for argv in readme_commands() if "rlharness.export" in argv]
    assert evaluate and export
    for args in evaluate:
        run_cli([*localised(args, default_run, tmp_path), "eval.num_prompts=4"], cwd=tmp_path, script="evaluate.py")
        assert list((tmp_path / "outputs" / "evaluate").rglob("summary.json"))
    for args in export:
        out = tmp_path / "exported"
        run_cli(localised(args, default_run, out), cwd=tmp_path, script="rlharness.export")
        assert (out / "config.json").exists()
