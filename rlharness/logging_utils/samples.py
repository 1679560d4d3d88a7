"""What the model wrote, for people: eval completions on disk, and sample tables for W&B.

`evals/step_XXXXXXXX.jsonl` holds one row per eval prompt: task, prompt, gold answer, and
each sample (greedy, then the `eval.num_samples` sampled ones) with the answer the judger
extracted, its judgement (correct | wrong | failed: <reason>) and score. A resumed run redoes
the steps after its checkpoint, so their files are removed (as `rollouts/`).

`sample_table` / `eval_table` turn groups and eval rows into (columns, rows) for a
`wandb.Table`, at most `max_rows` rows, whole groups (or whole prompts) only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from rlharness.logging_utils.metrics import replace_text
from rlharness.core.redaction import redact
from rlharness.core.run_dir import RunDir, step_of
from rlharness.core.types import Group, RolloutState, Status


def judgement(group: Group, s: RolloutState) -> str:
    """Sample `s` of `group`: correct | wrong | failed: <the group's drop reason>."""
    if s.status == Status.FAILED:
        return redact(f"failed: {group.drop_reason or 'judging failed'}")
    if "infra_failure" in s.extra:  # not the policy's: neither right nor wrong
        return redact(f"failed: {s.extra['infra_failure']}")
    return "correct" if s.reward is not None and s.reward.get("score", 0.0) >= 1.0 else "wrong"


def eval_sample(group: Group, s: RolloutState, kind: str, extract: Callable[[str], str | None]) -> dict[str, Any]:
    row = {"kind": kind, "response": s.response_text, "extracted": extract(s.response_text),
           "judgement": judgement(group, s),
           "score": None if s.status == Status.FAILED or "infra_failure" in s.extra else (s.reward or {}).get("score"),
           "finish_reason": s.finish_reason}
    if "turns" in s.extra:  # the tool agent: what it called and what came back
        row["tool_calls"] = s.extra.get("tool_calls", 0)
        row["turns"] = s.extra["turns"]
    return row


def eval_rows(greedy: list[Group], sampled: list[Group] | None,
              extract: Callable[[str], str | None]) -> list[dict[str, Any]]:
    """One row per prompt: its greedy sample and its sampled ones (same prompt order in both lists)."""
    rows = []
    for i, group in enumerate(greedy):
        samples = [eval_sample(group, s, "greedy", extract) for s in group.samples]
        if sampled is not None:
            samples += [eval_sample(sampled[i], s, "sampled", extract) for s in sampled[i].samples]
        rows.append({"task": group.task, "prompt_index": group.prompt_index, "prompt": group.prompt_text,
                     "answer": group.label.get("answer"), "samples": samples})
    return rows


def write_eval_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def forget_evals_after(run_dir: str | Path, step: int) -> None:
    """A resume redoes the steps after its checkpoint: their eval files go (as rollouts/ rows do)."""
    for p in RunDir(run_dir).evals.glob("step_*.jsonl"):
        if step_of(p.name) > step:
            p.unlink()


TRAIN_COLUMNS = ["step", "task", "group_id", "prompt", "response", "reward", "finish_reason",
                 "min_policy_version", "max_policy_version"]
TOOL_COLUMNS = ["tool_calls", "turns"]
EVAL_COLUMNS = ["step", "task", "prompt_index", "prompt", "answer", "kind", "response", "extracted", "judgement",
                "score", "finish_reason"]


def _bounded(units: list[list[Any]], max_rows: int) -> list[Any]:
    """Whole units (a group's samples, a prompt's samples) while they fit in max_rows; a first unit
    larger than max_rows is cut (a table is never empty when there were samples)."""
    out: list[Any] = []
    for unit in units:
        if len(out) + len(unit) > max_rows:
            return out or unit[:max_rows]
        out += unit
    return out


def sample_table(step: int, groups: list[Group], max_rows: int) -> tuple[list[str], list[list[Any]]]:
    """A training step's samples, group by group."""
    tools = any("turns" in s.extra for g in groups for s in g.samples)
    columns = TRAIN_COLUMNS + (TOOL_COLUMNS if tools else [])
    units = []
    for g in groups:
        unit = []
        for s in g.samples:
            row = [step, g.task, g.group_id, g.prompt_text, s.response_text, (s.reward or {}).get("score"),
                   s.finish_reason, s.min_policy_version, s.max_policy_version]
            if tools:
                row += [s.extra.get("tool_calls", 0), json.dumps(s.extra.get("turns", []))]
            unit.append(row)
        units.append(unit)
    return columns, _bounded(units, max_rows)


def eval_table(step: int, rows: list[dict[str, Any]], max_rows: int) -> tuple[list[str], list[list[Any]]]:
    """An eval's completions, prompt by prompt."""
    units = [[[step, r["task"], r["prompt_index"], r["prompt"], None if r["answer"] is None else str(r["answer"]),
               s["kind"], s["response"], s["extracted"], s["judgement"], s["score"], s["finish_reason"]]
              for s in r["samples"]] for r in rows]
    return EVAL_COLUMNS, _bounded(units, max_rows)
