"""Our vLLM worker extension: weights arrive by broadcast from training rank 0.

vLLM mixes this class into each of its workers (`worker_extension_cls`, as TRL's
`vllm serve`, OpenRLHF and verl do). The async engine runs its workers in another
process and its RPC channel carries plain data only (no functions, no tensors), so
the engine calls these methods by name through `collective_rpc` with plain
arguments (names, shapes, dtypes, a version), and the tensors travel in a process
group of our own: training rank 0 is rank 0, the workers of each engine the ranks
after it (`rlharness.weights.transfer.WeightGroupMember`: NCCL on GPU, gloo on CPU, one code path),
and vLLM's in-place `reload_weights` loads them.

This module is imported inside vLLM's worker processes; it must stay importable
without vLLM (the engine names it by its dotted path).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from rlharness.weights.delta import WeightShadow
from rlharness.weights.transfer import WeightGroupError, WeightGroupMember, specs_from_rows

log = logging.getLogger(__name__)

EXTENSION_PATH = "rlharness.engine.vllm_worker.WeightSyncExtension"


class WeightSyncExtension:
    """Methods vLLM adds to its worker (`self` is the worker: `self.rank`, `self.model_runner`)."""

    def rlh_weight_group_join(self, backend: str, host: str, port: int, rank_offset: int, world_size: int,
                              timeout_s: float, bucket_bytes: int, cpu_linear: str, deltas: bool = False) -> int:
        """Join the weight group as rank `rank_offset + <this worker's rank>`; returns that rank.
        `cpu_linear`: `engine.cpu_linear` (see `_rlh_torch_linear`). `deltas`: versions may hold only
        differences (rlharness/weights/delta.py): this worker keeps every tensor of the version it holds,
        under the model's names, and hands the loader whole tensors."""
        self.rlh_weight_group_leave()
        self._rlh_cpu_linear = cpu_linear
        self._rlh_shadow = WeightShadow() if deltas else None
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
        shadow = getattr(self, "_rlh_shadow", None)
        if shadow is not None:  # a difference needs the whole of what it patches: received first, then loaded
            shadow.receive(incoming)
            incoming = iter(shadow.tensors.items())
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

        if self._rlh_torch_linear():
            # Every layer computes from its own plain weight (below): the loaders copy each
            # tensor into place as it arrives, and there is nothing to process after loading.
            model = self._rlh_model()
            # Tied parameters (an LM head sharing the embedding): vLLM's loader loads one name and
            # skips the others; loading each under the name it skips keeps what HF's
            # `load_state_dict` and vLLM's reload both do (the last name written wins).
            owner: dict[int, str] = {}
            alias = {name: owner.setdefault(id(p), name) for name, p in model.named_parameters(remove_duplicate=False)}
            with torch.no_grad():
                done = model.load_weights((alias.get(name, name), t) for name, t in stream())
            # A layer made plain above holds no values until loaded: a sync must cover the model.
            missing = {name for name, _ in model.named_parameters()} - set(done or ())
            if missing:
                raise WeightGroupError(f"weight version {version} did not hold {len(missing)} of the model's "
                                       f"parameters (e.g. {sorted(missing)[:3]})")
        else:
            # vLLM's in-place reload (not the model's bare `load_weights`): it restores the
            # loaders that post-load processing removed and re-processes the weights.
            self.reload_weights(weights_iterator=stream())
        return loaded

    def rlh_linear_kernels(self) -> dict[str, int]:
        """How many layers compute through each CPU GEMM (tests, diagnostics): {kernel: layers}."""
        import torch.nn.functional as F

        counts: dict[str, int] = {}
        for module in self._rlh_model().modules():
            if hasattr(module, "cpu_linear"):
                kind = "torch" if module.cpu_linear is F.linear else "packed"
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    def _rlh_torch_linear(self) -> bool:
        """On vLLM's CPU build with `engine.cpu_linear=torch`: put every GEMM layer on torch's
        `F.linear` over its own full weight (once; again after a disk reload re-packed one),
        so a sync is a copy into those weights. False where that does not apply (GPU, quantized
        or LoRA-wrapped models): the caller then uses vLLM's reload.

        Why: after loading, vLLM's CPU build re-packs each linear weight into oneDNN's blocked
        layout (`dispatch_cpu_unquantized_gemm`: `create_onednn_mm`) and frees the plain one;
        the packed copy cannot be updated in place, so each sync through `reload_weights`
        re-materializes every layer, loads it, re-packs it and copies it back. vLLM keeps a
        layer on `F.linear` with its weight where `_cpu_skip_gemm_dispatch` is set (its MLA
        `kv_b_proj`); setting it here keeps vLLM's own later reloads (`weight_sync=disk`) so.
        Called once the first bucket is in (a sync that never starts leaves the model as it was);
        a first sync that breaks off mid-stream leaves the layers it did not reach without values
        (vLLM's reload would leave a mix of versions there), and the engine reports it failed."""
        if self._rlh_cpu_linear != "torch":
            return False
        import torch.nn.functional as F
        from vllm.platforms import current_platform

        config = self.model_runner.vllm_config
        if not current_platform.is_cpu() or config.model_config.quantization is not None or config.lora_config:
            return False
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
        from vllm.model_executor.model_loader.reload.meta import materialize_layer, restore_layer_on_meta

        layers = [m for m in self._rlh_model().modules() if hasattr(m, "cpu_linear") and m.cpu_linear is not F.linear]
        for module in layers:
            weight = getattr(module, "weight", None)
            if weight is None or weight.is_meta or (weight.ndim != 2 and weight.numel() > 0):
                return False  # not a plain GEMM layer: leave the whole model to vLLM's reload
        for module in layers:
            if module.weight.numel() == 0:  # the packing freed it: back to its model-format parameter
                info = get_layerwise_info(module)
                restore_layer_on_meta(module, info)
                materialize_layer(module, info)
            module._cpu_skip_gemm_dispatch = True
            module.cpu_linear = F.linear
        return True

    def _rlh_model(self) -> Any:
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model
