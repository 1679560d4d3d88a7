"""Our vLLM worker extension: weights arrive by broadcast from training rank 0.

vLLM mixes this class into each of its workers (`worker_extension_cls`, as TRL's
`vllm serve`, OpenRLHF and verl do). The async engine runs its workers in another
process and its RPC channel carries plain data only (no functions, no tensors), so
the engine calls these methods by name through `collective_rpc` with plain
arguments (names, shapes, dtypes, a version), and the tensors travel in a process
group of our own: training rank 0 is rank 0, the workers of each engine the ranks
after it (`weight_transfer.WeightGroupMember`: NCCL on GPU, gloo on CPU, one code path),
and vLLM's in-place `reload_weights` loads them.

This module is imported inside vLLM's worker processes; it must stay importable
without vLLM (the engine names it by its dotted path).
"""

from __future__ import annotations

import logging
from typing import Any

from rlharness.weight_transfer import WeightGroupError, WeightGroupMember, specs_from_rows

log = logging.getLogger(__name__)

EXTENSION_PATH = "rlharness.engine.vllm_worker.WeightSyncExtension"


class WeightSyncExtension:
    """Methods vLLM adds to its worker (`self` is the worker: `self.rank`, `self.model_runner`)."""

    def rlh_weight_group_join(self, backend: str, host: str, port: int, rank_offset: int, world_size: int,
                              timeout_s: float, bucket_bytes: int) -> int:
        """Join the weight group as rank `rank_offset + <this worker's rank>`; returns that rank."""
        self.rlh_weight_group_leave()
        rank = rank_offset + int(getattr(self, "rank", 0))
        self._rlh_member = WeightGroupMember(backend, host, port, rank, world_size, timeout_s, bucket_bytes)
        log.info("vllm worker joined the %s weight group as rank %d of %d (%s:%d)",
                 backend, rank, world_size, host, port)
        return rank

    def rlh_weight_group_leave(self) -> None:
        member = getattr(self, "_rlh_member", None)
        self._rlh_member = None
        if member is not None:
            member.close()

    def rlh_receive_weights(self, version: int, specs: list[list[Any]] | None = None) -> int:
        """Receive `version` by broadcast and load it; returns how many tensors were loaded.

        `specs`: [name, shape, dtype] per tensor when the caller has them; None reads
        them from the group's store (a remote trainer published them there)."""
        member = getattr(self, "_rlh_member", None)
        if member is None:
            raise WeightGroupError("rlh_receive_weights before rlh_weight_group_join")
        typed = None if specs is None else specs_from_rows(specs)
        incoming = member.receive_stream(int(version), typed)
        # The specs and the first bucket arrive before vLLM's reload starts: a sync that never
        # starts (no sender, a timeout) raises here and leaves the model as it was.
        first = next(incoming, None)
        loaded = 0

        def stream():  # bucket k+1 arrives while vLLM loads bucket k (WeightGroupMember.receive_stream)
            nonlocal loaded
            for item in ([] if first is None else [first]):
                loaded += 1
                yield item
            for item in incoming:
                loaded += 1
                yield item

        # vLLM's in-place reload (not the model's bare `load_weights`): it restores the
        # loaders that post-load processing removed and re-processes the weights.
        self.reload_weights(weights_iterator=stream())
        return loaded

    def rlh_weight_names(self) -> list[str]:
        """The model's parameter names as vLLM holds them (tests, diagnostics)."""
        return [name for name, _ in self._rlh_model().named_parameters()]

    def _rlh_model(self) -> Any:
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model
