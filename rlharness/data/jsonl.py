"""`task=jsonl`: prompts and answers from a local JSONL or Parquet file.

The GSM8K layout works as is: `question` is the prompt, `answer` ends with
`#### <number>` and the label is the text after the last delimiter ({"answer": "72"}).
Field names, the prompt template (`str.format` over the row's fields, plus
`{prompt}` for `prompt_field`) and the delimiter come from `JsonlTaskConf`. With the
tokenizer's chat template the prompt is one user message with the generation prompt
appended (the template adds its system prompt, if any): `apply_chat_template` unset uses
it when there is one, `true` requires it (a model without is refused), `false` never.

Files are read with the `datasets` library. JSONL lines are first checked one by one
with `json.loads`, so a malformed row is reported as `path:line` (the `datasets`
error would name neither); Parquet rows are reported by row index.

Relative paths resolve against the current directory first, then the project root
(as `model.path`), so the data shipped in `assets/` works from any directory.

Split: eval = all of `eval_path` when given, else the last `num_eval` rows of `path`
(train = the rest).
"""

from __future__ import annotations

import json
import logging
import string
from pathlib import Path
from typing import Any

from rlharness.config.schema import ConfigError, JsonlTaskConf
from rlharness.data.base import PromptRow, TaskData
from rlharness.model import PROJECT_ROOT, require_chat_template

log = logging.getLogger(__name__)

_JSONL_SUFFIXES = (".jsonl", ".json")
_PARQUET_SUFFIXES = (".parquet",)


class DataFileError(ValueError):
    """A malformed data file; the message names the file and the line or row."""


def _file_format(path: Path, key: str) -> str:
    if path.suffix in _JSONL_SUFFIXES:
        return "json"
    if path.suffix in _PARQUET_SUFFIXES:
        return "parquet"
    raise ConfigError(
        f"{key}={str(path)!r}: unknown file type {path.suffix!r}; expected one of "
        f"{', '.join(_JSONL_SUFFIXES + _PARQUET_SUFFIXES)}"
    )


