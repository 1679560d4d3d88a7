"""engine=vllm: weight-sync seconds against model size (both routes), and vLLM against engine=hf.

Needs vLLM (run with .venv-vllm/bin/python; `bash scripts/setup_vllm.sh`). For each model
size (random-weight Llama models built in code, fp32), one vLLM engine is started and a
new weight version is loaded `--repeats` times through each route:

- `collective`: this process (holding the weights, as the colocated trainer does) and
  vLLM's worker form a process group (gloo here, NCCL between GPUs) and the weights are
  broadcast in buckets (`engine.weight_sync=collective`);
- `disk`: safetensors written to a temporary folder, read back by vLLM's
  `reload_weights` (`engine.weight_sync=disk`).

Both are timed end to end (`VLLMEngine.load_weights`, prefix-cache reset included); the
first collective load also forms the group and is reported apart. The engine comparison
generates the same sampled requests (temperature 1, EOS ignored so both produce the
same number of tokens) on the tiny model with engine=vllm and engine=hf.

    .venv-vllm/bin/python benchmarks/vllm_weight_sync.py            # full (minutes on 2 cores)
    .venv-vllm/bin/python benchmarks/vllm_weight_sync.py --quick    # one small size: checks it runs

Prints markdown tables and writes CSV to benchmarks/results/ (or --out-dir).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from rlharness.config.schema import HFEngineConf, ModelConf, VLLMEngineConf
from rlharness.engine import build_engine
from rlharness.engine.base import GenerateRequest, SamplingParams
from rlharness.model.tiny import save_tiny_model

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Size:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int


SIZES = [
    Size("2L h128", 2, 128, 4, 512),
    Size("4L h512", 4, 512, 8, 2048),
    Size("8L h1024", 8, 1024, 16, 4096),  # ~0.5 GB fp32: the most a shared 24 GB box holds comfortably
]


@dataclass(slots=True)
class NoEOS(SamplingParams):
    """vLLM's ignore_eos (read by the vllm engine)."""

    ignore_eos: bool = True


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one small size, one repeat, few requests")
    p.add_argument("--repeats", type=int, default=3, help="loads per route and size (median reported)")
    p.add_argument("--requests", type=int, default=64, help="requests in the engine comparison")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens per request in the engine comparison")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats={args.repeats}: must be >= 1")
    if args.requests < 1:
        p.error(f"--requests={args.requests}: must be >= 1")
    if not 1 <= args.max_tokens <= 100:
        p.error(f"--max-tokens={args.max_tokens}: must be in 1..100 (the models hold 128 positions)")
    return args


def _perturbed(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in state.items()}


async def _sync_times(model_dir: Path, repeats: int) -> dict[str, float]:
    from safetensors.torch import load_file

    state = load_file(str(model_dir / "model.safetensors"))
    numel = sum(v.numel() for v in state.values())
    engine = build_engine(VLLMEngineConf(sync_timeout_s=600.0), ModelConf(path=str(model_dir)), seed=0)
    version = 0
    try:
        times: dict[str, list[float]] = {"collective": [], "disk": []}
        first = 0.0
        for route in ("collective", "disk"):
            engine.conf = dataclasses.replace(engine.conf, weight_sync=route)
            for i in range(repeats + (1 if route == "collective" else 0)):
                version += 1
                new = _perturbed(state, version)
                t0 = time.perf_counter()
                await engine.load_weights(new, version)
                dt = time.perf_counter() - t0
                if route == "collective" and i == 0:
                    first = dt  # forms the group too
                else:
                    times[route].append(dt)
        return {"params_m": numel / 1e6, "mb_fp32": numel * 4 / 2**20, "first_collective_s": first,
                "collective_s": statistics.median(times["collective"]), "disk_s": statistics.median(times["disk"])}
    finally:
        await engine.close()


async def _throughput(engine, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    reqs = [GenerateRequest(f"b{i}", p, NoEOS(temperature=1.0, max_tokens=max_tokens), seed=i)
            for i, p in enumerate(prompts)]
    await engine.generate(reqs[0])  # warm-up (first request compiles/allocates)
    t0 = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(r) for r in reqs))
    dt = time.perf_counter() - t0
    return dt, sum(len(r.token_ids) for r in results)


async def _engines(model_dir: Path, n: int, max_tokens: int) -> list[dict]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [f"{i % 1000:03d}+{(i * 37) % 1000:03d}=" for i in range(n)]
    prompts = [tok(t)["input_ids"] for t in texts]
    rows = []
    # EOS off on both sides (vLLM: ignore_eos on the request; hf: an empty EOS set), so both make n x max_tokens.
    for name, conf, kw in (("vllm", VLLMEngineConf(), {}), ("hf", HFEngineConf(), {"eos_token_ids": []})):
        t0 = time.perf_counter()
        engine = build_engine(conf, ModelConf(path=str(model_dir)), seed=0, **kw)
        start_s = time.perf_counter() - t0
        try:
            dt, tokens = await _throughput(engine, prompts, max_tokens)
        finally:
            await engine.close()
        rows.append({"engine": name, "start_s": start_s, "requests": n, "tokens": tokens, "wall_s": dt,
                     "tokens_per_s": tokens / dt})
    return rows


def _table(rows: list[dict], cols: list[str]) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return "\n".join(out)


def main(argv=None) -> dict:
    args = _parse(argv)
    sizes = SIZES[:1] if args.quick else SIZES
    repeats = 1 if args.quick else args.repeats
    n, max_tokens = (8, 16) if args.quick else (args.requests, args.max_tokens)
    torch.set_num_threads(1)  # this process only sends; vLLM's worker has its own threads
    sync_rows = []
    with tempfile.TemporaryDirectory(prefix="rlh-vllm-bench-") as tmp:
        for size in sizes:
            model_dir = save_tiny_model(Path(tmp) / size.name.replace(" ", "_"), layers=size.layers,
                                        hidden=size.hidden, heads=size.heads, ffn=size.ffn)
            sync_rows.append({"model": size.name, **asyncio.run(_sync_times(model_dir, repeats))})
            print(_table(sync_rows[-1:], list(sync_rows[-1])), flush=True)
        engine_rows = asyncio.run(_engines(Path(tmp) / sizes[0].name.replace(" ", "_"), n, max_tokens))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report = (f"# engine=vllm benchmark ({stamp}, {platform.node()}, {torch.get_num_threads()} driver thread(s))\n\n"
              f"## Weight sync (median of {repeats})\n\n{_table(sync_rows, list(sync_rows[0]))}\n\n"
              f"## vLLM vs hf engine ({sizes[0].name}, {n} requests x {max_tokens} tokens, T=1)\n\n"
              f"{_table(engine_rows, list(engine_rows[0]))}\n")
    print(report)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    for name, rows in (("sync", sync_rows), ("engines", engine_rows)):
        with open(args.out_dir / f"vllm_{name}{suffix}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    (args.out_dir / f"vllm_weight_sync{suffix}.md").write_text(report)
    return {"sync": sync_rows, "engines": engine_rows}


if __name__ == "__main__":
    main()
