"""`task=arithmetic`: seeded synthetic problems with exact answers.

"042+917=" -> "959". Operands have exactly `digits` digits with leading zeros (when
`zero_pad`), so the tiny character model sees fixed-width problems. Train and eval
splits are disjoint: every problem is drawn once from one seeded stream, eval first.
"""

from __future__ import annotations

import operator
import random

from rlharness.config.schema import ArithmeticTaskConf
from rlharness.data.base import PromptRow, TaskData
from rlharness.logging_utils.progress import Progress

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def format_problem(a: int, op: str, b: int, digits: int, zero_pad: bool) -> str:
    fmt = f"{{:0{digits}d}}" if zero_pad else "{}"
    return f"{fmt.format(a)}{op}{fmt.format(b)}="


def make_arithmetic_task(conf: ArithmeticTaskConf, tokenizer=None) -> TaskData:
    rng = random.Random(conf.seed)
    hi = 10**conf.digits - 1
    space = (hi + 1) ** 2 * len(conf.operators)
    wanted = conf.num_eval + conf.num_train
    if wanted > space:
        raise ValueError(
            f"task: num_train + num_eval = {wanted} exceeds the {space} distinct problems with "
            f"digits={conf.digits} and operators={list(conf.operators)}"
        )
    seen: set[tuple[int, str, int]] = set()
    rows: list[tuple[str, str]] = []
    progress = Progress(f"task arithmetic: generating {wanted} problems", wanted)
    while len(rows) < wanted:
        progress.update(len(rows))
        a, b, op = rng.randint(0, hi), rng.randint(0, hi), rng.choice(list(conf.operators))
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        rows.append((format_problem(a, op, b, conf.digits, conf.zero_pad), str(_OPS[op](a, b))))

    def split(part: list[tuple[str, str]]) -> list[PromptRow]:
        return [PromptRow(index=i, prompt_text=p, label={"answer": ans}) for i, (p, ans) in enumerate(part)]

    return TaskData(name="arithmetic", eval=split(rows[: conf.num_eval]), train=split(rows[conf.num_eval:]))
