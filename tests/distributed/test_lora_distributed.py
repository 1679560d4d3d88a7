"""LoRA on the distributed paths: backend=deepspeed (ZeRO-2, two ranks) trains like backend=torch and
checkpoints the adapter in PEFT's format; a disaggregated async run (Ray) trains with adapters synced."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlharness.backend import build_backend
from rlharness.distributed.train_actor import start_ranked_backend
from rlharness.config.schema import AlgoConf, DeepSpeedBackendConf, LoraConf, ModelConf, TorchBackendConf
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.distributed.test_deepspeed_backend import make_batch
from tests.helpers import HANG_S, QUICK, run_in_process

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.mark.deepspeed
def test_zero2_lora_matches_torch_and_resumes(ray_session, tiny_model_dir, tmp_path):
    algo = AlgoConf(name="grpo", lr=1e-2, mini_batches=2, micro_batch_size=2, kl_coef=0.01)
    model = ModelConf(path=tiny_model_dir, lora=LoraConf(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"]))
    ds = start_ranked_backend(DeepSpeedBackendConf(zero_stage=2, num_workers=2), model, algo, 10, 0,
                              cpus_per_worker=1.0, timeout_s=HANG_S)
    ref = build_backend(TorchBackendConf(), model, algo, 10, 0)
    batches = [make_batch(algo, seed=s) for s in (1, 2, 3)]

    async def main():
        try:
            for b in batches[:2]:
                got, want = await ds.train_step(b), await ref.train_step(b)
                for key in ("train/loss", "train/kl", "train/grad_norm"):
                    assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
            assert got["train/kl"] > 0  # the reference (adapters off) differs from the trained policy
            for _ in range(2):  # the first sync sends everything, the second the merged q/v matrices only
                weights, ref_weights = dict(await ds.get_weights()), await ref.get_weights()
                assert set(weights) == set(ref_weights)
                for name, t in ref_weights.items():
                    torch.testing.assert_close(weights[name], t, rtol=1e-4, atol=1e-5, msg=name)
            assert all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in weights)

            await ds.save(str(tmp_path / "ckpt"))
            assert (tmp_path / "ckpt" / "adapter_model.safetensors").is_file()
            assert not (tmp_path / "ckpt" / "model.safetensors").exists()
            continued = await ds.train_step(batches[2])
            await ds.load(str(tmp_path / "ckpt"))
            resumed = await ds.train_step(batches[2])
            assert resumed["train/loss"] == pytest.approx(continued["train/loss"], rel=1e-6, abs=1e-8)
            assert resumed["train/grad_norm"] == pytest.approx(continued["train/grad_norm"], rel=1e-6)
        finally:
            await ds.close()

    asyncio.run(main())


def test_disagg_async_lora_run(ray_session, tmp_path):
    run_dir = tmp_path / "run"
    run_in_process(run_dir, [*QUICK, "mode=disagg", "cluster=local_ray", "strategy=async", "max_staleness=0",
                             "total_steps=4", "eval_every=0", "save_every=2", "model.lora.rank=4",
                             "model.lora.sync=adapter", "algo.lr=3e-3"])  # on-policy: no stale tokens in the gap
    rows = [r for r in read_metrics(RunDir(run_dir).metrics) if "train/loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["train/logprob_diff_rollout"] < 1e-4 for r in rows)  # the engines serve the trained adapter
    assert (RunDir(run_dir).checkpoint(4) / "backend" / "adapter_config.json").is_file()
    # The adapter only (94 kB of tensors; the model's weights are 2.1 MB), as the object store holds it.
    sent = [r["perf/weight_sync_bytes"] for r in rows]
    assert all(90_000 < b < 200_000 for b in sent), sent
