"""Issue 25 on SmolLM2-135M-Instruct: token-budget micro-batches, balanced ranks, weight sync vs a copy.

All in one run, each comparison measured side by side:

1. `train`: one training step (forward + backward of every micro-batch, lr 1e-12 so every step
   starts from the same weights) on rows of a 48-token prompt and a response drawn lognormal
   with CV 1, with `algo.micro_batch_size` rows per micro-batch (the default path) and
   with `backend.micro_batch_tokens` (by default the baseline's largest micro-batch, so never
   more activation memory), on one model, steps interleaved; the optimizer step is timed apart
   (its cost does not depend on the micro-batches). Peak RSS over the RSS at the step's start,
   sampled. Tokens/s counts non-padding tokens; loss and grad norm are compared (relative).
2. `balance`: `perf/rank_token_imbalance` (max/mean tokens per rank) of the strided split
   (rank r: rows r, r + W, ...) and the Karmarkar-Karp split on the same distribution, 2 and
   4 ranks, mean and worst over `--draws` batches.
3. `sync`: SmolLM2's state dict (fp32) moved by
   - a memcpy of the same bytes (one flat tensor) and the hf engine's `load_weights`;
   - a plain two-process gloo broadcast of one flat tensor of the same bytes;
   - the weight group (`WeightGroupMember.send` / `receive_stream`, bucketed and pipelined)
     to the same second process, which copies each tensor into its own model-shaped state
     as it arrives (what an engine's load does);
   - with vLLM installed (run with .venv-vllm/bin/python): `engine=vllm`'s
     `weight_sync=collective` load end to end (prefix-cache reset included), then the time
     to first token of a request sent right after the sync (and one without a sync before it);
     on vLLM's CPU build, for both `engine.cpu_linear` settings (two engines, interleaved):
     `torch` (plain weights loaded in place) and `onednn` (the default: vLLM's packed weights,
     re-packed by its reload on every sync), each with the generation throughput of a fixed
     batch after the sync (`--gen-requests` prompts x `--gen-tokens` greedy tokens, EOS ignored),
     so a faster sync that costs rollout speed shows;
   - with Ray installed (`--object-store`, on by default): `mode=disagg`'s object-store route for
     the same state dict, end to end: a training actor (`TrainWorkerActor` hosting a `Learner`
     of the model) copies its weights and puts them into the object store (`RemoteWeights`), the
     hf engine actor (`EngineActor`) reads that object and loads it (`ObjectStoreChannel`); the two
     halves are timed too, and the time to first token through the actor after the sync;
   - vLLM's CPU build re-packs every linear layer's weight for oneDNN after each load
     (`create_onednn_mm`, in vLLM's reload): that packing alone, over the same weights in this
     process, to show how much of vLLM's sync is not transfer at all.
   Repeats are interleaved (broadcast, group, vLLM, object store, memcpy, ...) so load changes hit all alike.

    .venv-vllm/bin/python benchmarks/trainer_sync_throughput.py           # ~10 min on a loaded 2-core box
    .venv-vllm/bin/python benchmarks/trainer_sync_throughput.py --quick   # small: checks it runs
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import dataclasses
import gc
import multiprocessing as mp
import os
import platform
import random
import socket
import statistics
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_throughput as et  # noqa: E402

from rlharness.backend.rank_balance import imbalance, rank_shares  # noqa: E402
from rlharness.config.schema import AlgoConf, HFEngineConf, ModelConf, TorchBackendConf  # noqa: E402
from rlharness.trainer.batch import build_train_batch  # noqa: E402
from rlharness.core.types import Group, RolloutState, Status  # noqa: E402

MODEL = str(Path(__file__).resolve().parent.parent / "assets" / "smollm2-135m-instruct")
PROMPT_LEN = 48


# ----------------------------------------------------------------------------- 1. train
def lengths_for(rows: int, mean_len: float, max_len: int, seed: int) -> list[int]:
    return et.lognormal_lengths(rows, mean_len, 1.0, max_len, random.Random(seed))


def batch_of(rows: int, mean_len: float, max_len: int, seed: int, algo: AlgoConf):
    rng = random.Random(seed + 1)
    lengths = lengths_for(rows, mean_len, max_len, seed)
    groups = []
    for g in range(rows // 4):
        prompt = [rng.randrange(10, 49152) for _ in range(PROMPT_LEN)]
        group = []
        for i in range(4):
            n = lengths[4 * g + i]
            group.append(RolloutState(
                uid=f"{g}-{i}", group_id=str(g), task="t", prompt_index=g, epoch=0, prompt_text="",
                prompt_ids=prompt, response_ids=[rng.randrange(10, 49152) for _ in range(n)],
                response_logprobs=[-rng.uniform(1, 3) for _ in range(n)], response_model_steps=[0] * n,
                reward={"score": float(rng.random() < 0.5)}, status=Status.COMPLETED, finish_reason="stop"))
        groups.append(Group.from_samples(group))
    return build_train_batch(groups, algo, pad_token_id=0, train_step=1, max_response_len=max_len,
                             temperature=1.0)[0]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Peak RSS over the RSS at entry, sampled every 2 ms (freed heap memory is trimmed first, so a
    configuration measured after another does not start on its predecessor's freed pages)."""

    def __enter__(self) -> "PeakRSS":
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        self.start = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def over_start_gb(self) -> float:
        return (self.peak - self.start) / 2**30


