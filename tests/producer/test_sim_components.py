"""The sim engine, the engine router and the sim training backend."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from rlharness.backend.sim import SimBackend
from rlharness.config.schema import SimBackendConf, SimEngineConf
from rlharness.engine.base import GenerateRequest, GenerateResult, SamplingParams
from rlharness.engine.router import EngineRouter
from rlharness.engine.sim import SimEngine, lognormal_params
from rlharness.core.types import TrainBatch
from tests.helpers import run_on_virtual_clock

pytestmark = pytest.mark.timeout(30)


def _req(i: int, max_tokens: int = 64) -> GenerateRequest:
    return GenerateRequest(request_id=f"r{i}", prompt_ids=[1, 2], sampling=SamplingParams(max_tokens=max_tokens))


def _engine(seed: int = 7, **kw) -> SimEngine:
    conf = dict(mean_response_len=10, cv=1.0, time_per_token_s=1e-4, slots=4)
    conf.update(kw)
    return SimEngine(SimEngineConf(**conf), seed=seed, vocab_size=20, eos_token_id=2)


async def _gen_all(engine, n, max_tokens=64):
    return await asyncio.gather(*(engine.generate(_req(i, max_tokens)) for i in range(n)))


def test_sim_engine_is_deterministic_and_respects_caps_and_eos():
    a = asyncio.run(_gen_all(_engine(), 20, max_tokens=12))
    b = asyncio.run(_gen_all(_engine(), 20, max_tokens=12))
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.logprobs for r in a] == [r.logprobs for r in b]
    for r in a:
        assert 1 <= len(r.token_ids) <= 12
        assert len(r.token_ids) == len(r.logprobs) == len(r.model_steps)
        assert all(lp <= 0 for lp in r.logprobs)
        if r.finish_reason == "stop":
            assert r.token_ids[-1] == 2 and 2 not in r.token_ids[:-1]
        else:
            assert r.finish_reason == "length" and len(r.token_ids) == 12 and 2 not in r.token_ids
    assert {r.finish_reason for r in a} == {"stop", "length"}


def test_sim_engine_lengths_follow_the_configured_mean():
    mu, sigma = lognormal_params(50.0, 0.5)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(50.0)
    assert math.sqrt(math.exp(sigma**2) - 1) == pytest.approx(0.5)  # coefficient of variation
    engine = _engine(mean_response_len=50, cv=0.5, time_per_token_s=0.0, slots=512)
    res = asyncio.run(_gen_all(engine, 400, max_tokens=10_000))
    mean_len = sum(len(r.token_ids) for r in res) / len(res)
    assert 45 < mean_len < 55


def test_sim_engine_limits_concurrency_and_aborts_with_partial_tokens():
    engine = _engine(mean_response_len=100, cv=0.0, time_per_token_s=0.005, slots=2)

    async def main():
        tasks = [asyncio.create_task(engine.generate(_req(i, 1000))) for i in range(5)]
        clock = asyncio.get_running_loop()
        while engine.stats()["in_flight"] < 5:
            await asyncio.sleep(0.001)
        start = clock.time()
        while clock.time() - start < 0.03:
            await asyncio.sleep(0.001)
        assert engine.stats()["in_flight"] == 5
        assert await engine.abort_all() == 5
        return await asyncio.gather(*tasks)

    res = run_on_virtual_clock(main())
    assert engine.stats()["max_active"] == 2
    assert all(r.finish_reason == "abort" for r in res)
    running = [r for r in res if r.token_ids]
    assert len(running) == 2 and all(0 < len(r.token_ids) < 100 for r in running)  # partial, by elapsed time
    assert sum(1 for r in res if not r.token_ids) == 3  # queued ones produced nothing


def test_sim_engine_stamps_each_token_with_the_version_that_produced_it():
    engine = _engine(mean_response_len=60, cv=0.0, time_per_token_s=0.001, slots=4)

    async def main():
        task = asyncio.create_task(engine.generate(_req(0, 1000)))
        await asyncio.sleep(0.02)
        await engine.load_weights({}, version=5)
        return await task

    r = run_on_virtual_clock(main())
    assert engine.version == 5
    assert r.model_steps == sorted(r.model_steps) and r.model_steps[0] == 0 and r.model_steps[-1] == 5
    stats = engine.stats()
    assert 0 < stats["busy_frac"] <= 1 and stats["tokens"] == 60


def test_router_balances_load_and_fans_out_abort_and_weights():
    engines = [_engine(mean_response_len=50, cv=0.0, time_per_token_s=0.001, seed=i) for i in range(2)]
    router = EngineRouter(engines)

    async def main():
        tasks = [asyncio.create_task(router.generate(_req(i, 1000))) for i in range(6)]
        await asyncio.sleep(0.005)
        assert router.in_flight() == [3, 3]
        assert await router.abort_all() == 6
        res = await asyncio.gather(*tasks)
        await router.load_weights({}, version=2)
        return res

    res = run_on_virtual_clock(main())
    assert all(r.finish_reason == "abort" for r in res)
    assert [e.stats()["requests"] for e in engines] == [3.0, 3.0]
    assert router.version == 2 and all(e.version == 2 for e in engines)
    assert router.stats()["requests"] == 6.0
    with pytest.raises(ValueError):
        EngineRouter([])


def test_sim_backend_reports_honest_metrics_and_round_trips(tmp_path):
    backend = SimBackend(SimBackendConf(step_time_s=0.0, time_per_token_s=0.0))
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.float32)
    adv = torch.tensor([[0, 1.0, 1.0, 0], [0, 0, -1.0, -1.0]])
    logp = torch.tensor([[0, -0.5, -1.5, -9], [-9, 0, -1.0, -3.0]])
    batch = TrainBatch(input_ids=torch.zeros(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 4),
                       response_mask=mask, advantages=adv, rollout_logprobs=logp,
                       model_steps=torch.zeros(2, 4, dtype=torch.long))
    m = asyncio.run(backend.train_step(batch))
    # -A*logp over the 4 response tokens: (0.5 + 1.5 - 1.0 - 3.0) / 4
    assert m["train/loss"] == pytest.approx(-0.5)
    assert m["train/entropy"] == pytest.approx((0.5 + 1.5 + 1.0 + 3.0) / 4)
    assert m["train/kl"] == 0.0 and m["train/tokens"] == 4
    assert asyncio.run(backend.get_weights()) == {"sim_version": 1}
    asyncio.run(backend.save(str(tmp_path / "ck")))
    other = SimBackend(SimBackendConf())
    asyncio.run(other.load(str(tmp_path / "ck")))
    assert other.version == 1 and other.tokens_trained == 4
    with pytest.raises(FileNotFoundError, match="sim_backend.json"):
        asyncio.run(other.load(str(tmp_path / "missing")))


def _on_virtual_clock(engine: SimEngine, request: GenerateRequest) -> GenerateResult:
    return run_on_virtual_clock(engine.generate(request))


def _seeded(prompt: list[int], seed: int, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(request_id="s", prompt_ids=prompt,
                           sampling=SamplingParams(max_tokens=max_tokens), seed=seed)


@pytest.mark.parametrize("max_len", [0, 40])
def test_sim_engine_continuation_of_a_seeded_request_ends_at_the_drawn_length(max_len):
    """Abort mid-response, continue prompt + partial on another engine: the same response, token for token."""
    prompt, budget = [5, 6, 7], 200
    conf = dict(mean_response_len=30, cv=1.0, time_per_token_s=0.001, slots=4, max_len=max_len)
    checked = 0
    for seed in range(40):
        whole = _on_virtual_clock(_engine(seed=1, **conf), _seeded(prompt, seed, budget))

        async def interrupted():  # simulated time: exact abort points, no real sleeping
            engine = _engine(seed=2, **conf)
            task = asyncio.create_task(engine.generate(_seeded(prompt, seed, budget)))
            await asyncio.sleep(0.001 * (len(whole.token_ids) / 2 + 0.5))
            await engine.abort_all()
            return await task

        part = run_on_virtual_clock(interrupted())
        if part.finish_reason != "abort" or not part.token_ids:
            continue
        assert part.token_ids == whole.token_ids[:len(part.token_ids)]
        rest = _on_virtual_clock(_engine(seed=3, **conf),
                                 _seeded(prompt + part.token_ids, seed, budget - len(part.token_ids)))
        assert part.token_ids + rest.token_ids == whole.token_ids
        assert part.logprobs + rest.logprobs == whole.logprobs
        assert rest.finish_reason == whole.finish_reason
        checked += 1
    assert checked >= 20


def test_sim_engine_seeded_lengths_follow_the_law_and_caps_hold_across_a_continuation():
    engine = _engine(mean_response_len=50, cv=1.0, time_per_token_s=0.0, slots=512)

    async def main():
        return await asyncio.gather(*(engine.generate(_seeded([1, 2], s, 10_000)) for s in range(600)))

    lengths = [len(r.token_ids) for r in asyncio.run(main())]
    assert 44 < sum(lengths) / len(lengths) < 56
    # The same seed, any engine: the same response; a budget cut is "length" without EOS.
    a = asyncio.run(_engine(seed=1).generate(_seeded([1, 2], 3, 10_000)))
    b = asyncio.run(_engine(seed=9).generate(_seeded([1, 2], 3, 10_000)))
    assert a.token_ids == b.token_ids and a.finish_reason == "stop" and a.token_ids[-1] == 2
    n = len(a.token_ids)
    if n >= 3:
        cut = asyncio.run(_engine(seed=1).generate(_seeded([1, 2], 3, n - 2)))
        assert cut.finish_reason == "length" and cut.token_ids == a.token_ids[:n - 2] and 2 not in cut.token_ids
        tail = asyncio.run(_engine(seed=1).generate(_seeded([1, 2] + cut.token_ids, 3, 2)))
        assert cut.token_ids + tail.token_ids == a.token_ids and tail.finish_reason == "stop"
