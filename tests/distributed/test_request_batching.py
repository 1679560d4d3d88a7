"""RemoteEngine sends concurrent generate calls as one streaming actor call and fans results back out."""

from __future__ import annotations

import asyncio

import pytest

from rlharness.config.schema import ModelConf, SimEngineConf
from rlharness.distributed.spawn import spawn_engines
from rlharness.engine.base import GenerateRequest, SamplingParams
from tests.helpers import HANG_S

pytestmark = [pytest.mark.ray, pytest.mark.timeout(2 * HANG_S)]

LONG = 40_000  # tokens of a long response


def request(i: int, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=max_tokens))


def test_concurrent_requests_share_calls_and_aborts_keep_partial_tokens(ray_session, tiny_model_dir):
    # Long responses (cv=0: all 40 000 tokens, 400 s: they never end within the test) so an abort lands
    # mid-response on any machine; short ones otherwise.
    slow = SimEngineConf(mean_response_len=LONG, cv=0.0, time_per_token_s=0.01, slots=32)
    engine = spawn_engines(slow, ModelConf(path=tiny_model_dir), seed=0, cpus=0.5, gpus=0, timeout_s=HANG_S,
                           name="batching")

    async def actor_stats() -> dict[str, float]:
        return await engine.actor.stats.remote()

    async def until(ready, what: str) -> None:
        """Poll the actor until `ready(its stats)`; only a hang reaches the deadline."""
        deadline = asyncio.get_running_loop().time() + HANG_S
        while not ready(await actor_stats()):
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def main():
        try:
            # 1. Twenty requests made together travel in one call; each caller gets its own result.
            short = [request(i, max_tokens=3) for i in range(20)]
            results = await asyncio.gather(*(engine.generate(r) for r in short))
            assert [r.request_id for r in results] == [r.request_id for r in short]
            assert all(r.finish_reason == "length" and len(r.token_ids) == 3 for r in results)
            assert engine.stats()["requests_per_call"] == 20

            # 2. Abort mid-response: every request comes back "abort" with the tokens it had. The abort
            # waits until all six run in the actor, and then at least 5 token times (a lower bound: a
            # slower machine only gives them more tokens, never all of them).
            long = [asyncio.ensure_future(engine.generate(request(100 + i, max_tokens=LONG))) for i in range(6)]
            await until(lambda st: st["running"] == 6, "the six requests to run in the actor")
            await asyncio.sleep(5 * slow.time_per_token_s)
            assert await engine.abort_all() == 6
            aborted = await asyncio.gather(*long)
            assert [r.request_id for r in aborted] == [f"r{100 + i}" for i in range(6)]
            for r in aborted:
                assert r.finish_reason == "abort" and 0 < len(r.token_ids) < LONG
                assert len(r.logprobs) == len(r.model_steps) == len(r.token_ids)

            # 3. A caller that stops waiting frees its request; the rest of its batch is unaffected.
            batch = [asyncio.ensure_future(engine.generate(request(200 + i, max_tokens=LONG if i == 0 else 3)))
                     for i in range(4)]
            done = await asyncio.gather(*batch[1:])  # the batch reached the actor; r200 runs on there
            assert all(r.finish_reason == "length" for r in done)
            batch[0].cancel()
            with pytest.raises(asyncio.CancelledError):
                await batch[0]
            # The cancel reaches the actor asynchronously; r200 would run for 400 s by itself.
            await until(lambda st: st["in_flight"] == 0, "the cancelled request to leave the actor")
            assert await engine.actor.cancel.remote(["r200"]) == 0  # nothing of it is still running
        finally:
            await engine.close()

    asyncio.run(main())
