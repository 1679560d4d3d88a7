"""reasoning-gym judger: the dataset's own `score_answer` on the answer taken from the response.

The label (rlharness/data/reasoning_gym.py) carries the dataset's name and config and
the item; the dataset object is rebuilt from them once per judging process (cached) and
`score_answer(answer, entry)` gives the reward in [0, 1], partial credit kept (e.g. the
default scorer's len(oracle) / len(answer) when the answer contains the oracle).

What counts as the answer (`judger.extract`):
- answer_tag: the last `<answer>...</answer>` (reasoning-gym's own convention, its
  `utils.extract_answer`);
- boxed: the last `\\boxed{...}`;
- last_number: the last number in the response (the math judger's rule: "x=-5" is -5,
  "3-5" holds 3 and 5). Small instruct models told "Give only the final number." answer
  "12" or "5 + 7 = 12": both end with the answer;
- response: the whole response, stripped;
- auto: answer tag, else boxed, else the last number when the reference answer is a
  number, else the whole response.
Nothing found passes None, which every reasoning-gym scorer scores 0.

Scoring runs in the judging processes (`score_inline` stays None): some scorers parse
with sympy or run a solver, which may take long; a stuck one is killed there.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from rlharness.config.schema import ReasoningGymJudgerConf
from rlharness.judger.base import Judger
from rlharness.judger.math import as_plain_number, last_boxed, last_number


def extract_answer(response: str, how: str, reference: str) -> str | None:
    from reasoning_gym.utils import extract_answer as answer_tag

    if how == "answer_tag":
        return answer_tag(response)
    if how == "boxed":
        return last_boxed(response)
    if how == "last_number":
        return last_number(response)
    if how == "response":
        return response.strip()
    found = answer_tag(response)
    if found is None:
        found = last_boxed(response)
    if found is None:
        found = last_number(response) if as_plain_number(reference) is not None else response.strip()
    return found


@lru_cache(maxsize=32)
def _dataset(name: str, config_json: str):
    from rlharness.data.reasoning_gym import make_dataset

    return make_dataset(name, json.loads(config_json), size=1, seed=0)


class ReasoningGymJudger(Judger):
    name = "reasoning_gym"
    label_keys = ("dataset", "dataset_config", "entry")

    def __init__(self, conf: ReasoningGymJudgerConf | None = None):
        self.conf = conf or ReasoningGymJudgerConf()

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        entry = label["entry"]
        answer = extract_answer(response_text, self.conf.extract, str(entry["answer"]))
        dataset = _dataset(label["dataset"], json.dumps(label["dataset_config"], sort_keys=True))
        return {"score": float(dataset.score_answer(answer, entry))}
