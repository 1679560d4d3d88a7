"""Hostile data rows are refused when the data loads, naming `file:line` (issue 22, item 9): before,
an answer `NaN` became the label "None" (and `#### None` scored 1), `1e309` failed inside `datasets`
with no line, an empty prompt passed and crashed the agent loop mid-run."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlharness.config.schema import JsonlTaskConf
from rlharness.data.jsonl import DataFileError, load_jsonl_task
from tests.faults.test_refused_input import SIM, refused

pytestmark = [pytest.mark.timeout(300)]

GOOD = '{"question": "1+1", "answer": "#### 2"}\n'


def task_file(tmp_path: Path, bad_row: str) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(GOOD + bad_row + "\n" + GOOD * 3)
    return path


@pytest.mark.parametrize("row, expect", [
    ('{"question": "2+2", "answer": NaN}', ["field 'answer' is NaN", "not a finite number"]),
    ('{"question": "2+2", "answer": 1e309}', ["field 'answer' is 1e309", "not a finite number"]),
    ('{"question": "2+2", "answer": -Infinity}', ["-Infinity"]),
    ('{"question": "2+2", "answer": "4", "meta": {"w": [1, NaN]}}', ["field 'meta.w.1' is NaN"]),  # any field
    ('{"question": "", "answer": "4"}', ["field 'question' is empty"]),
    ('{"question": "   ", "answer": "4"}', ["field 'question' is empty"]),
    ('{"question": "2+2", "answer": ""}', ["field 'answer' is empty"]),
    ('{"question": "2+2", "answer": "the sum is #### "}', ["no answer after the delimiter '####'"]),
    ('{"question": "2+2", "answer": null}', ["missing field 'answer'"]),
    ('{"question": null, "answer": "4"}', ["missing field 'question'"]),
    ('{"question": "2+2", "answer": ["4"]}', ["field 'answer' is list"]),
    ('{"question": "2+2", "answer": true}', ["field 'answer' is bool"]),
    ('{"question": "2+2", "answer": {"v": 4}}', ["field 'answer' is dict"]),
    ('{"question": "2+2"}', ["missing field 'answer'"]),
    ('[' * 100000 + ']' * 100000, ["nested too deeply"]),
])
def test_a_hostile_row_is_refused_naming_its_line(tmp_path, row, expect):
    path = task_file(tmp_path, row)
    with pytest.raises(DataFileError) as err:
        load_jsonl_task(JsonlTaskConf(path=str(path), num_eval=1))
    assert str(err.value).startswith(f"{path}:2: "), str(err.value)
    for word in expect:
        assert word in str(err.value), str(err.value)


def test_a_template_that_cannot_render_a_row_names_it(tmp_path):
    path = task_file(tmp_path, '{"question": "2+2", "answer": "4"}')
    with pytest.raises(DataFileError, match=rf"^{path}:1: task.prompt_template='{{question:d}}' cannot render"):
        load_jsonl_task(JsonlTaskConf(path=str(path), num_eval=1, prompt_template="{question:d}"))


def test_answers_are_kept_exactly_as_written(tmp_path):
    """`datasets` would read the column as floats (1 -> 1.0) once any row holds a fraction."""
    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "a", "answer": 1}\n{"question": "b", "answer": 1.5}\n'
                    '{"question": "c", "answer": 12345678901234567890123}\n{"question": "d", "answer": "x"}\n')
    data = load_jsonl_task(JsonlTaskConf(path=str(path), num_eval=1))
    assert [r.label["answer"] for r in data.train + data.eval] == ["1", "1.5", "12345678901234567890123", "x"]


def test_a_nan_answer_is_refused_on_the_command_line(tmp_path):
    path = task_file(tmp_path, '{"question": "2+2", "answer": NaN}')
    refused([*SIM, "task=jsonl", f"task.path={path}", "task.num_eval=1", "eval.num_prompts=1",
             f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, [f"{path}:2", "NaN"])
