"""How a weight version travels from the trainer to the engines: the pieces every route shares.

Needs only torch (Ray is imported where an object-store payload is fetched), so the
engines, the training actors and the Ray layer all build on it without importing one
another. What lives here:

- the tensor specs of a version (name, shape, dtype) and their plain-data rows, for an
  RPC channel that carries no tensors (vLLM's `collective_rpc`);
- bucket planning: same-dtype tensors flattened into buckets of at most `BUCKET_BYTES`, the
  parts of a layer an engine fuses (q/k/v, gate/up) kept in one bucket;
- group membership: `WeightGroupMember`, one process's place in a broadcast group of its
  own (NCCL between GPUs, gloo otherwise: one code path), and `WeightGroup`, the driver's
  list of who is in one;
- the payloads the driver hands an engine proxy: `RemoteWeights` (a version in the Ray
  object store, stored as `PackedWeights`: its bytes copied once, read without a copy) and
  `CollectiveWeights` (a version that travels by broadcast from training rank 0 when the
  engines load it);
- the route, chosen once when the run is built (`choose_route`) from the engine's
  declared `engine.weight_sync`.

A broadcast transfer is:

1. rank 0 writes the version's tensor specs into the group's store (or the caller sends
   them along with the request);
2. each bucket is broadcast from rank 0; receivers split them back into named tensors
   (views, no copy). Pipelined on both sides: rank 0 packs bucket k+1 while k is on the
   wire, and a receiver posts bucket k+1 before it hands bucket k to the loader;
3. each engine loads the received tensors as that version, as they arrive.

Every step is bounded by the group's timeout: reading the specs (the store's timeout),
each broadcast (`Work.wait(timeout)`; NCCL's watchdog also aborts a communicator stuck
past it), and the driver's wait (`WeightSyncTimeout`). A hung peer raises; it never
blocks forever. A broadcast needs every member, so a group's transfer always includes
every engine; an engine restarted by Ray cannot rejoin the communicator.
"""

from __future__ import annotations

import asyncio
import pickle
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Iterator

import torch

BUCKET_BYTES = 32 << 20  # 2 kept buffers per member; several buckets for the pipeline to overlap
_SPECS_KEY = "weights/specs/{version}"

# The routes a weight version can take to disaggregated engines.
OBJECT_STORE, NCCL, GLOO = "object_store", "nccl", "gloo"


def choose_route(weight_sync: str, engine_gpus: float, trainer_gpus: float) -> str:
    """How weights reach disaggregated engines, from the engine's declared `engine.weight_sync`.

    `disk` (vLLM reads a folder its engine process writes): the object store to the
    engine. Engines and trainers both on GPUs: an NCCL broadcast group. `collective` (an
    engine whose workers live in a process of their own, reachable only by a group):
    a gloo group when either side is on CPU. `auto`: the object store.
    """
    if weight_sync == "disk":
        return OBJECT_STORE
    if engine_gpus > 0 and trainer_gpus > 0:
        return NCCL
    return GLOO if weight_sync == "collective" else OBJECT_STORE


class WeightSyncTimeout(TimeoutError):
    """A weight transfer to an engine did not finish in time (the engine is hung, not slow)."""


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
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


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
        bits = flat.view(_BITS[flat.element_size()])
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
                else:
                    flat = self._bucket_buffer(k, specs, bucket)  # bucket k - 2 is through: its buffer is free
                    torch.cat([tensors[i].detach().reshape(-1) for i in bucket], out=flat)
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
        import ray  # only a process that fetches a payload needs Ray

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
        """The stored object's size (the weights sent, serialized), without fetching it here."""
        import ray.experimental

        found = ray.experimental.get_object_locations([self.ref], timeout_ms=int(self.timeout_s * 1000))
        return int(found.get(self.ref, {}).get("object_size") or 0)


@dataclass
class WeightGroup:
    """Driver-side handle: who is in the group (training actors, engine actors in rank order)."""

    train_actors: list[Any]
    engine_actors: list[Any]
    backend: str
    timeout_s: float


class CollectiveWeights:
    """A weight version that travels by broadcast from training rank 0 when an engine loads it."""

    def __init__(self, group: WeightGroup, call_trainers: Any) -> None:
        self.group = group
        self._call_trainers = call_trainers  # async (method, *args) -> results: every training rank

    def __repr__(self) -> str:
        return f"CollectiveWeights({self.group.backend}, {len(self.group.engine_actors)} engine(s))"

    async def transfer(self, engine_actors: list[Any], version: int) -> list[dict[str, float]]:
        """Broadcast to every engine and load as `version`; the engines' counters come back."""
        if set(map(id, engine_actors)) != set(map(id, self.group.engine_actors)):
            raise WeightGroupError(f"a broadcast needs every member: {len(engine_actors)} engine(s) given, "
                                   f"the group has {len(self.group.engine_actors)}")
        send = asyncio.ensure_future(self._call_trainers("weight_group_send", version))
        receives = [asyncio.ensure_future(_await(a.weight_group_receive.remote(version)))
                    for a in self.group.engine_actors]
        members = [send, *receives]
        names = ["training rank 0", *(f"engine {i}" for i in range(len(receives)))]
        try:
            # The members time out on their own (timeout_s); the margin covers the calls' round trips.
            done, pending = await asyncio.wait(members, timeout=self.group.timeout_s + 5.0,
                                               return_when=asyncio.FIRST_EXCEPTION)
            failed = [(n, f.exception()) for n, f in zip(names, members) if f in done and f.exception()]
            if failed:
                name, exc = failed[0]
                raise WeightGroupError(f"weight broadcast (version {version}, {self.group.backend}) failed at "
                                       f"{name}: {type(exc).__name__}: {exc}") from exc
            if pending:
                late = [n for n, f in zip(names, members) if f in pending]
                raise WeightSyncTimeout(f"weight broadcast (version {version}, {self.group.backend}): {late} did "
                                        f"not finish within timeout_s={self.group.timeout_s:g}")
        finally:
            for f in members:
                if not f.done():
                    f.cancel()
        return [f.result() for f in receives]


async def _await(ref: Any) -> Any:
    return await ref
