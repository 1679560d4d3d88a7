"""Weight versions in the Ray object store: copied in once, read in place by every engine.

A training rank puts a version into the store itself (`for_object_store`) and hands the
driver only the reference (`RemoteWeights`), so the tensors go trainer -> object store ->
every engine, never through the driver, and every engine reads the same object.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Iterator

import ray
import torch

from rlharness.weights.transfer import tensor_specs


class PackedWeights:
    """A state dict in the form the Ray object store holds without extra copies.

    Ray pickles a torch tensor through `torch.save` (its bytes serialized, then copied into
    the store, then deserialized by the reader: three copies of 513 MB for SmolLM2), but a
    numpy array out of band: one copy into the store, and the reader's array is a view of
    the store's memory. So each tensor travels as a uint8 numpy view of its bytes (any
    dtype, bfloat16 included) next to its spec; `tensors()` rebuilds the named tensors as
    views of those bytes, read-only where they live in the store: readers copy from them
    (an engine's load), never write into them."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        self.specs = tensor_specs(state)
        self.arrays = [t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
                       for t in state.values()]

    def tensors(self) -> dict[str, torch.Tensor]:
        with warnings.catch_warnings():  # "non-writable array": the store's memory, only read (see above)
            warnings.simplefilter("ignore", UserWarning)
            return {s.name: torch.from_numpy(a).view(s.torch_dtype).view(s.shape)
                    for s, a in zip(self.specs, self.arrays)}


def for_object_store(state: Mapping[str, Any]) -> Any:
    """What to `ray.put` for a weight version: `PackedWeights` when every value is a tensor
    (a state dict), else the plain dict (e.g. the sim backend's version counter)."""
    state = dict(state)
    return PackedWeights(state) if state and all(isinstance(t, torch.Tensor) for t in state.values()) else state


def unpacked(state: Any) -> Any:
    """The named tensors of a `PackedWeights`; anything else as it is."""
    return state.tensors() if isinstance(state, PackedWeights) else state


class RemoteWeights(Mapping):
    """A state dict that lives in the Ray object store; behaves as a (lazily fetched) mapping.

    The training worker (rank 0) puts the state dict into the object store itself and
    hands the driver only the reference: the tensors go trainer -> object store -> every
    engine, never through the driver, and every engine reads the same object."""

    def __init__(self, ref: Any, timeout_s: float) -> None:
        self.ref = ref
        self.timeout_s = timeout_s
        self._value: dict[str, Any] | None = None

    def _fetch(self) -> dict[str, Any]:
        if self._value is None:
            self._value = unpacked(ray.get(self.ref, timeout=self.timeout_s))
        return self._value

    def __getitem__(self, key: str) -> Any:
        return self._fetch()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fetch())

    def __len__(self) -> int:
        return len(self._fetch())

    def __repr__(self) -> str:
        return f"RemoteWeights({self.ref})"

    @property
    def nbytes(self) -> int:
        return stored_bytes(self.ref, self.timeout_s)


def to_object_ref(state: Mapping[str, Any] | Any) -> Any:
    """An ObjectRef for `state`: the one it already has, or a single new `ray.put`."""
    if isinstance(state, RemoteWeights):
        return state.ref
    if isinstance(state, ray.ObjectRef):
        return state
    return ray.put(for_object_store(state))


def stored_bytes(ref: Any, timeout_s: float) -> int:
    """A stored object's size (the weights sent, serialized), without fetching it here."""
    import ray.experimental

    found = ray.experimental.get_object_locations([ref], timeout_ms=int(timeout_s * 1000))
    return int(found.get(ref, {}).get("object_size") or 0)
