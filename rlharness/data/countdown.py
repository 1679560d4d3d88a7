"""`task=countdown`: reach a target from given numbers with + - * /.

Prompt: the numbers separated by spaces, a comma, the target, "=" — e.g. "3 5 7,15=".
Only characters of `rlharness.model.tiny.DEFAULT_CHARS` appear, so the tiny character
model can read it. Label: {"numbers": [3, 5, 7], "target": 15}.

Every problem is solvable by construction: the numbers are drawn, shuffled, and
combined pairwise in a random order with random operators into a single expression
that uses each number once; its value is the target. Every intermediate value stays a
positive integer (subtraction only when the result is positive, division only when
exact), as in the game. Train and eval are disjoint: problems are drawn once from one
seeded stream (eval first) and a (numbers as a multiset, target) pair is never repeated.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlharness.config.schema import CountdownTaskConf
from rlharness.data.base import PromptRow, TaskData
from rlharness.logging_utils.progress import Progress

# Draws that may be spent per wanted problem before concluding the space is too small.
_MAX_DRAWS_PER_PROBLEM = 50


@dataclass(frozen=True)
class CountdownProblem:
    numbers: tuple[int, ...]
    target: int
    expression: str  # the generating expression; it evaluates to `target`

    @property
    def prompt(self) -> str:
        return format_prompt(self.numbers, self.target)

    @property
    def label(self) -> dict:
        return {"numbers": list(self.numbers), "target": self.target}


def format_prompt(numbers: tuple[int, ...] | list[int], target: int) -> str:
    return " ".join(str(n) for n in numbers) + f",{target}="


def _combine(rng: random.Random, a: tuple[int, str], b: tuple[int, str]) -> tuple[int, str]:
    """One random operator applied to two (value, expression) pairs; positive integer result."""
    (va, ea), (vb, eb) = a, b
    options = [("+", va + vb), ("*", va * vb)]
    if va > vb:
        options.append(("-", va - vb))
    if vb != 0 and va % vb == 0:
        options.append(("/", va // vb))
    op, value = rng.choice(options)
    return value, f"({ea}{op}{eb})"


def generate_problem(rng: random.Random, num_numbers: int, max_number: int) -> CountdownProblem:
    numbers = tuple(rng.randint(1, max_number) for _ in range(num_numbers))
    items = [(n, str(n)) for n in numbers]
    rng.shuffle(items)
    while len(items) > 1:
        i = rng.randrange(len(items) - 1)  # merge neighbours i, i+1: a random binary tree
        items[i: i + 2] = [_combine(rng, items[i], items[i + 1])]
    target, expr = items[0]
    if expr.startswith("("):
        expr = expr[1:-1]  # the outermost pair is redundant
    return CountdownProblem(numbers=numbers, target=target, expression=expr)


def generate_problems(conf: CountdownTaskConf) -> list[CountdownProblem]:
    """num_eval + num_train distinct problems from one seeded stream, eval first."""
    rng = random.Random(conf.seed)
    wanted = conf.num_eval + conf.num_train
    seen: set[tuple[tuple[int, ...], int]] = set()
    problems: list[CountdownProblem] = []
    draws = 0
    progress = Progress(f"task countdown: generating {wanted} problems", wanted)
    while len(problems) < wanted:
        progress.update(len(problems))
        draws += 1
        if draws > _MAX_DRAWS_PER_PROBLEM * wanted:
            raise ValueError(
                f"task: could only draw {len(problems)} distinct countdown problems of the "
                f"num_train + num_eval = {wanted} wanted with num_numbers={conf.num_numbers}, "
                f"max_number={conf.max_number}; raise task.max_number or lower the counts"
            )
        p = generate_problem(rng, conf.num_numbers, conf.max_number)
        key = (tuple(sorted(p.numbers)), p.target)
        if key in seen:
            continue
        seen.add(key)
        problems.append(p)
    return problems


def make_countdown_task(conf: CountdownTaskConf, tokenizer=None) -> TaskData:
    problems = generate_problems(conf)

    def split(part: list[CountdownProblem]) -> list[PromptRow]:
        return [PromptRow(index=i, prompt_text=p.prompt, label=p.label) for i, p in enumerate(part)]

    return TaskData(name="countdown", eval=split(problems[: conf.num_eval]),
                    train=split(problems[conf.num_eval:]))
