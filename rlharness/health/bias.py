"""Staleness and filtering bias, visible: what was generated against what was trained.

An async run drops what takes too long (token-mode expiry) and a group filter drops what carries no
signal; either can leave training with mostly short answers, or mostly easy ones, without a word. The
producer tallies every finished generation (`GenerationTally`: response length and reward of each
judged sample, and the lengths of samples dropped: filtered, or expired after they finished) and hands
the tally out with each batch; `bias_metrics` compares it with the batch (`BiasMeter`):

- `bias/trained_len_over_generated`: mean trained response length / mean generated response length
  since the last batch (1 = no length bias; below 1: short answers are trained more than generated);
- `bias/trained_reward_minus_generated`: the same for the reward, as a difference;
- `bias/dropped_by_len_bucket/<lo>-<hi>`: samples dropped / samples generated since the start, per
  response-length bucket (quarters of the response budget, in tokens): a long bucket dropped more than
  a short one is the bias;
- `bias/generated_samples`, `bias/dropped_samples`: the counts behind them.

`distributions` gives the same four lists (lengths and rewards, generated and trained) for W&B histograms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlharness.core.types import Group

BUCKETS = 4


@dataclass
class GenerationTally:
    """What finished generating (judged) and what was dropped, since it was last taken."""

    lengths: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    dropped_lengths: list[int] = field(default_factory=list)

    def add_generated(self, group: Group) -> None:
        self.lengths += [len(s.response_ids) for s in group]
        self.rewards += scores(group)

    def add_dropped(self, lengths: list[int]) -> None:
        self.dropped_lengths.extend(lengths)

    def merge(self, other: GenerationTally) -> None:
        self.lengths += other.lengths
        self.rewards += other.rewards
        self.dropped_lengths += other.dropped_lengths

    def take(self) -> GenerationTally:
        """The tally so far; this one starts empty."""
        out = GenerationTally(self.lengths, self.rewards, self.dropped_lengths)
        self.lengths, self.rewards, self.dropped_lengths = [], [], []
        return out


def bucket_edges(budget: int, buckets: int = BUCKETS) -> list[int]:
    """Token edges of `buckets` equal parts of the response budget: [0, e1), [e1, e2), ... [e_{k-1}, budget]."""
    return [round(budget * i / buckets) for i in range(buckets + 1)]


def scores(samples: list) -> list[float]:
    return [float(s.reward["score"]) for s in samples if s.reward is not None and "score" in s.reward]


def bucket_of(length: int, edges: list[int]) -> int:
    for i in range(1, len(edges) - 1):
        if length < edges[i]:
            return i - 1
    return len(edges) - 2


class BiasMeter:
    """`bias/...` per step (module docstring). The drop shares by length bucket count from the start of
    this process's life: a sample is dropped steps after it was generated (it expires while it waits),
    so per-step counts would not match; over the run they do."""

    def __init__(self, budget: int) -> None:
        self.edges = bucket_edges(budget)
        self.generated = [0] * BUCKETS
        self.dropped = [0] * BUCKETS

    def update(self, tally: GenerationTally, groups: list[Group]) -> dict[str, float]:
        for n in tally.lengths:
            self.generated[bucket_of(n, self.edges)] += 1
        for n in tally.dropped_lengths:
            self.dropped[bucket_of(n, self.edges)] += 1
        out = {"bias/generated_samples": float(len(tally.lengths)),
               "bias/dropped_samples": float(len(tally.dropped_lengths))}
        trained = [s for g in groups for s in g]
        trained_lens = [len(s.response_ids) for s in trained]
        trained_rewards = scores(trained)
        if tally.lengths and trained_lens and sum(tally.lengths) > 0:
            out["bias/trained_len_over_generated"] = ((sum(trained_lens) / len(trained_lens))
                                                      / (sum(tally.lengths) / len(tally.lengths)))
        if trained_rewards and tally.rewards:
            out["bias/trained_reward_minus_generated"] = (sum(trained_rewards) / len(trained_rewards)
                                                          - sum(tally.rewards) / len(tally.rewards))
        for i in range(BUCKETS):
            if self.generated[i]:
                key = f"bias/dropped_by_len_bucket/{self.edges[i]}-{self.edges[i + 1]}"
                out[key] = self.dropped[i] / self.generated[i]
        return out


def distributions(tally: GenerationTally, groups: list[Group]) -> dict[str, list[float]]:
    """Lengths and rewards, generated and trained, for W&B histograms (`bias/...`)."""
    trained = [s for g in groups for s in g]
    return {
        "bias/generated_len": [float(n) for n in tally.lengths],
        "bias/trained_len": [float(len(s.response_ids)) for s in trained],
        "bias/generated_reward": list(tally.rewards),
        "bias/trained_reward": scores(trained),
    }
