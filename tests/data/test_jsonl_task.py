import json

import pytest

from rlharness.config.schema import ConfigError, JsonlTaskConf
from rlharness.data import build_task
from rlharness.data.jsonl import DataFileError
from rlharness.model.tiny import build_char_tokenizer

GSM8K_ROWS = [
    {"question": f"Tom has {i} apples and buys 1,000 more. How many?",
     "answer": f"He has {i} + 1000 = <<{i}+1000={i + 1000}>>{i + 1000} apples.\n#### {i + 1000:,}"}
    for i in range(10)
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_jsonl_prompts_and_answers(tmp_path):
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    task = build_task(JsonlTaskConf(path=path, num_eval=3))
    assert [r.prompt_text for r in task.train] == [r["question"] for r in GSM8K_ROWS[:7]]
    assert [r.prompt_text for r in task.eval] == [r["question"] for r in GSM8K_ROWS[7:]]
    assert task.train[0].label == {"answer": "1,000"}
    assert task.eval[-1].label == {"answer": "1,009"}
    assert [r.index for r in task.eval] == [0, 1, 2]


def test_parquet_file_with_custom_fields_and_template(tmp_path):
    import datasets

    rows = [{"problem": f"What is {i}*2?", "solution": str(2 * i), "topic": "mult"} for i in range(6)]
    path = tmp_path / "data.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    conf = JsonlTaskConf(path=str(path), num_eval=2, prompt_field="problem", answer_field="solution",
                         prompt_template="[{topic}] {prompt} Answer:")
    task = build_task(conf)
    assert task.train[1].prompt_text == "[mult] What is 1*2? Answer:"
    assert task.eval[0].prompt_text == "[mult] What is 4*2? Answer:"
    assert [r.label["answer"] for r in task.eval] == ["8", "10"]


def test_eval_path_gives_the_whole_eval_split(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS[:4])
    evl = _write_jsonl(tmp_path / "test.jsonl", GSM8K_ROWS[4:])
    task = build_task(JsonlTaskConf(path=train, eval_path=evl, num_eval=1))
    assert len(task.train) == 4 and len(task.eval) == 6


def test_malformed_jsonl_line_is_reported_as_path_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(r) for r in GSM8K_ROWS[:3]] + ['{"question": "x", "answer": '] + [json.dumps(GSM8K_ROWS[3])]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFileError, match=rf"{path}:4: invalid JSON"):
        build_task(JsonlTaskConf(path=str(path), num_eval=1))


def test_missing_field_names_the_field_and_line(tmp_path):
    rows = GSM8K_ROWS[:2] + [{"question": "no answer here"}] + GSM8K_ROWS[2:4]
    path = _write_jsonl(tmp_path / "missing.jsonl", rows)
    with pytest.raises(DataFileError, match=r"missing\.jsonl:3: missing field 'answer'"):
        build_task(JsonlTaskConf(path=path, num_eval=1))


def test_parquet_null_field_names_the_row(tmp_path):
    import datasets

    rows = [{"question": "a", "answer": "#### 1"}, {"question": None, "answer": "#### 2"}]
    path = tmp_path / "nulls.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    with pytest.raises(DataFileError, match=r"nulls\.parquet: row 1: missing field 'question'"):
        build_task(JsonlTaskConf(path=str(path), num_eval=1))


def test_missing_file_names_task_path(tmp_path):
    with pytest.raises(ConfigError, match=r"task\.path=.*nowhere\.jsonl.*no such file"):
        build_task(JsonlTaskConf(path=str(tmp_path / "nowhere.jsonl")))


def test_num_eval_that_leaves_no_training_rows_is_refused(tmp_path):
    path = _write_jsonl(tmp_path / "small.jsonl", GSM8K_ROWS[:3])
    with pytest.raises(ConfigError, match="task.num_eval=3 leaves no training rows"):
        build_task(JsonlTaskConf(path=path, num_eval=3))


