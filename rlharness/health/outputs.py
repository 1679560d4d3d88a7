"""Degenerate outputs: responses that repeat themselves, are made of one token or nothing, and
responses hitting the length budget at a rising rate.

`output_stats` reads the step's samples (the model's own tokens: tool output and the like are not
the model's; the final stop token is not part of the text) into shares logged as `health/...`;
`DegenerateOutputs` compares their mean over the last `window_steps` steps with the run's first.
"""

from __future__ import annotations

from rlharness.config.schema import DegenerateOutputsConf
from rlharness.health.alarm import Alarm, Latch
from rlharness.health.trend import mean
from rlharness.core.types import Group, RolloutState


def model_tokens(s: RolloutState) -> list[int]:
    """The tokens the model wrote, without a final stop token."""
    mask = s.loss_mask()
    tokens = [t for t, m in zip(s.response_ids, mask) if m]
    if tokens and s.finish_reason == "stop":
        tokens = tokens[:-1]
    return tokens


def repeated_share(tokens: list[int], n: int) -> float:
    """The share of the response's n-grams that already occurred earlier in it (0 when it has none)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def output_stats(groups: list[Group], ngram: int, repeat_share: float) -> dict[str, float]:
    """Shares of the step's responses that are empty, one token repeated (at least ngram + 1 of them),
    or repeat their n-grams (at least 2 x ngram tokens, `repeat_share` of their n-grams seen before);
    `health/degenerate_frac` counts a response that is any of these once."""
    empty = one_token = repeating = degenerate = total = 0
    for g in groups:
        for s in g:
            tokens = model_tokens(s)
            total += 1
            is_empty = not tokens
            is_one = len(tokens) > ngram and len(set(tokens)) == 1
            is_rep = len(tokens) >= 2 * ngram and repeated_share(tokens, ngram) >= repeat_share
            empty += is_empty
            one_token += is_one
            repeating += is_rep
            degenerate += is_empty or is_one or is_rep
    if not total:
        return {}
    return {"health/empty_frac": empty / total, "health/one_token_frac": one_token / total,
            "health/repeat_frac": repeating / total, "health/degenerate_frac": degenerate / total}


class DegenerateOutputs:
    name = "degenerate_outputs"

    def __init__(self, conf: DegenerateOutputsConf) -> None:
        self.conf = conf
        self.degenerate: list[tuple[int, float]] = []
        self.truncated: list[tuple[int, float]] = []
        self.degenerate_latch, self.truncated_latch = Latch(), Latch()

    def observe(self, row: dict) -> tuple[dict[str, float], list[Alarm]]:
        step = int(row["step"])
        for key, series in (("health/degenerate_frac", self.degenerate), ("rollout/truncated_frac", self.truncated)):
            if row.get(key) is not None:
                series.append((step, float(row[key])))
        metrics: dict[str, float] = {}
        c, w = self.conf, self.conf.window_steps
        alarms = []
        if len(self.degenerate) >= 2 * w:
            start, now = mean([v for _, v in self.degenerate[:w]]), mean([v for _, v in self.degenerate[-w:]])
            metrics["health/degenerate_rise"] = now - start
            if self.degenerate_latch(now >= c.max_frac and now - start >= c.min_rise):
                alarms.append(Alarm(
                    self.name, step, "the responses are degenerating",
                    f"health/degenerate_frac {now:.3f} (mean of the last {w} steps: responses that repeat "
                    f"{c.ngram}-grams, one token over and over, or empty; health/repeat_frac "
                    f"{row.get('health/repeat_frac', float('nan')):.3f}, health/one_token_frac "
                    f"{row.get('health/one_token_frac', float('nan')):.3f}, health/empty_frac "
                    f"{row.get('health/empty_frac', float('nan')):.3f} this step) against {start:.3f} at the "
                    f"start (health.degenerate_outputs.max_frac={c.max_frac:g}, min_rise={c.min_rise:g})",
                    "look at the samples (rollouts/step_*.jsonl): a judger that rewards the degenerate text (a "
                    "format pattern, a reward model), a too-high algo.lr; add a repetition penalty to the reward, "
                    "a KL term (algo.kl_coef), or roll back"))
        if len(self.truncated) >= 2 * w:
            start, now = mean([v for _, v in self.truncated[:w]]), mean([v for _, v in self.truncated[-w:]])
            metrics["health/truncated_rise"] = now - start
            if self.truncated_latch(now - start >= c.truncated_rise):
                alarms.append(Alarm(
                    self.name, step, "more and more responses hit the length budget",
                    f"rollout/truncated_frac {now:.3f} (mean of the last {w} steps) against {start:.3f} at the "
                    f"start (+{now - start:.3f}, health.degenerate_outputs.truncated_rise={c.truncated_rise:g})",
                    "look at the cut responses (finish_reason=length in rollouts/): rambling or repetition that "
                    "the reward does not punish; add an overlong penalty (algo.overlong_buffer_len) or mask cut "
                    "responses (algo.mask_truncated), or raise agent.sampling.max_tokens if they are right but long"))
        return metrics, alarms
