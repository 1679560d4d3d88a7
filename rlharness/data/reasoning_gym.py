"""`task=reasoning_gym`: one procedural dataset of the reasoning-gym library.

`reasoning_gym.create_dataset(task.dataset, size=N, seed=task.seed, **task.dataset_config)`
generates the items (`question`, `answer`, `metadata`); item i depends only on the seed and
i, so the same config regenerates the same rows (a resumed run's sampler positions point
at the same prompts).

Split: eval first, then train, from one index stream of one seeded dataset. Generators
repeat items when their space is small (two one-digit terms: 100 sums), so eval keeps
the first `num_eval` distinct questions and train the next `num_train` items whose
question is not an eval question (train may repeat its own items: epochs over a small
space). A space too small for `num_eval` distinct questions is refused.

Prompt: the question, then `task.instruction` after a space, as one user message of the
model's chat template (with its default system prompt) when the tokenizer has one.
Label: the item itself plus the dataset's name and config, so the judger
(`rlharness.judger.reasoning_gym`) can call that dataset's own `score_answer`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

from rlharness.config.schema import ConfigError, ReasoningGymTaskConf
from rlharness.data.base import PromptRow, TaskData
from rlharness.logging_utils.progress import Progress

log = logging.getLogger(__name__)

# Draws that may be spent per wanted row before concluding the space is too small.
_MAX_DRAWS_PER_ROW = 20
# Config fields rlharness sets itself (from task.seed and the split sizes).
_RESERVED_KEYS = ("seed", "size")
# The probe of a dataset config before a run (`probe_dataset`): items, and the limits one item must fit.
PROBE_ITEMS = 3
PROBE_MEMORY_MB = 4096
MAX_QUESTION_CHARS = 100_000  # far beyond any model's positions: a size typo, not a task
_PROBED: dict[str, float] = {}


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def config_keys(dataset: str) -> list[str]:
    """The keys `task.dataset_config` may set for `dataset` (its config dataclass's fields)."""
    from reasoning_gym.factory import DATASETS

    return [f.name for f in dataclasses.fields(DATASETS[dataset][1]) if f.name not in _RESERVED_KEYS]


def check_dataset(dataset: str, dataset_config: dict[str, Any], key: str = "task",
                  timeout_s: float = 30.0) -> None:
    """Refuse an unknown dataset, an unknown config key, or values the dataset's own validation rejects."""
    names = dataset_names()
    if dataset not in names:
        raise ConfigError(f"{key}.dataset={dataset!r} is not a reasoning-gym dataset; valid: {', '.join(names)}")
    allowed = config_keys(dataset)
    unknown = sorted(set(dataset_config) - set(allowed))
    if unknown:
        raise ConfigError(f"{key}.dataset_config has unknown key(s) {', '.join(unknown)} for dataset {dataset!r}; "
                          f"valid: {', '.join(allowed)}")
    probe_dataset(dataset, dataset_config, key, timeout_s)


class DatasetProbe:
    """A few items of a dataset, generated where they can be killed (a judging process: rlharness/judger/pool.py)."""

    def __init__(self, dataset: str, dataset_config: dict[str, Any]):
        self.dataset, self.dataset_config = dataset, dataset_config

    def probe(self) -> tuple[float, int]:
        """(seconds per item, the longest question in characters) over PROBE_ITEMS items after a first one
        (which pays for imports)."""
        ds = make_dataset(self.dataset, self.dataset_config, size=PROBE_ITEMS + 1, seed=0)
        longest = len(str(ds[0]["question"]))
        t0 = time.perf_counter()
        longest = max([longest] + [len(str(ds[i]["question"])) for i in range(1, PROBE_ITEMS + 1)])
        return (time.perf_counter() - t0) / PROBE_ITEMS, longest


def probe_dataset(dataset: str, dataset_config: dict[str, Any], key: str = "task", timeout_s: float = 30.0) -> float:
    """Seconds per item of `dataset` with `dataset_config`, found by generating a few in a process of their own
    under a time and memory limit: values the dataset's validation rejects, sizes that make one item take
    minutes or gigabytes (`max_terms: 1e8`), or questions no model could read are refused before a run
    generates thousands of them. Remembered per config (preflight and the job ask once each)."""
    from rlharness.judger.pool import JudgeLimitExceeded, JudgePool

    cache_key = json.dumps([dataset, dataset_config], sort_keys=True, default=str)
    if cache_key in _PROBED:
        return _PROBED[cache_key]
    shown = f"{key}.dataset_config={dataset_config}"
    pool = JudgePool(DatasetProbe(dataset, dataset_config), 1, PROBE_MEMORY_MB)
    try:
        pool.start()  # not the dataset's refusal: a process that cannot start is raised as it is
        try:
            per_item, longest = pool.call_blocking("probe", (), timeout_s)
        except JudgeLimitExceeded as exc:
            what = (f"took more than {timeout_s:g} s ({key}.probe_timeout_s)" if exc.kind == "timeout" else
                    f"ran out of memory ({PROBE_MEMORY_MB} MB)" if exc.kind == "memory" else "crashed")
            raise ConfigError(f"{shown} is not allowed: generating {PROBE_ITEMS} {dataset!r} items {what}; a size in "
                              f"it is too large (a run generates thousands)") from None
        except Exception as exc:  # noqa: BLE001 - the dataset's validate() asserts; a bad type raises TypeError
            detail = str(exc) or type(exc).__name__
            raise ConfigError(f"{shown} is rejected by dataset {dataset!r}: {detail}") from None
    finally:
        pool.close()
    if longest > MAX_QUESTION_CHARS:
        raise ConfigError(f"{shown} is not allowed: dataset {dataset!r} makes questions of {longest} characters "
                          f"(at most {MAX_QUESTION_CHARS}); lower the sizes in it")
    _PROBED[cache_key] = per_item
    return per_item


def make_dataset(dataset: str, dataset_config: dict[str, Any], size: int, seed: int):
    import reasoning_gym

    return reasoning_gym.create_dataset(dataset, size=size, seed=seed, **dataset_config)


def render_prompt(question: str, instruction: str, tokenizer=None, apply_chat_template: bool = True) -> str:
    text = f"{question.rstrip()} {instruction}" if instruction else question
    if apply_chat_template and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


def split_items(conf: ReasoningGymTaskConf) -> tuple[list[dict], list[dict]]:
    """(eval, train) items: eval's questions distinct, none of them in train."""
    wanted = conf.num_eval + conf.num_train
    max_draws = _MAX_DRAWS_PER_ROW * wanted
    ds = make_dataset(conf.dataset, conf.dataset_config, size=max_draws, seed=conf.seed)
    per_item = probe_dataset(conf.dataset, conf.dataset_config, timeout_s=conf.probe_timeout_s)
    log.info("task reasoning_gym %s: generating %d items (about %.0f s at %.2f ms each)", conf.dataset, wanted,
             wanted * per_item, 1e3 * per_item)
    progress = Progress(f"task reasoning_gym {conf.dataset}: generating {wanted} items", wanted)
    eval_items: list[dict] = []
    eval_questions: set[str] = set()
    i = 0
    while len(eval_items) < conf.num_eval:
        progress.update(len(eval_items))
        if i >= max_draws:
            raise ConfigError(
                f"task.dataset={conf.dataset}: only {len(eval_items)} distinct questions in {max_draws} draws, "
                f"fewer than task.num_eval={conf.num_eval}; lower task.num_eval or widen task.dataset_config")
        item = ds[i]
        i += 1
        if item["question"] not in eval_questions:
            eval_questions.add(item["question"])
            eval_items.append(item)
    train_items: list[dict] = []
    while len(train_items) < conf.num_train and i < max_draws:
        progress.update(len(eval_items) + len(train_items))
        item = ds[i]
        i += 1
        if item["question"] not in eval_questions:
            train_items.append(item)
    if len(train_items) < conf.num_train:
        raise ConfigError(
            f"task.dataset={conf.dataset}: only {len(train_items)} training items outside the eval set in "
            f"{max_draws} draws, fewer than task.num_train={conf.num_train}: the eval set covers (almost) the whole "
            f"space; lower task.num_eval or widen task.dataset_config")
    return eval_items, train_items


def _label(conf: ReasoningGymTaskConf, item: dict) -> dict[str, Any]:
    return {"answer": str(item["answer"]), "dataset": conf.dataset, "dataset_config": dict(conf.dataset_config),
            "entry": {"question": item["question"], "answer": item["answer"],
                      "metadata": item.get("metadata", {})}}


def make_reasoning_gym_task(conf: ReasoningGymTaskConf, tokenizer=None) -> TaskData:
    check_dataset(conf.dataset, conf.dataset_config, timeout_s=conf.probe_timeout_s)
    eval_items, train_items = split_items(conf)

    def rows(items: list[dict]) -> list[PromptRow]:
        return [PromptRow(index=i, label=_label(conf, item),
                          prompt_text=render_prompt(item["question"], conf.instruction, tokenizer,
                                                    conf.apply_chat_template))
                for i, item in enumerate(items)]

    log.info("task reasoning_gym %s: %d train items, %d eval items (distinct questions, none in train), seed %d",
             conf.dataset, len(train_items), len(eval_items), conf.seed)
    return TaskData(name="reasoning_gym", train=rows(train_items), eval=rows(eval_items))
