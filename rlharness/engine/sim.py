"""`engine=sim`: a rollout engine that costs time, not compute.

Each response has a total length drawn from a lognormal with the configured mean and
coefficient of variation (capped at `max_len` and at the request's budget) and takes
`prefill_s + tokens * time_per_token_s` on the event loop's clock, so a virtual clock
can drive it. At most `slots` requests run at once; the rest queue. `abort_all` ends
every request at once with the tokens generated so far (proportional to elapsed
time) and finish reason "abort". Each token is stamped with the weight version in
force when it was generated.

A request with a `seed` (the sample's stable seed) gets its whole response --
length, token ids, log-probs -- from that seed alone, as a real engine's seeded
sampling would: so a continuation (prompt + partial response, partial rollout) ends
at the length drawn for the sample, not at partial + a fresh draw, and it does so on
any engine. The engine recognises a continuation by the longest tail of the prompt
that equals a prefix of the seeded response (a fresh prompt whose last q tokens happen
to spell that prefix, probability ~vocab^-q, makes the response q tokens shorter --
consistently, continuation included). A request without a seed draws from the
engine's RNG (deterministic given the seed and the order of requests); continuing it
draws a new length for the remainder.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
from typing import Any, Callable

import numpy as np

from rlharness.config.schema import ModelConf, SimEngineConf
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine

log = logging.getLogger(__name__)


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of the normal underlying a lognormal with this mean and coefficient of variation."""
    sigma2 = math.log1p(cv * cv)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


class _Request:
    def __init__(self) -> None:
        self.aborted = asyncio.Event()
        self.start_s: float | None = None  # when it got a slot


