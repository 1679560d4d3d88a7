"""engine=vllm against engine=hf and the trainer's own log-probs, on vLLM's CPU build or CUDA.

These run in .venv-vllm (`bash scripts/setup_vllm.sh`; `.venv-vllm/bin/python -m pytest -m vllm`),
where they never skip on CPU (in a Python without vLLM, tests/conftest.py deselects them): one engine is built per module (~30 s on 2 cores) and every
test uses it, in test order (weight versions go forward). In .venv (no vLLM) only the
clear error is checked.

Tolerances: log-probs are compared in float32 with |diff| <= 1e-4 (measured: ~2e-6
against engine=hf; vLLM and HF use different kernels, so not bit-equal).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import threading

import pytest
import torch

from rlharness.config.schema import ConfigError, HFEngineConf, ModelConf, VLLMEngineConf
from rlharness.engine import build_engine
from rlharness.engine.base import GenerateRequest, SamplingParams
from tests.helpers import HANG_S

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
LOGPROB_TOL = 1e-4
MAX_LONG = 120  # with ignore_eos: the tiny model holds 128 positions
PROMPTS = ["1+2=", "123+456=", "77", "905+5="]


def vllm_test(fn):
    """A vLLM test (tests/conftest.py: run in .venv-vllm, deselected or skipped where vLLM is missing)."""
    return pytest.mark.vllm(pytest.mark.timeout(600)(fn))


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed")
def test_missing_vllm_gives_a_clear_error_naming_the_setup_script(tiny_model_dir):
    from rlharness.engine.vllm import require_vllm

    with pytest.raises(ConfigError, match=r"engine=vllm.*scripts/setup_vllm\.sh"):
        require_vllm()
    with pytest.raises(ImportError, match=r"setup_vllm\.sh"):
        build_engine(VLLMEngineConf(), ModelConf(path=tiny_model_dir), seed=0)


def test_weight_sync_option_is_checked():
    with pytest.raises(ConfigError, match=r"engine.weight_sync='nfs'.*collective, disk"):
        VLLMEngineConf(weight_sync="nfs")


@dataclasses.dataclass(slots=True)
class NoEOS(SamplingParams):
    """vLLM's `ignore_eos`: the request runs to max_tokens, so an abort always finds it running."""

    ignore_eos: bool = True


class Loop:
    """One event loop for the module: the engine's output handler lives in it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __call__(self, coro):
        return self.loop.run_until_complete(coro)


@pytest.fixture(scope="module")
def vllm_env(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = Loop()
    # engine.cpu_linear=torch: on the CPU build the syncs below load in place (the default, onednn,
    # runs vLLM's reload: tests/benchmarks/test_vllm_weight_sync_quick.py and the other vLLM tests).
    conf = VLLMEngineConf(sync_timeout_s=HANG_S, cpu_linear="torch")
    engine = run(_build(conf, tiny_model_dir))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    yield run, engine, model, tok, [tok(p)["input_ids"] for p in PROMPTS]
    run(engine.close())
    run.loop.close()


async def _generate_all(engine, reqs):
    return await asyncio.gather(*(engine.generate(r) for r in reqs))


async def _build(conf, model_dir):
    return build_engine(conf, ModelConf(path=model_dir), seed=0)


def _greedy(run, engine, prompts, max_tokens=12):
    reqs = [GenerateRequest(str(i), p, SamplingParams(greedy=True, max_tokens=max_tokens)) for i, p in enumerate(prompts)]
    return run(_generate_all(engine, reqs))


def _hf_greedy(model, tok, prompt, max_tokens=12) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_tokens,
                             pad_token_id=tok.pad_token_id)
    return out[0, len(prompt):].tolist()


def _trainer_logprobs(model, prompt, tokens, temperature=1.0) -> list[float]:
    """What the trainer recomputes (rlharness.algo.losses.token_logprobs on the full sequence)."""
    from rlharness.algo.losses import token_logprobs

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        lp = token_logprobs(model(ids).logits, ids, temperature)
    return lp[0, len(prompt):].tolist()


def _assert_matches_model(run, engine, model, tok, prompts, version):
    """Greedy tokens = HF generate with `model`'s weights, log-probs = its recomputation, all stamped `version`."""
    for p, res in zip(prompts, _greedy(run, engine, prompts)):
        assert res.token_ids == _hf_greedy(model, tok, p)
        assert res.logprobs == pytest.approx(_trainer_logprobs(model, p, res.token_ids), abs=LOGPROB_TOL)
        assert res.model_steps == [version] * len(res.token_ids)


