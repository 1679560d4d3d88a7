"""The GPU paths, checked for real on one machine in a few minutes: what `scripts/gpu_check.sh` runs.

No GPU has been lent to this project before; these paths ran only on CPUs (vLLM's CPU build, gloo).
On SmolLM2-135M-Instruct in bfloat16, each phase timed, everything written to one JSON file:

1. `vllm`: vLLM's CUDA build with sleep mode (`engine.sleep_mode=true`): start, a rollout of
   `--prompts` x `--samples` sampled responses (tokens/s), `sleep()` (GPU memory freed).
2. `trainer`: the trainer on CUDA (`backend.device=cuda`, bfloat16): its log-probs of the rollout's
   tokens against vLLM's (the bfloat16 log-prob gap, `train/logprob_diff_rollout`), then training
   steps on that batch (tokens/s).
3. `nccl_sync`: the weights after those steps to vLLM's worker by NCCL broadcast (the disaggregated
   route: `WeightGroupMember` rank 0 here, vLLM's worker rank 1): a full sync, then a delta sync
   (rlharness/weights/delta.py) after one more step, each timed, the vLLM log-probs against the
   trainer's before and after (a sync that did not arrive leaves the gap of the old weights). With
   two GPUs the trainer takes the second; with one, both processes share it and each claims a host of
   its own (`NCCL_HOSTID`), because NCCL refuses two ranks of one communicator on one GPU of one host
   (it then moves the bytes over its socket transport on loopback).
4. `colocated_sync`: what `engine=vllm` does on one GPU: the same weights through vLLM's local gloo
   group (`VLLMEngine.load_weights`), full and delta, timed.
5. `packed_rows_<attention>_<lengths>`: packed rows (`backend.packing`) against padded token-budget
   micro-batches (`benchmarks/packed_rows.py`'s `measure_layouts`, bfloat16, `--packed-budget` tokens per
   micro-batch): training tokens/s of each, padding, peak memory, for each attention that can train here
   (eager, sdpa, flex_attention's block mask; flash_attention_2 where flash-attn is installed), on the
   lengths of the `rollout` phase's samples (smollm2_arith's kind) and on lognormal ones (mean 96, CV 1);
   `packing` sums them up: the best packed tokens/s over the best padded, per lengths (issue 43's 1.5x).

A phase that fails is recorded (`errors`) and the run goes on where it can; the exit status is 1 if
any phase failed. Without a usable GPU it stops at once with one line saying why (exit 1).

    .venv-vllm/bin/python scripts/gpu_check.py --out gpu_check.json      # (scripts/gpu_check.sh runs this)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # packed_rows.measure_layouts

MODEL = ROOT / "assets" / "smollm2-135m-instruct"
PROBE_PROMPTS = 8  # prompts of the rollouts that check a sync (their gap to the trainer's weights)
# NCCL as vLLM runs it (its docs, "known issues": vLLM sets NCCL_CUMEM_ENABLE=0; a peer that does
# not match fails the weight broadcast).
os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")


class NoGPU(RuntimeError):
    """Nothing can be checked here."""


def fail_line(message: str) -> None:
    print(f"gpu_check: FAILED: {message}", file=sys.stderr)


class Report:
    """Phases, their numbers and their errors; written to `path` after every phase (a hang leaves what ran)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"started": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
                                     "phases": {}, "errors": {}}

    def phase(self, name: str, fn: Callable[[], dict[str, Any]]) -> bool:
        t0 = time.perf_counter()
        print(f"gpu_check: {name} ...", flush=True)
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, the next phase may still run
            self.data["errors"][name] = f"{type(exc).__name__}: {exc}"
            self.data["phases"][name] = {"s": time.perf_counter() - t0, "traceback": traceback.format_exc()}
            fail_line(f"{name}: {type(exc).__name__}: {exc}")
            ok = False
        else:
            self.data["phases"][name] = {"s": round(time.perf_counter() - t0, 3), **result}
            print(f"gpu_check: {name} done in {time.perf_counter() - t0:.1f} s: {json.dumps(result)[:400]}",
                  flush=True)
            ok = True
        self.write()
        return ok

    def write(self) -> None:
        self.data["ok"] = not self.data["errors"]
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def require_gpu() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise NoGPU(f"torch {torch.__version__} in {sys.executable} sees no CUDA device (a CPU build, or no "
                    f"driver): run scripts/gpu_check.sh on a machine with an NVIDIA GPU after scripts/setup_vllm.sh")
    from rlharness.engine.vllm import vllm_device

    if vllm_device() != "cuda":
        raise NoGPU("the vLLM installed here is the CPU build: run scripts/setup_vllm.sh on this GPU machine "
                    "(it installs vLLM's CUDA build when nvidia-smi answers)")
    import transformers
    import vllm

    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "gpus": torch.cuda.device_count(), "cuda": torch.version.cuda, "torch": torch.__version__,
            "vllm": vllm.__version__, "transformers": transformers.__version__, "python": platform.python_version()}


