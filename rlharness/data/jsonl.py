"""`task=jsonl`: prompts and answers from a local JSONL or Parquet file.

The GSM8K layout works as is: `question` is the prompt, `answer` ends with
`#### <number>` and the label is the text after the last delimiter ({"answer": "72"}).
Field names, the prompt template (`str.format` over the row's fields, plus
`{prompt}` for `prompt_field`) and the delimiter come from `JsonlTaskConf`. With the
tokenizer's chat template the prompt is one user message with the generation prompt
appended (the template adds its system prompt, if any): `apply_chat_template` unset uses
it when there is one, `true` requires it (a model without is refused), `false` never.

JSONL lines are parsed one by one with `json.loads`, so a bad row is reported as
`path:line`, and each row is kept exactly as written (the `datasets` library would
name neither file nor line, and would coerce a column: `1` becomes `1.0` when another
row holds `1.5`, `NaN` becomes None). Parquet files are read with `datasets`; their
rows are reported by row index. Refused, naming the row: NaN, Infinity or a number
beyond float64 (e.g. `1e309`) anywhere in a row, a missing, null, empty or non-scalar
prompt or answer, an answer with nothing after its delimiter, a prompt that renders
empty.

Relative paths resolve against the current directory first, then the project root
(as `model.path`), so the data shipped in `assets/` works from any directory. A glob pattern
(`data/train-*.parquet`, as Hugging Face shards a split) reads every file it matches, in name order.

Split: eval = all of `eval_path` when given, else the last `num_eval` rows of `path`
(train = the rest).
"""

from __future__ import annotations

import glob
import json
import logging
import math
import string
from pathlib import Path
from typing import Any

from rlharness.config.schema import ConfigError, JsonlTaskConf
from rlharness.data.base import PromptRow, TaskData
from rlharness.model.load import PROJECT_ROOT, require_chat_template

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


class _NonFinite(str):
    """A number JSON allows Python to read but no float holds: NaN, Infinity, 1e309 (its text)."""


