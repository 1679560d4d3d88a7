"""backend=torch, deepspeed (ZeRO-2) and fsdp2 on the same batches: the same step, and what each costs.

One process drives a `backend=torch` learner (in this process, `--threads` torch threads) and,
one after the other, two-rank `backend=deepspeed` and `backend=fsdp2` learners (Ray actors of one
CPU and one torch thread each, on local Ray) through the same `--steps` batches of random groups
(4 samples per prompt, responses of 4-24 tokens: ranks get padding rows and uneven lengths; a KL
to the reference model). Per backend: the largest relative difference of step 1's loss, KL and
grad norm from backend=torch's, and the median seconds of a `train_step` over steps 2.. (step 1
builds optimizer state and, for the ranks, warms their process groups up). Wall times depend on
the box's load: read them side by side.

    .venv/bin/python benchmarks/backends_step.py --steps 5 --groups 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from deepspeed_ppo import batch, rel  # benchmarks/deepspeed_ppo.py: random groups of uneven lengths

from rlharness.backend import build_backend
from rlharness.cluster import connect_ray
from rlharness.config.schema import (AlgoConf, DeepSpeedBackendConf, FSDP2BackendConf, LocalRayClusterConf,
                                     ModelConf, TorchBackendConf)
from rlharness.distributed.train_actor import start_ranked_backend
from rlharness.model.tiny import save_tiny_model

COMPARED = ("train/loss", "train/kl", "train/grad_norm")


async def timed_steps(backend, batches) -> tuple[dict[str, float], list[float]]:
    first, seconds = None, []
    for b in batches:
        t0 = time.perf_counter()
        out = await backend.train_step(b)
        seconds.append(time.perf_counter() - t0)
        first = first or out
    return first, seconds[1:]


async def main(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="backends_step_"))
    model = ModelConf(path=str(save_tiny_model(work / "model", seed=0)))
    algo = AlgoConf(name="grpo", lr=1e-3, micro_batch_size=8, kl_coef=0.01)
    batches = [batch(algo, step, args.groups) for step in range(1, args.steps + 1)]
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()}; {args.groups} groups x 4 rows, {args.steps} steps; "
          f"torch: {args.threads} thread(s) in this process; ranked: 2 ranks x 1 thread")
    want, torch_s = await timed_steps(build_backend(TorchBackendConf(), model, algo, 100, 0), batches)
    print("backend | max rel diff of step 1 from torch (key) | median s/step (steps 2..)")
    print(f"torch | - | {statistics.median(torch_s):.3f}")
    for conf in (DeepSpeedBackendConf(zero_stage=2, num_workers=2), FSDP2BackendConf(num_workers=2)):
        ranked = start_ranked_backend(conf, model, algo, 100, 0, cpus_per_worker=1.0, timeout_s=600)
        try:
            got, secs = await timed_steps(ranked, batches)
        finally:
            await ranked.close()
        worst = max(COMPARED, key=lambda k: rel(got[k], want[k]))
        print(f"{conf.name} | {rel(got[worst], want[worst]):.1e} ({worst}) | {statistics.median(secs):.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cli = parser.parse_args()
    connect_ray(LocalRayClusterConf(num_cpus=4, object_store_memory_mb=256))
    asyncio.run(main(cli))
