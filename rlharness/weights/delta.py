"""Delta weight syncs: a sync sends only the values that changed, in the engine's dtype, since the last one.

In bfloat16 an optimizer step changes few of a model's stored values: the update is below half a
unit in the last place for most weights (SmolLM2-135M, AdamW at 1e-5: 3% of the bfloat16 values
change per step from a float32 trainer, 1.3-2% from a bfloat16 one; docs/benchmarks.md "Delta weight
sync"). So the sender (the process holding the trainer's weights: the colocated driver, or training
rank 0's actor) keeps the last version it sent, cast to the engine's dtype (`DeltaEncoder`), and
sends each tensor as one of:

- `name`: the whole tensor in the engine's dtype (the first sync, a forced full one, a tensor whose
  difference would not be smaller);
- `name@blocks` and `name@values`: the indices (int32, or int64 past 2**31 blocks) of the blocks of
  `block` elements of the flattened tensor whose bits changed, and those blocks' new values (whole
  blocks: the last one padded, so `values.numel() == blocks.numel() * block` and a receiver needs no
  other word about the block size);
- nothing, when no bit of it changed.

The payload is a plain state dict of tensors, so every route (in process, object store, a broadcast
group, vLLM's workers) carries it as it carries full weights. A receiver patches what it holds in
place (`apply_payload_`: the hf engine's parameters, the sender's own reference) or keeps every
tensor of the version (`WeightShadow`: a vLLM worker, whose loader takes whole tensors). The result is
bit for bit what a full sync of the same version leaves: a full sync's cast is the same rounding.

Versions: an encoded payload is pending until the sync that carries it has reached every engine
(`commit`); the next payload is the difference to the committed version. So a payload made ahead of
its sync (the object-store route puts it right after the step) or a failed sync never moves the base,
and `version_state` can rebuild the whole of the committed version, or of the one in flight, for an
engine that restarted with its initial weights and must not be sent a difference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlharness.weights.transfer import BITS_OF_SIZE

BLOCKS, VALUES = "@blocks", "@values"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_tensor_state(state: Any) -> bool:
    """A non-empty mapping of tensors (a sim backend's version counter is not one: it passes as it is)."""
    return isinstance(state, Mapping) and bool(state) and all(isinstance(v, torch.Tensor) for v in state.values())


def split_payload(payload: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor],
                                                                dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """(whole tensors by name, {name: (blocks, values)} differences)."""
    whole, deltas = {}, {}
    for key, value in payload.items():
        if key.endswith(BLOCKS):
            name = key[:-len(BLOCKS)]
            deltas[name] = (value, payload[name + VALUES])
        elif not key.endswith(VALUES):
            whole[key] = value
    return whole, deltas


def payload_names(payload: Mapping[str, Any]) -> list[str]:
    """The model's tensor names a payload touches."""
    return [k[:-len(BLOCKS)] if k.endswith(BLOCKS) else k for k in payload if not k.endswith(VALUES)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(-1)
    return flat.view(BITS_OF_SIZE[flat.element_size()])


def _padded(flat: torch.Tensor, block: int) -> torch.Tensor:
    pad = -flat.numel() % block
    return torch.cat([flat, flat.new_zeros(pad)]) if pad else flat


def _changed_elements(old: torch.Tensor, new: torch.Tensor, most: int | None) -> torch.Tensor | None:
    """Indices (int64) of the elements of the flattened tensors in which any bit differs; None when more
    than `most` 8-byte words do (so more elements do too). Narrow dtypes compare 8-byte words first (a
    quarter of bfloat16's comparisons and of `nonzero`'s scan, which dominate), then only the changed
    words' elements."""
    a, b = _bits(old), _bits(new)
    per_word = 8 // a.element_size()
    if per_word > 1 and a.numel() % per_word == 0:
        try:
            words = (a.view(torch.int64) != b.view(torch.int64)).nonzero().flatten()
        except RuntimeError:  # storage not aligned to 8 bytes: element by element below
            words = None
        if words is not None:
            if most is not None and words.numel() > most:  # at least as many elements changed
                return None
            # Which elements of a changed word differ: its XOR's lanes (little-endian: element k is bits
            # k * width and up), no gather of single elements.
            xor = a.view(torch.int64)[words] ^ b.view(torch.int64)[words]
            width = 8 * a.element_size()
            lanes = torch.stack([(xor >> (width * k)) & ((1 << width) - 1) for k in range(per_word)], 1) != 0
            row, lane = lanes.nonzero().unbind(1)
            return words[row] * per_word + lane
    return (a != b).nonzero().flatten()


def changed_blocks(old: torch.Tensor, new: torch.Tensor, block: int, most: int | None = None) -> torch.Tensor | None:
    """Indices of the blocks of `block` elements (of the flattened tensors) in which any bit differs;
    None when more than `most` blocks do (the tensor goes whole)."""
    if block == 1:
        index = _changed_elements(old, new, most)
    else:
        index = _padded(_bits(old) != _bits(new), block).view(-1, block).any(1).nonzero().flatten()
    if index is None or (most is not None and index.numel() > most):
        return None
    return index.to(torch.int32 if -(-old.numel() // block) < 2**31 else torch.int64)


def block_values(t: torch.Tensor, blocks: torch.Tensor, block: int) -> torch.Tensor:
    """The elements of those blocks, whole blocks (the last padded)."""
    flat = t.reshape(-1)
    if block == 1:
        return flat[blocks.long()]
    return _padded(flat, block).view(-1, block)[blocks.long()].reshape(-1)


def patch_(target: torch.Tensor, blocks: torch.Tensor, values: torch.Tensor) -> None:
    """Write a difference into `target` (contiguous) in place."""
    if blocks.numel() == 0:
        return
    flat = target.view(-1)
    block = values.numel() // blocks.numel()
    index = blocks.to(device=flat.device, dtype=torch.long)
    values = values.to(device=flat.device, dtype=flat.dtype)
    if block > 1:
        index = (index[:, None] * block + torch.arange(block, device=flat.device)).reshape(-1)
        inside = index < flat.numel()  # the last block's padding
        index, values = index[inside], values[inside]
    flat.index_copy_(0, index, values)


def apply_payload_(targets: Mapping[str, torch.Tensor], payload: Mapping[str, torch.Tensor]) -> None:
    """Load a payload into tensors that hold the previous version (an engine's parameters), in place."""
    whole, deltas = split_payload(payload)
    with torch.no_grad():
        for name, value in whole.items():
            targets[name].copy_(value)
        for name, (blocks, values) in deltas.items():
            patch_(targets[name], blocks, values)


def check_payload(payload: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """A payload fits a model of these tensor shapes: known names, whole tensors of the right shape,
    differences whose blocks lie inside their tensor (raises naming the first that does not)."""
    unknown = sorted(set(payload_names(payload)) - set(shapes))
    if unknown:
        raise KeyError(f"load_weights: parameters not in the engine's model: {unknown[:5]}")
    whole, deltas = split_payload(payload)
    bad = [(k, tuple(v.shape), tuple(shapes[k])) for k, v in whole.items() if tuple(v.shape) != tuple(shapes[k])]
    if bad:
        raise ValueError(f"load_weights: shape mismatch (name, given, expected): {bad[:3]}")
    for name, (blocks, values) in deltas.items():
        numel = 1
        for d in shapes[name]:
            numel *= d
        block = values.numel() // max(blocks.numel(), 1)
        if blocks.numel() and (values.numel() != blocks.numel() * block or int(blocks.max()) * block >= numel
                               or int(blocks.min()) < 0):
            raise ValueError(f"load_weights: the difference for {name} does not fit its shape {tuple(shapes[name])}")


class DeltaEncoder:
    """The sender's side: casts each version to the engine's dtype and, with `delta`, encodes it as the
    difference to the last committed version. Non-tensor states (the sim backend's) pass unchanged."""

    def __init__(self, dtype: str | None, delta: bool, block: int = 1) -> None:
        if block < 1:
            raise ValueError(f"block={block} must be >= 1")
        self.dtype = _DTYPES[dtype] if dtype else None
        self.delta, self.block = delta, block
        self._committed: dict[str, torch.Tensor] = {}  # the engines' version, in their dtype
        self._committed_version: int | None = None
        self._pending: dict[str, torch.Tensor] = {}  # the last payload, until its sync is through

    def _cast(self, t: torch.Tensor, copy: bool = False) -> torch.Tensor:
        return t.detach().to(dtype=self.dtype or t.dtype, copy=copy)

    def encode(self, state: Any, full: bool = False) -> Any:
        """This version as a payload: the difference to the committed version (`full`: every tensor whole)."""
        if not is_tensor_state(state):
            return state
        if not self.delta:
            return {k: self._cast(v) for k, v in state.items()}
        out: dict[str, torch.Tensor] = {}
        for name, t in state.items():
            new = self._cast(t)  # may be the trainer's live tensor: what is sent whole is copied below
            old = None if full else self._committed.get(name)
            if old is None or old.shape != new.shape or old.dtype != new.dtype:
                out[name] = self._cast(t, copy=True)  # it may be committed: never a view of the live tensor
                continue
            # A difference of n blocks costs n indices and n * block values: above `most` it is not smaller.
            blocks_total = -(-new.numel() // self.block)
            block_bytes = (4 if blocks_total < 2**31 else 8) + self.block * new.element_size()
            blocks = changed_blocks(old, new, self.block, most=(new.nbytes - 1) // block_bytes)
            if blocks is None:
                out[name] = self._cast(t, copy=True)
            elif blocks.numel():
                out[name + BLOCKS], out[name + VALUES] = blocks, block_values(new, blocks, self.block)
        self._pending = out
        return out

    def commit(self, version: int) -> None:
        """The last payload reached every engine: it is the base of the next difference."""
        self._apply(self._committed, self._pending)
        self._pending, self._committed_version = {}, int(version)

    def version_state(self, version: int) -> dict[str, torch.Tensor]:
        """Every tensor of `version` whole: the committed version, or the committed one with the pending
        payload applied (a sync of `version` in flight). For an engine that lost what it held."""
        if not self.delta:
            raise ValueError("version_state: this encoder keeps no versions (delta syncs are off)")
        if version == self._committed_version:
            return dict(self._committed)
        if self._committed_version is not None and version < self._committed_version:
            raise ValueError(f"version_state({version}): version {version} is older than the one the sender "
                             f"holds ({self._committed_version})")
        if not self._pending:
            raise ValueError(f"version_state({version}): the sender holds version {self._committed_version} "
                             f"and no later payload")
        state = {k: v.clone() for k, v in self._committed.items()}
        self._apply(state, self._pending)
        return state

    @staticmethod
    def _apply(held: dict[str, torch.Tensor], payload: Mapping[str, torch.Tensor]) -> None:
        whole, deltas = split_payload(payload)
        held.update(whole)  # the payload's own copies (encode made them)
        for name, (blocks, values) in deltas.items():
            patch_(held[name], blocks, values)


class WeightShadow:
    """Every tensor of the version a receiver holds, under the model's names: for a receiver whose loader
    takes whole tensors (vLLM's), fed payload entries one by one as they arrive (each is copied: a
    broadcast's tensors are views of buffers reused for later buckets)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._halves: dict[str, tuple[str, torch.Tensor]] = {}  # name -> the part of a difference seen first

    def _feed(self, key: str, value: torch.Tensor) -> None:
        if key.endswith(BLOCKS) or key.endswith(VALUES):
            name, part = key.rsplit("@", 1)
            first = self._halves.pop(name, None)
            if first is None:
                self._halves[name] = (part, value.clone())
                return
            blocks, values = (first[1], value) if part == "values" else (value, first[1])
            held = self.tensors.get(name)
            if held is None:
                raise ValueError(f"a weight difference for {name} arrived, but this receiver never held it whole "
                                 f"(a restarted receiver needs a full sync)")
            patch_(held, blocks, values)
            return
        held = self.tensors.get(key)
        if held is not None and held.shape == value.shape and held.dtype == value.dtype:
            held.copy_(value)
        else:
            self.tensors[key] = value.detach().clone()

    def receive(self, entries: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One version's payload entries, in any order (a broken-off earlier one leaves nothing behind)."""
        self._halves = {}
        for key, value in entries:
            self._feed(key, value)
        if self._halves:
            raise ValueError(f"weight differences without their other part: {sorted(self._halves)[:3]}")


@dataclass(frozen=True)
class WeightEncoding:
    """What a sync sends: tensors cast to `dtype` (the engine's; None: as the trainer holds them), and with
    `delta` only what changed (`EngineConf.sends_deltas`)."""

    dtype: str | None = None
    delta: bool = False

    def encoder(self) -> DeltaEncoder:
        return DeltaEncoder(self.dtype, self.delta)