def _perturbed(model, scale, seed):
    """A new weight version: every tensor moved by noise (a different model, same names)."""
    g = torch.Generator().manual_seed(seed)
    new = {k: v + scale * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
    model.load_state_dict(new)
    return new


@vllm_test
def test_greedy_tokens_and_logprobs_equal_engine_hf(vllm_env, tiny_model_dir):
    run, engine, model, tok, prompts = vllm_env
    hf = build_engine(HFEngineConf(), ModelConf(path=tiny_model_dir), seed=0)
    ours, ref = _greedy(run, engine, prompts), _greedy(run, hf, prompts)
    for p, a, b in zip(prompts, ours, ref):
        assert a.token_ids == b.token_ids == _hf_greedy(model, tok, p) and a.text == b.text
        assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)
        assert a.model_steps == [0] * len(a.token_ids)


@vllm_test
def test_sampled_logprobs_at_temperature_0_7_equal_the_trainers_recomputation(vllm_env):
    run, engine, model, tok, prompts = vllm_env
    params = SamplingParams(temperature=0.7, max_tokens=16)
    reqs = [GenerateRequest(f"t{i}", p, params, seed=100 + i) for i, p in enumerate(prompts * 2)]
    results = run(_generate_all(engine, reqs))
    for r, res in zip(reqs, results):
        assert len(res.token_ids) == len(res.logprobs) > 0
        tempered = _trainer_logprobs(model, r.prompt_ids, res.token_ids, temperature=0.7)
        assert res.logprobs == pytest.approx(tempered, abs=LOGPROB_TOL)
        # ...and not the temperature-1 ones (what vLLM reports by default).
        raw = _trainer_logprobs(model, r.prompt_ids, res.token_ids)
        assert max(abs(a - b) for a, b in zip(res.logprobs, raw)) > 1e-2


@vllm_test
def test_per_request_seeds_reproduce(vllm_env):
    run, engine, _, _, prompts = vllm_env
    params = SamplingParams(temperature=1.0, max_tokens=16)

    def draw(seed):
        reqs = [GenerateRequest(f"s{seed}-{i}", p, params, seed=seed + i) for i, p in enumerate(prompts)]
        return [r.token_ids for r in run(_generate_all(engine, reqs))]

    first = draw(7)
    assert draw(7) == first
    assert draw(1000) != first


@vllm_test
def test_abort_returns_partial_tokens(vllm_env):
    run, engine, _, _, prompts = vllm_env

    async def go():
        long = asyncio.create_task(engine.generate(GenerateRequest("long", prompts[0], NoEOS(max_tokens=MAX_LONG))))
        while not any(rec.token_ids for rec in engine._inflight.values()):  # it is decoding
            await asyncio.sleep(0.01)
        assert await engine.abort_all() == 1
        return await asyncio.wait_for(long, HANG_S)

    partial = run(go())
    assert partial.finish_reason == "abort"
    assert 0 < len(partial.token_ids) == len(partial.logprobs) == len(partial.model_steps) < MAX_LONG


@vllm_test
def test_weights_load_through_broadcast_then_disk(vllm_env):
    run, engine, model, tok, prompts = vllm_env
    assert engine.conf.weight_sync == "collective"
    run(engine.load_weights(_perturbed(model, 0.05, seed=1), version=1))
    _assert_matches_model(run, engine, model, tok, prompts, version=1)
    run(engine.load_weights(_perturbed(model, 0.05, seed=2), version=2))  # the group is reused
    _assert_matches_model(run, engine, model, tok, prompts, version=2)

    engine.conf = dataclasses.replace(engine.conf, weight_sync="disk")
    try:
        run(engine.load_weights(_perturbed(model, 0.05, seed=3), version=3))
    finally:
        engine.conf = dataclasses.replace(engine.conf, weight_sync="collective")
    _assert_matches_model(run, engine, model, tok, prompts, version=3)
    assert engine.version == 3 and engine.stats()["weight_syncs"] == 3


