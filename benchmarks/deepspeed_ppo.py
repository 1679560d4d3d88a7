"""Issue 26: algo=ppo's critic under backend=deepspeed vs backend=torch, on the same batches.

One process drives a `backend=torch` PPO backend and a `backend=deepspeed` one (2 CPU ranks on
local Ray, ZeRO stage `--zero-stage`) through the same `--steps` batches of random groups (4
samples per prompt, responses of 4-24 tokens, so ranks get padding rows and uneven lengths;
two mini-batches, micro-batches of 4 rows, the KL in the reward). Per step: the largest
relative difference over the critic/* metrics and over the policy's loss / KL / grad norm,
and the seconds of each backend's `train_step` (side by side, so a ratio; wall times depend on
the box's load). At the end: the largest absolute difference between the two critics' weights,
and the same for a save + load of the DeepSpeed backend (must be 0: bit-exact).

    .venv/bin/python benchmarks/deepspeed_ppo.py --steps 4 --zero-stage 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

import torch

from rlharness.backend import build_backend
from rlharness.distributed.train_actor import start_ranked_backend
from rlharness.config.schema import (AlgoConf, CriticConf, DeepSpeedBackendConf, LocalRayClusterConf, ModelConf,
                                     TorchBackendConf)
from rlharness.cluster import connect_ray
from rlharness.model.tiny import save_tiny_model
from rlharness.trainer.batch import build_train_batch
from rlharness.core.types import Group, RolloutState, Status

# critic/vf_clip_frac apart: it counts tokens, and one whose value moved by about cliprange_value
# falls on either side with rounding (as the policy's train/clip_frac).
CRITIC = ("critic/value_loss", "critic/vf_explained_var", "critic/values_mean", "critic/returns_mean",
          "critic/grad_norm", "critic/kl_reward")
POLICY = ("train/loss", "train/kl", "train/grad_norm", "train/entropy")


def batch(algo: AlgoConf, seed: int, groups: int, k: int = 4, vocab: int = 19):
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(4, vocab) for _ in range(rng.randint(4, 12))]
        members = []
        for i in range(k):
            resp = [rng.randrange(4, vocab) for _ in range(rng.randint(4, 24))]
            members.append(RolloutState(
                uid=f"{g}-{i}", group_id=str(g), task="t", prompt_index=g, epoch=0, prompt_text="",
                prompt_ids=list(prompt), response_ids=resp, response_logprobs=[-rng.uniform(2, 4) for _ in resp],
                response_model_steps=[0] * len(resp), reward={"score": float(rng.random() < 0.5)},
                status=Status.COMPLETED, finish_reason="stop"))
        out.append(Group.from_samples(members))
    return build_train_batch(out, algo, pad_token_id=0, train_step=seed, max_response_len=24, temperature=1.0)[0]


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


async def main(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="ds_ppo_"))
    model = ModelConf(path=str(save_tiny_model(work / "model", seed=0)))
    algo = AlgoConf(name="ppo", advantage="gae", lr=1e-3, mini_batches=2, micro_batch_size=4, kl_coef=0.01,
                    kl_reward_coef=0.1, critic=CriticConf(lr=1e-3))
    torch.set_num_threads(1)
    ref = build_backend(TorchBackendConf(), model, algo, 100, 0)
    ds = start_ranked_backend(DeepSpeedBackendConf(zero_stage=args.zero_stage, num_workers=2), model, algo, 100, 0,
                                 cpus_per_worker=1.0, timeout_s=600)
    try:
        print(f"load average {os.getloadavg()}; ZeRO-{args.zero_stage}, 2 ranks, {args.groups} groups x 4 rows")
        print("step | max rel diff critic/* (key: deepspeed vs torch) | vf_clip_frac deepspeed vs torch | "
              "max rel diff train/* | torch s | deepspeed s")
        for step in range(1, args.steps + 1):
            b = batch(algo, step, args.groups)
            t0 = time.perf_counter()
            want = await ref.train_step(b)
            t1 = time.perf_counter()
            got = await ds.train_step(b)
            t2 = time.perf_counter()
            c = max(CRITIC, key=lambda k: rel(got[k], want[k]))
            p = max(POLICY, key=lambda k: rel(got[k], want[k]))
            f = "critic/vf_clip_frac"
            print(f"{step} | {rel(got[c], want[c]):.2e} ({c}: {got[c]:.4g} vs {want[c]:.4g}) | {got[f]:.4f} vs "
                  f"{want[f]:.4f} | {rel(got[p], want[p]):.2e} ({p}) | {t1 - t0:.2f} | {t2 - t1:.2f}")
        theirs = (await ds._on_all("critic_weights_blocking"))[0]
        mine = ref.critic.module.state_dict()
        print("critic weights, max |deepspeed - torch|:",
              f"{max(float((theirs[k] - v).abs().max()) for k, v in mine.items()):.2e}")
        await ds.save(str(work / "ckpt"))
        nxt = batch(algo, 1000, args.groups)
        a = await ds.train_step(nxt)
        after = (await ds._on_all("critic_weights_blocking"))[0]
        await ds.load(str(work / "ckpt"))
        b2 = await ds.train_step(nxt)
        again = (await ds._on_all("critic_weights_blocking"))[0]
        print("save + load + the same step: critic/* equal:", all(a[k] == b2[k] for k in (*CRITIC, f)),
              "| critic weights max diff:", max(float((again[k] - v).abs().max()) for k, v in after.items()))
    finally:
        await ds.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--zero-stage", type=int, default=2)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cli = parser.parse_args()
    connect_ray(LocalRayClusterConf(num_cpus=4, object_store_memory_mb=256))
    asyncio.run(main(cli))