CHAT_TEMPLATE = (
    "{% for m in messages %}(({{ m['content'] }})){% endfor %}"
    "{% if add_generation_prompt %}=#{% endif %}"
)


def test_chat_template_applied_when_the_tokenizer_has_one(tmp_path):
    path = _write_jsonl(tmp_path / "g.jsonl", GSM8K_ROWS[:3])
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    task = build_task(JsonlTaskConf(path=path, num_eval=1), tokenizer=tok)
    assert task.train[0].prompt_text == f"(({GSM8K_ROWS[0]['question']}))=#"
    off = build_task(JsonlTaskConf(path=path, num_eval=1, apply_chat_template=False), tokenizer=tok)
    assert off.train[0].prompt_text == GSM8K_ROWS[0]["question"]


def test_no_chat_template_leaves_the_prompt_alone(tmp_path):
    path = _write_jsonl(tmp_path / "g.jsonl", GSM8K_ROWS[:3])
    tok = build_char_tokenizer()
    assert not tok.chat_template
    task = build_task(JsonlTaskConf(path=path, num_eval=1), tokenizer=tok)
    assert task.train[0].prompt_text == GSM8K_ROWS[0]["question"]
    # Unless the task asks for the template: then the tokenizer without one is refused, by key.
    with pytest.raises(ConfigError, match=r"task.apply_chat_template=true but model.path=.* has no chat template"):
        build_task(JsonlTaskConf(path=path, num_eval=1, apply_chat_template=True), tokenizer=tok)
    tok.chat_template = CHAT_TEMPLATE
    asked = build_task(JsonlTaskConf(path=path, num_eval=1, apply_chat_template=True), tokenizer=tok)
    assert asked.train[0].prompt_text == f"(({GSM8K_ROWS[0]['question']}))=#"


def test_a_glob_pattern_reads_every_shard_in_name_order(tmp_path):
    """A split sharded as Hugging Face writes it (`train-0000N-of-0000M.parquet`), or JSONL shards."""
    import datasets

    (tmp_path / "pq").mkdir()
    for n, part in ((1, GSM8K_ROWS[5:]), (0, GSM8K_ROWS[:5])):  # the second shard written first
        datasets.Dataset.from_list(part).to_parquet(str(tmp_path / "pq" / f"train-0000{n}-of-00002.parquet"))
    task = build_task(JsonlTaskConf(path=str(tmp_path / "pq" / "train-*.parquet"), num_eval=3))
    assert [r.prompt_text for r in (*task.train, *task.eval)] == [r["question"] for r in GSM8K_ROWS]
    assert task.train[5].source == f"{tmp_path}/pq/train-00001-of-00002.parquet: row 0"
    (tmp_path / "jl").mkdir()
    _write_jsonl(tmp_path / "jl" / "a.jsonl", GSM8K_ROWS[:4])
    _write_jsonl(tmp_path / "jl" / "b.jsonl", GSM8K_ROWS[4:])
    task = build_task(JsonlTaskConf(path=str(tmp_path / "jl" / "*.jsonl"), num_eval=2))
    assert [r.prompt_text for r in (*task.train, *task.eval)] == [r["question"] for r in GSM8K_ROWS]
    assert task.eval[0].source == f"{tmp_path}/jl/b.jsonl:5"


def test_a_directory_a_pattern_that_matches_nothing_and_mixed_formats_are_refused(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(ConfigError, match=r"a directory; name its files, e.g. task.path='.*/d/\*.parquet'"):
        build_task(JsonlTaskConf(path=str(tmp_path / "d")))
    with pytest.raises(ConfigError, match="the pattern matches no file"):
        build_task(JsonlTaskConf(path=str(tmp_path / "d" / "*.jsonl")))
    _write_jsonl(tmp_path / "d" / "a.jsonl", GSM8K_ROWS)
    (tmp_path / "d" / "b.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match="matches both JSONL and Parquet files"):
        build_task(JsonlTaskConf(path=str(tmp_path / "d" / "*")))
