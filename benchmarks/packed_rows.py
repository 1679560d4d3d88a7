"""Packed rows (`backend.packing`) against token-budget micro-batches of padded rows, on SmolLM2-135M-Instruct.

One training step (forward + backward of every micro-batch and the optimizer step; lr 1e-12, so
every step starts from the same weights) of one batch, on one model, after one unmeasured step of
each, the two configurations' steps interleaved so that the shared machine's load hits both alike:

- `padded`: `backend.micro_batch_tokens=B, backend.packing=false`: rows grouped longest first,
  each micro-batch right-padded to its longest row (rows x longest <= B);
- `packed`: `backend.micro_batch_tokens=B, backend.packing=null` (the default; on for SmolLM2):
  the same micro-batches with shorter samples moved into the padding of longer ones' rows
  (`packing.packed_micro_batches`).

Reported per configuration: training tokens (non-padding) per CPU second of this process (all its
threads: `time.process_time`) and per wall second, the padding fraction of the tokens the model
computed, the peak RSS over the step's start, and loss / grad norm (which must agree).

Batches: `--rows` samples of a 48-token prompt and a lognormal response (mean `--mean-len`, CV 1),
or with `--rollouts DIR` the real prompt and response lengths of a run's rollout ledger
(`<run dir>/rollouts/*.jsonl`, e.g. of `python train.py experiment=smollm2_arith`).

    .venv/bin/python benchmarks/packed_rows.py                      # lognormal, mean 96, CV 1
    .venv/bin/python benchmarks/packed_rows.py --rollouts outputs/RUN/rollouts
    .venv/bin/python benchmarks/packed_rows.py --attn sdpa          # -> results/packed_rows_sdpa.json
    .venv/bin/python benchmarks/packed_rows.py --fit-attention      # a token's cost by row width

`--fit-attention` measures what a token costs in rows of different widths (one training step of
equal-length rows, a third prompt, the same tokens at every width) and fits cost = a + b x width:
a / b is the width at which a row's attention costs as much as the rest of the step (why packed rows
are no wider than padded ones with eager or sdpa attention).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_sync_throughput import MODEL, PROMPT_LEN, PeakRSS, lengths_for  # noqa: E402

from rlharness.backend.learner import Learner  # noqa: E402
from rlharness.backend.packing import computed_ids  # noqa: E402
from rlharness.config.schema import AlgoConf, ModelConf, TorchBackendConf  # noqa: E402
from rlharness.core.types import Group, RolloutState, Status  # noqa: E402
from rlharness.trainer.batch import build_train_batch  # noqa: E402

GROUP = 4
ROWS = 32  # --rows' default: results of other batch sizes are named for theirs


def batch_of(sizes: list[tuple[int, int]], algo: AlgoConf, seed: int, vocab_size: int = 49152):
    """A training batch of samples of these (prompt, response) lengths, groups of GROUP, random token ids."""
    rng = random.Random(seed)
    groups = []
    for g in range(len(sizes) // GROUP):
        group = []
        for i in range(GROUP):
            p, n = sizes[GROUP * g + i]
            group.append(RolloutState(
                uid=f"{g}-{i}", group_id=str(g), task="t", prompt_index=g, epoch=0, prompt_text="",
                prompt_ids=[rng.randrange(10, vocab_size) for _ in range(p)],
                response_ids=[rng.randrange(10, vocab_size) for _ in range(n)],
                response_logprobs=[-rng.uniform(1, 3) for _ in range(n)], response_model_steps=[0] * n,
                reward={"score": float(rng.random() < 0.5)}, status=Status.COMPLETED, finish_reason="stop"))
        groups.append(Group.from_samples(group))
    return build_train_batch(groups, algo, pad_token_id=0, train_step=1,
                             max_response_len=max(n for _, n in sizes), temperature=1.0)[0]


class PeakMemory:
    """Peak memory of the device over its start: RSS on a CPU (`PeakRSS`), allocated CUDA memory on a GPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.rss = None if self.cuda else PeakRSS()

    def __enter__(self) -> "PeakMemory":
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.rss.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        else:
            self.rss.__exit__(*exc)

    @property
    def over_start_gb(self) -> float:
        return (torch.cuda.max_memory_allocated() - self.start) / 2**30 if self.cuda else self.rss.over_start_gb


