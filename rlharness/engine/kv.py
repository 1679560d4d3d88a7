"""The running batch of a continuous-batching decoder: a left-padded KV cache and its mask.

All rows share one column axis: column j of every layer's keys/values and of
`attention_mask` is the same slot, left padding is masked out, and each row carries
its own `position_ids`, so rows of different lengths decode together.

Keys/values live in preallocated buffers (`SlotLayer`): a decode step writes one
column in place, where Hugging Face's `DynamicLayer` would `torch.cat` the whole cache
(measured: that copy was the largest single cost of a step at the tiny size). The batch
changes shape only in `rebuild`, which copies the rows that stay and the rows that join
into fresh buffers, right-aligned, dropping columns that are padding for every row.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

# Free columns a rebuilt buffer gets; it doubles when full.
HEADROOM_COLS = 64


def cache_kwarg(model) -> str:
    """The name `model.forward` takes the KV cache by: transformers 5.24 renamed
    `past_key_values` to `cache` (the old name warns at every call until 5.40 removes it);
    vLLM's venv pins an older line that knows only `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class SlotLayer(DynamicLayer):
    """A `DynamicLayer` whose keys/values are views into a buffer with spare columns."""

    def __init__(self, buf_k: torch.Tensor | None = None, buf_v: torch.Tensor | None = None,
                 length: int = 0):
        super().__init__()
        self.length = 0
        if buf_k is not None:
            self.dtype, self.device = buf_k.dtype, buf_k.device
            self.buf_k, self.buf_v, self.length = buf_k, buf_v, length
            self.keys, self.values = buf_k[:, :, :length], buf_v[:, :, :length]
            self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        q = key_states.shape[-2]
        if not self.is_initialized:
            b, h, _, d = key_states.shape
            self.dtype, self.device = key_states.dtype, key_states.device
            self.buf_k = key_states.new_empty(b, h, q + HEADROOM_COLS, d)
            self.buf_v = value_states.new_empty(b, h, q + HEADROOM_COLS, value_states.shape[-1])
            self.is_initialized = True
        end = self.length + q
        if end > self.buf_k.shape[2]:
            self._grow(max(end, 2 * self.buf_k.shape[2]))
        self.buf_k[:, :, self.length:end] = key_states
        self.buf_v[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self.buf_k[:, :, :end], self.buf_v[:, :, :end]
        return self.keys, self.values

    def _grow(self, cols: int) -> None:
        for name in ("buf_k", "buf_v"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[0], old.shape[1], cols, old.shape[3])
            new[:, :, :self.length] = old[:, :, :self.length]
            setattr(self, name, new)

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0


def check_supported(model) -> None:
    """Refuse layer kinds whose columns are not plain slots (sliding window, linear attention)."""
    kinds = {type(layer) for layer in DynamicCache(config=model.config).layers}
    if kinds - {DynamicLayer}:
        raise NotImplementedError(
            f"engine=hf batches full-attention KV caches only; {type(model).__name__} uses "
            f"{sorted(k.__name__ for k in kinds)} (sliding-window or linear-attention layers)"
        )


def prefill_cache(model) -> DynamicCache:
    """The cache a joining group is prefilled into (plain layers: one write, then rebuilt)."""
    return DynamicCache(config=model.config)


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


def _first_used_column(mask: torch.Tensor) -> int:
    return int(mask.any(0).long().argmax()) if mask.shape[1] else 0


def rebuild(old: Batch | None, keep: list[int], fresh: Batch | None) -> Batch | None:
    """Rows `keep` of `old` (in order) then all rows of `fresh`, in new slot buffers.

    Rows are right-aligned on the newest column; leading columns that are padding for
    every remaining row are dropped. Returns None when no row is left.
    """
    parts = []  # (batch, row index or None for all, first column kept)
    if old is not None and keep:
        index = torch.tensor(keep, dtype=torch.long, device=old.next_tokens.device)
        parts.append((old, index, _first_used_column(old.attention_mask.index_select(0, index))))
    if fresh is not None and fresh.size:
        parts.append((fresh, None, _first_used_column(fresh.attention_mask)))
    if not parts:
        return None

    def rows(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
        return t if index is None else t.index_select(0, index)

    width = max(b.length - start for b, _, start in parts)
    total = sum(b.size if i is None else len(i) for b, i, _ in parts)
    ref = parts[0][0]
    mask = ref.attention_mask.new_zeros(total, width)
    layers = []
    for li, ref_layer in enumerate(ref.cache.layers):
        k0 = ref_layer.keys
        # Uninitialised beyond what is written: the headroom is written before it is read,
        # and only the left padding is zeroed (masked, but 0 * NaN garbage would be NaN).
        buf_k = k0.new_empty(total, k0.shape[1], width + HEADROOM_COLS, k0.shape[3])
        buf_v = k0.new_empty(total, k0.shape[1], width + HEADROOM_COLS, ref_layer.values.shape[3])
        row = 0
        for b, index, start in parts:
            n = b.size if index is None else len(index)
            cols = b.length - start
            layer = b.cache.layers[li]
            buf_k[row:row + n, :, :width - cols] = 0
            buf_v[row:row + n, :, :width - cols] = 0
            buf_k[row:row + n, :, width - cols:width] = rows(layer.keys[:, :, start:], index)
            buf_v[row:row + n, :, width - cols:width] = rows(layer.values[:, :, start:], index)
            if li == 0:
                mask[row:row + n, width - cols:] = rows(b.attention_mask[:, start:], index)
            row += n
        layers.append(SlotLayer(buf_k, buf_v, width))
    cache = ref.cache if isinstance(ref.cache.layers[0], SlotLayer) else DynamicCache(config=None)
    cache.layers = layers
    return Batch(
        cache=cache,
        attention_mask=mask,
        next_tokens=torch.cat([rows(b.next_tokens, i) for b, i, _ in parts]),
        next_positions=torch.cat([rows(b.next_positions, i) for b, i, _ in parts]),
    )
