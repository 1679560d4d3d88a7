"""`engine=vllm`: vLLM's async engine (GPU) behind the `RolloutEngine` interface.

vLLM is imported lazily (it is CUDA-only on PyPI and pins its own torch; see
ENVIRONMENT.md), so importing this module never needs it. What this adapter adds:

- Partial tokens on abort. Outputs stream as deltas and are accumulated here, so
  `abort_all()` returns each request's tokens so far with finish "abort" whether or not
  the installed vLLM emits a final output for aborted requests.
- Weight versions. Tokens are stamped with the version current when their delta
  arrives. That is exact when nothing decodes during a swap, which is how the trainers
  use it (production pauses, in-flight requests are aborted, then weights load); a
  delta racing a swap may be stamped with the newer version.
- Weights are loaded into every worker with `collective_rpc` calling the model's own
  `load_weights`, then the prefix cache is reset (its KV came from the old weights).

Log-probabilities are vLLM's `raw_logprobs` (the model's distribution at temperature
1): equal to the hf engine's at temperature 1, the RL default; at other temperatures
the hf engine reports the tempered distribution and this one does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from rlharness.config.schema import ModelConf, VLLMEngineConf
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine
from rlharness.model import resolve_model_path

log = logging.getLogger(__name__)


def import_vllm():
    """The `vllm` module, or an ImportError that says what to do."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "engine=vllm needs vLLM, which is not installed (it is a CUDA build that pins its own "
            "torch): install it in a GPU environment with `pip install vllm`, or use engine=hf"
        ) from exc
    return vllm


def _load_weights_on_worker(worker, weights: list[tuple[str, Any]]) -> None:
    """Runs inside each vLLM worker (sent by collective_rpc)."""
    worker.model_runner.model.load_weights(weights=weights)


@dataclass
class _InFlight:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    model_steps: list[int] = field(default_factory=list)
    text: str = ""
    aborted: asyncio.Event = field(default_factory=asyncio.Event)


class VLLMEngine(RolloutEngine):
    def __init__(self, conf: VLLMEngineConf, model_conf: ModelConf, seed: int, **engine_kwargs: Any):
        vllm = import_vllm()
        from vllm.sampling_params import RequestOutputKind

        self.conf = conf
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
            **engine_kwargs,
        )
        self._llm = vllm.AsyncLLMEngine.from_engine_args(args)
        self._version = 0
        self._ids = itertools.count()
        self._inflight: dict[str, _InFlight] = {}
        self._tokens_total = 0

    @property
    def version(self) -> int:
        return self._version

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
        )

    async def _consume(self, vllm_id: str, request: GenerateRequest, rec: _InFlight) -> str:
        prompt = {"prompt_token_ids": list(request.prompt_ids)}
        async for out in self._llm.generate(prompt, self._sampling(request), vllm_id):
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

    async def load_weights(self, state: dict[str, Any], version: int) -> None:
        weights = [(name, tensor.detach().cpu()) for name, tensor in state.items()]
        await self._llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        await self._llm.reset_prefix_cache()  # cached KV came from the old weights
        self._version = int(version)
        log.info("vllm engine: weights version %d loaded (%d tensors)", version, len(weights))

    async def close(self) -> None:
        self._llm.shutdown()

    def stats(self) -> dict[str, float]:
        return {"tokens_total": float(self._tokens_total), "running": float(len(self._inflight))}
