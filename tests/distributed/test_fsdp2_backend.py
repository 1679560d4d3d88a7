"""backend=fsdp2: two ranks of torch's FSDP2 (`fully_shard`, gloo on CPU) on Ray actors train like
backend=torch (first step: loss, grad norm, updated weights), save and resume exactly (their checkpoint
is backend=torch's: either resumes it), take LoRA and the critic, and train through train.py in
mode=disagg cluster=local_ray."""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch

from rlharness.backend import build_backend
from rlharness.config.schema import AlgoConf, CriticConf, FSDP2BackendConf, LoraConf, ModelConf, TorchBackendConf
from rlharness.distributed.train_actor import start_ranked_backend
from tests.distributed.test_deepspeed_backend import make_batch
from tests.helpers import HANG_S

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(HANG_S)]

# The first step's metrics compared with backend=torch's.
COMPARED = ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/grad_norm", "train/clip_frac",
            "train/logprob_diff_rollout", "train/response_tokens", "train/num_updates")


def fsdp2_and_torch(algo: AlgoConf, model: ModelConf, **torch_kw):
    """Two FSDP2 ranks and backend=torch, both with `torch_kw`'s backend keys."""
    fsdp2 = start_ranked_backend(FSDP2BackendConf(num_workers=2, **torch_kw), model, algo, 10, 0,
                                 cpus_per_worker=1.0, timeout_s=HANG_S)
    return fsdp2, build_backend(TorchBackendConf(**torch_kw), model, algo, 10, 0)


def assert_same_step(got: dict[str, float], want: dict[str, float], keys=COMPARED) -> None:
    for key in keys:
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (key, got[key], want[key])


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], lr: float) -> None:
    """Every tensor within 1e-5 of torch's, relative in norm; no element further than a tenth of the LR.
    Not each element to 1e-5: an element whose gradient is a sum that nearly cancels keeps a rounding
    difference of the order its terms are summed in (the ranks' shares), and Adam divides each gradient
    by its own RMS, so such an element moves by a few percent of the LR more or less (0.4% of the
    elements here; so does backend=torch split into other micro-batches)."""
    assert set(got) == set(want)
    for name, t in want.items():
        diff = (got[name] - t).float()
        assert float(diff.norm()) <= 1e-5 * float(t.float().norm()), (name, float(diff.norm() / t.float().norm()))
        assert float(diff.abs().max()) <= lr / 10, (name, float(diff.abs().max()))


def test_two_ranks_equal_torch_on_the_first_step(ray_session, tiny_model_dir):
    """9 rows (a padding row per mini-batch), two updates of micro-batches of 2, a KL to the (sharded)
    reference: the summed shards' gradient is the one-process gradient."""
    algo = AlgoConf(name="grpo", lr=1e-3, mini_batches=2, micro_batch_size=2, kl_coef=0.01)
    fsdp2, ref = fsdp2_and_torch(algo, ModelConf(path=tiny_model_dir))
    batch = make_batch(algo, seed=1)

    async def main():
        try:
            got, want = await fsdp2.train_step(batch), await ref.train_step(batch)
            assert want["train/num_updates"] == 2 and want["train/kl"] > 0
            assert_same_step(got, want)
            assert 1.0 <= got["perf/rank_token_imbalance"] < 1.5
            assert_same_weights(dict(await fsdp2.get_weights()), await ref.get_weights(), algo.lr)
        finally:
            await fsdp2.close()

    asyncio.run(main())


def test_gradient_checkpointing_token_budget_and_chunked_scores_equal_torch(ray_session, tiny_model_dir):
    """Checkpointed blocks recomputed in the backward (FSDP2 gathers them again), token-budget
    micro-batches split across ranks, 3-token chunks of the output head outside the forward."""
    algo = AlgoConf(name="grpo", lr=1e-3, mini_batches=2, micro_batch_size=2, kl_coef=0.01)
    fsdp2, ref = fsdp2_and_torch(algo, ModelConf(path=tiny_model_dir), gradient_checkpointing=True,
                                 micro_batch_tokens=16, logprob_chunk_tokens=3)
    batch = make_batch(algo, seed=2)

    async def main():
        try:
            assert_same_step(await fsdp2.train_step(batch), await ref.train_step(batch))
        finally:
            await fsdp2.close()

    asyncio.run(main())