class TimedBackend:
    """A Learner whose optimizer steps are timed apart (their cost does not depend on micro-batching)."""

    @staticmethod
    def build(algo: AlgoConf):
        from rlharness.backend.learner import Learner

        b = Learner(TorchBackendConf(), ModelConf(path=MODEL), algo, 10, 0)
        b.optimizer_s = 0.0
        step = b.policy.step

        def timed_step(what):
            t0 = time.perf_counter()
            try:
                return step(what)
            finally:
                b.optimizer_s += time.perf_counter() - t0

        b.policy.step = timed_step
        return b


def train_part(args) -> list[dict]:
    """Both configurations in one process on one model, steps interleaved (fixed rows, tokens, fixed, ...)."""
    # lr 1e-12: an update far below float32 resolution, so every step starts from the same weights.
    algo = AlgoConf(name="grpo", lr=1e-12, weight_decay=0.0, micro_batch_size=args.micro_rows)
    batch = batch_of(args.rows, args.mean_len, args.max_len, args.seed, algo)
    b = TimedBackend.build(algo)
    configs = {f"{args.micro_rows} rows": None, f"{args.budget} tokens": args.budget}
    rows = {name: {"config": name, "step_s": [], "fwd_bwd_s": [], "peak": 0.0} for name in configs}
    tokens = int(batch.attention_mask.sum())
    for _ in range(args.steps):
        for name, budget in configs.items():
            b.conf = dataclasses.replace(b.conf, micro_batch_tokens=budget)
            b.optimizer_s = 0.0
            with PeakRSS() as mem:
                t0 = time.perf_counter()
                out = b.train_step_blocking(batch)
                step_s = time.perf_counter() - t0
            r = rows[name]
            slices = b._micro_slices(torch.arange(args.rows), batch.attention_mask)
            r.update(micro_batches=len(slices), tokens=tokens,
                     padded_tokens=sum(len(s) * int(batch.attention_mask[s].sum(-1).max()) for s in slices),
                     largest_micro_batch=max(len(s) * int(batch.attention_mask[s].sum(-1).max()) for s in slices),
                     loss=out["train/loss"], grad_norm=out["train/grad_norm"])
            r["step_s"].append(step_s)
            r["fwd_bwd_s"].append(step_s - b.optimizer_s)
            r["peak"] = max(r["peak"], mem.over_start_gb)
            print(name, f"step {step_s:.1f} s (optimizer {b.optimizer_s:.1f} s)", flush=True)
    out_rows = []
    for r in rows.values():
        step_s, fb, peak = statistics.median(r.pop("step_s")), statistics.median(r.pop("fwd_bwd_s")), r.pop("peak")
        out_rows.append({**r, "step_s": step_s, "fwd_bwd_s": fb, "step_tok_s": tokens / step_s,
                         "fwd_bwd_tok_s": tokens / fb, "peak_rss_over_start_gb": peak})
    del b
    gc.collect()
    return out_rows


