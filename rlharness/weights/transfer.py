"""The pieces every weight route shares: tensors of a version and how they travel in a group.

Needs only torch, so the engines, the training backends and the Ray layer all build on it
without importing one another. (How a version is routed to the engines, and the Ray
payloads, are the weight channel's: `rlharness.distributed.weight_channel`.) What lives here:

- the tensor specs of a version (name, shape, dtype) and their plain-data rows, for an
  RPC channel that carries no tensors (vLLM's `collective_rpc`);
- exact block checksums of a version (the on-policy guard compares both ends with them);
- bucket planning: same-dtype tensors flattened into buckets of at most `BUCKET_BYTES`, the
  parts of a layer an engine fuses (q/k/v, gate/up) kept in one bucket;
- group membership: `WeightGroupMember`, one process's place in a broadcast group of its
  own (NCCL between GPUs, gloo otherwise: one code path).

A broadcast transfer is:

1. rank 0 writes the version's tensor specs into the group's store (or the caller sends
   them along with the request);
2. each bucket is broadcast from rank 0; receivers split them back into named tensors
   (views, no copy). Pipelined on both sides: rank 0 packs bucket k+1 while k is on the
   wire, and a receiver posts bucket k+1 before it hands bucket k to the loader;
3. each engine loads the received tensors as that version, as they arrive.

Every step is bounded by the group's timeout: reading the specs (the store's timeout) and
each broadcast (`Work.wait(timeout)`; NCCL's watchdog also aborts a communicator stuck
past it). A hung peer raises; it never blocks forever.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Iterator

import torch

BUCKET_BYTES = 32 << 20  # 2 kept buffers per member; several buckets for the pipeline to overlap
_SPECS_KEY = "weights/specs/{version}"

class WeightGroupError(RuntimeError):
    """The weight broadcast group could not be formed or a transfer failed (names the member)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a state dict (0 for anything else)."""
    if not isinstance(state, Mapping):
        return 0
    return sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))


def tied_once(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Each tensor once, under its first name: a weight version names a tied parameter (an LM head
    sharing the embedding) once, as `save_pretrained` writes it. Sending both names would move and
    load the same bytes twice (SmolLM2: its 113 MB embedding, a fifth of the model); an engine
    built from the same config ties them too, so loading the first name sets both."""
    seen: set[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in named:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if t.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out


# Integer views of a float's bits, by element size: a checksum that any changed bit changes.
BITS_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# Elements per checksum block: 4 KiB of float32, a memory page, so a verdict can tell one stale page
# from a whole stale tensor.
CHECKSUM_BLOCK = 1024


def weight_checksums(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An exact fingerprint of each tensor of a weight version (each tied tensor once): per block of
    `CHECKSUM_BLOCK` elements, the sum of their bit patterns (int64), so two sides can say whether they
    hold the same version and, where not, which parts of a tensor differ."""
    out = {}
    for name, t in tied_once(state.items()).items():
        flat = t.detach().contiguous().view(-1)
        bits = flat.view(BITS_OF_SIZE[flat.element_size()])
        whole = bits.numel() // CHECKSUM_BLOCK * CHECKSUM_BLOCK
        sums = [bits[:whole].view(-1, CHECKSUM_BLOCK).sum(1, dtype=torch.int64)]
        if whole < bits.numel():
            sums.append(bits[whole:].sum(dtype=torch.int64).view(1))
        out[name] = torch.cat(sums)
    return out


def tensor_specs(state: Mapping[str, torch.Tensor]) -> list[TensorSpec]:
    return [TensorSpec(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()]


def _module_group(name: str) -> str:
    """The part of a parameter name an engine may fuse across: its parent module's parent.

    `model.layers.0.self_attn.q_proj.weight` -> `model.layers.0.self_attn` (vLLM fuses q/k/v into
    qkv_proj, gate/up into gate_up_proj, and loads such a layer only once all its parts came)."""
    parts = name.split(".")
    return ".".join(parts[:-2]) if len(parts) > 2 else name


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Indices of `specs` grouped into buckets: one dtype per bucket, at most `bucket_bytes` each
    (a tensor larger than that gets a bucket of its own). Order within a dtype is kept.

    Adjacent tensors of one module group (`_module_group`, same dtype) never straddle two buckets,
    unless together they exceed `bucket_bytes`: a receiver that reuses its buffers hands out views
    valid only while their bucket is being loaded, and vLLM holds a fused layer's parts until its
    last part arrives. A group larger than the cap starts a bucket of its own and is split only
    where its tensors would overflow it."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be > 0")
    runs: list[list[int]] = []  # adjacent tensors of one module group and dtype
    for i, spec in enumerate(specs):
        prev = specs[runs[-1][-1]] if runs else None
        if prev is not None and prev.dtype == spec.dtype and _module_group(prev.name) == _module_group(spec.name):
            runs[-1].append(i)
        else:
            runs.append([i])
    size = [s.numel * torch.empty((), dtype=s.torch_dtype).element_size() for s in specs]
    buckets: list[list[int]] = []
    open_bucket: dict[str, tuple[list[int], int]] = {}
    for run in runs:
        dtype, run_bytes = specs[run[0]].dtype, sum(size[i] for i in run)
        current = open_bucket.get(dtype)
        if current is None or (current[1] + run_bytes > bucket_bytes and current[0]):
            current = ([], 0)
            buckets.append(current[0])
        for i in run:
            if current[0] and current[1] + size[i] > bucket_bytes and run_bytes > bucket_bytes:
                current = ([], 0)  # a group larger than the cap: split where it overflows
                buckets.append(current[0])
            current[0].append(i)
            current = (current[0], current[1] + size[i])
        open_bucket[dtype] = current
    return buckets


def spec_rows(specs: list[TensorSpec]) -> list[list[Any]]:
    """`[name, shape, dtype]` per tensor: plain data, for an RPC channel that carries no objects."""
    return [[s.name, list(s.shape), s.dtype] for s in specs]


def specs_from_rows(rows: list[list[Any]]) -> list[TensorSpec]:
    return [TensorSpec(n, tuple(s), d) for n, s, d in rows]


def make_process_group(backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> Any:
    """A process group of its own (not the default one): TCPStore rendezvous at host:port (rank 0 serves)."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=True)
    if backend == "gloo":
        pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    elif backend == "nccl":
        if not dist.is_nccl_available():
            raise WeightGroupError("weight group backend=nccl, but this torch build has no NCCL")
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout  # the watchdog aborts a collective stuck past this
        pg = dist.ProcessGroupNCCL(store, rank, world_size, options)
    else:
        raise WeightGroupError(f"weight group backend={backend!r} is not one of gloo, nccl")
    return store, pg


class WeightGroupMember:
    """One process's place in the group (lives inside a training or engine actor)."""

    def __init__(self, backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float,
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        self.backend, self.rank, self.world_size = backend, rank, world_size
        self.timeout_s, self.bucket_bytes = timeout_s, bucket_bytes
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.store, self.pg = make_process_group(backend, host, port, rank, world_size, timeout_s)
        self._last_version: int | None = None
        # Two bucket buffers used in turn (bucket k in buffer k % 2), kept across syncs: the
        # pipeline needs two, and memory touched for the first time costs a page fault per page
        # (on a loaded CPU host more than the copy itself).
        self._buffers: list[torch.Tensor | None] = [None, None]

    def close(self) -> None:
        """Leave the group (its communicator's resources are freed)."""
        shutdown = getattr(self.pg, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def _start_broadcast(self, tensor: torch.Tensor) -> Any:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        return self.pg.broadcast([tensor], opts)

    def _finish(self, work: Any) -> None:
        if not work.wait(timedelta(seconds=self.timeout_s)):
            raise TimeoutError(f"weight broadcast (rank {self.rank}) did not finish within {self.timeout_s:g} s")

    def _bucket_buffer(self, k: int, specs: list[TensorSpec], bucket: list[int]) -> torch.Tensor:
        """Bucket k's flat tensor in buffer k % 2 (grown when a bucket needs more)."""
        dtype = specs[bucket[0]].torch_dtype
        numel = sum(specs[i].numel for i in bucket)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buf = self._buffers[k % 2]
        if buf is None or buf.numel() < nbytes:
            buf = self._buffers[k % 2] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return buf[:nbytes].view(dtype)

    def send(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Rank 0: publish the specs, broadcast every bucket.

        Pipelined: bucket k+1 is packed (one copy per tensor, the only one on this side; a
        bucket of one contiguous tensor is sent from the tensor itself) while bucket k is on
        the wire."""
        if self.rank != 0:
            raise WeightGroupError(f"send on rank {self.rank}: only rank 0 (training rank 0) sends")
        specs = tensor_specs(state)
        self.store.set(_SPECS_KEY.format(version=version), pickle.dumps(specs))
        if self._last_version is not None:  # receivers read it before the broadcast could finish
            self.store.delete_key(_SPECS_KEY.format(version=self._last_version))
        self._last_version = version
        tensors = list(state.values())
        in_flight: tuple[Any, torch.Tensor] | None = None  # (work, its buffer: alive until it is done)
        with torch.no_grad():
            for k, bucket in enumerate(plan_buckets(specs, self.bucket_bytes)):
                only = tensors[bucket[0]].detach()
                if len(bucket) == 1 and only.is_contiguous() and only.device == self.device:
                    flat = only.reshape(-1)  # a bucket of one tensor goes as it is: no copy (e.g. the embedding)
                else:  # (tensors elsewhere, e.g. a trainer's on a GPU into a gloo group, are copied here)
                    flat = self._bucket_buffer(k, specs, bucket)  # bucket k - 2 is through: its buffer is free
                    torch.cat([tensors[i].detach().reshape(-1).to(self.device) for i in bucket], out=flat)
                if in_flight is not None:
                    self._finish(in_flight[0])
                in_flight = (self._start_broadcast(flat), flat)
            if in_flight is not None:
                self._finish(in_flight[0])

    def receive(self, version: int, specs: list[TensorSpec] | None = None) -> dict[str, torch.Tensor]:
        """Ranks 1..n: receive every bucket of `version`, return named tensors (each bucket its own memory)."""
        return dict(self.receive_stream(version, specs, reuse_buffers=False))

    def receive_stream(self, version: int, specs: list[TensorSpec] | None = None,
                       reuse_buffers: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks 1..n: (name, tensor) pairs of `version`, bucket by bucket.

        Pipelined: bucket k+1's broadcast is posted before bucket k's tensors are yielded, so
        it arrives while the caller loads bucket k (vLLM's `reload_weights` takes the iterator).
        The tensors are views of the received buffers: no copy here. With `reuse_buffers` the
        buffers are the member's two kept ones, so a tensor is valid only until the iterator
        moves on to the next bucket: for a caller that copies each tensor as it comes (a load).

        `specs` are the version's tensor specs when the caller has them (e.g. sent along
        with the request); otherwise they are read from the group's store."""
        if self.rank == 0:
            raise WeightGroupError("receive on rank 0: rank 0 sends")
        if specs is None:
            key = _SPECS_KEY.format(version=version)
            self.store.wait([key], timedelta(seconds=self.timeout_s))  # raises after the timeout
            specs = pickle.loads(self.store.get(key))
        buckets = plan_buckets(specs, self.bucket_bytes)

        def post(k: int) -> tuple[Any, torch.Tensor]:
            bucket = buckets[k]
            flat = (self._bucket_buffer(k, specs, bucket) if reuse_buffers else
                    torch.empty(sum(specs[i].numel for i in bucket), dtype=specs[bucket[0]].torch_dtype,
                                device=self.device))
            return self._start_broadcast(flat), flat

        nxt = post(0) if buckets else None
        for k, bucket in enumerate(buckets):
            work, flat = nxt
            self._finish(work)
            nxt = post(k + 1) if k + 1 < len(buckets) else None  # into bucket k - 1's buffer: loaded already
            offset = 0
            for i in bucket:
                n = specs[i].numel
                yield specs[i].name, flat[offset:offset + n].view(specs[i].shape)
                offset += n