def _parse_float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _non_finite_field(value: Any, where: str = "") -> tuple[str, str] | None:
    """(field path, text) of the first non-finite number in a parsed row, or None."""
    if isinstance(value, _NonFinite):
        return where, str(value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite_field(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _read_jsonl(path: Path, required: list[str]) -> tuple[list[dict[str, Any]], list[int]]:
    """Every non-blank line is UTF-8 text holding a JSON object with the required fields, else
    `path:line`; a file without a row is refused here. Returns the rows and the line number of each."""
    rows, lines = [], []
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
                row = json.loads(line, parse_float=_parse_float, parse_constant=_NonFinite)
            except json.JSONDecodeError as exc:
                raise DataFileError(f"{path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
            except RecursionError:
                raise DataFileError(f"{path}:{lineno}: invalid JSON: nested too deeply") from None
            if not isinstance(row, dict):
                raise DataFileError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            bad = _non_finite_field(row)
            if bad is not None:
                raise DataFileError(f"{path}:{lineno}: field {bad[0]!r} is {bad[1]}, not a finite number (NaN, "
                                    f"Infinity or beyond float64's range); write it as a string if it is text")
            _check_row(row, required, f"{path}:{lineno}")
            rows.append(row)
    if not lines:
        raise DataFileError(f"{path}: no rows (the file is empty or blank); expected one JSON object per line")
    return rows, lines


def _check_row(row: dict[str, Any], required: list[str], where: str, non_empty: tuple[str, ...] = ()) -> None:
    """The required fields are present, scalar and finite; those in `non_empty` hold some text."""
    for name in required:
        value = row.get(name)
        if value is None:  # absent, JSON null, or a Parquet null
            raise DataFileError(f"{where}: missing field {name!r} (fields: {sorted(row)})")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise DataFileError(f"{where}: field {name!r} is {type(value).__name__}, expected a string or number")
        if isinstance(value, float) and not math.isfinite(value):  # Parquet (JSONL refused them already)
            raise DataFileError(f"{where}: field {name!r} is {value}, not a finite number")
        if name in non_empty and not str(value).strip():
            raise DataFileError(f"{where}: field {name!r} is empty")


def data_files(path_str: str, key: str) -> list[Path]:
    """The files a data path names: one file, or every file a glob pattern matches (`data/train-*.parquet`,
    sorted), each there and of a type read here (else one line naming `key`)."""
    pattern = Path(path_str).expanduser()
    if glob.has_magic(str(pattern)):
        found = sorted(Path(f) for f in glob.glob(str(pattern)) if Path(f).is_file())
        if not found and not pattern.is_absolute():  # like model.path: shipped data from any directory
            found = sorted(Path(f) for f in glob.glob(str(PROJECT_ROOT / pattern)) if Path(f).is_file())
        if not found:
            raise ConfigError(f"{key}={path_str!r}: the pattern matches no file ({pattern.absolute()})")
    else:
        path = pattern
        if not path.is_file() and not path.is_absolute() and (PROJECT_ROOT / path).is_file():
            path = PROJECT_ROOT / path
        if path.is_dir():
            raise ConfigError(f"{key}={path_str!r}: a directory; name its files, e.g. {key}='{path_str.rstrip('/')}/"
                              f"*.parquet' (the pattern in quotes, so that the shell leaves it to rlharness)")
        if not path.is_file():
            raise ConfigError(f"{key}={path_str!r}: no such file ({path.resolve()})")
        found = [path]
    formats = {_file_format(f, key) for f in found}
    if len(formats) > 1:
        raise ConfigError(f"{key}={path_str!r}: matches both JSONL and Parquet files; one format per path")
    return found


def read_rows(path_str: str, required: list[str], key: str = "task.path",
              non_empty: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The rows of a JSONL or Parquet file as dicts, each checked for the required fields."""
    return read_rows_with_sources(path_str, required, key, non_empty)[0]


def read_rows_with_sources(path_str: str, required: list[str], key: str = "task.path",
                           non_empty: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], list[str]]:
    """`read_rows` plus where each row is: "path:line" (JSONL) or "path: row i" (Parquet); a glob pattern's
    files in name order."""
    rows, sources = [], []
    for path in data_files(path_str, key):
        if _file_format(path, key) == "json":
            file_rows, lines = _read_jsonl(path, required)
            file_sources = [f"{path}:{n}" for n in lines]
        else:
            file_rows = _load_with_datasets(path, "parquet")
            if not file_rows:
                raise DataFileError(f"{path}: no rows")
            file_sources = [f"{path}: row {i}" for i in range(len(file_rows))]
        for row, src in zip(file_rows, file_sources):
            _check_row(row, required, src, non_empty)
        rows += file_rows
        sources += file_sources
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
    return [_prompt_row(i, row, conf, tokenizer, src) for i, (row, src) in enumerate(zip(rows, sources))]


def _prompt_row(index: int, row: dict[str, Any], conf: JsonlTaskConf, tokenizer, source: str) -> PromptRow:
    """One row as a prompt and label; a row that renders no prompt or no answer is refused, naming it."""
    try:
        text = render_prompt(row, conf, tokenizer)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:  # a format spec the value refuses
        raise DataFileError(f"{source}: task.prompt_template={conf.prompt_template!r} cannot render this row: "
                            f"{type(exc).__name__}: {exc}") from None
    if not text.strip():
        raise DataFileError(f"{source}: the prompt is empty (task.prompt_template={conf.prompt_template!r})")
    answer = extract_answer(row[conf.answer_field], conf.answer_delimiter)
    if not answer:
        raise DataFileError(f"{source}: field {conf.answer_field!r} has no answer after the delimiter "
                            f"{conf.answer_delimiter!r}: {str(row[conf.answer_field])[-80:]!r}")
    return PromptRow(index=index, prompt_text=text, label={"answer": answer}, source=source)


def load_jsonl_task(conf: JsonlTaskConf, tokenizer=None) -> TaskData:
    if conf.apply_chat_template and tokenizer is not None:
        require_chat_template(tokenizer, "task.apply_chat_template")
    # The template's fields must exist in every row (`prompt` is the prompt_field alias).
    required = [conf.prompt_field, conf.answer_field]
    required += [f for f in template_fields(conf.prompt_template) if f != "prompt" and f not in required]
    non_empty = (conf.prompt_field, conf.answer_field)
    rows, sources = read_rows_with_sources(conf.path, required, "task.path", non_empty)
    if conf.eval_path:
        (eval_rows, eval_sources), train_rows, train_sources = (
            read_rows_with_sources(conf.eval_path, required, "task.eval_path", non_empty), rows, sources)
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
