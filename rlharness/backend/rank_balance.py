"""Which rows each data-parallel rank trains (backend=deepspeed, fsdp2): equal row counts, balanced tokens.

RL responses have very different lengths, so handing rank r the rows r, r + W, ... gives
one rank far more tokens than another and every other rank waits for it at the gradient
reduction. As verl's `balance_batch` (`get_seqlen_balanced_partitions`), the rows of each
mini-batch are split into W parts of equal size by the Karmarkar-Karp largest-differencing
heuristic on their lengths, then refined by swaps between the heaviest and lightest parts.
Equal sizes keep what sharded training needs: every rank runs the same number of
forward/backward passes (ZeRO-3 and FSDP2 gather parameters collectively in each, ZeRO-2 and
FSDP2 reduce gradients in each backward). Which rank trains a row does not change the
loss or the gradient: each micro-batch's loss is divided by the whole mini-batch's
denominator and the ranks' gradients are summed (`ModelRunner.backward`).

Micro-batches per rank: `algo.micro_batch_size` rows, or with `backend.micro_batch_tokens`
the token-budget groups of `micro_batches.token_budget_slices`, then split further on the
ranks that have fewer groups until all ranks have as many (always possible: a rank has as
many rows as any other, and a group holds at least one row).

Before that each mini-batch is padded to a multiple of W rows (`pad_rows`) with copies of its
shortest row that train nothing, so that every rank gets as many rows.

Everything here is a pure function of the lengths: every rank computes the same plan.
"""

from __future__ import annotations

import dataclasses
import heapq
import math

import torch

from rlharness.backend.micro_batches import token_budget_slices
from rlharness.backend.packing import packed_budget_slices, packed_size_slices
from rlharness.core.types import TrainBatch