# ----------------------------------------------------------------------------- 2. balance
def balance_part(args) -> list[dict]:
    out = []
    for world in (2, 4):
        figures: dict[bool, list[float]] = {False: [], True: []}
        for draw in range(args.draws):
            lengths = torch.tensor([PROMPT_LEN + n for n in lengths_for(args.balance_rows, args.mean_len,
                                                                         args.max_len, 1000 + draw)])
            for balance in (False, True):
                shares = rank_shares(lengths, world, balance)
                figures[balance].append(imbalance([float(lengths[s].sum()) for s in shares]))
        out.append({"workers": world, "rows": args.balance_rows,
                    "strided_mean": statistics.mean(figures[False]), "strided_max": max(figures[False]),
                    "balanced_mean": statistics.mean(figures[True]), "balanced_max": max(figures[True])})
    return out


# ----------------------------------------------------------------------------- 3. sync
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _receiver(port: int, nbytes: int, specs, conn) -> None:
    """The second process: a plain flat receive, or the weight group's stream copied into a model-shaped state."""
    from rlharness.weights.transfer import WeightGroupMember

    member = WeightGroupMember("gloo", "127.0.0.1", port, 1, 2, 600.0)
    flat = torch.empty(nbytes, dtype=torch.uint8)
    targets = {s.name: torch.empty(s.shape, dtype=s.torch_dtype) for s in specs}
    while True:
        cmd, version, bucket_bytes = conn.recv()
        if cmd == "stop":
            break
        if cmd == "plain":
            member._finish(member._start_broadcast(flat))
        else:
            member.bucket_bytes = bucket_bytes
            with torch.no_grad():
                for name, t in member.receive_stream(version, specs):
                    targets[name].copy_(t)
        conn.send("done")
    member.close()


