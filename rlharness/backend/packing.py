"""Packed rows (`backend.packing`): a micro-batch's samples end to end, no padding between them and no
attention across them.

A micro-batch of right-padded rows computes every row to its longest: with RL's long-tailed response
lengths much of that is padding (token-budget micro-batches group rows of similar length, which
helps, but a group still pads to its first row). Packed, shorter samples fill that padding: the
mini-batch's samples, longest first, each go into the first row with room for them, of any
micro-batch, else start a row (`packed_micro_batches`). Micro-batches stay within the token budget
(rows x width <= budget, which also bounds memory) and no row is wider than the padded layout's: eager
and sdpa attention compute a row's whole width x width scores (the block-diagonal mask zeroes most of
them), so rows as wide as the longest sample would pay in attention what they save in padding. With
flash-attention's variable-length path, which computes only each sample's own scores, or flex_attention's
block mask, which computes only the blocks holding them (both GPU-only for training), a micro-batch is
one row of the budget instead. With `algo.micro_batch_size`, each micro-batch's samples are packed
into rows as wide as its longest. A micro-batch lists its samples row by row and `next_fit` lays them
out again in that order.

Each sample's position ids start at 0 as they do in its own row, and transformers' mask builders
take a position id that does not follow its predecessor for the start of a new sequence
(`masking_utils.find_packed_sequence_indices`: eager and sdpa get a block-diagonal causal mask,
flex_attention a block mask of it, flash-attention its variable-length path), so no token attends
across samples; `honours_packing` checks that a model does, with its attention implementation, before
a run relies on it.

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
    """Indices of `lengths` in bins of `capacity` (or the longest item, if longer): longest first, each
    into the first bin it fits. Within a bin, in the order placed."""
    return packed_micro_batches(lengths, math.inf, capacity)[0] if lengths else []


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


def packed_micro_batches(lengths: list[int], budget: float, min_width: int = 0) -> list[list[list[int]]]:
    """Indices of `lengths` as micro-batches of packed rows (micro-batch -> rows -> samples), longest
    first. The longest sample not yet placed opens a micro-batch as wide as itself (or `min_width`, if
    wider), which takes more rows while rows x width <= `budget`; each sample goes into the first row,
    of any micro-batch, with room for it, else a new row of the last micro-batch, else it opens the
    next. With `min_width` 0 these are the padded layout's token-budget micro-batches
    (`micro_batches.token_budget_slices`) with shorter samples moved into their rows' padding: no wider
    rows than padded ones, as dense attention costs rows x width^2. With `min_width` = the budget, one
    row per micro-batch filled first-fit decreasing: the least padding, for an attention that computes
    only each sample's own scores (`VARLEN_ATTENTION`)."""
    micro: list[list[list[int]]] = []
    rooms: list[list[int]] = []  # each row's free tokens
    width = 0  # the last micro-batch's
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        n = lengths[i]
        spot = next(((m, r) for m, free in enumerate(rooms) for r, room in enumerate(free) if n <= room), None)
        if spot is not None:
            m, r = spot
            micro[m][r].append(i)
            rooms[m][r] -= n
        elif micro and (len(micro[-1]) + 1) * width <= budget:
            micro[-1].append([i])
            rooms[-1].append(width - n)
        else:
            width = row_width([n], min_width)
            micro.append([[i]])
            rooms.append([width - n])
    return micro


def row_width(sizes: list[int], min_width: int) -> int:
    """The width a micro-batch of samples of these `sizes` is packed at: its longest sample, or
    `min_width` where that is wider."""
    return max(min_width, max(sizes, default=1))


def _listed(rows: torch.Tensor, micro_batch: list[list[int]]) -> torch.Tensor:
    """A planned micro-batch's samples (positions in `rows`) as row indices, row by row."""
    return rows[torch.tensor([i for row in micro_batch for i in row], dtype=torch.long)]


def packed_budget_slices(rows: torch.Tensor, lengths: torch.Tensor, budget: int,
                         min_width: int = 0) -> tuple[list[torch.Tensor], int]:
    """Micro-batches of packed rows within the token `budget` (`packed_micro_batches`), each listing its
    samples row by row (`next_fit` at its `row_width` lays them out again, in at most as many rows).
    Returns the micro-batches and the number of samples longer than the budget (trained alone)."""
    if budget < 1:
        raise ValueError(f"micro-batch token budget {budget} must be >= 1")
    lens = [int(n) for n in lengths]
    return [_listed(rows, mb) for mb in packed_micro_batches(lens, budget, min_width)], sum(n > budget for n in lens)


def packed_size_slices(rows: torch.Tensor, lengths: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Micro-batches of `size` samples (`algo.micro_batch_size`), each listing its samples row by row as
    packed first-fit decreasing into rows as wide as its longest sample."""
    return [_listed(r, packed_micro_batches([int(k) for k in n], math.inf)[0])
            for r, n in zip(torch.split(rows, size), torch.split(lengths, size))]


# Attention implementations whose packed path computes only each sample's own scores: flash's variable-length
# kernels, and flex_attention's block mask (transformers builds it from the packed position ids: only the
# 128 x 128 blocks that hold some sample's own scores are computed). Their packed rows are a budget wide.
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")


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
        """Pack right-padded rows (each row's tokens first, then padding) into rows as wide as the longest
        row, or `width` where that is wider: first-fit decreasing, or with `in_order` in the given order
        (`next_fit`: the order of a planned micro-batch)."""
        return cls._build(ids, *cls._layout(attention_mask, width, in_order))

    @classmethod
    def pack_if_denser(cls, ids: torch.Tensor, attention_mask: torch.Tensor, width: int | None = None,
                       in_order: bool = False) -> "PackedRows | None":
        """`pack`'s layout where it has fewer rows than the padded one; else None: one sample per row is
        the padded rows' work (or more, with a wider row), without packing's gathers."""
        lengths, width, bins = cls._layout(attention_mask, width, in_order)
        return cls._build(ids, lengths, width, bins) if len(bins) < ids.shape[0] else None

    @staticmethod
    def _layout(attention_mask: torch.Tensor, width: int | None,
                in_order: bool) -> tuple[list[int], int, list[list[int]]]:
        """The rows' lengths, the packed width, and each packed row's rows."""
        lengths = [int(n) for n in attention_mask.sum(-1)]
        width = row_width(lengths, 0 if width is None else width)
        return lengths, width, (next_fit if in_order else first_fit_decreasing)(lengths, width)

    @classmethod
    def _build(cls, ids: torch.Tensor, lengths: list[int], width: int, bins: list[list[int]]) -> "PackedRows":
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


def computed_ids(mb: dict[str, Any]) -> torch.Tensor:
    """The ids a micro-batch's forward computes: its packed rows where it has them, else its padded rows."""
    return mb["packed"].input_ids if "packed" in mb else mb["input_ids"]


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
