"""Groups of judged samples -> one padded `TrainBatch` (+ rollout metrics).

Row b is prompt_ids + response_ids of one sample, right-padded. Every per-token
tensor is indexed by the token's own position: a response token at position t has
response_mask 1 (0 for tokens the agent loop inserted, e.g. tool output:
`RolloutState.loss_mask`), its sample's advantage, the engine's log-prob for it and the weight
version that produced it, all at [b, t]. Prompt and padding positions have mask 0,
advantage 0, log-prob 0 and model step -1. (The seeds shifted advantages one token
against the labels; the loss functions shift the *logits* instead, once, in
`token_logprobs`.)

Rows: one per sample, in the groups' member order, then one per *branch*: an agent whose
calls ran in parallel (or restarted its conversation) produced several token sequences,
each generated on its own context (`RolloutState.extra["branches"]`, each a dict of
`prompt_ids`, `response_ids`, `response_logprobs`, `response_model_steps`, `response_mask`;
the gateway's, rlharness/agent/gateway_session.py). A branch is trained as a row of its own
with its sample's advantage: its tokens keep their own log-probs and versions and are never
interleaved with another sequence's.

Members that failed for a reason that is not the policy's are left out of the advantage
statistics and of the loss under `algo.failed_member_policy=mask` (rlharness/core/member_failures.py);
the reward metrics count the valid members only.
"""

from __future__ import annotations

import statistics

import torch

from rlharness.algo.advantages import compute_advantages
from rlharness.algo.distill import distill_advantages, distill_metrics
from rlharness.algo.shaping import overlong_penalty, truncated_samples
from rlharness.config.schema import ADVANTAGES, AlgoConf
from rlharness.core.member_failures import masked
from rlharness.core.types import Group, RolloutState, TrainBatch

_BRANCH_KEYS = ("prompt_ids", "response_ids", "response_logprobs", "response_model_steps", "response_mask")


def training_rows(s: RolloutState) -> list[tuple[list[int], list[int], list[float], list[int], list[int]]]:
    """(prompt ids, response ids, log-probs, versions, loss mask) of each token sequence of `s`:
    its own, then its branches' (module docstring)."""
    rows = [(s.prompt_ids, s.response_ids, s.response_logprobs, s.response_model_steps, s.loss_mask())]
    for b in s.extra.get("branches", ()):
        rows.append(tuple(b[k] for k in _BRANCH_KEYS))
    return rows


def _score(s: RolloutState, policy: str) -> float:
    if masked(s, policy):
        return 0.0  # left out: no statistic and no loss reads it
    if s.reward is None or "score" not in s.reward:
        raise ValueError(f"sample uid={s.uid} (group {s.group_id}) has no reward['score']: judge it before training")
    return float(s.reward["score"])


def _check_row(s: RolloutState, row) -> None:
    _, ids, logprobs, steps, mask = row
    if not (len(ids) == len(logprobs) == len(steps) == len(mask)):
        raise ValueError(
            f"sample uid={s.uid}: response_ids ({len(ids)}), response_logprobs ({len(logprobs)}), "
            f"response_model_steps ({len(steps)}) and the loss mask ({len(mask)}) differ in length"
        )


def _check_teacher(s: RolloutState) -> None:
    if len(s.teacher_logprobs) != len(s.response_ids):
        raise ValueError(f"sample uid={s.uid} (task {s.task}): {len(s.teacher_logprobs)} teacher log-probs for "
                         f"{len(s.response_ids)} response tokens: its task has a teacher, which scores every "
                         f"group before it is trained")