def _perturbed(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    return {k: v + seed * 1e-4 for k, v in state.items()}


async def _gen_tok_s(engine, prompt: list[int], requests: int, tokens: int) -> float:
    """Generated tokens/s of `requests` greedy requests of `tokens` tokens sent together."""
    from rlharness.engine.base import GenerateRequest, SamplingParams

    @dataclasses.dataclass(slots=True)
    class NoEOS(SamplingParams):
        ignore_eos: bool = True

    reqs = [GenerateRequest(f"gen-{time.monotonic_ns()}-{i}", prompt + [10 + i], NoEOS(greedy=True, max_tokens=tokens))
            for i in range(requests)]
    t0 = time.perf_counter()
    out = await asyncio.gather(*(engine.generate(r) for r in reqs))
    elapsed = time.perf_counter() - t0
    assert all(len(r.token_ids) == tokens for r in out), "a request stopped early"
    return requests * tokens / elapsed


async def _ttft(engine, prompt: list[int]) -> float:
    from rlharness.engine.base import GenerateRequest, SamplingParams

    t0 = time.perf_counter()
    await engine.generate(GenerateRequest(f"ttft-{time.monotonic_ns()}", prompt, SamplingParams(max_tokens=1),
                                          seed=0))
    return time.perf_counter() - t0


def _torch_backend() -> object:
    from rlharness.backend.learner import Learner

    return Learner(TorchBackendConf(), ModelConf(path=MODEL), AlgoConf(name="grpo"), 10, 0)


def _start_object_store_route():
    """A training actor and an hf engine actor on a local Ray, as `mode=disagg cluster=local_ray` builds them."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from rlharness.distributed.spawn import spawn_engines
    from rlharness.distributed.train_actor import spawn_train_workers

    ray.init(num_cpus=4, object_store_memory=1536 * 2**20, include_dashboard=False, log_to_driver=False)
    backend = spawn_train_workers(lambda rank, addr, port: _torch_backend, 1, 1, 0, {}, 600.0, name="bench")
    engine = spawn_engines(HFEngineConf(max_batch_size=4), ModelConf(path=MODEL), seed=0, cpus=1, gpus=0,
                           timeout_s=600.0, name="bench-engine")
    return ray, backend, engine


def _onednn_pack_s(state: dict[str, torch.Tensor]) -> float | None:
    """vLLM's CPU post-load packing of every 2-D weight (what its reload runs after each load), or None."""
    try:
        from vllm import _custom_ops as ops
    except ImportError:
        return None
    if not getattr(ops, "_supports_onednn", False):
        return None
    weights = [t for t in state.values() if t.ndim == 2]
    t0 = time.perf_counter()
    handlers = [ops.create_onednn_mm(w.t(), 32) for w in weights]
    elapsed = time.perf_counter() - t0
    del handlers
    return elapsed


def sync_part(args) -> dict:
    from safetensors.torch import load_file

    from rlharness.weights.transfer import WeightGroupMember, tensor_specs
    from rlharness.engine.hf import HFEngine
    from rlharness.model.load import load_tokenizer

    state = load_file(str(Path(MODEL) / "model.safetensors"))
    specs = tensor_specs(state)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    flat_src, flat_dst = torch.full((nbytes,), 1, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    prompt = load_tokenizer(ModelConf(path=MODEL))("12+34=")["input_ids"]

    port = free_port()
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_receiver, args=(port, nbytes, specs, child_conn), daemon=True)
    child.start()
    sender = WeightGroupMember("gloo", "127.0.0.1", port, 0, 2, 600.0)
    vllm_engine = None
    vllm_engines: dict[str, object] = {}  # engine.cpu_linear -> engine (the CPU build: both settings)
    try:
        import vllm  # noqa: F401

        from rlharness.config.schema import VLLMEngineConf
        from rlharness.engine import build_engine
        from rlharness.engine.vllm import vllm_device

        for kernel in ("torch", "onednn") if vllm_device() == "cpu" else ("torch",):
            vllm_engines[kernel] = build_engine(VLLMEngineConf(sync_timeout_s=600.0, cpu_linear=kernel),
                                                ModelConf(path=MODEL), seed=0)
        vllm_engine = vllm_engines.get(VLLMEngineConf().cpu_linear, vllm_engines["torch"])  # the default
    except ImportError:
        print("vLLM is not installed: its rows are skipped (run with .venv-vllm/bin/python)", flush=True)

    route = None
    if args.object_store:
        try:
            route = _start_object_store_route()
        except ImportError:
            print("Ray is not installed: the object-store rows are skipped", flush=True)

    async def go() -> dict[str, list[float]]:
        hf = HFEngine(HFEngineConf(max_batch_size=4), ModelConf(path=MODEL), seed=0)
        t: dict[str, list[float]] = {k: [] for k in ("memcpy", "plain_gloo", *(f"group_{mb}mb" for mb in args.bucket_mb),
                                                     "hf_load", "hf_ttft_after_sync", "vllm_sync",
                                                     "vllm_ttft_after_sync", "vllm_ttft_no_sync",
                                                     "vllm_gen_tok_s", "vllm_torch_sync", "vllm_torch_gen_tok_s",
                                                     "vllm_onednn_sync", "vllm_onednn_gen_tok_s",
                                                     "vllm_onednn_pack", "objstore_sync", "objstore_put",
                                                     "objstore_load", "objstore_ttft_after_sync",
                                                     "objstore_ttft_no_sync")}
        version = 1
        try:
            for engine in vllm_engines.values():  # forms the group (timed apart: not a sync's cost)
                await engine.load_weights(state, version)
                await _ttft(engine, prompt)  # warm-up
            if route is not None:
                _, backend, engine = route
                await engine.load_weights(await backend.get_weights(), version)  # first touches of memory
                await _ttft(engine, prompt)
            await _ttft(hf, prompt)
            for cmd, mb in (("plain", 0), *(("group", mb) for mb in args.bucket_mb)):  # first touches of memory
                sender.bucket_bytes = mb << 20
                parent_conn.send((cmd, version, sender.bucket_bytes))
                if cmd == "plain":
                    sender._finish(sender._start_broadcast(flat_src))
                else:
                    sender.send(state, version)
                parent_conn.recv()
            for _ in range(args.repeats):
                version += 1
                new = _perturbed(state, version)
                t0 = time.perf_counter()
                parent_conn.send(("plain", version, 0))
                sender._finish(sender._start_broadcast(flat_src))
                parent_conn.recv()
                t["plain_gloo"].append(time.perf_counter() - t0)

                for mb in args.bucket_mb:
                    sender.bucket_bytes = mb << 20
                    t0 = time.perf_counter()
                    parent_conn.send(("group", version, sender.bucket_bytes))
                    sender.send(new, version)
                    parent_conn.recv()
                    t[f"group_{mb}mb"].append(time.perf_counter() - t0)

                for kernel, engine in vllm_engines.items():
                    keys = ["vllm"] if len(vllm_engines) == 1 else [f"vllm_{kernel}"]
                    keys += ["vllm"] * (len(vllm_engines) > 1 and engine is vllm_engine)
                    t0 = time.perf_counter()
                    await engine.load_weights(new, version)
                    elapsed = time.perf_counter() - t0
                    if engine is vllm_engine:
                        t["vllm_ttft_after_sync"].append(await _ttft(engine, prompt))
                        t["vllm_ttft_no_sync"].append(await _ttft(engine, prompt))
                    tok_s = await _gen_tok_s(engine, prompt, args.gen_requests, args.gen_tokens)
                    for key in keys:
                        t[f"{key}_sync"].append(elapsed)
                        t[f"{key}_gen_tok_s"].append(tok_s)
                if vllm_engine is not None:
                    pack_s = _onednn_pack_s(new)
                    if pack_s is not None:
                        t["vllm_onednn_pack"].append(pack_s)

                if route is not None:
                    _, backend, engine = route
                    t0 = time.perf_counter()
                    weights = await backend.get_weights()  # the trainer's copy, put into the object store
                    t1 = time.perf_counter()
                    await engine.load_weights(weights, version)  # the engine actor reads it and loads it
                    t2 = time.perf_counter()
                    t["objstore_sync"].append(t2 - t0)
                    t["objstore_put"].append(t1 - t0)
                    t["objstore_load"].append(t2 - t1)
                    t["objstore_ttft_after_sync"].append(await _ttft(engine, prompt))
                    t["objstore_ttft_no_sync"].append(await _ttft(engine, prompt))
                    del weights

                t0 = time.perf_counter()
                await hf.load_weights(new, version)
                t["hf_load"].append(time.perf_counter() - t0)
                t["hf_ttft_after_sync"].append(await _ttft(hf, prompt))

                t0 = time.perf_counter()
                flat_dst.copy_(flat_src)
                t["memcpy"].append(time.perf_counter() - t0)
                del new
        finally:
            await hf.close()
            for engine in vllm_engines.values():
                await engine.close()
            if route is not None:
                await route[2].close()
                await route[1].close()
        return t

    try:
        times = asyncio.run(go())
    finally:
        parent_conn.send(("stop", 0, 0))
        child.join(60)
        sender.close()
        if route is not None:
            route[0].shutdown()
    med = {k: statistics.median(v) for k, v in times.items() if v}
    med["bytes_mb"] = nbytes / 2**20
    med["tensors"] = len(state)
    return med


# ----------------------------------------------------------------------------- main
def table(rows: list[dict]) -> str:
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return "\n".join(out)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: checks that it runs")
    p.add_argument("--parts", default="train,balance,sync")
    p.add_argument("--rows", type=int, default=16, help="rows in the training batch (a multiple of 4)")
    p.add_argument("--micro-rows", type=int, default=4, help="algo.micro_batch_size of the fixed-row baseline")
    p.add_argument("--budget", type=int, default=0, help="backend.micro_batch_tokens (0: micro-rows x the longest "
                                                          "row, the fixed-row baseline's largest micro-batch)")
    p.add_argument("--mean-len", type=float, default=128.0, help="mean response length (lognormal, CV 1)")
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=2, help="training steps per configuration (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--balance-rows", type=int, default=64, help="rows per batch in the balance part")
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3, help="sync repeats (median)")
    p.add_argument("--gen-requests", type=int, default=8, help="vLLM generation throughput: requests in the batch")
    p.add_argument("--gen-tokens", type=int, default=32, help="vLLM generation throughput: greedy tokens per request")
    p.add_argument("--object-store", action=argparse.BooleanOptionalAction, default=True,
                   help="time mode=disagg's Ray object-store route (trainer actor -> object store -> hf engine actor)")
    p.add_argument("--bucket-mb", default="32,256", help="weight-group bucket sizes to time (MiB; vLLM uses "
                                                          "rlharness.weights.transfer.BUCKET_BYTES)")
    args = p.parse_args(argv)
    args.bucket_mb = [int(x) for x in args.bucket_mb.split(",")]
    if args.quick:
        args.rows, args.mean_len, args.max_len, args.steps, args.repeats, args.draws = 8, 24.0, 64, 1, 1, 3
        args.gen_requests, args.gen_tokens = 2, 4
    if args.budget <= 0:  # never more tokens in a micro-batch (so activations) than the baseline's largest
        args.budget = args.micro_rows * (PROMPT_LEN + max(lengths_for(args.rows, args.mean_len, args.max_len,
                                                                        args.seed)))
    return args