def _check_jsonl_lines(path: Path, required: list[str]) -> list[int]:
    """Every non-blank line is UTF-8 text holding a JSON object with the required fields, else
    `path:line`; a file without a row is refused here (the datasets library would say StopIteration).
    Returns the line number of each row."""
    lines = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataFileError(f"{path}:{lineno}: not UTF-8 text (byte {raw[exc.start]:#04x} at column "
                                    f"{exc.start + 1}); re-encode the file as UTF-8") from None
            if not line.strip():
                continue
            lines.append(lineno)
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFileError(f"{path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DataFileError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            _check_row(row, required, f"{path}:{lineno}")
    if not lines:
        raise DataFileError(f"{path}: no rows (the file is empty or blank); expected one JSON object per line")
    return lines


def _check_row(row: dict[str, Any], required: list[str], where: str) -> None:
    for name in required:
        if name not in row or row[name] is None:
            raise DataFileError(f"{where}: missing field {name!r} (fields: {sorted(row)})")
        if not isinstance(row[name], (str, int, float)) or isinstance(row[name], bool):
            raise DataFileError(
                f"{where}: field {name!r} is {type(row[name]).__name__}, expected a string or number"
            )


def read_rows(path_str: str, required: list[str], key: str = "task.path") -> list[dict[str, Any]]:
    """The rows of a JSONL or Parquet file as dicts, each checked for the required fields."""
    return read_rows_with_sources(path_str, required, key)[0]


def read_rows_with_sources(path_str: str, required: list[str],
                           key: str = "task.path") -> tuple[list[dict[str, Any]], list[str]]:
    """`read_rows` plus where each row is: "path:line" (JSONL) or "path: row i" (Parquet)."""
    path = Path(path_str).expanduser()
    if not path.is_file() and not path.is_absolute() and (PROJECT_ROOT / path).is_file():
        path = PROJECT_ROOT / path  # like model.path: shipped data (assets/...) from any directory
    if not path.is_file():
        raise ConfigError(f"{key}={path_str!r}: no such file ({path.resolve()})")
    fmt = _file_format(path, key)
    lines = _check_jsonl_lines(path, required) if fmt == "json" else []

    rows = _load_with_datasets(path, fmt)
    if fmt == "parquet":
        for i, row in enumerate(rows):
            _check_row(row, required, f"{path}: row {i}")
    if not rows:
        raise DataFileError(f"{path}: no rows")
    sources = [f"{path}:{n}" for n in lines] if len(lines) == len(rows) else [f"{path}: row {i}" for i in range(len(rows))]
    return rows, sources


def _load_with_datasets(path: Path, fmt: str) -> list[dict[str, Any]]:
    import datasets

    bars_were_off = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # one file, read in well under a second: no bars in the log
    try:
        ds = datasets.load_dataset(fmt, data_files=str(path), split="train", keep_in_memory=True)
    except Exception as exc:  # noqa: BLE001 - e.g. a column whose type changes between rows
        raise DataFileError(f"{path}: the datasets library could not read it: {type(exc).__name__}: {exc}") from exc
    finally:
        if not bars_were_off:
            datasets.enable_progress_bars()
    return ds.to_list()


def template_fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def extract_answer(answer: Any, delimiter: str) -> str:
    """The final answer: the text after the last delimiter (GSM8K '####'), else the whole field."""
    text = str(answer)
    if delimiter and delimiter in text:
        text = text.rsplit(delimiter, 1)[1]
    return text.strip()


def render_prompt(row: dict[str, Any], conf: JsonlTaskConf, tokenizer=None) -> str:
    text = conf.prompt_template.format_map({**row, "prompt": row[conf.prompt_field]})
    if conf.apply_chat_template is not False and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    return text


def _rows_to_prompts(rows: list[dict[str, Any]], conf: JsonlTaskConf, tokenizer,
                     sources: list[str] | None = None) -> list[PromptRow]:
    sources = sources if sources is not None else [""] * len(rows)
    return [
        PromptRow(index=i, prompt_text=render_prompt(row, conf, tokenizer),
                  label={"answer": extract_answer(row[conf.answer_field], conf.answer_delimiter)}, source=src)
        for i, (row, src) in enumerate(zip(rows, sources))
    ]


def load_jsonl_task(conf: JsonlTaskConf, tokenizer=None) -> TaskData:
    if conf.apply_chat_template and tokenizer is not None:
        require_chat_template(tokenizer, "task.apply_chat_template")
    # The template's fields must exist in every row (`prompt` is the prompt_field alias).
    required = [conf.prompt_field, conf.answer_field]
    required += [f for f in template_fields(conf.prompt_template) if f != "prompt" and f not in required]
    rows, sources = read_rows_with_sources(conf.path, required, "task.path")
    if conf.eval_path:
        (eval_rows, eval_sources), train_rows, train_sources = (
            read_rows_with_sources(conf.eval_path, required, "task.eval_path"), rows, sources)
    else:
        if conf.num_eval >= len(rows):
            raise ConfigError(
                f"task.num_eval={conf.num_eval} leaves no training rows: {conf.path} has {len(rows)} "
                f"rows; lower task.num_eval or set task.eval_path"
            )
        cut = len(rows) - conf.num_eval
        eval_rows, train_rows, eval_sources, train_sources = rows[cut:], rows[:cut], sources[cut:], sources[:cut]
    log.info("task jsonl: %d train rows from %s, %d eval rows from %s", len(train_rows), conf.path,
             len(eval_rows), conf.eval_path or f"the last {conf.num_eval} rows of {conf.path}")
    return TaskData(name="jsonl", train=_rows_to_prompts(train_rows, conf, tokenizer, train_sources),
                    eval=_rows_to_prompts(eval_rows, conf, tokenizer, eval_sources))
