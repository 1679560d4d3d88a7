"""RemoteEngine sends concurrent generate calls as one streaming actor call and fans results back out."""

from __future__ import annotations

import asyncio

import pytest

from rlharness.config.schema import ModelConf, SimEngineConf
from rlharness.distributed.spawn import spawn_engines
from rlharness.engine.base import GenerateRequest, SamplingParams

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def request(i: int, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=max_tokens))


def test_concurrent_requests_share_calls_and_aborts_keep_partial_tokens(ray_session, tiny_model_dir):
    # Long responses (cv=0: all 400 tokens, 4 s) so an abort lands mid-response; short ones otherwise.
    slow = SimEngineConf(mean_response_len=400, cv=0.0, time_per_token_s=0.01, slots=32)
    engine = spawn_engines(slow, ModelConf(path=tiny_model_dir), seed=0, cpus=0.5, gpus=0, timeout_s=60,
                           name="batching")

    async def main():
        try:
            # 1. Twenty requests made together travel in one call; each caller gets its own result.
            short = [request(i, max_tokens=3) for i in range(20)]
            results = await asyncio.gather(*(engine.generate(r) for r in short))
            assert [r.request_id for r in results] == [r.request_id for r in short]
            assert all(r.finish_reason == "length" and len(r.token_ids) == 3 for r in results)
            assert engine.stats()["requests_per_call"] == 20

            # 2. Abort mid-response: every request comes back "abort" with the tokens it had.
            long = [asyncio.ensure_future(engine.generate(request(100 + i, max_tokens=400))) for i in range(6)]
            await asyncio.sleep(0.5)
            assert await engine.abort_all() == 6
            aborted = await asyncio.gather(*long)
            assert [r.request_id for r in aborted] == [f"r{100 + i}" for i in range(6)]
            for r in aborted:
                assert r.finish_reason == "abort" and 0 < len(r.token_ids) < 400
                assert len(r.logprobs) == len(r.model_steps) == len(r.token_ids)

            # 3. A caller that stops waiting frees its request; the rest of its batch is unaffected.
            batch = [asyncio.ensure_future(engine.generate(request(200 + i, max_tokens=400 if i == 0 else 3)))
                     for i in range(4)]
            await asyncio.sleep(0.3)
            batch[0].cancel()
            done = await asyncio.gather(*batch[1:])
            assert all(r.finish_reason == "length" for r in done)
            with pytest.raises(asyncio.CancelledError):
                await batch[0]
            for _ in range(50):  # the cancel reaches the actor asynchronously
                if await engine.actor.cancel.remote(["r200"]) == 0:
                    break
                await asyncio.sleep(0.05)
            assert await engine.actor.cancel.remote(["r200"]) == 0  # nothing of it is still running
        finally:
            await engine.close()

    asyncio.run(main())
