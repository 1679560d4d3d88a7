"""LoRA against full fine-tuning: trainer memory, optimizer state, checkpoints, weight syncs, engine speed.

For each model (`--models`, default the embedded chat model and SmolLM2-135M-Instruct):

- **trainer**: one process per setting (so peak memory is that setting's alone): full
  fine-tuning without and with a KL term (the frozen reference is a second copy of the
  model), LoRA with a KL term (the reference is the same model with its adapters off).
  Peak resident memory of the process (`ru_maxrss`, model load + two training steps +
  a checkpoint), optimizer-state bytes, checkpoint bytes, trainable/total parameters,
  seconds per training step.
- **sync**: bytes and seconds per weight sync to an `engine=hf` engine (`backend.get_weights()`
  then `engine.load_weights`): full weights, LoRA `merged` (after the first sync: the adapted
  matrices only), LoRA `adapter` (A and B only; the engine applies them in its forward).
- **engine**: `engine=hf` tokens/s serving the adapter in its forward against the merged
  weights (same requests, EOS ignored so both produce the same tokens); with `--vllm` (run
  from .venv-vllm) the same for `engine=vllm`: a LoRARequest per request against merged weights.

    .venv/bin/python benchmarks/lora.py                      # both models (minutes on 2 cores)
    .venv/bin/python benchmarks/lora.py --models assets/tiny-chat --quick
    .venv/bin/python benchmarks/lora.py --models assets/smollm2-135m-instruct --quick --sections trainer
    .venv-vllm/bin/python benchmarks/lora.py --vllm --models assets/tiny-chat   # engine=vllm only

Prints markdown tables; CSV to benchmarks/results/lora_*.csv.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlharness.backend.learner import Learner  # noqa: E402
from rlharness.config.schema import AlgoConf, HFEngineConf, LoraConf, ModelConf, TorchBackendConf  # noqa: E402
from rlharness.engine.base import SamplingParams  # noqa: E402
from rlharness.trainer.batch import build_train_batch  # noqa: E402
from rlharness.core.types import Group, RolloutState, Status  # noqa: E402

SETTINGS = {  # name -> (lora rank, kl_coef)
    "full": (0, 0.0),
    "full + KL (reference copy)": (0, 0.05),
    "LoRA r8 + KL (adapters off)": (8, 0.05),
}


def batch(rows: int, prompt_len: int, response_len: int, vocab: int, algo: AlgoConf):
    g = torch.Generator().manual_seed(0)
    groups = []
    for gi in range(rows // 4):
        prompt = torch.randint(10, vocab, (prompt_len,), generator=g).tolist()
        groups.append(Group.from_samples([RolloutState(
            uid=f"{gi}-{i}", group_id=str(gi), task="t", prompt_index=gi, epoch=0, prompt_text="",
            prompt_ids=prompt, response_ids=torch.randint(10, vocab, (response_len,), generator=g).tolist(),
            response_logprobs=[-3.0] * response_len, response_model_steps=[0] * response_len,
            reward={"score": float(i % 2)}, status=Status.COMPLETED, finish_reason="stop") for i in range(4)]))
    return build_train_batch(groups, algo, pad_token_id=0, train_step=1, max_response_len=response_len,
                             temperature=1.0)[0]


def model_conf(path: str, rank: int, sync: str = "merged") -> ModelConf:
    return ModelConf(path=path, lora=LoraConf(rank=rank, alpha=2.0 * max(rank, 1), sync=sync))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def trainer_child(path: str, setting: str, rows: int, response_len: int) -> dict:
    """One setting in this process: its peak memory is the setting's own."""
    rank, kl = SETTINGS[setting]
    algo = AlgoConf(name="grpo", lr=1e-4, kl_coef=kl, micro_batch_size=rows)
    b = Learner(TorchBackendConf(), model_conf(path, rank), algo, total_steps=10, seed=0)
    data = batch(rows, 24, response_len, b.tokenizer.vocab_size, algo)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        b.train_step_blocking(data)
        times.append(time.perf_counter() - t0)
    opt_bytes = sum(t.numel() * t.element_size() for s in b.optimizer.state.values() for t in s.values()
                    if isinstance(t, torch.Tensor))
    with tempfile.TemporaryDirectory() as d:
        b.save_blocking(d)
        ckpt = dir_bytes(Path(d))
    params = list(b.model.parameters())
    return {"model": path, "setting": setting, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "optimizer_state_mb": opt_bytes / 2**20, "checkpoint_mb": ckpt / 2**20,
            "trainable": sum(p.numel() for p in params if p.requires_grad), "total": sum(p.numel() for p in params),
            "step_s": times[-1]}


def trainer_rows(path: str, rows: int, response_len: int) -> list[dict]:
    out = []
    for setting in SETTINGS:
        proc = subprocess.run([sys.executable, __file__, "--child", path, setting, str(rows), str(response_len)],
                              capture_output=True, text=True, check=True)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