def test_saves_and_resumes_exactly_and_torch_resumes_its_checkpoint(ray_session, tiny_model_dir, tmp_path):
    """Fresh ranks that load the step-2 checkpoint train step 3 bit for bit as the ranks that went on."""
    algo = AlgoConf(name="grpo", lr=1e-3, micro_batch_size=3, kl_coef=0.01)
    model = ModelConf(path=tiny_model_dir)
    fsdp2, torch_backend = fsdp2_and_torch(algo, model)
    batches = [make_batch(algo, seed=s) for s in (1, 2, 3)]
    ckpt = tmp_path / "ckpt"

    async def main():
        try:
            for b in batches[:2]:
                await fsdp2.train_step(b)
            saved_weights = dict(await fsdp2.get_weights())
            await fsdp2.save(str(ckpt))
            continued = await fsdp2.train_step(batches[2])
            continued_weights = dict(await fsdp2.get_weights())
            with pytest.raises(ValueError, match="not a hosted backend method"):
                await fsdp2._on_all("weights_to_copy_now")
        finally:
            await fsdp2.close()
        resumed_ranks = start_ranked_backend(FSDP2BackendConf(num_workers=2), model, algo, 10, 0,
                                             cpus_per_worker=1.0, timeout_s=HANG_S)
        try:
            await resumed_ranks.load(str(ckpt))
            resumed = await resumed_ranks.train_step(batches[2])
            for key in COMPARED + ("train/lr",):
                assert resumed[key] == continued[key], key  # the same shards, optimizer state, LR: bit for bit
            resumed_weights = dict(await resumed_ranks.get_weights())
            assert all(torch.equal(resumed_weights[n], t) for n, t in continued_weights.items())
        finally:
            await resumed_ranks.close()
        # The checkpoint is backend=torch's: a model folder, the optimizer in torch's layout.
        from transformers import AutoModelForCausalLM

        folder = AutoModelForCausalLM.from_pretrained(str(ckpt)).state_dict()
        for name, t in saved_weights.items():
            assert torch.equal(folder[name], t), name
        await torch_backend.load(str(ckpt))
        assert_same_step(await torch_backend.train_step(batches[2]), continued, COMPARED + ("train/lr",))

    asyncio.run(main())


def test_lora_on_two_ranks_equals_torch_and_resumes(ray_session, tiny_model_dir, tmp_path):
    """Adapters on sharded blocks: the same step, the same merged weights for the engines (the first
    sync sends the whole model), a PEFT adapter folder as checkpoint that resumes."""
    algo = AlgoConf(name="grpo", lr=1e-2, micro_batch_size=3, kl_coef=0.05)  # the reference: adapters off
    model = ModelConf(path=tiny_model_dir, lora=LoraConf(rank=4, alpha=8.0))
    fsdp2, ref = fsdp2_and_torch(algo, model)
    batches = [make_batch(algo, seed=s) for s in (1, 2)]

    async def main():
        try:
            got, want = await fsdp2.train_step(batches[0]), await ref.train_step(batches[0])
            assert_same_step(got, want)
            assert_same_weights(dict(await fsdp2.get_weights()), await ref.get_weights(), algo.lr)
            assert_same_weights(dict(await fsdp2.get_weights()), await ref.get_weights(), algo.lr)  # merged only
            await fsdp2.save(str(tmp_path / "ckpt"))
            assert (tmp_path / "ckpt" / "adapter_model.safetensors").is_file()
            assert not (tmp_path / "ckpt" / "model.safetensors").exists()
            continued = await fsdp2.train_step(batches[1])
            await fsdp2.load(str(tmp_path / "ckpt"))
            assert (await fsdp2.train_step(batches[1]))["train/loss"] == continued["train/loss"]
        finally:
            await fsdp2.close()

    asyncio.run(main())