def measure_layouts(model: ModelConf, sizes: list[tuple[int, int]], budget: int, steps: int, seed: int,
                    device: str = "cpu") -> dict:
    """Padded against packed micro-batches (token budget `budget`) of one batch of `sizes` (prompt, response
    lengths) on one learner: per layout the median step's CPU and wall seconds, tokens per each, padding
    fraction, micro-batches, peak memory over the step's start, loss and grad norm."""
    algo = AlgoConf(name="grpo", lr=1e-12, weight_decay=0.0)
    b = Learner(TorchBackendConf(micro_batch_tokens=budget, device=device), model, algo, 10, 0)
    if not b.packing:
        raise RuntimeError(f"{model.path} with {model.attn_implementation} attention does not keep packed rows apart")
    batch = batch_of(sizes, algo, seed, int(b.model.config.get_text_config().vocab_size))
    tokens = int(batch.attention_mask.sum())
    configs = {"padded": False, "packed": True}
    for packing in configs.values():  # warm-up (first-call allocations, kernels' set-up, compiles): not measured
        b.packing = packing
        b.train_step_blocking(batch)
    runs = {name: {"cpu_s": [], "wall_s": [], "peak_gb": 0.0} for name in configs}
    for _ in range(steps):
        for name, packing in configs.items():  # interleaved: the machine's load hits both alike
            b.packing = packing
            with PeakMemory(device) as mem:
                cpu0, wall0 = time.process_time(), time.perf_counter()
                out = b.train_step_blocking(batch)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            r = runs[name]
            r["cpu_s"].append(cpu)
            r["wall_s"].append(wall)
            r["peak_gb"] = max(r["peak_gb"], mem.over_start_gb)
            r.update(loss=out["train/loss"], grad_norm=out["train/grad_norm"],
                     computed=computed_tokens(b, batch.attention_mask),
                     micro_batches=len(b._micro_slices(torch.arange(len(sizes)), batch.attention_mask)))
            print(f"{model.attn_implementation} {name}: {cpu:.2f} CPU s, {wall:.3f} s", flush=True)
    result = {"attn": model.attn_implementation, "device": device, "dtype": model.dtype, "rows": len(sizes),
              "budget": budget, "tokens": tokens, "configs": {}}
    for name, r in runs.items():
        cpu_s, wall_s = statistics.median(r.pop("cpu_s")), statistics.median(r.pop("wall_s"))
        result["configs"][name] = {**r, "cpu_s": cpu_s, "wall_s": wall_s, "tokens_per_cpu_s": tokens / cpu_s,
                                   "tokens_per_s": tokens / wall_s, "padding_frac": 1 - tokens / r["computed"]}
    pad, pack = result["configs"]["padded"], result["configs"]["packed"]
    result["speedup_per_cpu_s"] = pack["tokens_per_cpu_s"] / pad["tokens_per_cpu_s"]
    result["speedup_per_s"] = pack["tokens_per_s"] / pad["tokens_per_s"]
    result["loss_rel_diff"] = abs(pack["loss"] - pad["loss"]) / max(abs(pad["loss"]), 1e-12)
    return result


