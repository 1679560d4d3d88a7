"""The running batch of a continuous-batching decoder: a left-padded KV cache and its mask.

All rows share one column axis: column j of every layer's keys/values and of
`attention_mask` is the same slot, left padding is masked out, and each row carries
its own `position_ids`, so rows of different lengths decode together. Rows join by
merging a freshly prefilled batch (padding the shorter side on the left), leave by
`index_select`, and columns that became padding for every row are trimmed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer


def new_cache(model) -> DynamicCache:
    """An empty cache for `model`; refuses layer kinds whose columns are not plain slots."""
    cache = DynamicCache(config=model.config)
    kinds = {type(layer) for layer in cache.layers}
    if kinds - {DynamicLayer}:
        raise NotImplementedError(
            f"engine=hf batches full-attention KV caches only; {type(model).__name__} uses "
            f"{sorted(k.__name__ for k in kinds)} (sliding-window or linear-attention layers)"
        )
    return cache


@dataclass
class Batch:
    """Device state of the running rows (the Python-side per-request state lives elsewhere)."""

    cache: DynamicCache
    attention_mask: torch.Tensor  # [B, L] long: 1 = a real token is cached in that column
    next_tokens: torch.Tensor  # [B] long: the last sampled token, not yet in the cache
    next_positions: torch.Tensor  # [B] long: position id of next_tokens

    @property
    def size(self) -> int:
        return int(self.next_tokens.shape[0])

    @property
    def length(self) -> int:
        return int(self.attention_mask.shape[1])


def _pad_left(t: torch.Tensor, cols: int, dim: int) -> torch.Tensor:
    if cols == 0:
        return t
    # F.pad counts dimensions from the last one, in (left, right) pairs.
    pad = [0, 0] * (t.dim() - 1 - dim) + [cols, 0]
    return F.pad(t, pad)


def merge(a: Batch | None, b: Batch) -> Batch:
    """Rows of `a` then rows of `b`, aligned on the right (the newest column)."""
    if a is None or a.size == 0:
        return b
    length = max(a.length, b.length)
    pad_a, pad_b = length - a.length, length - b.length
    for la, lb in zip(a.cache.layers, b.cache.layers):
        la.keys = torch.cat([_pad_left(la.keys, pad_a, 2), _pad_left(lb.keys, pad_b, 2)], 0)
        la.values = torch.cat([_pad_left(la.values, pad_a, 2), _pad_left(lb.values, pad_b, 2)], 0)
    return Batch(
        cache=a.cache,
        attention_mask=torch.cat([_pad_left(a.attention_mask, pad_a, 1),
                                  _pad_left(b.attention_mask, pad_b, 1)], 0),
        next_tokens=torch.cat([a.next_tokens, b.next_tokens]),
        next_positions=torch.cat([a.next_positions, b.next_positions]),
    )


def select_rows(batch: Batch, keep: list[int]) -> Batch:
    """Keep only rows `keep` (in that order), then drop the all-padding columns on the left."""
    index = torch.tensor(keep, dtype=torch.long, device=batch.next_tokens.device)
    mask = batch.attention_mask.index_select(0, index)
    # First column some remaining row still uses; everything before it is padding for all.
    start = int(mask.any(0).long().argmax()) if mask.shape[1] else 0
    for layer in batch.cache.layers:
        layer.keys = layer.keys.index_select(0, index)[:, :, start:]
        layer.values = layer.values.index_select(0, index)[:, :, start:]
    return Batch(
        cache=batch.cache,
        attention_mask=mask[:, start:],
        next_tokens=batch.next_tokens.index_select(0, index),
        next_positions=batch.next_positions.index_select(0, index),
    )