class SimEngine(RolloutEngine):
    def __init__(self, conf: SimEngineConf, seed: int, vocab_size: int, eos_token_id: int | None = None,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        if vocab_size < 2:
            raise ValueError(f"SimEngine: vocab_size={vocab_size} must be >= 2")
        self.conf = conf
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.decode = decode
        self._rng = np.random.default_rng(seed)
        self._mu, self._sigma = lognormal_params(conf.mean_response_len, conf.cv)
        self._version = 0
        # (loop time, version) of every weight load, to stamp tokens by when they were produced.
        self._version_times: list[float] = [-math.inf]
        self._versions: list[int] = [0]
        self._slots: asyncio.Semaphore | None = None  # created in the running loop
        self._requests: set[_Request] = set()
        # Stats, on the loop clock.
        self._active = 0
        self._max_active = 0
        self._busy_since: float | None = None
        self._busy_s = 0.0
        self._slot_s = 0.0  # integral of running requests over loop time (busy slot-seconds)
        self._slot_t: float | None = None  # when _slot_s was last brought up to date
        self._first_s: float | None = None
        self._last_s: float | None = None  # last time a request started or ended
        self._tokens = 0
        self._num_requests = 0
        self._num_aborted = 0


    @classmethod
    def for_model(cls, conf: SimEngineConf, model_conf: ModelConf, seed: int, name: str | None = None,
                  **kw: Any) -> "SimEngine":
        """`engine=sim` for a run: the vocabulary, EOS and decoding of `model_conf`'s tokenizer unless given."""
        if "vocab_size" not in kw:
            from rlharness.model.load import load_tokenizer

            tok = load_tokenizer(model_conf)
            kw = {"vocab_size": len(tok), "eos_token_id": tok.eos_token_id,
                  "decode": lambda ids: tok.decode(ids, skip_special_tokens=True), **kw}
        return cls(conf, seed, **kw)
    @property
    def version(self) -> int:
        return self._version

    # ------------------------------------------------------------------ sampling
    def _total_length(self, rng: np.random.Generator) -> int:
        """The response's uncapped length L = max(1, round(lognormal)); the first draw of `rng`."""
        return max(1, int(round(float(rng.lognormal(self._mu, self._sigma)))))

    def _seeded_tokens(self, seed: int, n: int) -> np.ndarray:
        """The first `n` tokens of the response seeded by `seed` (a prefix of every longer draw)."""
        rng = np.random.default_rng([seed, 0])
        self._total_length(rng)  # same stream as `_draw`: length first, then tokens
        ids = rng.integers(0, self.vocab_size, size=n)
        if self.eos_token_id is not None:  # EOS only ends a response: never inside it
            ids = np.where(ids == self.eos_token_id, (ids + 1) % self.vocab_size, ids)
        return ids

    @staticmethod
    def _continued(prompt: np.ndarray, seq: np.ndarray) -> int:
        """Tokens of `seq` already at the end of `prompt`: the longest p with prompt[-p:] == seq[:p]."""
        top = min(len(seq), len(prompt))
        if top == 0:
            return 0
        for p in np.flatnonzero(seq[:top] == prompt[-1])[::-1] + 1:
            if np.array_equal(prompt[len(prompt) - p:], seq[:p]):
                return int(p)
        return 0

    def _draw(self, prompt_ids: list[int], max_tokens: int, seed: int | None) -> tuple[list[int], list[float], str]:
        """The rest of the response to `prompt_ids`: (token ids, log-probs, finish reason)."""
        if seed is None:  # one-off: a fresh response from the engine's stream
            seed, prompt_ids = int(self._rng.integers(0, 2**62)), []
        length = self._total_length(np.random.default_rng([seed, 0]))
        capped = min(length, self.conf.max_len) if self.conf.max_len > 0 else length
        seq = self._seeded_tokens(seed, min(capped, len(prompt_ids) + max_tokens))  # all any request needs
        # A response already complete is never continued, so at most capped - 1 tokens are done.
        done = self._continued(np.asarray(prompt_ids, dtype=np.int64), seq[:capped - 1])
        # It ends by itself (EOS) if the drawn length is under max_len and fits the budget.
        stop = (self.conf.max_len <= 0 or length < self.conf.max_len) and length - done <= max_tokens
        n = length - done if stop else min(capped - done, max_tokens)
        ids = seq[done:done + n].copy()
        if stop and self.eos_token_id is not None:
            ids[-1] = self.eos_token_id
        logprobs = -np.random.default_rng([seed, 1]).exponential(1.0, size=done + n)[done:]
        return [int(i) for i in ids], [float(x) for x in logprobs], "stop" if stop else "length"

    def _version_at(self, t: float) -> int:
        return self._versions[bisect.bisect_right(self._version_times, t) - 1]

    # ------------------------------------------------------------------ RolloutEngine
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        loop = asyncio.get_running_loop()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.conf.slots)
        if self._first_s is None:
            self._first_s = loop.time()
        self._num_requests += 1
        ids, logprobs, finish = self._draw(request.prompt_ids, request.sampling.max_tokens, request.seed)
        req = _Request()
        self._requests.add(req)
        try:
            n = await self._run(req, len(ids))
        finally:
            self._requests.discard(req)
        if n < len(ids):
            finish = "abort"
            self._num_aborted += 1
        # Token i was produced at start + prefill + (i + 1) * time_per_token.
        start = req.start_s if req.start_s is not None else loop.time()
        steps = [self._version_at(start + self.conf.prefill_s + (i + 1) * self.conf.time_per_token_s)
                 for i in range(n)]
        self._tokens += n
        out = ids[:n]
        return GenerateResult(request_id=request.request_id, token_ids=out, logprobs=logprobs[:n],
                              model_steps=steps, finish_reason=finish,
                              text=self.decode(out) if self.decode is not None else "")

    async def _run(self, req: _Request, length: int) -> int:
        """Hold a slot for the request's duration; returns how many tokens it produced."""
        assert self._slots is not None
        loop = asyncio.get_running_loop()
        acquire = asyncio.ensure_future(self._slots.acquire())
        abort_wait = asyncio.ensure_future(req.aborted.wait())
        try:
            await asyncio.wait({acquire, abort_wait}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            acquire.cancel()
            abort_wait.cancel()
            if acquire.done() and not acquire.cancelled():
                self._slots.release()
            raise
        if not acquire.done():  # aborted while queued: no tokens
            acquire.cancel()
            abort_wait.cancel()
            return 0
        abort_wait.cancel()
        req.start_s = loop.time()
        self._enter(req.start_s)
        try:
            duration = self.conf.prefill_s + length * self.conf.time_per_token_s
            try:
                await asyncio.wait_for(req.aborted.wait(), timeout=duration)
            except asyncio.TimeoutError:
                return length
            elapsed = loop.time() - req.start_s - self.conf.prefill_s
            if self.conf.time_per_token_s <= 0:
                return 0 if elapsed < 0 else length
            return max(0, min(length - 1, int(elapsed / self.conf.time_per_token_s)))
        finally:
            self._leave(loop.time())
            self._slots.release()

    def _accrue(self, now: float) -> None:
        if self._slot_t is not None:
            self._slot_s += self._active * (now - self._slot_t)
        self._slot_t = now

    def busy_slot_s(self, now: float) -> float:
        """Slot-seconds spent generating up to loop time `now` (a slot counts while it holds a request)."""
        return self._slot_s + (self._active * (now - self._slot_t) if self._slot_t is not None else 0.0)

    def _enter(self, now: float) -> None:
        self._accrue(now)
        self._last_s = now
        if self._active == 0:
            self._busy_since = now
        self._active += 1
        self._max_active = max(self._max_active, self._active)

    def _leave(self, now: float) -> None:
        self._accrue(now)
        self._last_s = now
        self._active -= 1
        if self._active == 0 and self._busy_since is not None:
            self._busy_s += now - self._busy_since
            self._busy_since = None

    async def abort_all(self) -> int:
        n = 0
        for req in list(self._requests):
            if not req.aborted.is_set():
                req.aborted.set()
                n += 1
        return n

    async def load_weights(self, state: dict[str, Any], version: int) -> None:
        self._version = version
        self._version_times.append(asyncio.get_running_loop().time())
        self._versions.append(version)

    def stats(self) -> dict[str, float]:
        """Cumulative counters: busy time (>= 1 request running) over time since the first request."""
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:  # read after the loop ended: up to the last activity
            now = self._last_s
        busy = self._busy_s
        if self._busy_since is not None and now is not None:
            busy += now - self._busy_since
        elapsed = (now - self._first_s) if (now is not None and self._first_s is not None) else 0.0
        return {
            "busy_s": busy,
            "elapsed_s": elapsed,
            "busy_frac": busy / elapsed if elapsed > 0 else 0.0,
            "busy_slot_s": self.busy_slot_s(now) if now is not None else self._slot_s,
            "tokens": float(self._tokens),
            "requests": float(self._num_requests),
            "aborted": float(self._num_aborted),
            "in_flight": float(len(self._requests)),  # running and queued
            "running": float(self._active),
            "max_active": float(self._max_active),
        }
