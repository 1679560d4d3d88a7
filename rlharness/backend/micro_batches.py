"""Token-budget micro-batches (`backend.micro_batch_tokens`): rows grouped by length, not by count.

A micro-batch is right-padded to its longest row, so fixed-count micro-batches of rows of
very different lengths (RL responses: a long tail) spend much of their compute on padding.
Sorting the rows longest first and filling each micro-batch while rows x longest row stays
within the budget groups rows of similar length together. The loss needs no other change:
every micro-batch already divides by the whole mini-batch's denominator
(`losses.loss_denominator`), so any partition of the rows accumulates the same loss and
gradient for every `algo.loss_agg` (up to float summation order).
"""

from __future__ import annotations

import torch


def token_budget_slices(rows: torch.Tensor, lengths: torch.Tensor, budget: int) -> tuple[list[torch.Tensor], int]:
    """Split `rows` (row indices) into groups whose size x longest length is at most `budget` tokens.

    `lengths[i]` is row `rows[i]`'s length (prompt + response, without padding). A row longer
    than the budget goes alone in its group. Returns the groups (longest rows first; within
    a group, in that order) and the number of rows longer than the budget.
    """
    if budget < 1:
        raise ValueError(f"micro-batch token budget {budget} must be >= 1")
    order = torch.argsort(lengths, descending=True, stable=True)
    groups: list[list[int]] = []
    width = 0  # the current group's longest row (its first: rows come longest first)
    oversized = 0
    for i in order.tolist():
        n = int(lengths[i])
        if groups and (len(groups[-1]) + 1) * width <= budget:
            groups[-1].append(i)
            continue
        groups.append([i])
        width = n
        oversized += n > budget
    return [rows[torch.tensor(g, dtype=torch.long)] for g in groups], oversized
