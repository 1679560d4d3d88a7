"""`backend=deepspeed`: DeepSpeed ZeRO (stages 0-3) across several training processes on Ray actors.

Each process (`DeepSpeedWorker`, one rank) is a `TorchBackend` whose model is the
DeepSpeed engine: the step logic (old log-probs, mini/micro-batches, the clipped
loss with TIS/KL/entropy, the metrics) is the torch backend's, unchanged. What
differs is confined to its hooks:
- every rank gets the whole batch and trains on its share of each mini-batch's samples
  (equal row counts, token counts balanced by Karmarkar-Karp: `rank_balance.py`; or rows
  rank, rank + W, ... with `balance_ranks=false`), in micro-batches of `micro_batch_size`
  rows or `micro_batch_tokens` tokens; the loss denominator is still the whole mini-batch's,
  and the loss is multiplied by W because DeepSpeed averages gradients over ranks,
  so the update equals the single-process one;
- each mini-batch is padded (zero mask, zero advantage rows) to a multiple of W so
  every rank runs the same number of forward/backward passes (ZeRO-3 gathers
  parameters collectively in each);
- `engine.backward` / `engine.step` (unmanaged gradient accumulation: reduction,
  clipping and the AdamW step at `step`), metric sums all-reduced across ranks.

With `algo.advantage=gae` (algo=ppo) each rank also holds the critic as a DeepSpeed engine of its
own (rlharness/backend/deepspeed_critic.py: own AdamW at `algo.critic.lr`, own clip, the policy's
ZeRO stage). Its values are computed at train time on each rank's share of the rows and summed
across ranks (like the old log-probs), so every rank runs GAE and the whitening on the whole
batch as backend=torch does; the value loss is split like the policy loss, and its sums are
all-reduced with the others, so critic/* equal backend=torch's.

The optimizer is a plain `torch.optim.AdamW` (DeepSpeed's fused CPU Adam costs an
80 s JIT compile). On CPU the gloo backend is used, and DeepSpeed's shared-memory
all-reduce op (only used by inference all-reduce; ~45 s JIT compile at the first
`init_distributed`) is marked unavailable so it is never built; JIT extensions that
are built go to a stable `TORCH_EXTENSIONS_DIR` (~/.cache/rlharness/torch_extensions).

Checkpoints: `save(dir)` writes DeepSpeed's checkpoint under `dir/deepspeed/` (every
rank) and a Hugging Face copy of the policy in `dir/` from rank 0 (ZeRO-3 parameters
gathered first), so the same `resume=` path as `backend=torch` works and `dir` loads
as a model; the critic's under `dir/critic/deepspeed/` and a copy of its weights in
`dir/critic/critic.safetensors`, backend=torch's name. `get_weights()` returns the full
state dict from rank 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from datetime import timedelta
from pathlib import Path

import torch

from rlharness.model import lora
from rlharness.core.checkpoint import check_state_files, writing
from rlharness.backend.lr_plan import LRPlan, planned
from rlharness.backend.rank_balance import imbalance, rank_micro_slices, rank_shares
from rlharness.backend.deepspeed_engine import (DS_SUBDIR, DS_TAG, all_ranks, deepspeed_state_classes, ds_config,
                                               step_engine)
from rlharness.backend.torch_backend import (CRITIC_DIR, TorchBackend, _Sums, all_finite, needs_reference,
                                             require_finite_weights)
from rlharness.config.schema import AlgoConf, DeepSpeedBackendConf, ModelConf
from rlharness.model.load import load_model, load_tokenizer
from rlharness.core.types import TrainBatch
from rlharness.weights.transfer import tied_once

log = logging.getLogger(__name__)

def torch_extensions_dir() -> str:
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "rlharness" / "torch_extensions")


def worker_env(device: str) -> dict[str, str]:
    """Environment a DeepSpeed worker process needs before `import deepspeed`."""
    return {"DS_ACCELERATOR": "cpu" if device == "cpu" else "cuda",
            "TORCH_EXTENSIONS_DIR": torch_extensions_dir()}


def _skip_shm_comm_build() -> None:
    """Training never uses DeepSpeed's CPU shm all-reduce (torch.distributed/gloo does the work)."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def pad_plan(rows: int, world_size: int, mini_batches: int,
             lengths: torch.Tensor | None = None) -> tuple[list[int] | None, list[float]]:
    """Which row each padded row copies (None: no padding needed) and whether it is a real row.

    A padding row copies its mini-batch's shortest row (by `lengths`; the first row without them):
    it trains nothing but still costs a forward and backward pass."""
    chunks = torch.tensor_split(torch.arange(rows), mini_batches)
    size = math.ceil(max(len(c) for c in chunks) / world_size) * world_size
    if all(len(c) == size for c in chunks):
        return None, [1.0] * rows
    index, real = [], []
    for c in chunks:
        copy = 0 if lengths is None or not len(c) else int(c[torch.argmin(lengths[c])])
        index += c.tolist() + [copy] * (size - len(c))
        real += [1.0] * len(c) + [0.0] * (size - len(c))
    return index, real