def build_train_batch(groups: list[Group], algo: AlgoConf, pad_token_id: int, train_step: int,
                      max_response_len: int, temperature: float,
                      task_budgets: dict[str, int] | None = None,
                      teacher_coefs: dict[str, float] | None = None) -> tuple[TrainBatch, dict[str, float]]:
    """Advantages per group (`algo.advantage`), broadcast over each sample's response tokens.

    Groups whose rewards are all equal stay in the batch with zero advantages (they add
    tokens to the loss normaliser but nothing to the gradient). `temperature` is the
    rollout sampling temperature; greedy (0) rollouts are scored at temperature 1.
    With `algo.overlong_buffer_len` the DAPO overlong penalty is added to each score before
    the advantages, against the budget of the group's own task (`task_budgets`: task name ->
    its `max_tokens`; a task not named there, or no dict, gets `max_response_len`, the run's
    largest): a task sampled with a smaller budget is penalised within its own buffer. With
    `algo.mask_truncated` responses cut by the budget get response_mask 0 (`rlharness.algo.shaping`).
    `teacher_coefs` (task name -> its teacher's coef; tasks without a teacher are not named) adds the
    distillation term -coef x reverse_kl_t to every token of those tasks' samples (rlharness/algo/distill.py),
    from the log-probs the teacher gave each sample (`RolloutState.teacher_logprobs`).
    """
    if not groups:
        raise ValueError("build_train_batch: no groups")
    sizes = {len(g) for g in groups}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"build_train_batch: every group needs the same, non-zero size; got sizes {sorted(sizes)}")
    samples = [s for g in groups for s in g.samples]
    coefs = teacher_coefs or {}
    policy = algo.failed_member_policy
    valid = torch.tensor([[not masked(s, policy) for s in g.samples] for g in groups])
    rewards = torch.tensor([[_score(s, policy) for s in g.samples] for g in groups], dtype=torch.float32)
    budgets = torch.tensor([[(task_budgets or {}).get(g.task, max_response_len)] for g in groups])
    penalty = overlong_penalty(torch.tensor([[len(s.response_ids) for s in g.samples] for g in groups]),
                               budgets, algo.overlong_buffer_len, algo.overlong_penalty_factor)
    scores = (rewards + penalty).reshape(-1)
    # gae: the backend computes per-token advantages against its critic at train time (from `scores`);
    # opd: the teacher's term below is the whole advantage.
    advantages = (torch.zeros_like(scores) if ADVANTAGES[algo.advantage] is None
                  else compute_advantages(rewards + penalty, algo, mask=valid).reshape(-1))
    truncated = truncated_samples(samples)
    left_out = (~valid).reshape(-1).tolist()
    masked_out = [(t and algo.mask_truncated) or out for t, out in zip(truncated, left_out)]

    # Every sample's own row first (member order: what the on-policy guard's per-row gaps follow), then
    # the branches'; `owner[b]` is the sample index of row b.
    per_sample = [training_rows(s) for s in samples]
    rows = [r[0] for r in per_sample] + [b for r in per_sample for b in r[1:]]
    owner = list(range(len(samples))) + [i for i, r in enumerate(per_sample) for _ in r[1:]]
    for b, row in enumerate(rows):
        _check_row(samples[owner[b]], row)
    lengths = [len(row[0]) + len(row[1]) for row in rows]
    num_rows, width = len(rows), max(lengths)
    input_ids = torch.full((num_rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((num_rows, width), dtype=torch.long)
    response_mask = torch.zeros((num_rows, width), dtype=torch.float32)
    token_adv = torch.zeros((num_rows, width), dtype=torch.float32)
    rollout_logprobs = torch.zeros((num_rows, width), dtype=torch.float32)
    model_steps = torch.full((num_rows, width), -1, dtype=torch.long)
    for b, (prompt_ids, ids, logprobs, steps, mask) in enumerate(rows):
        i = owner[b]
        p, r = len(prompt_ids), len(ids)
        input_ids[b, : p + r] = torch.tensor(prompt_ids + ids, dtype=torch.long)
        attention_mask[b, : p + r] = 1
        # Tokens the agent loop inserted (tool output, `loss_mask` 0) get no loss and,
        # like prompt positions, advantage 0.
        if not masked_out[i]:
            response_mask[b, p: p + r] = torch.tensor(mask, dtype=torch.float32)
        token_adv[b, p: p + r] = advantages[i] * response_mask[b, p: p + r]
        rollout_logprobs[b, p: p + r] = torch.tensor(logprobs, dtype=torch.float32)
        model_steps[b, p: p + r] = torch.tensor(steps, dtype=torch.long)
    distill = _add_teacher_term(samples, coefs, rollout_logprobs, response_mask, token_adv) if coefs else {}

    batch = TrainBatch(
        input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask, advantages=token_adv,
        rollout_logprobs=rollout_logprobs, model_steps=model_steps, train_step=train_step,
        num_groups=len(groups), max_response_len=max_response_len,
        temperature=temperature if temperature > 0 else 1.0, scores=scores[owner],
    )
    metrics = {**rollout_metrics(groups, rewards, advantages, valid), **distill}
    if ADVANTAGES[algo.advantage] is None:  # gae: not known before the critic's values (critic/* metrics); opd: none
        del metrics["rollout/adv_abs_mean"]
    metrics["rollout/overlong_penalty_mean"] = float(penalty.mean())
    metrics["rollout/truncated_masked_frac"] = sum(t and algo.mask_truncated for t in truncated) / len(samples)
    metrics["rollout/members_masked"] = float(sum(left_out))
    metrics["rollout/branch_rows"] = float(num_rows - len(samples))
    return batch, metrics


def _add_teacher_term(samples: list[RolloutState], coefs: dict[str, float], rollout_logprobs: torch.Tensor,
                      response_mask: torch.Tensor, token_adv: torch.Tensor) -> dict[str, float]:
    """Adds -coef x reverse_kl_t to the tokens of each sample's own row (rows 0..len(samples)-1) whose task
    has a teacher; returns the distill/* metrics. The teacher scored each sample's own sequence, so a
    branch row (an agent's parallel call) gets no teacher term."""
    n, width = len(samples), rollout_logprobs.shape[1]
    teacher_logprobs = torch.zeros((n, width), dtype=torch.float32)
    for b, s in enumerate(samples):
        if s.task in coefs:
            _check_teacher(s)
            p, r = len(s.prompt_ids), len(s.response_ids)
            teacher_logprobs[b, p: p + r] = torch.tensor(s.teacher_logprobs, dtype=torch.float32)
    row_coef = torch.tensor([coefs.get(s.task, 0.0) for s in samples])
    scored = response_mask[:n] * torch.tensor([float(s.task in coefs) for s in samples]).unsqueeze(1)
    token_adv[:n] += distill_advantages(rollout_logprobs[:n], teacher_logprobs, scored, row_coef)
    return distill_metrics(rollout_logprobs[:n], teacher_logprobs, scored)


def rollout_metrics(groups: list[Group], rewards: torch.Tensor, advantages: torch.Tensor,
                    valid: torch.Tensor | None = None) -> dict[str, float]:
    """Reward and length statistics of the batch; rewards over the `valid` members only ([G, k] bool)."""
    samples = [s for g in groups for s in g.samples]
    response_lens = [len(s.response_ids) for s in samples]
    valid = torch.ones(rewards.shape, dtype=torch.bool) if valid is None else valid
    flat = rewards[valid] if bool(valid.any()) else rewards.reshape(-1)
    hi = torch.where(valid, rewards, -torch.inf).max(dim=1).values
    lo = torch.where(valid, rewards, torch.inf).min(dim=1).values
    zero_signal = int(((hi == lo) | (valid.sum(dim=1) < 2)).sum())
    # A router's parts (e.g. reward_model and math: the learned reward and the true correctness).
    parts = sorted({k for s in samples if s.reward for k in s.reward if k != "score"})
    part_means = {f"rollout/reward_{k}_mean": statistics.fmean(s.reward[k] for s in samples
                                                             if s.reward and k in s.reward) for k in parts}
    branch_tokens = sum(len(b["response_ids"]) for s in samples for b in s.extra.get("branches", ()))
    return {**part_means,
        "rollout/reward_mean": float(flat.mean()),
        "rollout/reward_std": float(flat.std()) if flat.numel() > 1 else 0.0,
        "rollout/reward_max": float(flat.max()),
        "rollout/reward_min": float(flat.min()),
        "rollout/response_len_mean": float(statistics.fmean(response_lens)),
        "rollout/response_len_max": float(max(response_lens)),
        "rollout/response_len_min": float(min(response_lens)),
        "rollout/truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
        "rollout/adv_abs_mean": float(advantages.abs().mean()),
        "rollout/groups_zero_signal_frac": zero_signal / len(groups),
        "rollout/num_groups": float(len(groups)),
        "rollout/num_samples": float(len(samples)),
        "rollout/num_response_tokens": float(sum(response_lens) + branch_tokens),
    }
