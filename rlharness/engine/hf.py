"""`engine=hf`: any Hugging Face causal LM served with PyTorch, with continuous batching.

One background thread owns the model and runs the loop: take new requests and
commands from a thread-safe inbox, apply weight loads and aborts *between* steps,
prefill joining requests together and merge their KV cache into the running batch
(`rlharness.engine.kv`), decode one token for every running row, and retire rows
that finished (EOS, stop string, max tokens) so waiting requests take their place.
torch releases the GIL inside kernels, so the asyncio loop that calls `generate`
stays responsive; results come back through `loop.call_soon_threadsafe`.

Each token carries the log-probability of the temperature-scaled distribution
(before top-p/top-k; temperature 1 for greedy) and the weight version that sampled
it. Sampling draws from one seeded `torch.Generator`: a run is reproducible for the
same requests arriving in the same order, not per request across schedules.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from rlharness.config.schema import HFEngineConf, ModelConf
from rlharness.engine import kv
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine, SamplingParams
from rlharness.engine.sampling import RowParams, sample_next
from rlharness.weights.delta import apply_payload_, check_payload
from rlharness.weights.transfer import weight_checksums

log = logging.getLogger(__name__)

# Sampling parameters for a finished row still in the batch (its token is discarded).
_DEAD_ROW = SamplingParams(greedy=True)

# Extra tokens decoded beyond the longest stop string, so multi-character tokens and
# skipped special tokens still leave the whole stop string inside the decoded tail.
_STOP_TAIL_SLACK = 8


@dataclass(eq=False)
class _Seq:
    """One request inside the engine thread."""

    request: GenerateRequest
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    stop_tail_tokens: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    model_steps: list[int] = field(default_factory=list)
    cancelled: bool = False


@dataclass
class _Command:
    kind: str  # "abort" | "load" | "cancel" | "stop"
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future | None = None
    state: dict[str, Any] | None = None
    version: int = 0
    seq: _Seq | None = None


def _resolve(fut: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def _post(loop: asyncio.AbstractEventLoop, fut: asyncio.Future, result: Any = None,
          error: BaseException | None = None) -> None:
    try:
        loop.call_soon_threadsafe(_resolve, fut, result, error)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass


class HFEngine(RolloutEngine):
    """Continuous-batching engine over a Hugging Face causal LM (CPU or GPU).

    Either loads `model_conf.path` (model + tokenizer) or takes an already-built
    `model`/`tokenizer` (used as given, not copied: it is put in eval mode and must not
    be trained while the engine decodes; sync weights with `load_weights`). `eos_token_ids` overrides the model's EOS set (an empty list
    disables EOS, as benchmarks do). A waiting request joins the running batch once
    `join_min_free` slots are free (or fewer if fewer wait): prefilling a handful of
    rows at once costs about one decode step, so this trades a little latency for
    fewer prefill passes.
    """

    def __init__(self, conf: HFEngineConf, model_conf: ModelConf | None = None, seed: int = 0, *,
                 name: str | None = None, model=None, tokenizer=None, eos_token_ids: list[int] | None = None,
                 join_min_free: int | None = None, command_timeout_s: float = 300.0,
                 idle_poll_s: float = 0.05):
        from rlharness.model.lora import engine_serves_adapter, wrap_for_engine
        from rlharness.model.load import load_model, load_tokenizer
        from rlharness.core.vml_warmup import warm_up_vml

        # The first admission is often this process's first forward pass: MKL must have picked its
        # kernels before that pass splits a cos/sin over two threads (rlharness/core/vml_warmup.py).
        warm_up_vml()
        self.name = name or "hf engine"
        if model is None:
            if model_conf is None:
                raise ValueError("HFEngine needs model_conf (to load model.path) or an explicit model")
            model = load_model(model_conf, device=conf.device)
            if engine_serves_adapter(model_conf):  # model.lora.sync=adapter: applied in this forward
                model = wrap_for_engine(model, model_conf)
        if tokenizer is None and model_conf is not None:
            tokenizer = load_tokenizer(model_conf)
        self.conf = conf
        self.device = torch.device(conf.device)
        self.model = model.to(self.device).eval()
        self._cache_kwarg = kv.cache_kwarg(self.model)
        self.tokenizer = tokenizer
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.eos_token_ids = frozenset(self._default_eos() if eos_token_ids is None else eos_token_ids)
        self.join_min_free = max(1, conf.max_batch_size // 8) if join_min_free is None else join_min_free
        self.command_timeout_s = command_timeout_s
        self.idle_poll_s = idle_poll_s
        self._params = dict(self.model.state_dict())
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._version = 0
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: list[_Seq] = []
        # Rows of the running batch; None marks a finished row not yet compacted away.
        self._slots: list[_Seq | None] = []
        self._num_live = 0
        self._batch: kv.Batch | None = None
        self._rows: RowParams | None = None
        self._stats_lock = threading.Lock()
        self._counters = {"busy_s": 0.0, "tokens": 0, "finished": 0, "steps": 0, "rows": 0}
        self._stats_since = time.perf_counter()
        self.tokens_total = 0  # cumulative, never reset (stats() windows reset)
        self._closed = False
        kv.check_supported(self.model)  # fail here, not in the thread
        self._thread = threading.Thread(target=self._loop, name="hf-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_model(cls, model, tokenizer=None, conf: HFEngineConf | None = None, seed: int = 0,
                   **kw) -> "HFEngine":
        return cls(conf or HFEngineConf(device=str(next(model.parameters()).device)), None, seed,
                   model=model, tokenizer=tokenizer, **kw)

    def _default_eos(self) -> list[int]:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.model.config, "eos_token_id", None)
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return []
        return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]

    # ------------------------------------------------------------------ async API
    @property
    def version(self) -> int:
        return self._version

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self._closed:
            raise RuntimeError("HFEngine.generate after close()")
        if not request.prompt_ids:
            raise ValueError(f"request {request.request_id!r}: empty prompt_ids")
        if request.sampling.max_tokens < 1:
            raise ValueError(f"request {request.request_id!r}: sampling.max_tokens="
                             f"{request.sampling.max_tokens} (expected >= 1)")
        bad = [t for t in request.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"request {request.request_id!r}: token ids {bad[:5]} outside the "
                             f"vocabulary [0, {self.vocab_size})")
        if request.sampling.stop and self.tokenizer is None:
            raise ValueError(f"request {request.request_id!r}: stop strings need a tokenizer")
        loop = asyncio.get_running_loop()
        stop_chars = max((len(s) for s in request.sampling.stop), default=0)
        seq = _Seq(request=request, loop=loop, future=loop.create_future(),
                   stop_tail_tokens=stop_chars + _STOP_TAIL_SLACK if stop_chars else 0)
        self._inbox.put(seq)
        self._check_alive()
        try:
            return await seq.future
        except asyncio.CancelledError:
            self._inbox.put(_Command("cancel", seq=seq))  # free its slot
            raise

    async def _command(self, cmd: _Command) -> Any:
        if self._closed:
            raise RuntimeError(f"HFEngine.{cmd.kind} after close()")
        cmd.loop = asyncio.get_running_loop()
        cmd.future = cmd.loop.create_future()
        self._inbox.put(cmd)
        self._check_alive()
        return await asyncio.wait_for(cmd.future, self.command_timeout_s)

    def _check_alive(self) -> None:
        if not self._thread.is_alive() and not self._closed:
            raise RuntimeError("hf engine thread is not running (it crashed; see the log)")

    async def abort_all(self) -> int:
        return await self._command(_Command("abort"))

    async def load_weights(self, state: dict[str, Any], version: int) -> None:
        """Whole tensors or a delta sync's differences (rlharness/weights/delta.py), patched in place."""
        check_payload(state, {k: tuple(v.shape) for k, v in self._params.items()})
        await self._command(_Command("load", state=state, version=int(version)))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._inbox.put(_Command("stop"))
        # join blocks: run it off the event loop, bounded.
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, self.command_timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"hf engine thread did not stop within {self.command_timeout_s} s")

    def weight_checksums(self) -> dict[str, torch.Tensor] | None:
        # Read from the caller's thread: only a load writes the weights, and loads run between steps on
        # the engine thread, which the trainer never asks for while it has one in flight.
        return weight_checksums(self._params)

    def stats(self) -> dict[str, float]:
        """Counters since the previous call: busy fraction, tokens, finished requests, occupancy."""
        with self._stats_lock:
            now = time.perf_counter()
            c, wall = self._counters, max(now - self._stats_since, 1e-9)
            out = {
                "busy_frac": min(1.0, c["busy_s"] / wall),
                "tokens": float(c["tokens"]),
                "tokens_per_s": c["tokens"] / wall,
                "requests_finished": float(c["finished"]),
                "mean_batch_size": c["rows"] / c["steps"] if c["steps"] else 0.0,
                "mean_batch_occupancy": c["rows"] / (c["steps"] * self.conf.max_batch_size) if c["steps"] else 0.0,
                "running": float(self._num_live),
                "waiting": float(len(self._waiting)),
            }
            self._counters = dict.fromkeys(c, 0)
            self._counters["busy_s"] = 0.0
            self._stats_since = now
        return out

    # ------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        try:
            with torch.inference_mode():
                while self._drain_inbox(block=not (self._num_live or self._waiting)):
                    started = time.perf_counter()
                    self._schedule()
                    if self._batch is not None:
                        self._decode_step()
                    with self._stats_lock:
                        self._counters["busy_s"] += time.perf_counter() - started
        except BaseException as exc:  # noqa: BLE001 - every waiter must hear about it
            log.exception("hf engine thread crashed")
            self._fail_all(exc)
            raise
        finally:
            self._abort_everything()
            self._fail_inbox(RuntimeError("hf engine stopped"))

    def _drain_inbox(self, block: bool) -> bool:
        """Take everything queued; apply commands in arrival order. False when told to stop."""
        try:
            item = self._inbox.get(timeout=self.idle_poll_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(item, _Seq):
                self._waiting.append(item)
            elif not self._apply(item):
                return False
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, cmd: _Command) -> bool:
        if cmd.kind == "stop":
            return False
        if cmd.kind == "cancel":
            cmd.seq.cancelled = True
            if cmd.seq in self._waiting:
                self._waiting.remove(cmd.seq)
            elif cmd.seq in self._slots:
                self._slots[self._slots.index(cmd.seq)] = None
                self._num_live -= 1
            return True
        try:
            if cmd.kind == "abort":
                result = self._abort_everything()
            elif cmd.kind == "load":
                self._load(cmd.state, cmd.version)
                result = None
            else:
                raise ValueError(f"unknown engine command {cmd.kind!r}")
        except Exception as exc:  # noqa: BLE001 - report to the caller, keep serving
            _post(cmd.loop, cmd.future, error=exc)
        else:
            _post(cmd.loop, cmd.future, result)
        return True

    def _load(self, state: dict[str, Any], version: int) -> None:
        apply_payload_(self._params, state)
        self._version = version
        log.debug("hf engine: weights version %d loaded (%d tensors)", version, len(state))

    def _abort_everything(self) -> int:
        seqs = [s for s in self._slots if s is not None] + self._waiting
        self._slots, self._waiting, self._batch, self._rows = [], [], None, None
        self._num_live = 0
        for seq in seqs:
            self._finish(seq, "abort")
        return len(seqs)

    def _fail_all(self, exc: BaseException) -> None:
        for seq in [s for s in self._slots if s is not None] + self._waiting:
            _post(seq.loop, seq.future, error=RuntimeError(f"hf engine failed: {exc!r}"))
        self._slots, self._waiting, self._num_live = [], [], 0

    def _fail_inbox(self, exc: BaseException) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item.future is not None and item.loop is not None:
                _post(item.loop, item.future, error=exc)

    # ------------------------------------------------------------------ scheduling
    def _schedule(self) -> None:
        """Between steps: let waiting requests join, or compact finished rows away.

        Finished rows stay in the batch (decoded, ignored) until a rebuild: rebuilding
        copies the whole cache, so it happens when requests join, when a quarter of the
        rows are dead, or when none is alive.
        """
        live = [i for i, s in enumerate(self._slots) if s is not None]
        free = self.conf.max_batch_size - len(live)
        if self._waiting and free > 0 and (not live or free >= min(self.join_min_free, len(self._waiting))):
            self._admit(live, free)
        elif len(live) < len(self._slots) and (not live or 4 * (len(self._slots) - len(live)) >= len(self._slots)):
            self._batch = kv.rebuild(self._batch, live, None)
            self._slots = [self._slots[i] for i in live]
            self._rows = None

    def _admit(self, live: list[int], free: int) -> None:
        joining, self._waiting = self._waiting[:free], self._waiting[free:]
        prompts = [s.request.prompt_ids for s in joining]
        width = max(map(len, prompts))
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = kv.prefill_cache(self.model)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         **{self._cache_kwarg: cache}, use_cache=True, logits_to_keep=1)
        rows = RowParams.from_params([s.request.sampling for s in joining], self.vocab_size, self.device,
                                     seeds=[s.request.seed for s in joining])
        tokens, logprobs = sample_next(out.logits[:, -1, :], rows, self._generator, positions=mask.sum(-1))
        fresh = kv.Batch(cache=cache, attention_mask=mask, next_tokens=tokens,
                         next_positions=mask.sum(-1))
        self._batch = kv.rebuild(self._batch, live, fresh)
        self._slots = [self._slots[i] for i in live] + joining
        self._num_live = len(self._slots)
        self._rows = None
        self._record(tokens, logprobs, offset=len(live))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("hf engine: admitted %d rows (seeds %s) beside %d live, version %d", len(joining),
                      [s.request.seed for s in joining], len(live), self._version)

    def _decode_step(self) -> None:
        b = self._batch
        if self._rows is None:
            self._rows = RowParams.from_params(
                [s.request.sampling if s is not None else _DEAD_ROW for s in self._slots],
                self.vocab_size, self.device, seeds=[s.request.seed if s is not None else None for s in self._slots])
        mask = torch.cat([b.attention_mask, b.attention_mask.new_ones(b.size, 1)], 1)
        out = self.model(input_ids=b.next_tokens[:, None], attention_mask=mask,
                         position_ids=b.next_positions[:, None], **{self._cache_kwarg: b.cache},
                         use_cache=True)
        tokens, logprobs = sample_next(out.logits[:, -1, :], self._rows, self._generator,
                                       positions=b.next_positions + 1)
        b.attention_mask, b.next_tokens, b.next_positions = mask, tokens, b.next_positions + 1
        with self._stats_lock:
            self._counters["steps"] += 1
            self._counters["rows"] += self._num_live
        self._record(tokens, logprobs, offset=0)

    def _record(self, tokens: torch.Tensor, logprobs: torch.Tensor, offset: int) -> None:
        """Append each live row's new token (rows from `offset` on); mark finished rows dead."""
        version, eos, slots = self._version, self.eos_token_ids, self._slots
        finished: list[tuple[_Seq, str]] = []
        for i, (tok, lp) in enumerate(zip(tokens.tolist(), logprobs.tolist()), start=offset):
            seq = slots[i]
            if seq is None:
                continue
            seq.token_ids.append(tok)
            seq.logprobs.append(lp)
            seq.model_steps.append(version)
            if tok in eos or (seq.stop_tail_tokens and self._hit_stop(seq)):
                finished.append((seq, "stop"))
            elif len(seq.token_ids) >= seq.request.sampling.max_tokens:
                finished.append((seq, "length"))
            else:
                continue
            slots[i] = None
        new_tokens = self._num_live if offset == 0 else len(slots) - offset
        self._num_live -= len(finished)
        self.tokens_total += new_tokens
        with self._stats_lock:  # before results go out, so a caller's stats() sees them
            self._counters["tokens"] += new_tokens
            self._counters["finished"] += len(finished)
        for seq, reason in finished:
            self._finish(seq, reason)

    def _hit_stop(self, seq: _Seq) -> bool:
        tail = self.tokenizer.decode(seq.token_ids[-seq.stop_tail_tokens:], skip_special_tokens=True)
        return any(s in tail for s in seq.request.sampling.stop)

    def _finish(self, seq: _Seq, reason: str) -> None:
        if seq.cancelled:
            return
        text = self.tokenizer.decode(seq.token_ids, skip_special_tokens=True) if self.tokenizer else ""
        result = GenerateResult(request_id=seq.request.request_id, token_ids=seq.token_ids,
                                logprobs=seq.logprobs, model_steps=seq.model_steps,
                                finish_reason=reason, text=text)
        _post(seq.loop, seq.future, result)

