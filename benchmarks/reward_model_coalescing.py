"""Reward-model scoring throughput: each group its own call vs groups coalesced (issue 26).

    .venv/bin/python benchmarks/reward_model_coalescing.py [--model tiny|smollm2] [--groups 8] \
        [--group-size 4] [--batch-size 16] [--rounds 6]

One `RewardModelJudger` and its one scoring process serve both, in alternating rounds (same
process, same model, same texts; the load of the box shared alike). A round is `--groups`
groups of `--group-size` rows arriving together (asyncio.gather):
- `per group`: each group sent as its own call to the scorer (`_ProcessScorer.logits`), as the
  judger did before `_Coalescing`: the calls wait on each other, one forward pass each;
- `coalesced`: `judge_group` for every group, the real path: waiting groups share calls of up
  to `--batch-size` rows.
Checks that both give the same scores (to float rounding), then prints a Markdown table of rows/s
(median over rounds) and calls and forward passes per round (the scorer process's own count).

Models: `tiny` = a random 1-layer Llama classifier (hidden 32) with the tiny arithmetic
model's tokenizer, texts "042+917=959"-like (~10 tokens); `smollm2` = SmolLM2-135M-Instruct
(assets/, `scripts/fetch_smollm2.sh`) with a fresh one-label head, saved in a temporary folder,
texts a chat-formatted question and a ~30-token answer (~70 tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tiny_classifier(out: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(ROOT / "assets/tiny-arith")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, num_labels=1,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    LlamaForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def smollm2_classifier(out: Path) -> Path:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    src = ROOT / "assets/smollm2-135m-instruct"
    torch.manual_seed(0)  # the fresh head
    model = AutoModelForSequenceClassification.from_pretrained(src, num_labels=1, dtype=torch.float32)
    model.save_pretrained(out)  # a copy: never write into assets/ (hard links shared between checkouts)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def texts_for(model: str, n: int) -> list[tuple[str, str]]:
    import random

    rng = random.Random(0)
    pairs = []
    for _ in range(n):
        a, b = rng.randrange(1000), rng.randrange(1000)
        answer = str(a + b + rng.choice([0, 0, 1, 10]))
        if model == "tiny":
            pairs.append((f"{a:03d}+{b:03d}=", answer))
        else:
            prompt = (f"<|im_start|>user\nWhat is {a} + {b}? Think step by step, then give only the final "
                      f"number.<|im_end|>\n<|im_start|>assistant\n")
            steps = " ".join(rng.choice(["First", "add", "the", "units,", "then", "tens,", "carry", "one."])
                             for _ in range(rng.randrange(8, 30)))
            pairs.append((prompt, f"{steps} The answer is {answer}.<|im_end|>"))
    return pairs


def states(pairs: list[tuple[str, str]], gid: str):
    """A group of one sample per (prompt, response) pair: the reward model scores each member's own."""
    from rlharness.core.types import Group, RolloutState

    return Group(gid, "arithmetic", 0, 0, "", {}, [
        RolloutState(uid=f"{gid}-{i}", group_id=gid, task="arithmetic", prompt_index=0, epoch=0, prompt_text=p,
                     prompt_ids=[], label={}, response_text=r, sample_seed=i) for i, (p, r) in enumerate(pairs)])


async def bench(args, folder: Path) -> None:
    from rlharness.config.schema import RewardModelJudgerConf
    from rlharness.judger import build_judger
    from rlharness.judger.reward_model import _forward_passes

    judger = build_judger(RewardModelJudgerConf(path=str(folder), batch_size=args.batch_size))
    coalescing = await judger._scorer()
    process = coalescing.scorer
    n = args.groups * args.group_size
    groups = [texts_for(args.model, n)[g * args.group_size:(g + 1) * args.group_size] for g in range(args.groups)]

    def passes() -> int:
        return process._pool.schedule(_forward_passes).result(timeout=60)

    async def per_group() -> list[float]:
        out = await asyncio.gather(*(process.logits([p + r for p, r in g], 600.0) for g in groups))
        return [judger.normalise(x) for logits in out for x in logits]

    async def coalesced() -> list[float]:
        out = await asyncio.gather(*(judger.judge_group(states(g, str(i)), 600.0) for i, g in enumerate(groups)))
        return [s.reward["score"] for g in out for s in g]

    modes = {"per group": per_group, "coalesced": coalesced}
    rates: dict[str, list[float]] = {m: [] for m in modes}
    counts: dict[str, tuple[float, int]] = {}
    scores: dict[str, list[float]] = {}
    try:
        for m, fn in modes.items():  # warm-up round each (first-call costs), scores compared
            scores[m] = await fn()
        worst = max(abs(a - b) / max(1e-6, abs(b)) for a, b in zip(scores["coalesced"], scores["per group"]))
        for _ in range(args.rounds):
            for m, fn in modes.items():
                calls, before = judger.stats()["scoring_calls"], passes()
                start = time.perf_counter()
                await fn()
                rates[m].append(n / (time.perf_counter() - start))
                counts[m] = (judger.stats()["scoring_calls"] - calls if m == "coalesced" else len(groups),
                             passes() - before)
    finally:
        await judger.close()
    print(f"model {args.model}, {args.groups} groups x {args.group_size} rows arriving together, "
          f"judger.batch_size={args.batch_size}, {args.rounds} rounds each, alternating; "
          f"largest relative score difference coalesced vs per group: {worst:.1e}\n")
    print("| mode | rows/s (median) | rows/s (min-max) | calls per round | forward passes per round |")
    print("| --- | --- | --- | --- | --- |")
    for m in modes:
        r = rates[m]
        print(f"| {m} | {statistics.median(r):.1f} | {min(r):.1f}-{max(r):.1f} | {counts[m][0]:g} | {counts[m][1]} |")
    ratio = statistics.median(rates["coalesced"]) / statistics.median(rates["per group"])
    print(f"\ncoalesced / per group (medians): {ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make = tiny_classifier if args.model == "tiny" else smollm2_classifier
        asyncio.run(bench(args, make(Path(tmp) / "rm")))


if __name__ == "__main__":
    main()