def karmarkar_karp(lengths: list[int], parts: int) -> list[list[int]]:
    """Indices of `lengths` in `parts` groups of equal size (len(lengths) must be a multiple of
    `parts`) whose sums are close: Karmarkar-Karp's largest differencing method with the equal-size
    constraint (as verl). Each group's indices are in ascending order."""
    if parts < 1 or len(lengths) % parts:
        raise ValueError(f"{len(lengths)} rows cannot be split into {parts} equal parts")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    # A state: `parts` partial groups (sum, indices), sorted by sum descending; its spread is max - min.
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for tie, start in enumerate(range(0, len(order), parts)):
        state = sorted(((lengths[i], [i]) for i in order[start:start + parts]), key=lambda g: -g[0])
        heapq.heappush(heap, (-(state[0][0] - state[-1][0]), tie, state))
    tie = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)  # the two states with the largest spreads
        _, _, b = heapq.heappop(heap)
        # Largest of one with smallest of the other: differences cancel.
        merged = sorted(((sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b))), key=lambda g: -g[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    groups = [g for _, g in heap[0][2]] if heap else [[] for _ in range(parts)]
    return [sorted(g) for g in _refine_by_swaps(lengths, groups)]


def _refine_by_swaps(lengths: list[int], groups: list[list[int]], max_swaps: int = 1000) -> list[list[int]]:
    """Swap one row of the heaviest group with one of the lightest while that narrows their gap.

    The equal-size variant of Karmarkar-Karp pairs rows of adjacent lengths, so one very long
    row (a long tail) can leave it several percent off; swaps keep the sizes equal and each one
    strictly lowers the sum of squared group sums, so this ends."""
    weights = torch.tensor(lengths, dtype=torch.float64)
    for _ in range(max_swaps):
        totals = [float(weights[g].sum()) if g else 0.0 for g in groups]
        hi = max(range(len(groups)), key=lambda k: totals[k])
        lo = min(range(len(groups)), key=lambda k: totals[k])
        gap = totals[hi] - totals[lo]
        if gap <= 0 or not groups[hi]:
            break
        diff = weights[groups[hi]][:, None] - weights[groups[lo]][None, :]  # what a swap moves
        after = torch.where((diff > 0) & (diff < gap), (gap - 2 * diff).abs(), torch.inf)
        best = int(torch.argmin(after))
        if not bool(torch.isfinite(after.view(-1)[best])):
            break
        i, j = divmod(best, len(groups[lo]))
        groups[hi][i], groups[lo][j] = groups[lo][j], groups[hi][i]
    return groups


def rank_shares(lengths: torch.Tensor, world_size: int, balance: bool) -> list[torch.Tensor]:
    """Positions (into `lengths`) each rank trains: Karmarkar-Karp, or strided (r, r + W, ...)."""
    n = lengths.numel()
    if not balance:
        return [torch.arange(r, n, world_size) for r in range(world_size)]
    return [torch.tensor(g, dtype=torch.long) for g in karmarkar_karp([int(x) for x in lengths], world_size)]


def imbalance(tokens: list[float]) -> float:
    """max/mean of the ranks' token counts (1.0 = perfectly balanced)."""
    mean = sum(tokens) / len(tokens)
    return max(tokens) / mean if mean > 0 else 1.0


def _split_to(groups: list[torch.Tensor], lengths: dict[int, int], count: int) -> list[torch.Tensor]:
    """Split the costliest multi-row groups in two until there are `count` groups."""
    groups = list(groups)
    while len(groups) < count:
        cost = [len(g) * max(lengths[int(i)] for i in g) if len(g) > 1 else -1 for g in groups]
        k = max(range(len(groups)), key=lambda j: cost[j])
        if cost[k] < 0:
            raise ValueError(f"cannot make {count} micro-batches of {sum(map(len, groups))} rows")
        g = groups[k]
        groups[k:k + 1] = [g[:len(g) // 2], g[len(g) // 2:]]
    return groups


def rank_micro_slices(rows: torch.Tensor, lengths: torch.Tensor, world_size: int, *, balance: bool,
                      micro_batch_size: int, budget: int | None,
                      packed_min_width: int | None = None) -> tuple[list[list[torch.Tensor]], int]:
    """Every rank's micro-batches (row indices from `rows`), the same number on every rank.

    `lengths[i]` is row `rows[i]`'s length; `rows` holds a multiple of `world_size` rows.
    `packed_min_width`: micro-batches of packed rows at least that wide (`packing.packed_budget_slices`,
    each rank's share packed on its own), not of padded rows. Returns the per-rank lists and how many rows are
    longer than `budget` (trained alone)."""
    per_rank, oversized = [], 0
    for share in rank_shares(lengths, world_size, balance):
        groups, over = micro_slices(rows[share], lengths[share], micro_batch_size, budget, packed_min_width)
        per_rank.append(groups)
        oversized += over
    count = max(len(g) for g in per_rank)
    length_of = {int(r): int(n) for r, n in zip(rows, lengths)}
    return [_split_to(g, length_of, count) for g in per_rank], oversized


def micro_slices(rows: torch.Tensor, lengths: torch.Tensor, micro_batch_size: int, budget: int | None,
                 packed_min_width: int | None) -> tuple[list[torch.Tensor], int]:
    """One rank's micro-batches of `rows` (`lengths`: theirs): `micro_batch_size` rows each, or the token
    `budget`'s groups; of padded rows, or of packed rows at least `packed_min_width` wide. Also returns how
    many rows are longer than `budget`."""
    if budget is None:
        if packed_min_width is None:
            return list(torch.split(rows, micro_batch_size)), 0
        return packed_size_slices(rows, lengths, micro_batch_size), 0
    if packed_min_width is None:
        return token_budget_slices(rows, lengths, budget)
    return packed_budget_slices(rows, lengths, budget, packed_min_width)


def pad_plan(rows: int, world_size: int, mini_batches: int,
             lengths: torch.Tensor | None = None) -> tuple[list[int] | None, list[float]]:
    """Which row each padded row copies (None: no padding needed) and whether it is a real row.

    A padding row copies its mini-batch's shortest row (by `lengths`; the first row without them):
    it trains nothing but still costs a forward and backward pass."""
    chunks = torch.tensor_split(torch.arange(rows), mini_batches)
    size = math.ceil(max(len(c) for c in chunks) / world_size) * world_size
    if all(len(c) == size for c in chunks):
        return None, [1.0] * rows
    index, real = [], []
    for c in chunks:
        copy = 0 if lengths is None or not len(c) else int(c[torch.argmin(lengths[c])])
        index += c.tolist() + [copy] * (size - len(c))
        real += [1.0] * len(c) + [0.0] * (size - len(c))
    return index, real


def pad_rows(batch: TrainBatch, world_size: int, mini_batches: int) -> TrainBatch:
    """Pad every mini-batch (the learner's `tensor_split` of the rows) to the same multiple of `world_size`.

    Padding rows copy the mini-batch's shortest row but train nothing (mask and advantage 0), and
    sit inside the mini-batch they pad, so each mini-batch holds the same real rows as without padding.
    """
    index, real = pad_plan(batch.input_ids.shape[0], world_size, mini_batches, batch.attention_mask.sum(-1))
    if index is None:
        return batch
    index_t = torch.tensor(index)
    keep = torch.tensor(real).unsqueeze(1)

    def take(t: torch.Tensor, zero_pads: bool) -> torch.Tensor:
        out = t[index_t]
        return out * keep.to(out.dtype) if zero_pads else out

    return dataclasses.replace(
        batch, input_ids=take(batch.input_ids, False), attention_mask=take(batch.attention_mask, False),
        response_mask=take(batch.response_mask, True), advantages=take(batch.advantages, True),
        rollout_logprobs=take(batch.rollout_logprobs, False), model_steps=take(batch.model_steps, False),
        # gae: a padding row's score lands on no token (its mask is 0)
        scores=None if batch.scores is None else batch.scores[index_t])