async def sync_rows(path: str, repeats: int) -> list[dict]:
    from rlharness.engine import build_engine

    out = []
    for name, rank, sync in (("full weights", 0, "merged"), ("LoRA merged", 8, "merged"), ("LoRA adapter", 8, "adapter")):
        conf = model_conf(path, rank, sync)
        algo = AlgoConf(name="grpo", lr=1e-3, micro_batch_size=8)
        b = Learner(TorchBackendConf(), conf, algo, total_steps=10, seed=0)
        engine = build_engine(HFEngineConf(), conf, seed=0)
        await engine.load_weights(await b.get_weights(), 0)  # the first sync (LoRA merged: everything, once)
        data = batch(8, 16, 16, b.tokenizer.vocab_size, algo)
        sizes, secs = [], []
        for v in range(1, repeats + 1):
            b.train_step_blocking(data)
            t0 = time.perf_counter()
            weights = await b.get_weights()
            await engine.load_weights(weights, v)
            secs.append(time.perf_counter() - t0)
            sizes.append(sum(t.numel() * t.element_size() for t in weights.values()))
        await engine.close()
        out.append({"model": path, "sync": name, "mb_per_sync": statistics.median(sizes) / 2**20,
                    "s_per_sync": statistics.median(secs), "tensors": len(weights)})
    return out


async def tokens_per_s(engine, sampling: SamplingParams, requests: int, repeats: int) -> float:
    """Median generated tokens per second over `repeats` rounds of the same `requests` (after a warm-up); closes it."""
    from rlharness.engine import GenerateRequest

    reqs = [GenerateRequest(str(i), [10 + i % 50, 20, 30, 40], sampling, seed=i) for i in range(requests)]
    await engine.generate_many(reqs[:2])
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = await engine.generate_many(reqs)
        rates.append(sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0))
    await engine.close()
    return statistics.median(rates)


async def engine_rows(path: str, requests: int, tokens: int, repeats: int) -> list[dict]:
    from rlharness.engine.hf import HFEngine
    from rlharness.model.lora import wrap_for_engine
    from rlharness.model.load import load_model

    out = []
    for name, sync in (("merged weights", "merged"), ("adapter in the forward", "adapter")):
        conf = model_conf(path, 8, sync)
        model = load_model(conf)
        if sync == "adapter":
            model = wrap_for_engine(model, conf)
        engine = HFEngine(HFEngineConf(max_batch_size=requests), None, 0, model=model, eos_token_ids=[])
        rate = await tokens_per_s(engine, SamplingParams(max_tokens=tokens), requests, repeats)
        out.append({"model": path, "engine=hf serving": name, "tokens_per_s": rate})
    return out


@dataclasses.dataclass(slots=True)
class NoEOS(SamplingParams):
    """vLLM's `ignore_eos`: every request produces max_tokens tokens."""

    ignore_eos: bool = True


async def vllm_rows(path: str, requests: int, tokens: int, repeats: int) -> list[dict]:
    """engine=vllm: the trained adapter served by vLLM (LoRARequest) against the same adapter merged."""
    from rlharness.config.schema import VLLMEngineConf
    from rlharness.engine import build_engine

    algo = AlgoConf(name="grpo", lr=1e-2, micro_batch_size=8)
    out = []
    for name, sync in (("merged weights", "merged"), ("adapter (LoRARequest)", "adapter")):
        conf = model_conf(path, 8, sync)
        b = Learner(TorchBackendConf(), conf, algo, total_steps=10, seed=0)
        b.train_step_blocking(batch(8, 16, 16, b.tokenizer.vocab_size, algo))  # a non-zero adapter
        engine = build_engine(VLLMEngineConf(weight_sync="disk"), conf, seed=0)
        await engine.load_weights(await b.get_weights(), 1)
        rate = await tokens_per_s(engine, NoEOS(max_tokens=tokens), requests, repeats)
        out.append({"model": path, "engine=vllm serving": name, "tokens_per_s": rate})
    return out


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    fmt = lambda v: f"{v:,.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)  # noqa: E731
    return "\n".join(["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
                     + ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows])


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        path, setting, rows, response_len = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        torch.set_num_threads(2)
        print(json.dumps(trainer_child(path, setting, rows, response_len)))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["assets/tiny-chat", "assets/smollm2-135m-instruct"])
    p.add_argument("--quick", action="store_true", help="fewer repeats and tokens: checks that it runs")
    p.add_argument("--sections", nargs="+", default=["trainer", "sync", "engine"], choices=["trainer", "sync", "engine"])
    p.add_argument("--vllm", action="store_true", help="only engine=vllm adapter vs merged (in .venv-vllm)")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args()
    repeats, tokens = (2, 8) if args.quick else (5, 32)
    print(f"# LoRA benchmark, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"torch threads {torch.get_num_threads()}, load average {open('/proc/loadavg').read().split()[:3]}")
    results: dict[str, list[dict]] = {"trainer": [], "sync": [], "engine": []}
    if args.vllm:
        results = {"vllm_engine": []}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def record(name: str, rows: list[dict]) -> None:
        """Print and save as soon as measured (a long run keeps what it finished)."""
        results[name] += rows
        print(f"\n## {name}\n\n{table(rows)}", flush=True)
        with open(out / f"lora_{name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(results[name][0]))
            w.writeheader()
            w.writerows(results[name])

    for path in args.models:
        if args.vllm:
            record("vllm_engine", asyncio.run(vllm_rows(path, requests=16, tokens=tokens, repeats=repeats)))
            continue
        if "trainer" in args.sections:
            record("trainer", trainer_rows(path, rows=4 if args.quick else 8, response_len=tokens))
        if "sync" in args.sections:
            record("sync", asyncio.run(sync_rows(path, repeats)))
        if "engine" in args.sections:
            record("engine", asyncio.run(engine_rows(path, requests=16, tokens=tokens, repeats=repeats)))
    print(f"\nload average at the end {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