@vllm_test
def test_collective_sync_on_the_cpu_build_loads_plain_weights_in_place_and_leaves_none_stale(vllm_env):
    """`engine.cpu_linear=torch`: after a collective sync every GEMM layer of vLLM's CPU
    build computes with torch over its own weights, which the next sync overwrites in place (no
    re-packing). A disk reload re-packs the tied LM head (vLLM's embedding processing); the next
    collective sync must put it back on the live weights, or the logits come from the old ones."""
    from rlharness.engine.vllm import vllm_device

    run, engine, model, tok, prompts = vllm_env
    if vllm_device() != "cpu":
        pytest.skip("the CPU build's GEMM layers")
    assert engine.conf.cpu_linear == "torch"

    def kernels():
        (counts,) = run(engine._rpc("rlh_linear_kernels", "reading the linear kernels"))
        return counts

    def embedding_moved(seed):  # the tied embedding / LM head alone, strongly: a stale head shows in every logit
        g = torch.Generator().manual_seed(seed)
        emb = model.get_input_embeddings().weight
        with torch.no_grad():
            emb.add_(0.5 * torch.randn(emb.shape, generator=g))
        return {k: v.clone() for k, v in model.state_dict().items()}

    run(engine.load_weights(embedding_moved(4), version=4))
    _assert_matches_model(run, engine, model, tok, prompts, version=4)
    layers = sum(kernels().values())
    assert kernels() == {"torch": layers}

    engine.conf = dataclasses.replace(engine.conf, weight_sync="disk")
    try:  # vLLM's own reload: the linear layers stay on torch, the embedding and LM head are packed again
        run(engine.load_weights(embedding_moved(5), version=5))
    finally:
        engine.conf = dataclasses.replace(engine.conf, weight_sync="collective")
    _assert_matches_model(run, engine, model, tok, prompts, version=5)
    assert kernels().get("torch", 0) == layers - 2 and kernels().get("packed") == 2

    run(engine.load_weights(embedding_moved(6), version=6))
    _assert_matches_model(run, engine, model, tok, prompts, version=6)
    assert kernels() == {"torch": layers}


@vllm_test
def test_weights_from_a_remote_trainers_group_and_a_sync_that_cannot_complete(vllm_env):
    """The disaggregated route: training rank 0 is another process's member; the specs come from its store."""
    from rlharness.weights.transfer import WeightGroupMember
    from rlharness.engine.vllm import WeightSyncError, free_port

    run, engine, model, tok, prompts = vllm_env
    # The group's timeout bounds the rendezvous and each transfer (successes: CI runs this at nice 10 beside
    # the other tests) and is what ends the wait for version 8 below, which nobody sends: 60 s for both.
    port, timeout_s = free_port(), 60.0
    trainer: dict = {}
    joined = threading.Thread(target=lambda: trainer.setdefault(
        "m", WeightGroupMember("gloo", "127.0.0.1", port, 0, 2, timeout_s)))
    joined.start()
    run(engine.join_weight_group("gloo", "127.0.0.1", port, 1, 2, timeout_s))
    joined.join(timeout_s)
    state = _perturbed(model, 0.05, seed=7)
    sender = threading.Thread(target=trainer["m"].send, args=(state, 7))
    sender.start()
    run(engine.receive_weights(7))
    sender.join(timeout_s)
    _assert_matches_model(run, engine, model, tok, prompts, version=7)

    # Nobody sends version 8: the worker's wait ends after the group's timeout, as an error naming the engine.
    with pytest.raises(WeightSyncError, match=r"vllm engine: receiving weight version 8"):
        run(engine.receive_weights(8))
    assert engine.version == 7
    _assert_matches_model(run, engine, model, tok, prompts, version=7)  # still serving the last version


@pytest.mark.vllm
@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.skipif(not (HAVE_VLLM and torch.cuda.is_available()), reason="sleep mode needs vLLM's CUDA build and a GPU")
def test_sleep_mode_frees_the_gpu_and_wakes_with_new_weights(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = Loop()
    engine = run(_build(VLLMEngineConf(sleep_mode=True, gpu_memory_utilization=0.3), tiny_model_dir))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    try:
        _greedy(run, engine, prompts)
        free_awake = torch.cuda.mem_get_info()[0]
        run(engine.sleep())
        assert torch.cuda.mem_get_info()[0] > free_awake  # the KV cache and weights left the GPU
        run(engine.load_weights(_perturbed(model, 0.05, seed=1), version=1))  # wakes it
        _assert_matches_model(run, engine, model, tok, prompts, version=1)
        run(engine.sleep())
        _assert_matches_model(run, engine, model, tok, prompts, version=1)  # a request wakes it too
    finally:
        run(engine.close())
        run.loop.close()