def arithmetic_prompts(tokenizer, count: int, seed: int) -> list[tuple[list[int], int]]:
    """(chat prompt ids, answer): smollm2_arith's kind of question."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        messages = [{"role": "user", "content": f"What is {a} + {b}? Give only the final number."}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append((tokenizer.encode(text, add_special_tokens=False), a + b))  # as the run's task data
    return out


class Check:
    """The state the phases share (one event loop: vLLM's output handler lives in it).

    `gpu=False` runs the phases on vLLM's CPU build, as tests/scripts/test_gpu_check.py rehearses them:
    without sleep mode, the trainer on the CPU, the broadcast group over gloo; `main` always checks a GPU."""

    def __init__(self, args: argparse.Namespace, gpu: bool = True) -> None:
        from rlharness.config.schema import AlgoConf, ModelConf
        from rlharness.model.load import load_tokenizer

        self.args, self.gpu = args, gpu
        self.loop = asyncio.new_event_loop()
        self.model = ModelConf(path=str(args.model), dtype="bfloat16")
        self.algo = AlgoConf(name="grpo", lr=args.lr, micro_batch_size=args.samples * 4)
        self.tokenizer = load_tokenizer(self.model)
        self.prompts = arithmetic_prompts(self.tokenizer, args.prompts, seed=0)
        self.engine: Any = None
        self.trainer: Any = None
        self.groups: list = []
        self.version = 0
        self.encoder: Any = None
        self.member: Any = None
        self.scorer: Any = None
        self.trainer_device = "cpu"

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    # ------------------------------------------------------------------ vLLM
    def start_vllm(self) -> dict[str, Any]:
        import torch

        from rlharness.config.schema import VLLMEngineConf
        from rlharness.engine import build_engine

        if self.gpu and torch.cuda.device_count() == 1:  # see the module docstring: NCCL on one GPU
            os.environ["NCCL_HOSTID"] = "rlharness-engine"  # inherited by vLLM's processes
        conf = VLLMEngineConf(sleep_mode=self.gpu, gpu_memory_utilization=self.args.gpu_memory_utilization,
                              weight_delta="on", sync_timeout_s=120.0)

        async def build():
            return build_engine(conf, self.model, seed=0)

        self.engine = self.run(build())
        return {"sleep_mode": conf.sleep_mode, "gpu_memory_utilization": conf.gpu_memory_utilization}

    def rollout(self, version: int, prompts: int | None = None) -> tuple[list, dict[str, Any]]:
        """The first `prompts` prompts (all) `--samples` times at temperature 1: groups of RolloutStates, and
        the phase's numbers."""
        from rlharness.core.types import Group, RolloutState, Status
        from rlharness.engine.base import GenerateRequest, SamplingParams

        sampling = SamplingParams(temperature=1.0, max_tokens=self.args.max_tokens)
        chosen = self.prompts[:prompts]
        requests = [GenerateRequest(f"{p}-{s}", ids, sampling, seed=1000 * p + s)
                    for p, (ids, _) in enumerate(chosen) for s in range(self.args.samples)]

        async def generate():
            return await asyncio.gather(*(self.engine.generate(r) for r in requests))

        t0 = time.perf_counter()
        results = self.run(generate())
        seconds = time.perf_counter() - t0
        groups = []
        for p, (ids, answer) in enumerate(chosen):
            group = []
            for s in range(self.args.samples):
                r = results[p * self.args.samples + s]
                correct = r.text.strip().split()[-1:] == [str(answer)]
                # A small bonus for brevity: every group gets a signal, so each step changes the weights.
                score = float(correct) + 0.1 * (1 - len(r.token_ids) / self.args.max_tokens)
                group.append(RolloutState(
                    uid=f"{p}-{s}", group_id=str(p), task="arith", prompt_index=p, epoch=0, prompt_text="",
                    prompt_ids=ids, response_ids=list(r.token_ids), response_logprobs=list(r.logprobs),
                    response_model_steps=list(r.model_steps), reward={"score": score},
                    status=Status.COMPLETED, finish_reason=r.finish_reason))
            groups.append(Group.from_samples(group))
        tokens = sum(len(r.token_ids) for r in results)
        assert all(set(r.model_steps) <= {version} for r in results), "tokens stamped with another version"
        return groups, {"requests": len(requests), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
                        "rollout_s": round(seconds, 3),
                        "reward_mean": sum(s.reward["score"] for g in groups for s in g) / len(requests)}

    def first_rollout(self) -> dict[str, Any]:
        self.groups, stats = self.rollout(version=0)
        return stats

    def sleep(self) -> dict[str, Any]:
        import torch

        free_before = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        self.run(self.engine.sleep())
        slept_s = time.perf_counter() - t0
        freed = torch.cuda.mem_get_info()[0] - free_before
        if freed <= 0:
            raise RuntimeError(f"vLLM's sleep freed no GPU memory (free before {free_before / 2**30:.2f} GiB)")
        return {"freed_gib": round(freed / 2**30, 2), "sleep_s": round(slept_s, 3)}

    # ------------------------------------------------------------------ trainer
    def batch(self, groups: list, train_step: int):
        from rlharness.trainer.batch import build_train_batch

        return build_train_batch(groups, self.algo, pad_token_id=self.tokenizer.pad_token_id, train_step=train_step,
                                 max_response_len=self.args.max_tokens, temperature=1.0)[0]

    def train(self) -> dict[str, Any]:
        from rlharness.backend import build_backend
        from rlharness.config.schema import TorchBackendConf

        device = self.trainer_device = self.training_device()
        t0 = time.perf_counter()
        self.trainer = build_backend(TorchBackendConf(device=device), self.model, self.algo, total_steps=10,
                                     seed=0)
        start_s = time.perf_counter() - t0
        batch = self.batch(self.groups, train_step=1)
        tokens = int(batch.attention_mask.sum())
        steps, seconds, first = [], 0.0, None
        for _ in range(self.args.train_steps):
            self.synchronize()
            t0 = time.perf_counter()
            metrics = self.run(self.trainer.train_step(batch))
            self.synchronize()
            seconds += time.perf_counter() - t0
            first = first or metrics
            steps.append({k: metrics[k] for k in ("train/loss", "train/grad_norm", "train/entropy",
                                                  "perf/padding_frac")})
        return {"device": device, "trainer_start_s": round(start_s, 3), "rows": int(batch.input_ids.shape[0]),
                # backend.packing's default: packed rows where the attention keeps samples apart (on CUDA too)
                "packed_rows": bool(getattr(self.trainer, "packing", False)),
                "tokens_per_step": tokens, "train_tokens_per_s": round(tokens * len(steps) / seconds, 1),
                "step_s": round(seconds / len(steps), 3),
                # The bfloat16 gap: vLLM's log-probs of its own tokens against the trainer's recomputation
                # (mean and max |diff| per response token, before any update).
                "logprob_gap_bf16_mean": first["train/logprob_diff_rollout"],
                "logprob_gap_bf16_max": first["train/logprob_diff_rollout_max"], "steps": steps}

    def training_device(self) -> str:
        """Where the trainer runs: the second GPU where there is one (vLLM holds the first), else the first."""
        import torch

        if not self.gpu:
            return "cpu"
        return "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"

    def synchronize(self) -> None:
        import torch

        if self.gpu:
            torch.cuda.synchronize()

    def gap_now(self, groups: list) -> float:
        """vLLM's log-probs of its tokens (the rollout's) against the trainer's current weights', mean |diff|
        per response token (a bfloat16 copy of the trainer's weights scores them, one row at a time)."""
        import torch
        from transformers import AutoModelForCausalLM

        from rlharness.algo.losses import token_logprobs

        if self.scorer is None:
            self.scorer = AutoModelForCausalLM.from_pretrained(str(self.args.model), dtype=torch.bfloat16).to(
                self.trainer_device).eval()
        self.scorer.load_state_dict(self._weights(), strict=False)  # a tied head is named once
        total = count = 0.0
        with torch.no_grad():
            for s in (s for g in groups for s in g):
                ids = torch.tensor([s.prompt_ids + s.response_ids], device=self.trainer_device)
                lp = token_logprobs(self.scorer(input_ids=ids).logits.float(), ids, 1.0)[0, len(s.prompt_ids):]
                total += float((lp.cpu() - torch.tensor(s.response_logprobs)).abs().sum())
                count += len(s.response_ids)
        return total / max(count, 1)

    # ------------------------------------------------------------------ weight syncs
    def _weights(self):
        from rlharness.distributed.weight_channel import weights_to_send

        return self.run(weights_to_send(self.trainer))

    def _step_and_encode(self, full: bool) -> dict:
        self.run(self.trainer.train_step(self.batch(self.groups, train_step=self.version + 1)))
        return self.encoder.encode(self._weights(), full)

    def group_sync(self) -> dict[str, Any]:
        """The disaggregated route: a broadcast group of this process (rank 0) and vLLM's worker; NCCL on
        the GPU (gloo where `gpu=False`)."""
        import torch

        from rlharness.engine.vllm import free_port
        from rlharness.weights.delta import WeightEncoding
        from rlharness.weights.transfer import WeightGroupMember, state_bytes

        backend = "nccl" if self.gpu else "gloo"
        one_gpu = self.gpu and torch.cuda.device_count() == 1
        if one_gpu:
            os.environ["NCCL_HOSTID"] = "rlharness-trainer"  # this process's NCCL: another "host" than vLLM's
        if self.gpu:
            torch.cuda.set_device(torch.device(self.trainer_device))
        self.encoder = WeightEncoding("bfloat16", delta=True).encoder()
        port, timeout_s = free_port(), 120.0
        box: dict[str, Any] = {}
        joiner = threading.Thread(target=lambda: box.setdefault(
            "m", WeightGroupMember(backend, "127.0.0.1", port, 0, 2, timeout_s)))
        joiner.start()
        self.run(self.engine.join_weight_group(backend, "127.0.0.1", port, 1, 2, timeout_s))
        joiner.join(timeout_s)
        self.member = box["m"]
        out: dict[str, Any] = {"backend": backend, "one_gpu_via_nccl_hostid": one_gpu}
        for kind in ("full", "delta"):
            payload = self._step_and_encode(full=kind == "full")
            self.version += 1
            probe, _ = self.rollout(self.version - 1, PROBE_PROMPTS)  # the engine is a step behind the trainer
            before = self.gap_now(probe)
            t0 = time.perf_counter()
            sender = threading.Thread(target=self.member.send, args=(payload, self.version))
            sender.start()
            self.run(self.engine.receive_weights(self.version))
            sender.join(timeout_s)
            seconds = time.perf_counter() - t0
            self.encoder.commit(self.version)
            probe, _ = self.rollout(self.version, PROBE_PROMPTS)
            after = self.gap_now(probe)
            out[kind] = {"bytes": state_bytes(payload), "s": round(seconds, 3),
                         "gb_per_s": round(state_bytes(payload) / seconds / 1e9, 3),
                         "gap_before_sync": before, "gap_after_sync": after}
        out["delta_share_of_full"] = round(out["delta"]["bytes"] / out["full"]["bytes"], 4)
        if not out["delta"]["gap_after_sync"] < out["delta"]["gap_before_sync"]:
            raise RuntimeError(f"after the delta sync vLLM's log-probs are no closer to the trainer's: {out}")
        return out

    def colocated_sync(self) -> dict[str, Any]:
        from rlharness.weights.delta import WeightEncoding
        from rlharness.weights.transfer import state_bytes

        # vLLM's own local gloo group (engine.weight_sync=collective), formed by the first load: its worker
        # leaves the NCCL group and starts a new shadow, so the first sync is full.
        encoder = WeightEncoding("bfloat16", delta=True).encoder()  # the local group's worker shadow is new
        self.run(self.engine.sleep())  # as a colocated step: train while vLLM sleeps, the load wakes it (GPU)
        out = {}
        for kind in ("full", "delta"):
            self.run(self.trainer.train_step(self.batch(self.groups, train_step=self.version + 1)))
            payload = encoder.encode(self._weights(), full=kind == "full")
            self.version += 1
            t0 = time.perf_counter()
            self.run(self.engine.load_weights(payload, self.version))
            encoder.commit(self.version)
            out[kind] = {"bytes": state_bytes(payload), "s": round(time.perf_counter() - t0, 3)}
        probe, stats = self.rollout(self.version, PROBE_PROMPTS)
        out["gap_after_sync"] = self.gap_now(probe)
        out["rollout_tokens_per_s_after"] = stats["tokens_per_s"]
        return out

    # ------------------------------------------------------------------ packed rows
    def packing_attentions(self) -> list[str]:
        """The attention implementations the trainer can train with on this device (eager, sdpa and, on a GPU,
        flex_attention; flash_attention_2 with the flash-attn package)."""
        from rlharness.model.attention import attention_problem

        device = "cuda" if self.gpu else "cpu"
        return [a for a in ("eager", "sdpa", "flex_attention", "flash_attention_2")
                if attention_problem(a, "backend.device", device, trains=True, generates=False) is None]

    def packing_sizes(self) -> dict[str, list[tuple[int, int]]]:
        """(prompt, response) lengths to train on: the `rollout` phase's samples (where it ran), lognormal ones."""
        from packed_rows import PROMPT_LEN, lengths_for

        rows = self.args.prompts * self.args.samples
        sizes = {"lognormal": [(PROMPT_LEN, n) for n in lengths_for(rows, 96.0, 384, seed=0)]}
        if self.groups:
            sizes["rollout"] = [(len(s.prompt_ids), max(1, len(s.response_ids))) for g in self.groups for s in g]
        return sizes

    def packed_rows(self, attention: str, sizes: list[tuple[int, int]]) -> dict[str, Any]:
        from packed_rows import measure_layouts

        from rlharness.config.schema import ModelConf

        device = self.training_device()
        model = ModelConf(path=str(self.args.model), dtype="bfloat16" if self.gpu else "float32",
                          attn_implementation=attention)
        budget = max(self.args.packed_budget, max(p + n for p, n in sizes))
        out = measure_layouts(model, sizes, budget, steps=self.args.packed_steps, seed=0, device=device)
        self.free_memory()
        return out

    def free_memory(self) -> None:
        """Drop the sync phases' trainer and scorer (and what a packed-rows phase left): the next phase has
        the device to itself."""
        import gc

        self.trainer = self.scorer = None
        gc.collect()
        if self.gpu:
            import torch

            torch.cuda.empty_cache()

    def close(self) -> None:
        if self.member is not None:
            self.member.close()
            self.member = None
        if self.engine is not None:
            self.run(self.engine.close())
            self.engine = None


def packing_summary(phases: dict[str, Any]) -> dict[str, Any]:
    """Per lengths: the best packed training tokens/s over the best padded, and which attention gave each."""
    out: dict[str, Any] = {}
    for name, result in phases.items():
        if not name.startswith("packed_rows_") or "configs" not in result:
            continue
        lengths = name.rsplit("_", 1)[1]
        entry = out.setdefault(lengths, {})
        for layout, numbers in result["configs"].items():
            if numbers["tokens_per_s"] > entry.get(layout, {}).get("tokens_per_s", 0):
                entry[layout] = {"attention": result["attn"], "tokens_per_s": round(numbers["tokens_per_s"], 1),
                                 "padding_frac": round(numbers["padding_frac"], 4)}
    for entry in out.values():
        if "packed" in entry and "padded" in entry:
            entry["packed_over_padded"] = round(entry["packed"]["tokens_per_s"] / entry["padded"]["tokens_per_s"], 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu_check.json")
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--train-steps", type=int, default=3)
    # Large enough that one step moves the log-probs past bfloat16's rounding gap: a sync that did not
    # arrive shows (smollm2_arith trains at 1e-5).
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    # Packed against padded micro-batches: tokens per micro-batch, and measured steps per layout (median).
    parser.add_argument("--packed-budget", type=int, default=8192)
    parser.add_argument("--packed-steps", type=int, default=2)
    args = parser.parse_args()
    report = Report(args.out)
    try:
        report.data["machine"] = require_gpu()
    except NoGPU as exc:
        fail_line(str(exc))
        report.data["errors"]["gpu"] = str(exc)
        report.write()
        return 1
    if not (args.model / "config.json").is_file():
        fail_line(f"{args.model} holds no model: run scripts/fetch_smollm2.sh")
        return 1
    check = Check(args)
    try:
        if report.phase("vllm_start", check.start_vllm) and report.phase("rollout", check.first_rollout):
            report.phase("sleep", check.sleep)
            if report.phase("trainer", check.train):
                report.phase("nccl_sync", check.group_sync)
                report.phase("colocated_sync", check.colocated_sync)
    finally:
        check.close()
    check.free_memory()  # the packed-rows phases train alone on the GPU
    for lengths, sizes in check.packing_sizes().items():
        for attention in check.packing_attentions():
            report.phase(f"packed_rows_{attention}_{lengths}",
                         lambda attention=attention, sizes=sizes: check.packed_rows(attention, sizes))
    report.data["packing"] = packing_summary(report.data["phases"])
    report.write()
    failed = list(report.data["errors"])
    print(f"gpu_check: {'OK' if not failed else 'FAILED phases: ' + ', '.join(failed)}; wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":  # vLLM spawns its engine process
    sys.exit(main())
