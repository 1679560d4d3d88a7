"""Remote judger: POST {"response", "label"} as JSON to `url`, read {"score": ...} back.

Members are judged concurrently (at most `max_concurrent_requests` requests in
flight over all groups, on one httpx.AsyncClient per event loop), each request
under `timeout_s`, the whole member under `agent.judge_timeout_s`. Connection
errors, timeouts, HTTP 429 and 5xx are retried `max_retries` times with exponential
backoff and jitter. With `batch_url`, a group is one POST of {"items": [...]}
answered by {"results": [...]}.

Refused, never retried: redirects (a 3xx is not followed: following would turn the
POST into a bodiless GET, possibly to another scheme), other 4xx, a reply that is
not JSON (or nested deeper than the parser goes) or has no numeric "score" (these three are
counted in `malformed_replies`). Any of these raises RemoteJudgeError, so
`Judger.judge_group` marks the group FAILED rather than scoring it 0. Other numeric
keys in a reply are kept in the reward.

`judger.headers` go with every request; a value `env:NAME` is read from the environment
when the request is made (never stored in the config, so a token stays out of every file).
A variable that is not set, or holds no legal header value (a `\r` from a file edited on Windows), is
refused with the config (before anything starts), naming it and never its value; the value is
redacted from every error text the run writes (rlharness/core/redaction.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
from typing import Any

from rlharness.config.schema import ENV_PREFIX, RemoteJudgerConf, header_value_problem
from rlharness.judger.base import Judger, gather_fail_fast
from rlharness.core.redaction import register_secret
from rlharness.core.types import RolloutState

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class RemoteJudgeError(RuntimeError):
    pass


class _Retryable(RemoteJudgeError):
    pass


class RemoteJudger(Judger):
    name = "remote"
    count_keys = ("groups_failed", "timeouts", "requests", "retries", "redirects_refused", "malformed_replies",
                  "rewards_out_of_range")

    def __init__(self, conf: RemoteJudgerConf | None = None):
        self.conf = conf or RemoteJudgerConf()
        # Jitter from a generator of its own: the run's global RNG state must not depend on judging.
        self._jitter = random.Random()

    def _headers(self) -> dict[str, str]:
        """The request headers, `env:NAME` values read now (a rotated token is picked up)."""
        headers = {"Content-Type": "application/json"}
        for name, value in self.conf.headers.items():
            var = _env_var(value)
            if var is None:
                headers[name] = str(value)
            elif var in os.environ:
                headers[name] = os.environ[var]
                register_secret(headers[name])  # a rotated token is redacted too
                problem = header_value_problem(headers[name])
                if problem is not None:
                    raise RemoteJudgeError(f"judger.headers.{name}: the environment variable {var} holds no legal "
                                           f"HTTP header value: {problem} (the value is not shown)")
            else:
                raise RemoteJudgeError(f"judger.headers.{name}: the environment variable {var} is no longer set")
        return headers

    # ------------------------------------------------------------------ synchronous (tests, tools)
    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        async def one() -> dict[str, float]:
            try:
                return await self._post_one(response_text, label)
            finally:
                await self.close()

        return asyncio.run(one())

    # ------------------------------------------------------------------ judging
    async def score_slow(self, members: list[RolloutState], timeout_s: float) -> list[dict[str, float]]:
        if self.conf.batch_url:
            try:
                return await asyncio.wait_for(self._post_batch(members), timeout=timeout_s)
            except asyncio.TimeoutError:
                self.counts["timeouts"] += 1
                raise
        try:
            return await gather_fail_fast([asyncio.wait_for(self._post_one(s.response_text, s.label), timeout_s)
                                           for s in members])
        except asyncio.TimeoutError:
            self.counts["timeouts"] += 1
            raise

    async def _post_one(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        return self._reward(await self._post(self.conf.url, {"response": response_text, "label": label}), self.conf.url)

    async def _post_batch(self, members: list[RolloutState]) -> list[dict[str, float]]:
        url = self.conf.batch_url
        reply = await self._post(url, {"items": [{"response": s.response_text, "label": s.label} for s in members]})
        results = reply.get("results") if isinstance(reply, dict) else None
        if not isinstance(results, list) or len(results) != len(members):
            self.counts["malformed_replies"] += 1
            raise RemoteJudgeError(f"{url}: reply needs 'results', a list of {len(members)} objects: "
                                   f"{_head(reply)}")
        return [self._reward(r, url) for r in results]

    async def _post(self, url: str, payload: dict[str, Any]) -> Any:
        """POST with retries; the parsed JSON reply."""
        body = json.dumps(payload).encode("utf-8")
        attempt = 0
        while True:
            try:
                return await self._attempt(url, body)
            except _Retryable as exc:
                if attempt >= self.conf.max_retries:
                    raise RemoteJudgeError(f"{exc} (after {attempt + 1} attempts)") from None
                delay = min(self.conf.backoff_max_s, self.conf.backoff_s * 2 ** attempt)
                delay *= 0.5 + 0.5 * self._jitter.random()
                attempt += 1
                self.counts["retries"] += 1
                log.info("judger remote: %s; retry %d/%d in %.2f s", exc, attempt, self.conf.max_retries, delay)
                await asyncio.sleep(delay)

    async def _attempt(self, url: str, body: bytes) -> Any:
        import httpx

        client, limit = self._client()
        async with limit:
            self.counts["requests"] += 1
            try:
                reply = await client.post(url, content=body, headers=self._headers())
            except httpx.TimeoutException:
                raise _Retryable(f"{url}: no reply within judger.timeout_s={self.conf.timeout_s:g}") from None
            except httpx.TransportError as exc:  # connection refused/reset, DNS, protocol errors
                raise _Retryable(f"{url}: {type(exc).__name__}: {exc}") from None
        if reply.is_redirect or 300 <= reply.status_code < 400:
            self.counts["redirects_refused"] += 1
            raise RemoteJudgeError(f"{url}: HTTP {reply.status_code} redirect to "
                                   f"{reply.headers.get('location', '?')!r} refused (set judger.url to the final URL)")
        if reply.status_code in _RETRY_STATUS:
            raise _Retryable(f"{url}: HTTP {reply.status_code} {reply.reason_phrase}")
        if reply.status_code >= 400:
            raise RemoteJudgeError(f"{url}: HTTP {reply.status_code} {reply.reason_phrase}")
        try:
            return json.loads(reply.content)
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested deeper than the parser goes
            self.counts["malformed_replies"] += 1
            why = "nested too deeply to parse" if isinstance(exc, RecursionError) else f"not JSON ({exc})"
            raise RemoteJudgeError(f"{url}: reply is {why}: {reply.content[:200]!r}") from None

    def _client(self):
        """The HTTP client and request limit of the running event loop (a run may use several loops)."""
        import httpx

        loop = asyncio.get_running_loop()
        held = self.__dict__.get("_http")
        if held is None or held[0] is not loop:
            limits = httpx.Limits(max_connections=self.conf.max_concurrent_requests,
                                  max_keepalive_connections=self.conf.max_concurrent_requests)
            client = httpx.AsyncClient(timeout=self.conf.timeout_s, follow_redirects=False, limits=limits)
            held = self.__dict__["_http"] = (loop, client, asyncio.Semaphore(self.conf.max_concurrent_requests))
        return held[1], held[2]

    def _reward(self, result: Any, url: str) -> dict[str, float]:
        """The reward of one reply; a reply without a numeric score is malformed (counted, refused)."""
        if not isinstance(result, dict) or not _is_number(result.get("score")):
            self.counts["malformed_replies"] += 1
            raise RemoteJudgeError(f"{url}: reply has no numeric 'score': {_head(result)}")
        return {k: float(v) for k, v in result.items() if _is_number(v)}

    async def close(self) -> None:
        held = self.__dict__.pop("_http", None)
        if held is not None and held[0] is asyncio.get_running_loop():
            await held[1].aclose()
        await super().close()


def _env_var(value: Any) -> str | None:
    text = str(value)
    return text[len(ENV_PREFIX):] if text.startswith(ENV_PREFIX) else None


def _head(value: Any) -> str:
    try:
        return str(value)[:200]
    except RecursionError:
        return "(nested too deeply to print)"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