def ledger_sizes(folder: Path, rows: int) -> list[tuple[int, int]]:
    """(prompt tokens, response tokens) of the first `rows` samples of a run's rollout ledger."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    sizes = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            sizes.append((len(tok(r["prompt"], add_special_tokens=False)["input_ids"]), max(1, r["response_len"])))
    if len(sizes) < rows:
        raise SystemExit(f"--rollouts {folder}: {len(sizes)} samples, fewer than --rows {rows}")
    return sizes[:rows]


def computed_tokens(b: Learner, mask: torch.Tensor) -> int:
    """Tokens the model computes for one pass over the batch (padding included)."""
    return sum(computed_ids(mb).numel() for _, mb in
               b._micro_batches({"input_ids": mask, "attention_mask": mask}, torch.arange(mask.shape[0])))


def fit_attention(args: argparse.Namespace) -> None:
    """Per-token CPU seconds of a training step at row widths 128 .. 1024 (4096 tokens each), fitted as
    a + b x width; prints a / b and writes results/packed_rows_attention_<attn>.json."""
    algo = AlgoConf(name="grpo", lr=1e-12, weight_decay=0.0)
    # One micro-batch: the whole [rows, width] batch of 4096 tokens.
    b = Learner(TorchBackendConf(packing=False, micro_batch_tokens=4096),
                ModelConf(path=MODEL, attn_implementation=args.attn), algo, 10, 0)
    widths, per_token = [128, 256, 512, 1024], []
    for width in widths:
        batch = batch_of([(width // 3, width - width // 3)] * (4096 // width), algo, args.seed)
        b.train_step_blocking(batch)  # warm-up
        cpu = []
        for _ in range(args.steps):
            cpu0 = time.process_time()
            b.train_step_blocking(batch)
            cpu.append(time.process_time() - cpu0)
        per_token.append(statistics.median(cpu) / 4096)
        print(f"width {width}: {1e3 * per_token[-1]:.2f} CPU ms per token", flush=True)
    slope, intercept = statistics.linear_regression(widths, per_token)
    result = {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "cpus": os.cpu_count(),
              "load": os.getloadavg()[0], "attn": args.attn, "widths": widths, "cpu_s_per_token": per_token,
              "a": intercept, "b": slope, "attention_tokens": intercept / slope}
    (Path(__file__).resolve().parent / "results" / f"packed_rows_attention_{args.attn}.json").write_text(
        json.dumps(result, indent=1))
    print(f"cost per token = {1e3 * intercept:.3f} + {1e3 * slope:.5f} x width CPU ms: attention costs as much as "
          f"the rest at width {intercept / slope:.0f} (load {result['load']:.1f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=ROWS, help="samples in the batch (a multiple of 4)")
    p.add_argument("--mean-len", type=float, default=96.0, help="mean response length (lognormal, CV 1)")
    p.add_argument("--max-len", type=int, default=384)
    p.add_argument("--budget", type=int, default=0, help="backend.micro_batch_tokens (0: 4 x the longest sample)")
    p.add_argument("--rollouts", type=Path, help="take (prompt, response) lengths from this rollout ledger")
    p.add_argument("--steps", type=int, default=2, help="training steps per configuration (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attn", default="eager", help="model.attn_implementation (eager, sdpa)")
    p.add_argument("--fit-attention", action="store_true", help="measure a token's cost by row width")
    args = p.parse_args()
    if args.fit_attention:
        return fit_attention(args)
    sizes = (ledger_sizes(args.rollouts, args.rows) if args.rollouts else
             [(PROMPT_LEN, n) for n in lengths_for(args.rows, args.mean_len, args.max_len, args.seed)])
    budget = args.budget or GROUP * max(p + n for p, n in sizes)
    load_before = os.getloadavg()[0]
    measured = measure_layouts(ModelConf(path=MODEL, attn_implementation=args.attn), sizes, budget, args.steps,
                               args.seed)
    result = {"date": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "cpus": os.cpu_count(),
              "load_before_after": [load_before, os.getloadavg()[0]],
              "lengths": "rollouts " + str(args.rollouts) if args.rollouts else f"lognormal mean {args.mean_len} CV 1",
              **measured}
    tokens, pad, pack = result["tokens"], result["configs"]["padded"], result["configs"]["packed"]
    attn = "" if args.attn == "eager" else f"_{args.attn}"
    rows = "" if args.rows == ROWS else f"_{args.rows}rows"
    name = f"packed_rows{'_rollouts' if args.rollouts else ''}{attn}{rows}.json"
    (Path(__file__).resolve().parent / "results" / name).write_text(json.dumps(result, indent=1))
    print(f"{result['date']}, {result['cpus']} CPUs, load {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"{args.rows} samples ({result['lengths']}), {tokens} tokens, budget {budget}")
    print("| micro-batches | tokens / CPU s | tokens / s | padding | micro-batches | peak RSS over start |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in result["configs"].items():
        print(f"| {name} | {r['tokens_per_cpu_s']:.2f} | {r['tokens_per_s']:.2f} | {r['padding_frac']:.1%} | "
              f"{r['micro_batches']} | {r['peak_gb']:.2f} GB |")
    print(f"packed / padded tokens per CPU s: {result['speedup_per_cpu_s']:.2f}x; loss differs by "
          f"{result['loss_rel_diff']:.1e} relative, grad norm {pad['grad_norm']:.6g} / {pack['grad_norm']:.6g}")


if __name__ == "__main__":
    main()
