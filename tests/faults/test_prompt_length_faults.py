"""Over-long prompts are refused or dropped when the data loads, never handed to the engine.

The tiny model has 128 positions and answers in at most agent.sampling.max_tokens=8 tokens,
so the default limit is 120 prompt tokens.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlharness.config.schema import ConfigError
from rlharness.data.base import PromptRow
from rlharness.data.prompt_length import PromptMeter, check_split
from rlharness.logging_utils.ledger import read_ledger
from rlharness.core.run_dir import RunDir
from tests.helpers import run_cli, run_in_process


def _write(path: Path, questions: list[str]) -> None:
    path.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in questions))


def _task(tmp_path: Path, questions: list[str]) -> list[str]:
    _write(tmp_path / "train.jsonl", questions)
    _write(tmp_path / "eval.jsonl", [f"{i:03d}+001=" for i in range(4)])
    return ["engine=sim", "backend=sim", "task=jsonl", f"task.path={tmp_path / 'train.jsonl'}",
            f"task.eval_path={tmp_path / 'eval.jsonl'}", "task.num_eval=4", "eval.num_prompts=4", "batch_size=2",
            "sampler.prompt_repeat_k=2", "total_steps=2", "logger=none", "save_every=0"]


@pytest.mark.timeout(300)
def test_a_10_mb_row_is_refused_at_load_with_its_file_and_line(tmp_path):
    questions = [f"{i:03d}+001=" for i in range(12)]
    questions[4] = "1" * 10_000_000  # line 5
    questions[9] = "2" * 300  # line 10
    proc = run_cli(_task(tmp_path, questions) + [f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                   check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (f"2 of 12 train prompts of task jsonl are longer than task.max_prompt_tokens=120 (first: "
            f"{tmp_path / 'train.jsonl'}:5, at least ") in out
    assert "set task.long_prompts=drop" in out
    assert not RunDir(tmp_path / "run").metrics.exists()  # refused before anything ran


@pytest.mark.timeout(300)
def test_long_prompts_are_dropped_when_asked_and_never_drawn(tmp_path, caplog):
    questions = [f"{i:03d}+001=" for i in range(12)]
    long_rows = {3: "3" * 200, 7: "7+" * 100}
    for i, q in long_rows.items():
        questions[i] = q
    with caplog.at_level(logging.WARNING, logger="rlharness.data.prompt_length"):
        run_in_process(tmp_path / "run", _task(tmp_path, questions) + ["task.long_prompts=drop", "total_steps=5"])
    assert (f"2 of 12 train prompts of task jsonl are longer than task.max_prompt_tokens=120 (first: "
            f"{tmp_path / 'train.jsonl'}:4, 200 tokens): left out (task.long_prompts=drop)") in caplog.text
    trained, dropped = read_ledger(tmp_path / "run")
    assert len(trained) == 5 * 2 * 2 and dropped == []
    assert not {r["prompt_index"] for r in trained} & set(long_rows)  # drawn only from the 10 that fit


def test_an_explicit_limit_and_the_bounds_agree_with_the_tokenizer():
    """The byte and vocabulary bounds only skip encoding; the decision is the same as counting."""
    encode = lambda text: list(text.encode())  # one token per byte  # noqa: E731
    meter = PromptMeter(encode, longest_token_chars=2)
    rows = [PromptRow(index=i, prompt_text="x" * n, source=f"f.jsonl:{i + 1}") for i, n in enumerate([5, 30, 31, 500])]
    assert [r.index for r in check_split(rows, "train", "t", 30, meter, "drop")] == [0, 1]
    with pytest.raises(ConfigError, match=r"2 of 4 train prompts of task t are longer than task.max_prompt_tokens="
                                          r"30 \(first: f.jsonl:3, 31 tokens\)"):
        check_split(rows, "train", "t", 30, meter, "refuse")
    with pytest.raises(ConfigError, match="none would be left"):
        check_split(rows[2:], "train", "t", 30, meter, "drop")