def test_ppo_critic_on_two_ranks_equals_torch(ray_session, tiny_model_dir, tmp_path):
    algo = AlgoConf(name="ppo", advantage="gae", lr=1e-3, micro_batch_size=2, mini_batches=2,
                    critic=CriticConf(lr=1e-3, warmup_steps=0))
    fsdp2, ref = fsdp2_and_torch(algo, ModelConf(path=tiny_model_dir))
    batch = make_batch(algo, seed=2)

    async def main():
        try:
            got, want = await fsdp2.train_step(batch), await ref.train_step(batch)
            assert_same_step(got, want, COMPARED + ("critic/value_loss", "critic/grad_norm", "critic/values_mean",
                                                    "critic/returns_mean", "critic/vf_clip_frac"))
            critic = (await fsdp2._on_all("critic_weights_blocking"))[0]
            assert_same_weights(critic, ref.critic_weights_blocking(), algo.critic.lr)
            await fsdp2.save(str(tmp_path / "ckpt"))
            assert (tmp_path / "ckpt" / "critic" / "critic.safetensors").is_file()
            continued = await fsdp2.train_step(batch)
            await fsdp2.load(str(tmp_path / "ckpt"))
            again = await fsdp2.train_step(batch)
            for key in ("critic/value_loss", "critic/grad_norm", "train/loss"):
                assert again[key] == continued[key], key
        finally:
            await fsdp2.close()

    asyncio.run(main())


@pytest.mark.timeout(2 * HANG_S + 60)
def test_disagg_run_on_fsdp2_trains_and_resumes_the_step_alike(tmp_path):
    """train.py mode=disagg cluster=local_ray backend=fsdp2: step 3 trained again from the step-2
    checkpoint (the step-3 one moved away, as if the run had died before writing it) gives step 3's
    samples and losses of the first time, and the same weights."""
    from safetensors.torch import load_file

    from tests.resume.test_kill_resume import launch, step_rows, trained_samples

    def run(run_dir, overrides):
        run_dir.mkdir(exist_ok=True)
        proc = launch(run_dir, overrides)
        assert proc.wait(timeout=HANG_S) == 0, proc.stderr_text()[-3000:]

    run_dir = tmp_path / "run"
    # Two ranks of half a CPU each and the engine on the other CPU: the 2 CPUs of cluster=local_ray.
    args = ["mode=disagg", "cluster=local_ray", "cluster.trainer_cpus=0.5", "backend=fsdp2", "total_steps=3",
            "save_every=1", "keep_checkpoints=3",
            "eval_every=0", "logger.mode=disabled", "batch_size=4", "sampler.prompt_repeat_k=4"]
    run(run_dir, args)
    first_samples, first_rows = trained_samples(run_dir), step_rows(run_dir)
    assert sorted(first_rows) == [1, 2, 3]
    assert all(r["train/grad_norm"] > 0 and "perf/rank_token_imbalance" in r for r in first_rows.values())
    shutil.move(run_dir / "checkpoints" / "step_00000003", tmp_path / "step_3_first")
    run(run_dir, args)  # resumes from step 2
    assert trained_samples(run_dir) == first_samples
    got = step_rows(run_dir)
    for k in ("train/loss", "train/grad_norm", "train/entropy", "rollout/reward_mean"):
        assert got[3][k] == pytest.approx(first_rows[3][k], rel=1e-4, abs=1e-6), (k, got[3][k], first_rows[3][k])
    a, b = (load_file(str(d / "backend" / "model.safetensors"))
            for d in (tmp_path / "step_3_first", run_dir / "checkpoints" / "step_00000003"))
    assert a.keys() == b.keys()
    # One update after the resume: Adam can turn a rounding difference of a near-zero gradient into up to
    # 2 LRs (tests/resume/test_ppo_resume.py); a run that did not resume its optimizer is far off.
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 2 * 3e-4
