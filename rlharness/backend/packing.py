"""Packed rows (`backend.packing`): a micro-batch's samples end to end, no padding between them and no
attention across them.

A micro-batch of right-padded rows computes every row to its longest: with RL's long-tailed response
lengths much of that is padding (token-budget micro-batches group rows of similar length, which
helps, but a group still pads to its first row). Packed, a mini-batch's samples are laid end to end
in rows of a capacity, filled first-fit decreasing over the whole mini-batch, so only the ends of a
few rows are padding; a sample longer than the capacity is a row of its own. Then whole rows make
the micro-batches, widest first: as many as the token budget holds (`packed_budget_slices`: rows x
width <= budget, which also bounds memory), or `algo.micro_batch_size` samples' rows. A micro-batch
lists its samples row by row and `next_fit` lays them out again in that order. The capacity
(`choose_capacity`) trades padding against attention: wide rows leave the least padding, but eager and
sdpa attention compute a row's whole width x width scores (the block-diagonal mask zeroes most of
them), so with a long tail of lengths rows narrower than the longest sample cost less.

Each sample's position ids start at 0 as they do in its own row, and transformers' mask builders
take a position id that does not follow its predecessor for the start of a new sequence
(`masking_utils.find_packed_sequence_indices`: eager and sdpa get a block-diagonal causal mask,
flash-attention its variable-length path), so no token attends across samples; `honours_packing`
checks that a model does, with its attention implementation, before a run relies on it.

The forward's outputs go back to the padded [B, T] layout the losses take (`PackedRows.rows_at`,
`PackedRows.unpack`), so log-probs, entropy, values, the loss and its gradient are the unpacked
computation's (up to float summation order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` in bins of at most `capacity` (an item longer goes alone): longest first, each
    into the first bin it fits. Within a bin, in the order placed."""
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        n = lengths[i]
        for b, room in enumerate(free):
            if n <= room:
                bins[b].append(i)
                free[b] -= n
                break
        else:
            bins.append([i])
            free.append(capacity - n)
    return bins


def next_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` in bins of at most `capacity`, in the given order: a new bin when the next item
    does not fit in the last one. On the concatenated bins of `first_fit_decreasing` it gives those bins
    back (an item opened a new bin because it did not fit the earlier ones, which only got fuller)."""
    bins: list[list[int]] = []
    room = 0
    for i, n in enumerate(lengths):
        if not bins or n > room:
            bins.append([])
            room = capacity
        bins[-1].append(i)
        room -= n
    return bins


def packed_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` bin-packed first-fit decreasing into packed rows of `capacity` tokens (a longer
    sample is a row of its own): each row's samples, the over-long rows first (longest first)."""
    return sorted(first_fit_decreasing(lengths, capacity), key=lambda b: -row_width([lengths[i] for i in b], capacity))


def row_width(sizes: list[int], capacity: int) -> int:
    """The width a micro-batch of samples of these `sizes` is packed at: `capacity`, or its longest sample
    where that is longer (such a sample is a row of its own, like a padded row)."""
    return max(capacity, max(sizes, default=1))


def packed_budget_slices(rows: torch.Tensor, lengths: torch.Tensor, budget: int,
                         capacity: int) -> tuple[list[torch.Tensor], int]:
    """Micro-batches of packed rows: all of `rows` bin-packed into rows of `capacity` tokens (a longer
    sample alone in its row), then consecutive rows, longest first, while rows x the first row's width
    <= `budget` (as `micro_batches.token_budget_slices` groups padded rows; at least one row). Each
    micro-batch lists its samples row by row (`next_fit` at its `row_width` lays them out again, in at
    most as many rows). Returns the micro-batches and the number of samples longer than the budget."""
    if budget < 1:
        raise ValueError(f"micro-batch token budget {budget} must be >= 1")
    lens = [int(n) for n in lengths]
    groups: list[list[int]] = []
    rows_in_group, width = 0, 0  # the current micro-batch's rows and width: its first row's (widest first)
    for row in packed_bins(lens, capacity):
        if groups and (rows_in_group + 1) * width <= budget:
            groups[-1] += row
            rows_in_group += 1
            continue
        groups.append(list(row))
        rows_in_group, width = 1, row_width([lens[i] for i in row], capacity)
    return [rows[torch.tensor(g, dtype=torch.long)] for g in groups], sum(n > budget for n in lens)


def packed_size_slices(rows: torch.Tensor, lengths: torch.Tensor, size: int, capacity: int) -> list[torch.Tensor]:
    """Micro-batches of `size` samples (`algo.micro_batch_size`), each listing its samples row by row as
    packed into rows of `capacity` tokens."""
    out = []
    for r, n in zip(torch.split(rows, size), torch.split(lengths, size)):
        out.append(r[torch.tensor([i for b in packed_bins([int(k) for k in n], capacity) for i in b])])
    return out


# The row width at which a row's attention (width^2 scores, masked or not) costs as much as the rest of its
# forward and backward: measured on SmolLM2-135M-Instruct on a CPU (benchmarks/packed_rows.py --capacity).
DENSE_ATTENTION_TOKENS = 2048.0
# Attention implementations whose packed path computes only each sample's own scores (variable length).
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")


def attention_tokens(attn_implementation: str) -> float:
    """`packing_cost`'s attention_tokens for a model's attention implementation."""
    return math.inf if attn_implementation in VARLEN_ATTENTION else DENSE_ATTENTION_TOKENS


