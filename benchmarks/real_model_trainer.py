"""The trainer and the hf engine on SmolLM2-135M-Instruct (49,152-token vocabulary): memory and speed.

1. Trainer peak memory and speed per micro-batch, each configuration in a fresh process
   (peak RSS, `ru_maxrss`, over the RSS just before the micro-batch; it includes the
   0.54 GB of gradient buffers the first backward allocates, the same in every row):
   - `full-logits`: the scoring the trainer used before issue 20 (the model's logits for
     every position, `token_logprobs` + `token_entropy` over the whole vocabulary);
   - `chunked`: response positions only, `backend.logprob_chunk_tokens` at a time;
   - `chunked+gc`: the same with `backend.gradient_checkpointing=true`.
   Forward + backward of one micro-batch of `--rows` rows (a 48-token prompt and a response
   drawn lognormal, CV 1), timed; tokens/s counts every non-padding token.
2. engine=hf against `model.generate` on the same prompts and per-request lengths (EOS off),
   `benchmarks/engine_throughput.py`'s two loops; with `--parts vllm` (run it with
   `.venv-vllm/bin/python`) also vLLM's CPU build (`engine=vllm`) on the same requests.
3. One weight sync into the hf engine (`load_weights`, the whole state dict) against a plain
   copy of the same tensors and one memcpy of the same number of bytes.

    python benchmarks/real_model_trainer.py            # a few minutes on 2 cores
    python benchmarks/real_model_trainer.py --quick    # smaller batch and fewer tokens

    PYTHONPATH=. .venv-vllm/bin/python benchmarks/real_model_trainer.py --parts engine,vllm   # the three side by side
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_throughput as et  # noqa: E402

from rlharness.algo.losses import loss_denominator, token_entropy, token_logprobs  # noqa: E402
from rlharness.backend.learner import Learner, Sums  # noqa: E402
from rlharness.config.schema import AlgoConf, HFEngineConf, ModelConf, TorchBackendConf  # noqa: E402
from rlharness.engine.hf import HFEngine  # noqa: E402
from rlharness.model.load import load_model, load_tokenizer  # noqa: E402
from rlharness.trainer.batch import build_train_batch  # noqa: E402
from rlharness.core.types import Group, RolloutState, Status  # noqa: E402

MODEL = "assets/smollm2-135m-instruct"
CONFIGS = {"full-logits": {}, "chunked": {}, "chunked+gc": {"gradient_checkpointing": True}}


class FullLogitsScores(Learner):
    """The trainer's scoring before issue 20 (kept here only as the baseline)."""

    def _token_scores(self, runner, mb, temperature, entropy):
        logits = runner.logits(mb["input_ids"], mb["attention_mask"])
        lp = token_logprobs(logits, mb["input_ids"], temperature)
        with torch.set_grad_enabled(entropy == "grad"):
            ent = token_entropy(logits if entropy == "grad" else logits.detach(), temperature)
        return lp, ent


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def synthetic_batch(rows: int, mean_len: float, max_len: int, vocab: int, seed: int):
    rng = random.Random(seed)
    lengths = et.lognormal_lengths(rows, mean_len, 1.0, max_len, rng)
    groups = []
    for g in range(rows // 4):
        prompt = [rng.randrange(10, vocab) for _ in range(48)]
        group = []
        for i in range(4):
            n = lengths[4 * g + i]
            group.append(RolloutState(
                uid=f"{g}-{i}", group_id=str(g), task="t", prompt_index=g, epoch=0, prompt_text="",
                prompt_ids=prompt, response_ids=[rng.randrange(10, vocab) for _ in range(n)],
                response_logprobs=[-rng.uniform(1, 3) for _ in range(n)], response_model_steps=[0] * n,
                reward={"score": float(i % 2)}, status=Status.COMPLETED, finish_reason="stop"))
        groups.append(Group.from_samples(group))
    algo = AlgoConf(name="grpo", micro_batch_size=rows)
    return algo, build_train_batch(groups, algo, pad_token_id=0, train_step=1, max_response_len=max_len,
                                   temperature=1.0)[0]


def child_micro_batch(config: str, rows: int, mean_len: float, max_len: int, chunk: int) -> dict:
    """One configuration, in its own process: peak RSS and time of one micro-batch's forward + backward."""
    torch.manual_seed(0)
    algo, batch = synthetic_batch(rows, mean_len, max_len, 49152, seed=0)
    cls = FullLogitsScores if config == "full-logits" else Learner
    b = cls(TorchBackendConf(logprob_chunk_tokens=chunk, **CONFIGS[config]), ModelConf(path=MODEL), algo, 10, 0)
    tensors = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
               "response_mask": batch.response_mask, "advantages": batch.advantages,
               "rollout_logprobs": batch.rollout_logprobs, "model_steps": batch.model_steps}
    den = loss_denominator(batch.response_mask, algo.loss_agg)
    mb = {**b._rows(tensors, torch.arange(rows)), "rows": torch.arange(rows)}
    b._row_gap = torch.zeros(rows, dtype=torch.float64)  # per-row gaps, as train_step sets them up

    def once() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        b._micro_step(mb, 1.0, den, max_len, Sums(), first_epoch=True)
        return time.perf_counter() - t0, time.process_time() - c0

    gc.collect()
    before = rss_bytes()
    seconds, cpu = once()  # the first micro-batch (it allocates the gradient buffers, in every configuration alike)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tokens = int(batch.attention_mask.sum())
    return {"config": config, "rows": rows, "width": int(batch.input_ids.shape[1]), "tokens": tokens,
            "response_tokens": int(batch.response_mask.sum()), "peak_over_start_gb": (peak - before) / 2**30,
            "step_s": seconds, "train_tok_s": tokens / seconds, "cpu_s": cpu, "train_tok_cpu_s": tokens / cpu}


