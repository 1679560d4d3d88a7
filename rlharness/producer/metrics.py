"""The producer's numbers for each batch it hands out (`ProducedBatch.stats`).

Two sources: the batch itself (rewards, response lengths, staleness per token and at
admission: `batch_stats`, `task_stats`, pure), and what happened since the last batch
(each task context's window counters, the buffer's expiry counters, the agent loops'
discarded tokens, seconds spent producing: `StepMetrics`, which resets them per batch).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rlharness.health.bias import GenerationTally
from rlharness.producer.replay_buffer import ReplayBuffer
from rlharness.core.types import Group, staleness

if TYPE_CHECKING:
    from rlharness.producer.context import ProduceContext


def batch_stats(groups: list[Group], train_step: int) -> dict[str, float]:
    """Reward, response length and staleness of the trained batch, in one pass over its samples
    (this runs for every sample of every step). Staleness is per response token
    (train_step - 1 - its version), summed per sample in C, not token by token."""
    samples = rewarded = tokens = version_sum = 0
    reward_sum = 0.0
    oldest: int | None = None
    versions: Counter = Counter()  # tokens per weight version (counted in C), for the histogram
    admitted: list[int] = []  # staleness at admission, per group
    for g in groups:
        samples += len(g.samples)
        if g.admission is not None:
            admitted.append(g.admission.staleness)
        for s in g.samples:
            steps = s.response_model_steps
            if steps:
                tokens += len(steps)
                version_sum += sum(steps)
                versions.update(steps)
                low = min(steps)
                if oldest is None or low < oldest:
                    oldest = low
            if s.reward is not None and "score" in s.reward:
                reward_sum += s.reward["score"]
                rewarded += 1
    mean_stale = staleness(version_sum / tokens, train_step) if tokens else 0.0
    max_stale = staleness(oldest, train_step) if oldest is not None else 0
    return {
        "rollout/reward_mean": reward_sum / rewarded if rewarded else 0.0,
        "rollout/response_len_mean": tokens / max(samples, 1),  # per-token lists have equal lengths
        "staleness/mean": float(mean_stale),
        "staleness/max": float(max_stale),
        # Bounded by max_staleness in admission mode (a slow group may be trained later than that).
        "staleness/admission_mean": sum(admitted) / len(admitted) if admitted else 0.0,
        "staleness/admission_max": float(max(admitted, default=0)),
        **{f"staleness/tokens_at_{int(staleness(v, train_step))}": float(n) for v, n in sorted(versions.items())},
    }


def task_stats(name: str, groups: list[Group], window: Counter, train_step: int) -> dict[str, float]:
    """`rollout/<task>/...` and `staleness/<task>/...` of one task of a multi-task run: its part
    of the batch (`groups` are the whole batch) and its `window` counters since the last one."""
    mine = [g for g in groups if g.task == name]
    samples = [s for g in mine for s in g.samples]
    scores = [s.reward["score"] for s in samples if s.reward is not None and "score" in s.reward]
    oldest = min((min(s.response_model_steps) for s in samples if s.response_model_steps), default=None)
    admitted = [g.admission.staleness for g in mine if g.admission is not None]
    return {
        f"staleness/{name}/max": float(staleness(oldest, train_step)) if oldest is not None else 0.0,
        f"staleness/{name}/admission_max": float(max(admitted, default=0)),
        f"rollout/{name}/num_groups": float(len(mine)),
        f"rollout/{name}/reward_mean": sum(scores) / len(scores) if scores else 0.0,
        f"rollout/{name}/response_len_mean":
            sum(len(s.response_ids) for s in samples) / len(samples) if samples else 0.0,
        f"rollout/{name}/raw_reward_mean":
            window["raw_reward_sum"] / window["raw_reward_count"] if window["raw_reward_count"] else 0.0,
        # Groups that came back from generation (kept, dropped or aborted): beyond the trained
        # ones, what over-sampling (tasks.<name>.over_sample_threshold) and retries cost.
        f"rollout/{name}/groups_generated": float(window["groups_generated"]),
        f"rollout/{name}/groups_filtered": float(window["groups_filtered"]),
        f"rollout/{name}/groups_failed": float(window["groups_failed"]),
        f"rollout/{name}/groups_aborted": float(window["groups_aborted"]),
    }


class StepMetrics:
    """The counters of the window since the last batch, read and reset once per batch taken."""

    def __init__(self, replay_buffer: ReplayBuffer, contexts: dict[str, ProduceContext]) -> None:
        self.replay_buffer = replay_buffer
        self.contexts = contexts
        self.produce_s = 0.0  # seconds spent producing (strategies running) since the last batch
        self._marks = self._read_marks()

    def _read_marks(self) -> dict[str, int]:
        c = self.replay_buffer.counters
        return {
            "expired": c["expired"],
            "expired_tokens": c["expired_tokens"],
            "discarded_tokens": sum(ctx.agent_loop.tokens_discarded for ctx in self.contexts.values()),
        }

    def restart_window(self) -> None:
        """The window starts now (a checkpoint was loaded: its counters are the baseline)."""
        self._marks = self._read_marks()

    def step_stats(self, groups: list[Group], train_step: int, rollout_s: float) -> dict[str, float]:
        """The stats of the batch `groups` for `train_step`; ends the window (`rollout_s`: the wait for it)."""
        per_task = {}
        if len(self.contexts) > 1:  # before the windows are reset
            for name, c in self.contexts.items():
                per_task.update(task_stats(name, groups, c.window, train_step))
        window: Counter = Counter()
        for c in self.contexts.values():
            window.update(c.window)
            c.window.clear()
        now, before = self._read_marks(), self._marks
        self._marks = now
        raw_n = window["raw_reward_count"]
        raw_mean = window["raw_reward_sum"] / raw_n if raw_n else 0.0
        raw_var = window["raw_reward_sq_sum"] / raw_n - raw_mean * raw_mean if raw_n else 0.0
        producing_s, self.produce_s = self.produce_s, 0.0
        batch = batch_stats(groups, train_step)
        return {
            "rollout/groups_filtered": float(window["groups_filtered"]),
            "rollout/groups_failed": float(window["groups_failed"]),
            "rollout/groups_aborted": float(window["groups_aborted"]),
            "rollout/groups_cancelled": float(window["groups_cancelled"]),
            "rollout/groups_abort_capped": float(window["groups_abort_capped"]),
            "rollout/members_failed_infra": float(window["members_failed_infra"]),
            "rollout/tokens_generated": float(window["tokens_generated"]),
            "rollout/tokens_wasted": float(now["expired_tokens"] - before["expired_tokens"]
                                           + now["discarded_tokens"] - before["discarded_tokens"]),
            "rollout/reward_mean": batch.pop("rollout/reward_mean"),
            # Every judged group generated since the last batch, before filtering (a filter such as
            # all_equal_reward makes the trained batch's reward mean say nothing about the policy).
            "rollout/raw_reward_mean": raw_mean,
            "rollout/raw_reward_std": max(raw_var, 0.0) ** 0.5,
            "rollout/raw_samples_judged": float(raw_n),
            "rollout/samples_generated": float(window["samples_generated"]),
            "perf/produce_s": producing_s,
            "rollout/response_len_mean": batch.pop("rollout/response_len_mean"),
            "buffer/expired": float(now["expired"] - before["expired"]),
            **batch,  # staleness: per token, at admission, histogram
            "perf/rollout_s": float(rollout_s),
            **per_task,
            **self._agent_stats(groups),
        }

    def take_generated(self) -> GenerationTally:
        """What finished generating and what was dropped (filtered, expired) since the last call."""
        tally = GenerationTally()
        for c in self.contexts.values():
            tally.merge(c.tally.take())
        tally.add_dropped(self.replay_buffer.expired_lengths)
        self.replay_buffer.expired_lengths = []
        return tally

    def _agent_stats(self, groups: list[Group]) -> dict[str, float]:
        """What each task's agent loop reports on its part of the batch (e.g. the gateway's calls)."""
        out: dict[str, float] = {}
        for name, c in self.contexts.items():
            out.update(c.agent_loop.step_metrics([g for g in groups if g.task == name]))
        return out