def main(argv=None) -> None:
    args = parse(argv)
    parts = args.parts.split(",")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report = [f"# Issue 25 benchmark ({stamp}, {platform.node()}, load average at start "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})\n"]
    if "train" in parts:
        rows = train_part(args)
        base, tok = rows
        report += [f"## Training step: {args.rows} rows, prompt {PROMPT_LEN} + response lognormal mean "
                   f"{args.mean_len:g} CV 1 (cap {args.max_len})\n", table(rows),
                   f"\ntokens/s ratio (token budget / fixed rows): step {tok['step_tok_s'] / base['step_tok_s']:.2f}x, "
                   f"forward+backward {tok['fwd_bwd_tok_s'] / base['fwd_bwd_tok_s']:.2f}x; "
                   f"loss rel. diff {abs(tok['loss'] - base['loss']) / abs(base['loss']):.2e}, grad-norm rel. diff "
                   f"{abs(tok['grad_norm'] - base['grad_norm']) / base['grad_norm']:.2e}\n"]
    if "balance" in parts:
        report += ["## Rank token imbalance (max/mean), strided vs Karmarkar-Karp\n", table(balance_part(args)), ""]
    if "sync" in parts:
        s = sync_part(args)
        report += ["## Weight sync, SmolLM2-135M fp32 state dict (median seconds)\n", table([s]),
                   "\n" + "; ".join(f"group ({mb} MiB buckets) / plain gloo broadcast: "
                                    f"{s[f'group_{mb}mb'] / s['plain_gloo']:.2f}x" for mb in args.bucket_mb)
                   + f"; hf load / memcpy: "
                   f"{s['hf_load'] / s['memcpy']:.2f}x"
                   + (f"; vllm collective sync / plain gloo broadcast: {s['vllm_sync'] / s['plain_gloo']:.2f}x"
                      if "vllm_sync" in s else "")
                   + (f" (engine.cpu_linear=torch: {s['vllm_torch_sync'] / s['plain_gloo']:.2f}x, onednn: "
                      f"{s['vllm_onednn_sync'] / s['plain_gloo']:.2f}x; generation tokens/s torch / onednn: "
                      f"{s['vllm_torch_gen_tok_s'] / s['vllm_onednn_gen_tok_s']:.2f}x)"
                      if "vllm_onednn_sync" in s else "")
                   + (f"; vllm oneDNN packing alone / plain gloo broadcast: "
                      f"{s['vllm_onednn_pack'] / s['plain_gloo']:.2f}x" if "vllm_onednn_pack" in s else "")
                   + (f"; object-store route / plain gloo broadcast: {s['objstore_sync'] / s['plain_gloo']:.2f}x"
                      f" (/ memcpy: {s['objstore_sync'] / s['memcpy']:.2f}x)" if "objstore_sync" in s else "")
                   + "\n"]
    report.append(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n".join(report), flush=True)


if __name__ == "__main__":
    main()
