"""Where an engine-vs-trainer log-prob gap comes from: the same prompts re-scored in one process.

    python benchmarks/logprob_gap_rescore.py RUN_DIR [--steps 1,2,3] [--dtype bfloat16]

For each step N, the prompts that RUN_DIR trained at step N (`rollouts/step_N.jsonl`) go to a
fresh hf engine (the run's model folder and `model.dtype` unless `--dtype`, the run's sampling
temperature, budget and samples per prompt unless `--max-tokens`/`--samples`), in one process, no
checkpoint and no resume. The trainer's scoring (`Learner._token_scores`, what `train/logprob_diff_rollout` compares
against) recomputes the same tokens' log-probs on the same weights. One line per prompt:

- its length and its left padding in the engine's batch (the engine left-aligns the batch's
  prompts, the trainer right-pads);
- mean |engine - trainer| per response token, the step's prompts batched in the engine as in
  the run, and the prompt alone in the engine (no padding; same seeds);
- the trainer against itself: the rows in the step's micro-batch against each row alone;
- the worst token's |engine - trainer| (batched).

`--pad-probe STEP:PROMPT` then takes that prompt's first batched sample and runs the model itself
(no engine, one forward over prompt + response) with k = 1..16 pad tokens on the left against none,
for `sdpa` and `eager` attention, bfloat16 and float32: the mean change of the response tokens'
log-probs, i.e. what left padding alone does to the numerics.

For runs whose weights did not move (reward 0 everywhere, as in the "real model paths" runs)
the model folder's weights are the weights the run's engine sampled with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rlharness.backend.learner import Learner
from rlharness.config.schema import AlgoConf, HFEngineConf, ModelConf, TorchBackendConf
from rlharness.engine import build_engine
from rlharness.engine.base import GenerateRequest, SamplingParams
from rlharness.model.load import load_tokenizer
from rlharness.trainer.batch import build_train_batch
from rlharness.core.types import Group, RolloutState, Status


def step_prompts(run_dir: Path, step: int) -> list[str]:
    rows = [json.loads(ln) for ln in (run_dir / "rollouts" / f"step_{step:08d}.jsonl").read_text().splitlines()]
    seen: dict[str, str] = {}
    for r in rows:
        seen.setdefault(r["group_id"], r["prompt"])
    return list(seen.values())


async def sample(engine, prompt_ids: list[list[int]], samples: int, max_tokens: int, temperature: float,
                 seed: int):
    reqs = [GenerateRequest(f"{i}-{j}", p, SamplingParams(temperature=temperature, max_tokens=max_tokens),
                            seed=seed + 100 * i + j)
            for i, p in enumerate(prompt_ids) for j in range(samples)]
    return await asyncio.gather(*(engine.generate(r) for r in reqs))


def groups_of(prompt_ids, results, samples: int) -> list[Group]:
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
        groups.append(Group.from_samples(group))
    return groups


def trainer_logprobs(backend: Learner, groups, pad_id: int, max_tokens: int,
                     temperature: float) -> tuple[torch.Tensor, ...]:
    algo = AlgoConf(name="grpo", micro_batch_size=64)
    batch, _ = build_train_batch(groups, algo, pad_token_id=pad_id, train_step=1, max_response_len=max_tokens,
                                 temperature=temperature)
    mb = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
          "response_mask": batch.response_mask}
    with torch.no_grad():
        lp, _ = backend._token_scores(backend.policy, mb, batch.temperature, "none")
    return lp, batch.rollout_logprobs, batch.response_mask


def padding_probe(path: str, ids: list[int], first: int) -> None:
    """Mean |log-prob with k pad tokens on the left - without| over positions >= `first`, per k."""
    from transformers import AutoModelForCausalLM

    ks = (1, 2, 4, 7, 8, 9, 12, 16)
    print(f"\n| attention, dtype | {' | '.join(f'pad {k}' for k in ks)} |\n|---|{'---|' * len(ks)}")
    target = torch.tensor(ids[1:])[:, None]
    for attn in ("sdpa", "eager"):
        for dtype in (torch.bfloat16, torch.float32):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn).eval()

            def logprobs(pad: int) -> torch.Tensor:
                mask = torch.tensor([[0] * pad + [1] * len(ids)])
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([[0] * pad + ids]), attention_mask=mask,
                                   position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[0, pad:-1]
                return logits.float().log_softmax(-1).gather(-1, target)[first - 1:, 0]

            base = logprobs(0)
            cells = " | ".join(f"{float((logprobs(k) - base).abs().mean()):.1e}" for k in ks)
            print(f"| {attn}, {str(dtype).removeprefix('torch.')} | {cells} |", flush=True)
            del model


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--steps", default="1,2,3")
    p.add_argument("--dtype", default=None, help="default: the run's model.dtype")
    p.add_argument("--samples", type=int, default=None, help="default: the run's sampler.prompt_repeat_k")
    p.add_argument("--max-tokens", type=int, default=None, help="default: the run's agent.sampling.max_tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pad-probe", default=None, metavar="STEP:PROMPT",
                   help="then the left-padding probe on that step's prompt (index in the table)")
    args = p.parse_args(argv)
    conf = OmegaConf.load(args.run_dir / ".hydra" / "config.yaml")
    dtype = args.dtype or conf.model.dtype
    samples = args.samples or conf.sampler.prompt_repeat_k
    max_tokens = args.max_tokens or conf.agent.sampling.max_tokens
    temperature = float(conf.agent.sampling.temperature)
    model_conf = ModelConf(path=conf.model.path, dtype=dtype)
    tok = load_tokenizer(model_conf)
    backend = Learner(TorchBackendConf(), model_conf, AlgoConf(name="grpo"), 10, 0)
    engine = build_engine(HFEngineConf(), model_conf, seed=args.seed)
    print(f"{conf.model.path} {dtype}, {samples} samples x {max_tokens} tokens per prompt at T={temperature}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}")
    print("| step | prompt | prompt tokens (engine left-padding) | engine vs trainer: prompts batched "
          "| prompt alone in the engine | trainer: batch vs row alone | worst token (batched) |")
    print("|---|---|---|---|---|---|---|")
    probe, out = None, []
    try:
        for step in (int(s) for s in args.steps.split(",")):
            prompt_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in step_prompts(args.run_dir, step)]
            seed = args.seed + 1000 * step
            results = asyncio.run(sample(engine, prompt_ids, samples, max_tokens, temperature, seed))
            batched = groups_of(prompt_ids, results, samples)
            lp, engine_lp, mask = trainer_logprobs(backend, batched, tok.pad_token_id, max_tokens, temperature)
            width = max(map(len, prompt_ids))
            for i, p_ids in enumerate(prompt_ids):
                rows = slice(i * samples, (i + 1) * samples)
                diff = (engine_lp[rows] - lp[rows]).abs() * mask[rows]
                alone_lp = torch.zeros_like(lp[rows])  # each row scored by itself, no padding
                for k, s in enumerate(batched[i]):
                    a = trainer_logprobs(backend, [Group.from_samples([s])], tok.pad_token_id, max_tokens,
                                         temperature)[0][0]
                    alone_lp[k, :a.shape[0]] = a
                # The same prompt alone in the engine (no left padding), same seeds.
                solo = groups_of([p_ids], asyncio.run(sample(engine, [p_ids], samples, max_tokens, temperature,
                                                           seed + 100 * i)),
                                 samples)
                s_lp, s_engine, s_mask = trainer_logprobs(backend, solo, tok.pad_token_id, max_tokens, temperature)
                n, s_n = mask[rows].sum(), s_mask.sum()
                row = {"step": step, "prompt": i, "prompt_tokens": len(p_ids), "left_pad": width - len(p_ids),
                       "batched": float(diff.sum() / n), "alone": float(((s_engine - s_lp).abs() * s_mask).sum() / s_n),
                       "trainer_self": float(((lp[rows] - alone_lp).abs() * mask[rows]).sum() / n),
                       "worst": float(diff.max())}
                out.append(row)
                print(f"| {step} | {i} | {row['prompt_tokens']} ({row['left_pad']}) | {row['batched']:.2e} | "
                      f"{row['alone']:.2e} | {row['trainer_self']:.2e} | {row['worst']:.2e} |", flush=True)
                if args.pad_probe == f"{step}:{i}":
                    probe = (p_ids + batched[i].samples[0].response_ids, len(p_ids))
    finally:
        asyncio.run(engine.close())
    if probe is not None:
        del backend, engine
        padding_probe(conf.model.path, *probe)
    return out


if __name__ == "__main__":
    main()