def packing_cost(lengths: list[int], budget: int, capacity: int, attention_tokens: float) -> float:
    """What training a mini-batch of samples of these `lengths` packed at `capacity` costs, in token
    units: each micro-batch's rows x width, plus its attention, rows x width^2 / `attention_tokens`
    (eager and sdpa attention compute a row's whole width x width scores, masked or not; flash
    attention's variable-length path does not: inf)."""
    rows = torch.arange(len(lengths))
    cost = 0.0
    for g in packed_budget_slices(rows, torch.tensor(lengths), budget, capacity)[0]:
        sizes = [lengths[int(i)] for i in g]
        width = row_width(sizes, capacity)
        cost += len(next_fit(sizes, width)) * width * (1 + width / attention_tokens)
    return cost


def choose_capacity(lengths: list[int], budget: int | None, attention_tokens: float) -> int:
    """Packed rows' capacity for a mini-batch: the longest sample without a token budget, else the one of
    a few candidates (the longest sample, its half and third, the lengths at quantiles 1/2 .. 19/20, the
    budget) that
    `packing_cost` finds cheapest: wide rows leave the least padding, narrow ones compute less attention."""
    longest = max(lengths, default=1)
    if budget is None:
        return longest
    ordered = sorted(lengths)
    candidates = {longest, longest // 2, longest // 3, max(budget, longest),
                  *(ordered[int(q * (len(ordered) - 1))] for q in (0.5, 0.65, 0.8, 0.9, 0.95))} - {0}
    return min(sorted(candidates), key=lambda c: (packing_cost(lengths, budget, c, attention_tokens), -c))


@dataclass
class PackedRows:
    """A micro-batch's right-padded rows [B, T] laid out packed: `input_ids` and `position_ids` [R, W], and
    where each token of the padded layout went (`index` [B, T], a position in the flattened [R * W]; -1
    for padding)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    index: torch.Tensor

    @classmethod
    def pack(cls, ids: torch.Tensor, attention_mask: torch.Tensor, width: int | None = None,
             in_order: bool = False) -> "PackedRows":
        """Pack right-padded rows (each row's tokens first, then padding) into rows of `width` tokens, or
        the longest row's length where that is longer (default: it): first-fit decreasing, or with
        `in_order` in the given order (`next_fit`: the order of a planned micro-batch)."""
        lengths = [int(n) for n in attention_mask.sum(-1)]
        width = row_width(lengths, 1 if width is None else width)
        bins = (next_fit if in_order else first_fit_decreasing)(lengths, width)
        device = ids.device
        packed = torch.zeros(len(bins), width, dtype=ids.dtype, device=device)
        # A row's unfilled end counts as a sequence of its own (positions from 0): nothing attends to it.
        positions = torch.zeros(len(bins), width, dtype=torch.long, device=device)
        index = torch.full(ids.shape, -1, dtype=torch.long, device=device)
        for r, samples in enumerate(bins):
            start = 0
            for b in samples:
                n = lengths[b]
                packed[r, start:start + n] = ids[b, :n]
                positions[r, start:start + n] = torch.arange(n, device=device)
                index[b, :n] = r * width + start + torch.arange(n, device=device)
                start += n
            positions[r, start:] = torch.arange(width - start, device=device)
        return cls(packed, positions, index)

    @property
    def padding(self) -> int:
        """Pad tokens in the packed rows."""
        return self.input_ids.numel() - int((self.index >= 0).sum())

    def forward_inputs(self) -> dict[str, Any]:
        """The model's inputs: packed ids and their position ids, no attention mask and no KV cache (the
        positions mark the samples' bounds; a 2-D mask, or a cache, switches transformers' packed-sequence
        detection off and every token would attend to the whole row before it)."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "attention_mask": None,
                "use_cache": False}

    def rows_at(self, out: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[N, ...]: the packed forward's outputs (`out` [R, W, ...]) at the padded layout's `positions`
        ([B, T - 1] bool: the tokens whose successor is scored), in the order `x[:, :-1][positions]` gives."""
        return out.reshape(-1, *out.shape[2:])[self.index[:, :-1][positions]]

    def unpack(self, out: torch.Tensor) -> torch.Tensor:
        """[B, T, ...]: the packed forward's outputs in the padded layout (zeros at padding)."""
        flat = out.reshape(-1, *out.shape[2:])
        full = flat.new_zeros(*self.index.shape, *out.shape[2:])
        real = self.index >= 0
        full[real] = flat[self.index[real]]
        return full


def honours_packing(forward: Callable[..., Any], vocab_size: int, device: torch.device | str) -> bool:
    """Whether a model (its `forward`, with its attention implementation) keeps packed samples apart: the
    second of two packed samples gets the same logits whatever the first one is."""
    g = torch.Generator().manual_seed(0)
    second = torch.randint(0, vocab_size, (5,), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long, device=device)
    mask[1, 5:] = 0
    outs = []
    for _ in range(2):  # the first sample (the longer: packed first) differs between the passes
        ids = torch.stack([torch.randint(0, vocab_size, (7,), generator=g), torch.cat([second, second[:2]])])
        packed = PackedRows.pack(ids.to(device), mask, width=12)
        with torch.no_grad():
            outs.append(packed.unpack(forward(**packed.forward_inputs()).logits)[1, :5].float())
    return torch.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5 * float(outs[0].abs().max()))