def run_children(args) -> list[dict]:
    out = []
    for config in CONFIGS:
        cmd = [sys.executable, __file__, "--child", config, "--rows", str(args.rows), "--mean-len",
               str(args.mean_len), "--max-len", str(args.max_len), "--chunk", str(args.chunk)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{config}: child failed:\n{done.stderr[-2000:]}")
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def cpu_s() -> float:
    """CPU seconds used so far by this process and its live children (vLLM's engine core and worker):
    on a shared box the work each side did, whatever share of the cores it got."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for proc in (me, *me.children(recursive=True)):
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def run_vllm(prompts: list[list[int]], lengths: list[int]) -> tuple[float, float, float]:
    """vLLM's CPU build (engine=vllm) on the same requests, EOS off: (start s, generation s, generation CPU s)."""
    from rlharness.config.schema import VLLMEngineConf
    from rlharness.engine import build_engine
    from rlharness.engine.base import GenerateRequest
    from vllm_weight_sync import NoEOS

    async def go():
        t0 = time.perf_counter()
        engine = build_engine(VLLMEngineConf(), ModelConf(path=MODEL), seed=0)
        start_s = time.perf_counter() - t0
        try:
            await engine.generate(GenerateRequest("warm", prompts[0], NoEOS(temperature=1.0, max_tokens=2)))
            t0, c0 = time.perf_counter(), cpu_s()
            results = await asyncio.gather(*(
                engine.generate(GenerateRequest(str(i), p, NoEOS(temperature=1.0, max_tokens=n), seed=i))
                for i, (p, n) in enumerate(zip(prompts, lengths))))
            elapsed, cpu = time.perf_counter() - t0, cpu_s() - c0
        finally:
            await engine.close()
        if [len(r.token_ids) for r in results] != lengths:
            raise RuntimeError("vllm returned other lengths than requested")
        return start_s, elapsed, cpu

    return asyncio.run(go())


def engine_vs_generate(requests: int, mean_len: float, max_len: int, seed: int, vllm: bool = False) -> dict:
    model = load_model(ModelConf(path=MODEL)).eval()
    tok = load_tokenizer(ModelConf(path=MODEL))
    model.generation_config.eos_token_id = None
    rng = random.Random(seed)
    prompts = et.make_prompts(requests, tok, rng)
    lengths = et.lognormal_lengths(requests, mean_len, 1.0, max_len, rng)
    et.run_engine(model, prompts[:2], [2, 2], requests, seed)  # warm-up
    torch.manual_seed(seed)
    c0 = cpu_s()
    generate_s = et.run_generate(model, prompts, lengths, requests, tok.pad_token_id)
    c1 = cpu_s()
    engine_s = et.run_engine(model, prompts, lengths, requests, seed)
    c2 = cpu_s()
    tokens = sum(lengths)
    out = {"requests": requests, "tokens": tokens, "generate_tok_s": tokens / generate_s,
           "engine_tok_s": tokens / engine_s, "speedup": generate_s / engine_s,
           "generate_tok_cpu_s": tokens / (c1 - c0), "engine_tok_cpu_s": tokens / (c2 - c1)}
    if vllm:
        del model
        gc.collect()
        out["vllm_start_s"], vllm_s, vllm_cpu = run_vllm(prompts, lengths)
        out["vllm_tok_s"], out["vllm_tok_cpu_s"] = tokens / vllm_s, tokens / vllm_cpu
    return out


def weight_sync(repeats: int) -> dict:
    model = load_model(ModelConf(path=MODEL)).eval()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    targets = {k: torch.empty_like(v) for k, v in state.items()}
    flat_src, flat_dst = torch.empty(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    flat_src.fill_(1)
    flat_dst.fill_(0)

    async def go():
        engine = HFEngine.from_model(model, None, HFEngineConf(max_batch_size=4), seed=0)
        sync, copy, memcpy = [], [], []
        try:
            for v in range(1, repeats + 1):
                t0 = time.perf_counter()
                await engine.load_weights(state, v)
                sync.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                with torch.no_grad():
                    for k, t in state.items():
                        targets[k].copy_(t)
                copy.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                flat_dst.copy_(flat_src)
                memcpy.append(time.perf_counter() - t0)
        finally:
            await engine.close()
        return min(sync), min(copy), min(memcpy)

    s, c, m = asyncio.run(go())
    return {"bytes_mb": nbytes / 2**20, "tensors": len(state), "hf_load_s": s, "tensor_copy_s": c, "memcpy_s": m,
            "load_over_copy": s / c}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--mean-len", type=float, default=64)
    p.add_argument("--max-len", type=int, default=192)
    p.add_argument("--chunk", type=int, default=TorchBackendConf.logprob_chunk_tokens)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parts", default="trainer,engine,sync",
                   help="comma-separated: trainer, engine, sync, vllm (with engine; needs .venv-vllm)")
    p.add_argument("--requests", type=int, default=16, help="requests in the engine comparison (--quick: 8)")
    args = p.parse_args(argv)
    if args.rows < 4 or args.rows % 4:
        p.error(f"--rows={args.rows} must be a positive multiple of 4 (groups of 4)")
    if args.child:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        print(json.dumps(child_micro_batch(args.child, args.rows, args.mean_len, args.max_len, args.chunk)))
        return
    if args.quick:
        args.rows, args.mean_len, args.max_len = 4, 24, 64
    print(f"SmolLM2-135M-Instruct, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.machine()}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}")
    parts = set(args.parts.split(","))
    if parts - {"trainer", "engine", "sync", "vllm"}:
        p.error(f"--parts={args.parts!r}: expected a comma-separated subset of trainer, engine, sync, vllm")
    if "vllm" in parts and "engine" not in parts:
        p.error("--parts: vllm is compared within the engine part; give --parts engine,vllm")
    if args.requests < 1:
        p.error(f"--requests={args.requests}: must be >= 1")
    if "trainer" in parts:
        trainer_table(run_children(args))
    if "engine" in parts:
        e = engine_vs_generate(8 if args.quick else args.requests, 8 if args.quick else 32,
                               24 if args.quick else 96, args.seed, vllm="vllm" in parts)
        print(f"\nengine=hf {e['engine_tok_s']:.1f} tok/s vs model.generate {e['generate_tok_s']:.1f} tok/s "
              f"({e['requests']} requests, {e['tokens']} tokens, x{e['speedup']:.2f}); per CPU second "
              f"{e['engine_tok_cpu_s']:.1f} vs {e['generate_tok_cpu_s']:.1f}; load {os.getloadavg()[0]:.2f}")
        if "vllm_tok_s" in e:
            print(f"engine=vllm (CPU build) {e['vllm_tok_s']:.1f} tok/s, {e['vllm_tok_cpu_s']:.1f} per CPU second "
                  f"(its processes together) on the same requests (started in {e['vllm_start_s']:.1f} s); "
                  f"load {os.getloadavg()[0]:.2f}")
    if "sync" in parts:
        w = weight_sync(2 if args.quick else 3)
        print(f"weight sync: hf engine load_weights {w['hf_load_s'] * 1e3:.0f} ms, plain tensor copy "
              f"{w['tensor_copy_s'] * 1e3:.0f} ms, one memcpy {w['memcpy_s'] * 1e3:.0f} ms of {w['bytes_mb']:.0f} "
              f"MB ({w['tensors']} tensors; load/copy x{w['load_over_copy']:.2f}); load {os.getloadavg()[0]:.2f}")


def trainer_table(rows: list[dict]) -> None:
    print("\n| scoring | rows x width | tokens (response) | peak RSS over start, GB | fwd+bwd s | train tok/s "
          "| CPU s | tok per CPU s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['rows']} x {r['width']} | {r['tokens']} ({r['response_tokens']}) | "
              f"{r['peak_over_start_gb']:.2f} | {r['step_s']:.2f} | {r['train_tok_s']:.0f} | {r['cpu_s']:.2f} | "
              f"{r['train_tok_cpu_s']:.0f} |")


if __name__ == "__main__":
    main()
