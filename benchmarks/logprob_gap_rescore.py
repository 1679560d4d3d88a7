"""Where an engine-vs-trainer log-prob gap comes from: the same prompts re-scored in one process.

    python benchmarks/logprob_gap_rescore.py RUN_DIR [--steps 1,2,3] [--dtype bfloat16]

For each step N, the prompts that RUN_DIR trained at step N (`rollouts/step_N.jsonl`) go to a
fresh hf engine (the run's model folder, `--dtype` on both sides, the run's sampling: T=1,
`--max-tokens`, `--samples` per prompt), in one process, no checkpoint and no resume. The
trainer's scoring (`TorchBackend._token_scores`, what `train/logprob_diff_rollout` compares
against) then recomputes the same tokens' log-probs on the same weights:

- `batch`: all the step's rows in one right-padded micro-batch, as the run scored them;
- `alone`: each row by itself (no padding, another matrix shape).

Printed per step: the prompt lengths, the mean |engine - trainer| per response token for
both (the first is what the run logs), the mean |batch - alone| (the trainer against
itself: only the shapes differ), and the share of tokens whose two log-probs are equal.
For runs whose weights did not move (reward 0 everywhere, as in the "real model paths"
runs) the model folder's weights are the weights the run's engine sampled with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rlharness.backend.torch_backend import TorchBackend
from rlharness.config.schema import AlgoConf, HFEngineConf, ModelConf, TorchBackendConf
from rlharness.engine import build_engine
from rlharness.engine.base import GenerateRequest, SamplingParams
from rlharness.model import load_tokenizer
from rlharness.trainer.batch import build_train_batch
from rlharness.types import RolloutState, Status


def step_prompts(run_dir: Path, step: int) -> list[str]:
    rows = [json.loads(ln) for ln in (run_dir / "rollouts" / f"step_{step:08d}.jsonl").read_text().splitlines()]
    seen: dict[str, str] = {}
    for r in rows:
        seen.setdefault(r["group_id"], r["prompt"])
    return list(seen.values())


async def sample(engine, prompt_ids: list[list[int]], samples: int, max_tokens: int, seed: int):
    reqs = [GenerateRequest(f"{i}-{j}", p, SamplingParams(temperature=1.0, max_tokens=max_tokens),
                            seed=seed + 100 * i + j)
            for i, p in enumerate(prompt_ids) for j in range(samples)]
    return await asyncio.gather(*(engine.generate(r) for r in reqs))


def groups_of(prompt_ids, results, samples: int) -> list[list[RolloutState]]:
    groups = []
    for i, p in enumerate(prompt_ids):
        group = []
        for j in range(samples):
            r = results[i * samples + j]
            group.append(RolloutState(
                uid=f"{i}-{j}", group_id=str(i), task="t", prompt_index=i, epoch=0, prompt_text="",
                prompt_ids=p, response_ids=list(r.token_ids), response_logprobs=list(r.logprobs),
                response_model_steps=[0] * len(r.token_ids), reward={"score": 0.0}, status=Status.COMPLETED,
                finish_reason=r.finish_reason))
        groups.append(group)
    return groups


def trainer_logprobs(backend: TorchBackend, groups, pad_id: int, max_tokens: int) -> tuple[torch.Tensor, ...]:
    algo = AlgoConf(name="grpo", micro_batch_size=64)
    batch, _ = build_train_batch(groups, algo, pad_token_id=pad_id, train_step=1, max_response_len=max_tokens,
                                 temperature=1.0)
    mb = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
          "response_mask": batch.response_mask}
    with torch.no_grad():
        lp, _ = backend._token_scores(backend.model, mb, 1.0, "none")
    return lp, batch.rollout_logprobs, batch.response_mask


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--steps", default="1,2,3")
    p.add_argument("--dtype", default=None, help="default: the run's model.dtype")
    p.add_argument("--samples", type=int, default=None, help="default: the run's sampler.prompt_repeat_k")
    p.add_argument("--max-tokens", type=int, default=None, help="default: the run's agent.sampling.max_tokens")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    conf = OmegaConf.load(args.run_dir / ".hydra" / "config.yaml")
    dtype = args.dtype or conf.model.dtype
    samples = args.samples or conf.sampler.prompt_repeat_k
    max_tokens = args.max_tokens or conf.agent.sampling.max_tokens
    model_conf = ModelConf(path=conf.model.path, dtype=dtype)
    tok = load_tokenizer(model_conf)
    backend = TorchBackend(TorchBackendConf(), model_conf, AlgoConf(name="grpo"), 10, 0)
    engine = build_engine(HFEngineConf(), model_conf, seed=args.seed)
    print(f"{conf.model.path} {dtype}, {samples} samples x {max_tokens} tokens per prompt, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}")
    print("| step | prompt | prompt tokens (engine left-padding) | engine vs trainer: prompts batched "
          "| prompt alone in the engine | trainer: batch vs row alone | worst token (batched) |")
    print("|---|---|---|---|---|---|---|")
    try:
        for step in (int(s) for s in args.steps.split(",")):
            prompt_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in step_prompts(args.run_dir, step)]
            seed = args.seed + 1000 * step
            batched = groups_of(prompt_ids, asyncio.run(sample(engine, prompt_ids, samples, max_tokens, seed)),
                                samples)
            lp, engine_lp, mask = trainer_logprobs(backend, batched, tok.pad_token_id, max_tokens)
            width = max(map(len, prompt_ids))
            for i, p_ids in enumerate(prompt_ids):
                rows = slice(i * samples, (i + 1) * samples)
                diff = (engine_lp[rows] - lp[rows]).abs() * mask[rows]
                alone_lp = torch.cat([trainer_logprobs(backend, [[s]], tok.pad_token_id, max_tokens)[0]
                                      for s in batched[i]])
                # The same prompt alone in the engine (no left padding), same seeds.
                solo = groups_of([p_ids], asyncio.run(sample(engine, [p_ids], samples, max_tokens, seed + 100 * i)),
                                 samples)
                s_lp, s_engine, s_mask = trainer_logprobs(backend, solo, tok.pad_token_id, max_tokens)
                n, s_n = mask[rows].sum(), s_mask.sum()
                self_gap = float(((lp[rows, :alone_lp.shape[1]] - alone_lp).abs() * mask[rows, :alone_lp.shape[1]]).sum() / n)
                print(f"| {step} | {i} | {len(p_ids)} ({width - len(p_ids)}) | {float(diff.sum() / n):.2e} | "
                      f"{float(((s_engine - s_lp).abs() * s_mask).sum() / s_n):.2e} | {self_gap:.2e} | "
                      f"{float(diff.max()):.2e} |", flush=True)
    finally:
        asyncio.run(engine.close())


if __name__ == "__main__":
    main()
