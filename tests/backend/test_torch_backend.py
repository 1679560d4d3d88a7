"""`backend=torch` on the tiny random model: real train steps, invariances, save/load."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random

import pytest
import torch

from rlharness.algo.losses import token_logprobs
from rlharness.backend import build_backend
from rlharness.backend.learner import Learner
from rlharness.backend.lr_plan import lr_multiplier
from rlharness.config.schema import AlgoConf, ModelConf, TorchBackendConf
from rlharness.trainer.batch import build_train_batch
from rlharness.core.types import Group, RolloutState, Status

pytestmark = pytest.mark.timeout(120)

METRICS = {"train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/grad_norm", "train/clip_frac",
           "train/lr", "train/tis_ratio_mean", "train/tis_truncated_frac", "train/logprob_diff_rollout"}


def make_groups(seed: int, num_groups: int = 3, k: int = 4, vocab: int = 24, rewards=None) -> list[Group]:
    """Groups with different prompt and response lengths; token ids avoid the 4 special tokens."""
    rng = random.Random(seed)
    groups = []
    for g in range(num_groups):
        prompt = [rng.randrange(4, vocab) for _ in range(rng.randint(3, 6))]
        group = []
        for i in range(k):
            n = rng.randint(1, 5)
            score = rewards[g][i] if rewards is not None else float(rng.random() < 0.5)
            group.append(RolloutState(
                uid=f"{g}-{i}", group_id=str(g), task="t", prompt_index=g, epoch=0, prompt_text="",
                prompt_ids=list(prompt), response_ids=[rng.randrange(4, vocab) for _ in range(n)],
                response_logprobs=[-rng.uniform(2.0, 4.0) for _ in range(n)], response_model_steps=[0] * n,
                reward={"score": score}, status=Status.COMPLETED, finish_reason="stop"))
        groups.append(Group.from_samples(group))
    return groups


def make_batch(algo: AlgoConf, seed: int = 0, **kw):
    return build_train_batch(make_groups(seed, **kw), algo, pad_token_id=0, train_step=1, max_response_len=8,
                             temperature=1.0)[0]


def backend(model_dir: str, **algo_kw) -> Learner:
    algo = AlgoConf(name="test", **algo_kw)
    return Learner(TorchBackendConf(), ModelConf(path=model_dir), algo, total_steps=10, seed=0)


def step(b: Learner, batch) -> dict[str, float]:
    return asyncio.run(b.train_step(batch))


def test_lr_multiplier_schedules():
    kw = dict(warmup_steps=2, total_steps=12, min_lr_ratio=0.1)
    assert [lr_multiplier(s, schedule="constant", **kw) for s in (0, 1, 2, 11)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_multiplier(2, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_multiplier(7, schedule="cosine", **kw) == pytest.approx(0.55)  # halfway: 0.1 + 0.9 * 0.5
    assert lr_multiplier(12, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_multiplier(7, schedule="linear", **kw) == pytest.approx(0.55)
    assert lr_multiplier(50, schedule="linear", **kw) == pytest.approx(0.1)


def test_build_backend_dispatch(tiny_model_dir):
    algo = AlgoConf(name="grpo")
    b = build_backend(TorchBackendConf(), ModelConf(path=tiny_model_dir), algo, total_steps=5, seed=0)
    assert isinstance(b, Learner) and b.reference is None
    # backend=deepspeed dispatch (Ray rank actors) is tested in tests/distributed/test_deepspeed_backend.py.


def test_train_step_changes_weights_and_returns_finite_metrics(tiny_model_dir):
    b = backend(tiny_model_dir)
    before = asyncio.run(b.get_weights())
    metrics = step(b, make_batch(b.algo))
    after = asyncio.run(b.get_weights())
    assert METRICS <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["train/lr"] == pytest.approx(3e-4)
    assert metrics["train/grad_norm"] > 0 and metrics["train/entropy"] > 0
    assert metrics["train/clip_frac"] == 0.0  # one update per step: the ratio is exactly 1
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(v.device.type == "cpu" for v in after.values())
    after[next(iter(after))].add_(1.0)  # a clone: the engine's copy must not alias the policy
    assert not torch.equal(after[next(iter(after))], asyncio.run(b.get_weights())[next(iter(after))])


def test_repeated_steps_raise_the_likelihood_of_positive_advantage_responses(tiny_model_dir):
    # Within each group one response is rewarded; its log-prob must rise, the others' fall.
    rewards = [[1.0, 0.0, 0.0, 0.0]] * 3
    b = backend(tiny_model_dir, lr=3e-3)
    batch = make_batch(b.algo, rewards=rewards)
    chosen = batch.advantages > 0
    rejected = batch.advantages < 0

    def mean_logprob(where):
        lp = b._logprobs_no_grad({"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                                          "response_mask": batch.response_mask}, 1.0)
        return lp[where].mean().item()

    chosen0, rejected0 = mean_logprob(chosen), mean_logprob(rejected)
    for _ in range(5):
        step(b, batch)
    assert mean_logprob(chosen) > chosen0 + 0.5
    assert mean_logprob(rejected) < rejected0


def test_gradients_do_not_depend_on_micro_batch_size(tiny_model_dir):
    small, full = (backend(tiny_model_dir, micro_batch_size=m, grad_clip=0.0, tis_cap=2.0) for m in (1, 256))
    initial = {k: v.clone() for k, v in small.model.state_dict().items()}
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        grads, losses = [], []
        for b in (small, full):
            b.algo = dataclasses.replace(b.algo, loss_agg=agg)
            b.model.load_state_dict(initial)  # p.grad after a step is taken at these weights
            losses.append(step(b, make_batch(b.algo))["train/loss"])
            grads.append(torch.cat([p.grad.flatten() for p in b.model.parameters()]))
        torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-4, msg=f"loss_agg={agg}")
        assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-7)
        assert grads[0].abs().sum() > 0


def test_all_zero_advantages_give_no_gradient_but_count(tiny_model_dir):
    b = backend(tiny_model_dir, grad_clip=0.0)
    before = asyncio.run(b.get_weights())
    metrics = step(b, make_batch(b.algo, rewards=[[1.0] * 4] * 3))
    assert metrics["train/grad_norm"] == 0.0 and metrics["train/loss"] == 0.0
    assert metrics["train/response_tokens"] > 0
    after = asyncio.run(b.get_weights())
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_tis_metrics_measure_trainer_vs_rollout_logprobs(tiny_model_dir):
    b = backend(tiny_model_dir, tis_cap=1.5)
    batch = make_batch(b.algo)
    with torch.no_grad():
        logits = b.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    trainer_lp = token_logprobs(logits, batch.input_ids)
    m = batch.response_mask > 0
    ratio = torch.exp(trainer_lp - batch.rollout_logprobs)[m]
    metrics = step(b, batch)
    assert metrics["train/logprob_diff_rollout"] == pytest.approx(
        (trainer_lp - batch.rollout_logprobs)[m].abs().mean().item(), rel=1e-4)
    assert metrics["train/tis_ratio_mean"] == pytest.approx(ratio.mean().item(), rel=1e-4)
    assert metrics["train/tis_truncated_frac"] == pytest.approx((ratio > 1.5).float().mean().item())
    assert 0 < metrics["train/tis_truncated_frac"] < 1


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rejection_masks_tokens_and_reports_the_share(tiny_model_dir, level):
    # Rollout log-probs are random (-2..-4) against the random model's (~ -log 24): some
    # token and sequence ratios leave [0.8, 1.25].
    b = backend(tiny_model_dir, rejection=level, rejection_low=0.8, rejection_high=1.25)
    batch = make_batch(b.algo)
    with torch.no_grad():
        logits = b.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    log_ratio = torch.where(batch.response_mask > 0, token_logprobs(logits, batch.input_ids) - batch.rollout_logprobs,
                            torch.zeros(()))
    m = batch.response_mask > 0
    if level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    ratio = torch.exp(log_ratio)[m]
    expected = ((ratio < 0.8) | (ratio > 1.25)).float().mean().item()
    metrics = step(b, batch)
    assert 0 < expected < 1
    assert metrics["train/rejected_frac"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("loss", ["ppo", "dual_clip", "gspo", "cispo"])
def test_every_policy_loss_trains_finitely_with_several_updates(tiny_model_dir, loss):
    agg = "seq_mean_token_mean" if loss == "gspo" else "token_mean"
    b = backend(tiny_model_dir, policy_loss=loss, loss_agg=agg, mini_batches=2, lr=3e-3)
    before = asyncio.run(b.get_weights())
    metrics = step(b, make_batch(b.algo))
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["train/num_updates"] == 2 and metrics["train/grad_norm"] > 0
    after = asyncio.run(b.get_weights())
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_kl_to_frozen_reference(tiny_model_dir):
    b = backend(tiny_model_dir, kl_coef=0.1, kl_estimator="k3", lr=3e-3)
    assert b.reference is not None
    batch = make_batch(b.algo)
    first = step(b, batch)
    assert first["train/kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before the first update
    second = step(b, batch)
    assert second["train/kl"] > 0
    assert all(not p.requires_grad for p in b.reference.module.parameters())


def test_several_updates_per_step_use_old_logprobs(tiny_model_dir):
    b = backend(tiny_model_dir, ppo_epochs=2, mini_batches=2, micro_batch_size=3, lr=3e-3)
    metrics = step(b, make_batch(b.algo))
    assert metrics["train/num_updates"] == 4
    assert all(math.isfinite(v) for v in metrics.values())
    # After the first epoch's updates the ratio moves away from 1, so the second epoch's
    # loss differs from -mean advantage and some tokens may clip.
    assert 0.0 <= metrics["train/clip_frac"] <= 1.0


def test_save_load_round_trip_is_exact(tiny_model_dir, tmp_path):
    algo_kw = dict(lr_schedule="cosine", warmup_steps=1, lr=1e-3)
    first = backend(tiny_model_dir, **algo_kw)
    step(first, make_batch(first.algo, seed=1))
    rng_at_save = torch.get_rng_state()
    asyncio.run(first.save(str(tmp_path / "ckpt")))
    assert (tmp_path / "ckpt" / "config.json").is_file()  # usable as model.path
    loaded_model = ModelConf(path=str(tmp_path / "ckpt"))
    torch.manual_seed(123)  # RNG state is restored by load, whatever it is now
    reference_metrics = step(first, make_batch(first.algo, seed=2))
    reference_weights = asyncio.run(first.get_weights())

    fresh = backend(tiny_model_dir, **algo_kw)
    asyncio.run(fresh.load(str(tmp_path / "ckpt")))
    assert torch.equal(torch.get_rng_state(), rng_at_save)
    metrics = step(fresh, make_batch(fresh.algo, seed=2))
    assert metrics["train/loss"] == reference_metrics["train/loss"]
    assert metrics["train/lr"] == reference_metrics["train/lr"]
    weights = asyncio.run(fresh.get_weights())
    assert all(torch.equal(weights[k], reference_weights[k]) for k in reference_weights)

    # The checkpoint directory is an ordinary model.path.
    as_policy = Learner(TorchBackendConf(), loaded_model, first.algo, total_steps=10, seed=0)
    assert as_policy.tokenizer.pad_token_id == first.tokenizer.pad_token_id


def test_load_rejects_a_directory_without_backend_state(tiny_model_dir, tmp_path):
    b = backend(tiny_model_dir)
    with pytest.raises(FileNotFoundError, match="backend_state.pt"):
        asyncio.run(b.load(str(tmp_path)))


def test_empty_batch_is_refused(tiny_model_dir):
    b = backend(tiny_model_dir)
    batch = make_batch(b.algo)
    batch = dataclasses.replace(batch, response_mask=torch.zeros_like(batch.response_mask))
    with pytest.raises(ValueError, match="no response tokens"):
        step(b, batch)


def test_weights_for_the_object_store_are_the_live_tensors(tiny_model_dir):
    """`ray.put` copies what the training actor hands it: the live parameters, not a snapshot of them."""
    b = backend(tiny_model_dir)
    live, snapshot = b.weights_to_copy_now(), b.get_weights_blocking()
    assert list(live) == list(snapshot) and all(torch.equal(live[k], snapshot[k]) for k in live)
    params = {p.data_ptr() for p in b.model.parameters()}
    assert all(t.data_ptr() in params for k, t in live.items() if "weight" in k)
    assert not any(t.data_ptr() in params for t in snapshot.values())


def test_a_tied_lm_head_travels_once_and_the_engine_gets_both_names(tiny_model_dir):
    """The embedding the LM head shares goes once, under its first name (as `save_pretrained` writes
    it), in the snapshot and in the live tensors; an engine of the same config loads it into both."""
    from rlharness.config.schema import HFEngineConf
    from rlharness.engine.hf import HFEngine

    b = backend(tiny_model_dir)
    assert b.model.lm_head.weight is b.model.model.embed_tokens.weight  # the tiny model ties them
    full = b.model.state_dict()
    for sent in (b.get_weights_blocking(), b.weights_to_copy_now()):
        assert "lm_head.weight" not in sent and "model.embed_tokens.weight" in sent
        assert set(sent) == set(full) - {"lm_head.weight"}
    with torch.no_grad():
        b.model.model.embed_tokens.weight.add_(0.5)  # a new version that moves the tied tensor

    async def load() -> dict[str, torch.Tensor]:
        engine = HFEngine(HFEngineConf(device="cpu"), ModelConf(path=tiny_model_dir))
        try:
            await engine.load_weights(b.get_weights_blocking(), 1)
            return engine.model.state_dict()
        finally:
            await engine.close()

    got = asyncio.run(load())
    assert torch.equal(got["lm_head.weight"], b.model.lm_head.weight)
    assert torch.equal(got["model.embed_tokens.weight"], b.model.model.embed_tokens.weight)
