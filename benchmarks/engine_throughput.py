"""engine=hf (continuous batching) against `model.generate` with static batches.

Same prompts, same per-request response lengths on both sides: lengths are drawn from
a lognormal with CV ~1 (the long tail RL rollouts have) and enforced through each
request's max_tokens, with EOS disabled on both sides so nobody stops early. Static
batches for `generate` are cut from the same request order with the engine's
max_batch_size; a static batch runs until its longest member is done (that waste is
what continuous batching removes; `static_useful_frac` says how much of their work
counts). A no-tail row (every response equally long) isolates the per-step
efficiency of the two loops from the scheduling gain. Both sample at temperature 1 from random-weight
Llama models built in code (the tiny char-level one and a larger one).

    python benchmarks/engine_throughput.py            # full run (a few minutes on 2 cores)
    python benchmarks/engine_throughput.py --quick    # seconds: checks it runs and reports

Prints a markdown table and writes CSV to benchmarks/results/ (or --out-dir).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import logging
import math
import platform
import random
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from rlharness.config.schema import HFEngineConf
from rlharness.engine.base import GenerateRequest, SamplingParams
from rlharness.engine.hf import HFEngine
from rlharness.model.tiny import build_char_tokenizer, build_tiny_llama

log = logging.getLogger(__name__)
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Setup:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    num_requests: int
    max_batch_size: int
    mean_len: float
    max_len: int
    cv: float = 1.0  # 0: every response equally long (no tail: isolates per-step efficiency)


FULL = [
    Setup("tiny (2L, h128)", layers=2, hidden=128, heads=4, ffn=512, num_requests=512,
          max_batch_size=64, mean_len=64, max_len=512),
    Setup("tiny, no tail (cv=0)", layers=2, hidden=128, heads=4, ffn=512, num_requests=512,
          max_batch_size=64, mean_len=64, max_len=512, cv=0.0),
    Setup("larger (8L, h512)", layers=8, hidden=512, heads=8, ffn=2048, num_requests=128,
          max_batch_size=32, mean_len=64, max_len=512),
]
QUICK = [
    Setup("tiny (2L, h128)", layers=2, hidden=128, heads=4, ffn=512, num_requests=24,
          max_batch_size=8, mean_len=12, max_len=48),
]


def lognormal_lengths(n: int, mean: float, cv: float, max_len: int, rng: random.Random) -> list[int]:
    sigma2 = math.log(1.0 + cv * cv)
    mu = math.log(mean) - sigma2 / 2
    return [max(1, min(max_len, round(rng.lognormvariate(mu, math.sqrt(sigma2))))) for _ in range(n)]


def make_prompts(n: int, tok, rng: random.Random) -> list[list[int]]:
    prompts = []
    for _ in range(n):
        text = f"{rng.randint(0, 10 ** rng.randint(1, 6))}+{rng.randint(0, 10 ** rng.randint(1, 6))}="
        prompts.append(tok(text)["input_ids"])
    return prompts


def run_engine(model, prompts, lengths, max_batch_size: int, seed: int) -> float:
    async def go():
        engine = HFEngine.from_model(model, None, HFEngineConf(max_batch_size=max_batch_size),
                                     seed=seed, eos_token_ids=[])
        try:
            t0 = time.perf_counter()
            results = await asyncio.gather(*(
                engine.generate(GenerateRequest(str(i), p, SamplingParams(temperature=1.0, max_tokens=n)))
                for i, (p, n) in enumerate(zip(prompts, lengths))))
            elapsed = time.perf_counter() - t0
        finally:
            await engine.close()
        got = [len(r.token_ids) for r in results]
        if got != lengths:
            raise RuntimeError("engine returned other lengths than requested")
        return elapsed

    return asyncio.run(go())


def run_generate(model, prompts, lengths, batch_size: int, pad_id: int) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            batch, want = prompts[start:start + batch_size], lengths[start:start + batch_size]
            width = max(map(len, batch))
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(batch):
                ids[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
            out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=max(want), min_new_tokens=max(want),
                                 eos_token_id=None, pad_token_id=pad_id)
            if out.shape[1] - width != max(want):
                raise RuntimeError("generate stopped before max_new_tokens")
    return time.perf_counter() - t0


def bench(setup: Setup, seed: int, repeats: int) -> dict:
    tok = build_char_tokenizer()
    model = build_tiny_llama(len(tok), layers=setup.layers, hidden=setup.hidden, heads=setup.heads,
                             ffn=setup.ffn, max_positions=setup.max_len + 64, seed=seed).eval()
    model.generation_config.eos_token_id = None
    rng = random.Random(seed)
    prompts = make_prompts(setup.num_requests, tok, rng)
    lengths = lognormal_lengths(setup.num_requests, setup.mean_len, setup.cv, setup.max_len, rng)
    tokens = sum(lengths)
    # Tokens the static batches decode, counting rows kept running for their batch's longest.
    static_tokens = sum(len(lengths[i:i + setup.max_batch_size]) * max(lengths[i:i + setup.max_batch_size])
                        for i in range(0, len(lengths), setup.max_batch_size))
    # Warm up both paths (allocator, first-call costs) on a small slice.
    run_engine(model, prompts[:4], [4] * 4, setup.max_batch_size, seed)
    run_generate(model, prompts[:4], [4] * 4, setup.max_batch_size, tok.pad_token_id)
    engine_s, generate_s = [], []
    for _ in range(repeats):  # interleaved, so load on the machine hits both alike
        torch.manual_seed(seed)
        generate_s.append(run_generate(model, prompts, lengths, setup.max_batch_size, tok.pad_token_id))
        engine_s.append(run_engine(model, prompts, lengths, setup.max_batch_size, seed))
    e, g = min(engine_s), min(generate_s)
    return {
        "config": setup.name, "requests": setup.num_requests, "max_batch_size": setup.max_batch_size,
        "tokens": tokens, "static_useful_frac": round(tokens / static_tokens, 3), "mean_len": round(tokens / setup.num_requests, 1), "max_len": max(lengths),
        "generate_s": round(g, 3), "engine_s": round(e, 3),
        "generate_tok_s": round(tokens / g, 1), "engine_tok_s": round(tokens / e, 1),
        "speedup": round(g / e, 2), "repeats": repeats,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a seconds-long run (for tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=None, help="runs per side; the best counts")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (0 = torch's default); 1 is steadier on a busy machine")
    parser.add_argument("--only", default="", help="run only configs whose name contains this")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats={args.repeats} must be >= 1")
    if args.threads < 0:
        parser.error(f"--threads={args.threads} must be >= 0 (0 = torch's default)")
    if not [s for s in (QUICK if args.quick else FULL) if args.only in s.name]:
        parser.error(f"--only={args.only!r} matches no config of "
                     f"{[s.name for s in (QUICK if args.quick else FULL)]}")
    if args.threads:
        torch.set_num_threads(args.threads)
    setups = [s for s in (QUICK if args.quick else FULL) if args.only in s.name]
    repeats = args.repeats or (1 if args.quick else 2)
    rows = [bench(s, args.seed, repeats) for s in setups]

    cols = ["config", "requests", "max_batch_size", "tokens", "static_useful_frac", "mean_len", "max_len",
            "generate_s", "engine_s", "generate_tok_s", "engine_tok_s", "speedup"]
    print(f"engine=hf vs model.generate (static batches), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.machine()}, "
          f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, best of {repeats}")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / ("engine_throughput_quick.csv" if args.quick else "engine_throughput.csv")
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
