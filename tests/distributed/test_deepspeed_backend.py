"""backend=deepspeed: two ZeRO ranks on Ray actors train like backend=torch; save/load resumes;
a dead rank stops the run with an error naming it."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from rlharness.backend import build_backend
from rlharness.distributed.train_actor import start_ranked_backend
from rlharness.backend.rank_balance import pad_rows
from rlharness.config.schema import AlgoConf, DeepSpeedBackendConf, ModelConf, TorchBackendConf
from rlharness.distributed.train_actor import TrainingWorkerDied
from rlharness.trainer.batch import build_train_batch
from rlharness.core.types import Group, RolloutState, Status
from tests.helpers import HANG_S

pytestmark = [pytest.mark.ray, pytest.mark.deepspeed, pytest.mark.slow, pytest.mark.timeout(300)]


def make_batch(algo: AlgoConf, seed: int, num_groups: int = 3, k: int = 3, vocab: int = 19):
    """Groups of uneven prompt/response lengths; 9 rows, so two ranks need a padding row."""
    rng = random.Random(seed)
    groups = []
    for g in range(num_groups):
        prompt = [rng.randrange(4, vocab) for _ in range(rng.randint(3, 6))]
        group = []
        for i in range(k):
            resp = [rng.randrange(4, vocab) for _ in range(rng.randint(1, 5))]
            group.append(RolloutState(
                uid=f"{g}-{i}", group_id=str(g), task="t", prompt_index=g, epoch=0, prompt_text="",
                prompt_ids=list(prompt), response_ids=resp, response_logprobs=[-rng.uniform(2, 4) for _ in resp],
                response_model_steps=[0] * len(resp), reward={"score": float(rng.random() < 0.5)},
                status=Status.COMPLETED, finish_reason="stop"))
        groups.append(Group.from_samples(group))
    return build_train_batch(groups, algo, pad_token_id=0, train_step=1, max_response_len=8, temperature=1.0)[0]


def two_ranks_and_torch(algo: AlgoConf, model_dir: str):
    """Two ZeRO-2 ranks and backend=torch on the same model, and the three batches both train on."""
    model = ModelConf(path=model_dir)
    ds = start_ranked_backend(DeepSpeedBackendConf(zero_stage=2, num_workers=2), model, algo, 10, 0,
                              cpus_per_worker=1.0, timeout_s=HANG_S)
    ref = build_backend(TorchBackendConf(), model, algo, 10, 0)
    return ds, ref, [make_batch(algo, seed=s) for s in (1, 2, 3)]


def test_padding_rows_train_nothing():
    algo = AlgoConf(name="grpo")
    batch = make_batch(algo, seed=0)
    padded = pad_rows(batch, world_size=2, mini_batches=2)  # 9 rows -> minis of 5 and 4 -> 6 and 6
    assert batch.input_ids.shape[0] == 9 and padded.input_ids.shape[0] == 12
    real, pads = [0, 1, 2, 3, 4, 6, 7, 8, 9], [5, 10, 11]  # rows 0-4 | pad | rows 5-8 | pad, pad
    for name in ("input_ids", "response_mask", "advantages", "rollout_logprobs"):
        assert torch.equal(getattr(padded, name)[real], getattr(batch, name)), name
    assert padded.response_mask[pads].sum() == 0 and padded.advantages[pads].abs().sum() == 0
    assert pad_rows(batch, world_size=3, mini_batches=1) is batch


def test_two_zero_ranks_match_torch_and_resume_from_save(ray_session, tiny_model_dir, tmp_path):
    # Two optimizer updates per step (mini_batches=2) and micro-batches of 2 exercise the split.
    algo = AlgoConf(name="grpo", lr=1e-3, mini_batches=2, micro_batch_size=2, kl_coef=0.01)
    ds, ref, batches = two_ranks_and_torch(algo, tiny_model_dir)

    async def main():
        try:
            for b in batches[:2]:
                got, want = await ds.train_step(b), await ref.train_step(b)
                for key in ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/response_tokens"):
                    assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
            weights, ref_weights = await ds.get_weights(), await ref.get_weights()
            assert set(weights) == set(ref_weights)
            # Up to a tenth of lr apart: Adam divides each gradient by its own running RMS, so float
            # rounding of near-zero gradients (the ranks sum them in another order) moves those elements
            # by up to lr; a wrong gradient moves most elements by about lr.
            for name, t in ref_weights.items():
                torch.testing.assert_close(weights[name], t, rtol=1e-4, atol=1e-4, msg=name)

            await ds.save(str(tmp_path / "ckpt"))
            assert (tmp_path / "ckpt" / "config.json").is_file()  # the HF copy: usable as model.path
            continued = await ds.train_step(batches[2])
            await ds.load(str(tmp_path / "ckpt"))
            resumed = await ds.train_step(batches[2])
            assert resumed["train/loss"] == pytest.approx(continued["train/loss"], rel=1e-6, abs=1e-8)
            assert resumed["train/grad_norm"] == pytest.approx(continued["train/grad_norm"], rel=1e-6)

            from transformers import AutoModelForCausalLM

            hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt")).state_dict()
            for name, t in weights.items():
                torch.testing.assert_close(hf[name], t, msg=name)

            import ray

            ray.kill(ds.actors[1], no_restart=True)
            with pytest.raises(TrainingWorkerDied, match="deepspeed-rank1"):
                await ds.train_step(batches[0])
        finally:
            await ds.close()

    asyncio.run(main())


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_non_finite_gradient_skips_the_update_on_every_rank(ray_session, tiny_model_dir, tmp_path, zero_stage):
    """Stage 0 applies any gradient unless refused (checked on every rank); ZeRO 1-3 skip a non-finite
    norm themselves. Either way: counted in train/skipped_updates, the weights untouched, and a save
    still works (the weights are finite)."""
    import dataclasses

    algo = AlgoConf(name="drgrpo", advantage="drgrpo", norm_adv_by_std=False, loss_agg="seq_mean_token_sum_norm")
    ds = start_ranked_backend(DeepSpeedBackendConf(zero_stage=zero_stage, num_workers=2), ModelConf(path=tiny_model_dir),
                              algo, 10, 0, cpus_per_worker=1.0, timeout_s=HANG_S)
    batch = make_batch(algo, seed=1)
    huge = dataclasses.replace(batch, advantages=batch.advantages * 1e30)  # the gradient norm overflows

    async def main():
        try:
            before = await ds.get_weights()
            out = await ds.train_step(huge)
            assert out["train/skipped_updates"] == 1 and out["train/weights_finite"] == 1.0
            after = await ds.get_weights()
            for name, t in before.items():
                assert torch.equal(after[name], t), name
            out = await ds.train_step(batch)
            assert out["train/skipped_updates"] == 0
            await ds.save(str(tmp_path / "ckpt"))
        finally:
            await ds.close()

    asyncio.run(main())


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_gradient_checkpointing_and_chunked_scores_match_torch(ray_session, tiny_model_dir, zero_stage):
    """backend.gradient_checkpointing and 3-token log-prob chunks on two ranks: the loss, the entropy and
    the gradient norm of plain backend=torch, over two steps."""
    algo = AlgoConf(name="grpo", lr=1e-3, micro_batch_size=2, entropy_coef=0.01)
    model = ModelConf(path=tiny_model_dir)
    ds = start_ranked_backend(DeepSpeedBackendConf(zero_stage=zero_stage, num_workers=2, gradient_checkpointing=True,
                                                   logprob_chunk_tokens=3),
                              model, algo, 10, 0, cpus_per_worker=1.0, timeout_s=HANG_S)
    ref = build_backend(TorchBackendConf(), model, algo, 10, 0)

    async def main():
        try:
            for seed in (4, 5):
                b = make_batch(algo, seed=seed)
                got, want = await ds.train_step(b), await ref.train_step(b)
                for key in ("train/loss", "train/entropy", "train/grad_norm", "train/response_tokens"):
                    assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
            # Step 2's loss is that of step 1's update: the updated weights agree. (Not compared element
            # by element: Adam turns rounding differences of near-zero gradients into up to lr.)
        finally:
            await ds.close()

    asyncio.run(main())


def test_token_budget_on_balanced_ranks_matches_torch(ray_session, tiny_model_dir):
    """backend.micro_batch_tokens on ranks given Karmarkar-Karp shares: the ranks hold different
    numbers of token-budget groups before they are evened out (ZeRO-3 gathers parameters in every
    pass, so a rank with fewer passes would hang the others); two updates per step (the old log-probs
    of a row come from whichever rank scored it); the loss and gradient norm are plain backend=torch's
    (every algo.loss_agg: tests/backend/test_rank_balance.py); the imbalance metric is reported."""
    algo = AlgoConf(name="grpo", lr=1e-3, mini_batches=2, kl_coef=0.01, loss_agg="seq_mean_token_mean")
    model = ModelConf(path=tiny_model_dir)
    ds = start_ranked_backend(DeepSpeedBackendConf(zero_stage=3, num_workers=2, micro_batch_tokens=16),
                              model, algo, 10, 0, cpus_per_worker=1.0, timeout_s=HANG_S)
    ref = build_backend(TorchBackendConf(), model, algo, 10, 0)

    async def main():
        try:
            for seed in (6, 7):
                b = make_batch(algo, seed=seed, num_groups=4)
                got, want = await ds.train_step(b), await ref.train_step(b)
                for key in ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/response_tokens"):
                    assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
                assert 1.0 <= got["perf/rank_token_imbalance"] <= 1.2
        finally:
            await ds.close()

    asyncio.run(main())


PPO_COMPARED = ("train/loss", "train/kl", "train/grad_norm", "critic/value_loss", "critic/vf_explained_var",
                "critic/values_mean", "critic/returns_mean", "critic/grad_norm", "critic/kl_reward")


def test_ppo_critic_on_two_zero_ranks_matches_torch_and_resumes_bit_exact(ray_session, tiny_model_dir, tmp_path):
    """algo=ppo: each rank's critic engine scores its rows, the values are summed across ranks, GAE and
    whitening run on the whole batch: critic/* and the updated critic equal backend=torch's; the critic
    is saved with the policy and a load continues exactly (the 9 rows need a padding row on 2 ranks;
    two mini-batches, micro-batches of 2, the KL in the reward, a clip that acts)."""
    from rlharness.config.schema import CriticConf

    algo = AlgoConf(name="ppo", advantage="gae", lr=1e-3, mini_batches=2, micro_batch_size=2, kl_coef=0.01,
                    kl_reward_coef=0.1, critic=CriticConf(lr=1e-3, cliprange_value=0.05, grad_clip=0.5))
    ds, ref, batches = two_ranks_and_torch(algo, tiny_model_dir)

    async def critic_weights():
        return (await ds._on_all("critic_weights_blocking"))[0]

    async def main():
        try:
            for b in batches[:2]:
                got, want = await ds.train_step(b), await ref.train_step(b)
                for key in PPO_COMPARED:
                    assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
                # A token whose value moved by about cliprange can land on either side of it (as the
                # policy's clip_frac, not compared either): within two of the batch's ~25 tokens.
                assert got["critic/vf_clip_frac"] == pytest.approx(want["critic/vf_clip_frac"], abs=0.08)
            assert want["critic/vf_clip_frac"] > 0 and want["critic/kl_reward"] != 0
            weights = await critic_weights()
            ref_weights = {k: v.detach() for k, v in ref.critic.module.state_dict().items()}
            assert set(weights) == set(ref_weights)
            for name, t in ref_weights.items():  # the tolerance of the policy's comparison above
                torch.testing.assert_close(weights[name], t, rtol=1e-4, atol=1e-4, msg=name)

            await ds.save(str(tmp_path / "ckpt"))
            from safetensors.torch import load_file

            saved = load_file(str(tmp_path / "ckpt" / "critic" / "critic.safetensors"))
            assert all(torch.equal(saved[k], v) for k, v in weights.items())
            continued = await ds.train_step(batches[2])
            after = await critic_weights()
            await ds.load(str(tmp_path / "ckpt"))
            assert all(torch.equal(v, weights[k]) for k, v in (await critic_weights()).items())
            resumed = await ds.train_step(batches[2])
            for key in (*PPO_COMPARED, "critic/vf_clip_frac"):
                assert resumed[key] == continued[key], key
            assert all(torch.equal(v, after[k]) for k, v in (await critic_weights()).items())
        finally:
            await ds.close()

    asyncio.run(main())
