"""Moving a weight version from the training side to the engines through the Ray object store.

The training worker (rank 0) puts the state dict into the object store itself and
hands the driver only the reference (`RemoteWeights`): the tensors go trainer ->
object store -> every engine, never through the driver, and every engine reads the
same object. A plain dict (a local backend) is put once by `to_object_ref`.

The GPU path (a NCCL broadcast from training rank 0 to the engines) lives in
`rlharness.distributed.collective`; both are bounded by a timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

import ray
import ray.experimental


class WeightSyncTimeout(TimeoutError):
    """A weight transfer to an engine did not finish in time (the engine is hung, not slow)."""


class RemoteWeights(Mapping):
    """A state dict that lives in the Ray object store; behaves as a (lazily fetched) mapping."""

    def __init__(self, ref: Any, timeout_s: float) -> None:
        self.ref = ref
        self.timeout_s = timeout_s
        self._value: dict[str, Any] | None = None

    def _fetch(self) -> dict[str, Any]:
        if self._value is None:
            self._value = ray.get(self.ref, timeout=self.timeout_s)
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
        """The stored object's size (the weights sent, serialized), without fetching it here."""
        found = ray.experimental.get_object_locations([self.ref], timeout_ms=int(self.timeout_s * 1000))
        return int(found.get(self.ref, {}).get("object_size") or 0)


def to_object_ref(state: Mapping[str, Any] | Any) -> Any:
    """An ObjectRef for `state`: the one it already has, or a single new `ray.put`."""
    if isinstance(state, RemoteWeights):
        return state.ref
    if isinstance(state, ray.ObjectRef):
        return state
    return ray.put(dict(state))