def pad_rows(batch: TrainBatch, world_size: int, mini_batches: int) -> TrainBatch:
    """Pad every mini-batch (TorchBackend's `tensor_split` of the rows) to the same multiple of `world_size`.

    Padding rows copy the mini-batch's shortest row but train nothing (mask and advantage 0), and
    sit inside the mini-batch they pad, so each mini-batch holds the same real rows as without padding.
    """
    index, real = pad_plan(batch.input_ids.shape[0], world_size, mini_batches, batch.attention_mask.sum(-1))
    if index is None:
        return batch
    index_t = torch.tensor(index)
    keep = torch.tensor(real).unsqueeze(1)

    def take(t: torch.Tensor, zero_pads: bool) -> torch.Tensor:
        out = t[index_t]
        return out * keep.to(out.dtype) if zero_pads else out

    return dataclasses.replace(
        batch, input_ids=take(batch.input_ids, False), attention_mask=take(batch.attention_mask, False),
        response_mask=take(batch.response_mask, True), advantages=take(batch.advantages, True),
        rollout_logprobs=take(batch.rollout_logprobs, False), model_steps=take(batch.model_steps, False),
        # gae: a padding row's score lands on no token (its mask is 0)
        scores=None if batch.scores is None else batch.scores[index_t])


class DeepSpeedWorker(TorchBackend):
    """One rank. Built inside a Ray actor with the rendezvous address of rank 0."""

    def __init__(self, conf: DeepSpeedBackendConf, model_conf: ModelConf, algo: AlgoConf, total_steps: int,
                 seed: int, *, rank: int, world_size: int, master_addr: str, master_port: int,
                 timeout_s: float = 600.0) -> None:
        on_cpu = conf.device == "cpu"
        os.environ.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "RANK": str(rank),
                           "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank if on_cpu else 0),
                           **worker_env(conf.device)})
        import deepspeed

        if on_cpu:
            _skip_shm_comm_build()
        deepspeed.init_distributed(dist_backend="gloo" if on_cpu else "nccl", auto_mpi_discovery=False,
                                   timeout=timedelta(seconds=timeout_s), verbose=False)
        self.conf, self.algo, self.total_steps = conf, algo, total_steps
        self.rank, self.world_size = rank, world_size
        self._warned_oversized = False
        self.device = torch.device("cpu" if on_cpu else "cuda")
        torch.manual_seed(seed)
        self.tokenizer = load_tokenizer(model_conf)
        self.model = load_model(model_conf, device=str(self.device))
        self._setup_lora(model_conf.lora, gradient_checkpointing=conf.gradient_checkpointing)  # LoRA: a PeftModel
        model = self.model
        if conf.gradient_checkpointing:  # before deepspeed.initialize wraps the module
            model.gradient_checkpointing_enable()
        model.train()
        self.ref_model = None
        if needs_reference(algo) and self.peft_model is None:
            self.ref_model = load_model(model_conf, device=str(self.device)).eval()
            self.ref_model.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=algo.lr,
            betas=(algo.adam_beta1, algo.adam_beta2), weight_decay=algo.weight_decay, fused=False)
        # Stepped once per training step, as in TorchBackend (DeepSpeed would step it per update).
        self.lr_plan = LRPlan(total_steps)  # re-planned when a resume changes total_steps (lr_plan.py)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: planned(step, self.lr_plan,
                                                                                                 self.algo))
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=self.optimizer,
                                                    config=ds_config(conf, algo, model_conf))
        self.model = self.engine
        self._check_head_split()  # for the reference model, and the policy below ZeRO-3
        self.critic = self._build_critic(model_conf, seed) if algo.advantage == "gae" else None
        log.info("deepspeed rank %d/%d up (ZeRO-%d, %s)", rank, world_size, conf.zero_stage,
                 "gloo" if on_cpu else "nccl")

    # ------------------------------------------------------------------ TorchBackend hooks
    def train_step_blocking(self, batch: TrainBatch) -> dict[str, float]:
        padded = pad_rows(batch, self.world_size, self.algo.mini_batches)
        out = super().train_step_blocking(padded)
        _, real = pad_plan(batch.input_ids.shape[0], self.world_size, self.algo.mini_batches)
        self.last_row_gaps = [g for g, r in zip(self.last_row_gaps, real) if r]  # the batch's own rows
        out["perf/rank_token_imbalance"] = self._rank_token_imbalance(padded.attention_mask.sum(-1))
        return out

    def _rank_token_imbalance(self, lengths: torch.Tensor) -> float:
        """max/mean over ranks of the tokens (padding rows included) each trains per epoch."""
        tokens = [0.0] * self.world_size
        for mini in torch.tensor_split(torch.arange(lengths.numel()), self.algo.mini_batches):
            if mini.numel():
                for r, share in enumerate(rank_shares(lengths[mini], self.world_size, self.conf.balance_ranks)):
                    tokens[r] += float(lengths[mini][share].sum())
        return imbalance(tokens)

    def _build_critic(self, model_conf: ModelConf, seed: int):
        from rlharness.backend.deepspeed_critic import DeepSpeedCritic

        return DeepSpeedCritic(self.algo.critic, model_conf, self.algo, self.conf, seed, self.world_size,
                               str(self.device))

    def _per_token_no_grad(self, batch: dict[str, torch.Tensor], fn) -> torch.Tensor:
        """Every row's (old log-probs, reference log-probs, the critic's values): each rank scores its share
        of the whole batch (zeros elsewhere), and a mini-batch's balanced shares are not the whole batch's,
        so the ranks' parts are summed."""
        out = super()._per_token_no_grad(batch, fn)
        torch.distributed.all_reduce(out)
        return out

    def _micro_slices(self, rows: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """This rank's micro-batches of `rows` (a multiple of W: padded); every rank gets as many."""
        lengths = attention_mask[rows].sum(-1)
        per_rank, oversized = rank_micro_slices(rows, lengths, self.world_size, balance=self.conf.balance_ranks,
                                                micro_batch_size=self.algo.micro_batch_size,
                                                budget=self.conf.micro_batch_tokens)
        self._warn_oversized(oversized, int(lengths.max()))
        return per_rank[self.rank]

    def _hf_model(self, model):
        return self.engine.module if model is self.engine else model

    def _final_hidden(self, model, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Through the engine's forward (its backward bookkeeping hooks on the outputs), no logits."""
        if model is not self.engine:
            return super()._final_hidden(model, ids, attn)
        out = self.engine(input_ids=ids, attention_mask=attn, use_cache=False, output_hidden_states=True,
                          logits_to_keep=torch.zeros(0, dtype=torch.long, device=ids.device))
        return out.hidden_states[-1]

    def _score_rows(self, model, ids: torch.Tensor, attn: torch.Tensor, positions: torch.Tensor):
        """ZeRO-3 gathers the head's weight collectively at every call of the head, and ranks hold
        different numbers of response tokens (so of chunks): there the model projects the response
        positions itself, in its one head call, and only the log-softmax is chunked."""
        if model is not self.engine or self.conf.zero_stage != 3:
            return super()._score_rows(model, ids, attn, positions)
        keep = torch.nn.functional.pad(positions, (0, 1))  # [B, T]: hidden state t - 1 scores token t
        return self.engine(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=keep).logits, None

    async def probe_longest(self, rows: int, prompt_tokens: int, response_tokens: int) -> None:
        return None  # DeepSpeed's engine steps its own (ZeRO) optimizer: not probed

    def _backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss * self.world_size, scale_wrt_gas=False)

    def _optimizer_step(self, train_step: int) -> torch.Tensor:
        norm, self._update_skipped = step_engine(self.engine, self.conf.zero_stage, f"train_step {train_step}")
        return norm

    def weights_finite(self) -> bool:
        """Every rank's parameters finite (ZeRO-3: each rank's own partition, `ds_tensor`)."""
        return all_ranks(all_finite([getattr(p, "ds_tensor", p) for p in self.engine.module.parameters()]))

    def _reduce_sums(self, sums: _Sums) -> None:
        same_everywhere = {"updates", "grad_norm", "skipped_updates", "critic_grad_norm", "critic_updates",
                           "micro_batches"}
        keys = sorted(k for k in sums.v if k not in same_everywhere)
        values = torch.tensor([sums.v[k] for k in keys], dtype=torch.float64)
        torch.distributed.all_reduce(values)
        sums.v.update(zip(keys, values.tolist()))
        worst = torch.tensor([sums.maxes.get("abs_diff_max", 0.0)], dtype=torch.float64)
        torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MAX)
        sums.maxes["abs_diff_max"] = float(worst)
        torch.distributed.all_reduce(self._row_gap)  # each rank filled its own rows, zeros elsewhere

    # ------------------------------------------------------------------ weights and state
    def _gathered(self):
        if self.conf.zero_stage == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=None)
        return contextlib.nullcontext()

    def get_weights_blocking(self) -> dict[str, torch.Tensor] | None:
        """The full state dict on rank 0, None elsewhere (every rank must call: ZeRO-3 gathers)."""
        with self._gathered():
            if self.rank != 0:
                return None
            if self.peft_model is not None:  # only what changed (model.lora.sync)
                return self._lora_sync.weights(self.peft_model)
            return {k: v.detach().to("cpu", copy=True) for k, v in tied_once(self.engine.module.state_dict().items()).items()}

    def critic_weights_blocking(self) -> dict[str, torch.Tensor] | None:
        """The critic's full state dict on rank 0, None elsewhere (every rank must call: ZeRO-3 gathers)."""
        return self.critic.weights(self.rank)

    def save_blocking(self, directory: str) -> None:
        require_finite_weights(self.weights_finite(), directory)  # every rank: a collective
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        lora_on = self.peft_model is not None
        with writing(out / DS_SUBDIR):
            self.engine.save_checkpoint(str(out / DS_SUBDIR), tag=DS_TAG, save_latest=False, client_state={
                "scheduler": self.scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
                "lr_plan": self.lr_plan.state_dict()}, exclude_frozen_parameters=lora_on)  # LoRA: no copy of the base
        if self.critic is not None:
            self.critic.save(out / CRITIC_DIR, self.rank)
        if lora_on:
            if self.rank == 0:  # the adapter in PEFT's format, as backend=torch writes it
                with self._gathered():
                    lora.save_adapter(self.peft_model, out)
                self.tokenizer.save_pretrained(out)
            torch.distributed.barrier()
            return
        state = self.get_weights_blocking()
        if self.rank == 0:
            with writing(out / "model.safetensors"):
                self.engine.module.save_pretrained(out, state_dict=state)
            with writing(out / "tokenizer.json"):
                self.tokenizer.save_pretrained(out)
        torch.distributed.barrier()

    def load_blocking(self, directory: str) -> None:
        src = Path(directory) / DS_SUBDIR
        if not (src / DS_TAG).is_dir():
            raise FileNotFoundError(f"backend checkpoint {directory}: {DS_SUBDIR}/{DS_TAG}/ is missing "
                                    f"(not written by backend=deepspeed?)")
        # DeepSpeed's checkpoint engine unpickles with weights_only=False: read every file
        # with the data-only loader first, so a crafted file is refused before it can run.
        check_state_files(src, allow=deepspeed_state_classes())
        lora.check_resume(directory, self.lora_conf, lora.targets_of(self.peft_model))
        path, client = self.engine.load_checkpoint(str(src), tag=DS_TAG, load_optimizer_states=True,
                                                   load_lr_scheduler_states=False,
                                                   load_module_strict=self.peft_model is None)
        if path is None:
            raise RuntimeError(f"deepspeed could not load the checkpoint in {src}")
        if self.critic is not None:
            self.critic.load(Path(directory) / CRITIC_DIR)
        self.scheduler.load_state_dict(client["scheduler"])
        self.restore_lr_plan(client.get("lr_plan"))
        torch.set_rng_state(client["torch_rng"])

