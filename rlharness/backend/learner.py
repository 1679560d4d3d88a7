"""The learner: the loss loop of every training backend, over the model runners of one (runner.py).

backend=torch, deepspeed and fsdp2 differ only in their `ModelRunner` (how a model runs, steps,
reduces and saves: torch_runner.py, deepspeed_runner.py, fsdp2_runner.py); everything else is here,
once. One `train_step(batch)`:
1. old log-probs of every response token under the current policy (no grad): the
   policy loss (`algo.policy_loss`) takes its ratio against them, and the off-policy
   correction (`algo.tis_*`, `algo.rejection*`) weighs each token by how far they are
   from the engine's rollout log-probs. With one optimizer step per training
   step (ppo_epochs = mini_batches = 1) they equal the detached log-probs of the
   training forward, so that forward is reused instead of run twice. These are the
   proximal policy of the decoupled objective (`algo.proximal`, `losses.proximal_logprobs`):
   `loglinear` approximates them from the tokens' versions instead, `behaviour` uses the
   rollout's log-probs (the coupled objective).
2. for each of `ppo_epochs` x `mini_batches` (contiguous slices, no shuffling):
   micro-batches of `micro_batch_size` samples (or, with `backend.micro_batch_tokens`, rows
   grouped longest first within that many tokens), gradient accumulation with the loss
   divided by the *mini-batch's* token/sequence count (so gradients do not depend on
   how the rows are split), gradient clipping, one AdamW step. Log-probs and entropy are
   computed for response tokens only, chunk by chunk (`rlharness/backend/token_scores.py`).
3. one LR-scheduler step (warmup and decay are counted in training steps).

With several ranks (backend=deepspeed, fsdp2: one learner per rank, each on its own Ray actor)
every rank gets the whole batch and trains its share of each mini-batch (rank_balance.py: equal
row counts, token counts balanced; each mini-batch padded with rows that train nothing to a
multiple of the ranks, so every rank runs as many forward/backward passes); the loss keeps the
whole mini-batch's denominator and the runners sum the ranks' gradients, so the update equals the
one-process one. Per-token passes without gradient (old and reference log-probs, the critic's
values) score each rank's share and are summed across ranks; metric sums are all-reduced.

With `algo.advantage=gae` (algo=ppo) the learner also trains the critic (rlharness/backend/critic.py,
on a runner of its own): before step 2 it computes the critic's values of the batch's response
tokens, the token rewards (the score on each row's last token, minus `algo.kl_reward_coef` x the
old-vs-reference log-prob), GAE and the returns (rlharness/algo/gae.py), and whitens the advantages
over the batch; in step 2 every mini-batch also takes one critic update (clipped value loss, token
mean), before the policy's. During `algo.critic.warmup_steps` only the critic updates.

The heavy work runs inline in the async methods; the caller decides the thread. The
`*_blocking` methods are the same work for callers that run it in a thread or actor.
"""

from __future__ import annotations

import asyncio
import logging
import math
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch

from rlharness.algo.gae import (clipped_value_loss, explained_variance, gae_advantages, last_token_rewards,
                                masked_mean, masked_whiten)
from rlharness.algo.losses import (aggregate_loss, compute_policy_loss, kl_penalty, loss_denominator, masked,
                                   proximal_logprobs, rejection_mask, tis_weights)
from rlharness.backend import critic as critic_files
from rlharness.backend.base import TrainingBackend
from rlharness.backend.critic import value_model
from rlharness.backend.lr_plan import LRPlan, apply_optimizer_settings, planned, replan
from rlharness.backend.packing import VARLEN_ATTENTION, PackedRows, computed_ids, honours_packing
from rlharness.backend.probe import probe_micro_batch
from rlharness.backend.policy_files import read_policy, write_policy
from rlharness.backend.rank_balance import (imbalance, micro_slices, pad_plan, pad_rows, rank_micro_slices,
                                            rank_shares)
from rlharness.backend.runner import ModelRunner, Runners, adamw
from rlharness.backend.token_scores import head_reproduces_logits, response_token_scores
from rlharness.config.schema import AlgoConf, ConfigError, ModelConf, TorchBackendConf
from rlharness.core.types import TrainBatch
from rlharness.model import lora
from rlharness.model.load import load_model, load_tokenizer
from rlharness.weights.transfer import weight_checksums

log = logging.getLogger(__name__)

STATE_FILE = "backend_state.pt"
CRITIC_DIR = "critic"


class Sums:
    """Token- and step-weighted running sums for the step's metrics."""

    def __init__(self) -> None:
        self.v: dict[str, float] = {}
        self.maxes: dict[str, float] = {}

    def add(self, key: str, value: float | torch.Tensor) -> None:
        self.v[key] = self.v.get(key, 0.0) + float(value)

    def max(self, key: str, value: float | torch.Tensor) -> None:
        self.maxes[key] = max(self.maxes.get(key, 0.0), float(value))

    def ratio(self, num: str, den: str) -> float:
        d = self.v.get(den, 0.0)
        return self.v.get(num, 0.0) / d if d > 0 else 0.0


# Sums that are the same on every rank (counted per update, not per row): not summed across ranks.
SAME_ON_EVERY_RANK = frozenset({"updates", "grad_norm", "skipped_updates", "critic_grad_norm", "critic_updates",
                                "micro_batches"})


class NonFiniteWeights(RuntimeError):
    """The policy holds a NaN or inf weight: nothing may be saved or sent to the engines."""


def require_finite_weights(finite: bool, directory: str) -> None:
    if not finite:
        raise NonFiniteWeights(f"not writing the checkpoint {directory}: the policy's weights are non-finite "
                               f"(NaN or inf); the previous checkpoint is kept")


def needs_reference(algo: AlgoConf) -> bool:
    """The frozen starting policy is needed: a KL loss, or the KL in the critic's reward (gae)."""
    return algo.kl_coef > 0 or (algo.advantage == "gae" and algo.kl_reward_coef > 0)


class Learner(TrainingBackend):
    """One training process's learner. `runners` says how its models run (default: backend=torch's)."""

    def __init__(self, conf: TorchBackendConf, model_conf: ModelConf, algo: AlgoConf, total_steps: int, seed: int,
                 runners: Runners | None = None) -> None:
        if runners is None:
            from rlharness.backend.torch_runner import torch_runners

            runners = torch_runners(conf)
        self.conf, self.algo, self.total_steps = conf, algo, total_steps
        self.ranks, self.device = runners.ranks, runners.device
        self._updates_done = 0  # optimizer updates so far in the current training step (proximal policy)
        self._warned_oversized = False
        torch.manual_seed(seed)
        self.tokenizer = load_tokenizer(model_conf)
        model = load_model(model_conf, device=str(self.device))
        self.lora_conf = model_conf.lora
        self.peft_model = None  # model.lora.rank > 0: the policy is a PeftModel (only adapters train)
        if self.lora_conf.enabled:
            model = self.peft_model = lora.wrap(model, self.lora_conf, conf.gradient_checkpointing)
            self._lora_sync = lora.WeightSync(self.lora_conf)
        if conf.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        model.train()
        # The KL's frozen reference is the starting policy (with LoRA: the policy with its adapters off).
        self.reference: ModelRunner | None = None
        if needs_reference(algo) and self.peft_model is None:
            reference = load_model(model_conf, device=str(self.device)).eval()
            self.reference = runners.make(reference.requires_grad_(False))
        self.policy = runners.make(model, adamw(algo.lr, (algo.adam_beta1, algo.adam_beta2), algo.weight_decay),
                                   algo.grad_clip)
        # Project only response positions (hidden states -> lm_head) where that gives the model's logits.
        self.head_split = head_reproduces_logits(self.policy)
        self.packing = self._packing_honoured(conf.packing, model_conf)
        self.attn_implementation = model_conf.attn_implementation
        self.lr_plan = LRPlan(total_steps)  # re-planned when a resume changes total_steps (lr_plan.py)
        self.critic: ModelRunner | None = None  # algo.advantage=gae's value model
        if algo.advantage == "gae":
            c = algo.critic
            self.critic = runners.make(value_model(c, model_conf, str(self.device), seed),
                                       adamw(c.lr, (algo.adam_beta1, algo.adam_beta2), c.weight_decay), c.grad_clip)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.policy.optimizer,
                                                           lambda step: planned(step, self.lr_plan, self.algo))

    def _packing_honoured(self, wanted: bool | None, model_conf: ModelConf) -> bool:
        """`backend.packing` resolved: whether micro-batches train as packed rows (packing.py). Probed on the
        policy (eval mode: no dropout draw); the reference and the critic share its attention implementation."""
        if wanted is False:
            return False
        was_training = self.model.training
        self.model.eval()
        try:
            ok = honours_packing(self.policy.forward, int(self.model.config.get_text_config().vocab_size),
                                 self.device)
        finally:
            self.model.train(was_training)
        if ok:
            log.info("backend.packing: micro-batches train as packed rows")
            return True
        what = (f"model {model_conf.path} with model.attn_implementation={model_conf.attn_implementation} lets "
                f"packed samples attend to each other")
        if wanted:
            raise ConfigError(f"backend.packing=true is not allowed: {what}; use backend.packing=false (or null: "
                              f"packed where the attention allows it)")
        log.warning("backend.packing: %s; training on padded rows", what)
        return False

    @property
    def model(self) -> torch.nn.Module:
        """The policy (a transformers model, or a PeftModel with LoRA)."""
        return self.policy.module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.policy.optimizer

    # ------------------------------------------------------------------ async interface
    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        # In a worker thread: in disaggregated runs the producer keeps going meanwhile.
        return await asyncio.to_thread(self.train_step_blocking, batch)

    async def get_weights(self) -> dict[str, Any]:
        return self.get_weights_blocking()

    async def save(self, directory: str) -> None:
        self.save_blocking(directory)

    async def load(self, directory: str) -> None:
        self.load_blocking(directory)

    async def probe_longest(self, rows: int, prompt_tokens: int, response_tokens: int) -> dict[str, Any] | None:
        if not self.policy.probes:
            return None  # a runner whose engine steps its own optimizer (DeepSpeed's ZeRO, FSDP2's shards)
        return await asyncio.to_thread(probe_micro_batch, self, rows, prompt_tokens, response_tokens, Sums())

    # ------------------------------------------------------------------ token scores
    def _token_scores(self, runner: ModelRunner, mb: dict[str, torch.Tensor], temperature: float,
                      entropy: str) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T] log-probs and entropy of the response tokens (0 elsewhere), chunk by chunk."""
        ids, attn, packed = mb["input_ids"], mb["attention_mask"], mb.get("packed")
        return response_token_scores(lambda positions: runner.response_rows(ids, attn, positions, self.head_split,
                                                                            packed),
                                     ids, mb["response_mask"], temperature=temperature, entropy=entropy,
                                     chunk_tokens=self.conf.logprob_chunk_tokens)

    def _reference_scores(self, mb: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
        """The KL term's reference log-probs: the frozen copy, or with LoRA the policy with its adapters off."""
        if self.peft_model is None:
            return self._token_scores(self.reference, mb, temperature, "none")[0]
        with lora.reference(self.peft_model):
            return self._token_scores(self.policy, mb, temperature, "none")[0]

    def _rows(self, batch: dict[str, torch.Tensor], idx: torch.Tensor,
              packed_min_width: int | None = None) -> dict[str, Any]:
        """Select rows and trim the right padding they all share (less compute per micro-batch); with
        packing, also their packed layout (`packed`, where it has fewer rows), which the models run on:
        rows as wide as the longest sample (or `packed_min_width`, if wider) filled in `idx`'s order (as
        `_micro_slices` planned them), or by default first-fit decreasing."""
        width = int(batch["attention_mask"][idx].sum(-1).max().item())
        mb: dict[str, Any] = {k: v[idx, :max(width, 1)] for k, v in batch.items()}
        packed = (PackedRows.pack_if_denser(mb["input_ids"], mb["attention_mask"], packed_min_width,
                                            in_order=packed_min_width is not None) if self.packing else None)
        if packed is not None:
            mb["packed"] = packed
        return mb

    def _micro_batches(self, batch: dict[str, torch.Tensor],
                       rows: torch.Tensor) -> Iterator[tuple[torch.Tensor, dict[str, Any]]]:
        """This rank's micro-batches of `rows` (`_micro_slices`): their indices and their rows (`_rows`)."""
        for idx in self._micro_slices(rows, batch["attention_mask"]):
            yield idx, self._rows(batch, idx, self._packed_min_width())

    def _packed_min_width(self) -> int | None:
        """Packed rows' least width (`packing.packed_micro_batches`): the token budget where the attention
        computes only each sample's own scores, else 0; None: no packing."""
        if not self.packing:
            return None
        budget = self.conf.micro_batch_tokens
        return budget if budget is not None and self.attn_implementation in VARLEN_ATTENTION else 0

    @torch.no_grad()
    def _per_token_no_grad(self, batch: dict[str, torch.Tensor], fn) -> torch.Tensor:
        """[B, T]: `fn(micro-batch)` ([b, t] per token) over the whole batch, micro-batch by micro-batch.
        With several ranks each scores its share (zeros elsewhere; a mini-batch's balanced shares are not
        the whole batch's) and the ranks' parts are summed."""
        out = torch.zeros_like(batch["response_mask"])
        for idx, mb in self._micro_batches(batch, torch.arange(batch["input_ids"].shape[0])):
            out[idx, : mb["input_ids"].shape[1]] = fn(mb)
        self.ranks.sum_(out)
        return out

    def _logprobs_no_grad(self, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
        return self._per_token_no_grad(batch, lambda mb: self._token_scores(self.policy, mb, temperature, "none")[0])

    # ------------------------------------------------------------------ micro-batches
    def _micro_slices(self, rows: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """This rank's micro-batches of `rows`: `algo.micro_batch_size` rows, or `backend.micro_batch_tokens`;
        with several ranks, its balanced share (`rows`: a multiple of the ranks), as many as every rank's."""
        budget = self.conf.micro_batch_tokens
        lengths = attention_mask[rows].sum(-1)
        min_width = self._packed_min_width()
        if self.ranks.world_size > 1:
            per_rank, oversized = rank_micro_slices(rows, lengths, self.ranks.world_size,
                                                    balance=self.conf.balance_ranks,
                                                    micro_batch_size=self.algo.micro_batch_size, budget=budget,
                                                    packed_min_width=min_width)
            slices = per_rank[self.ranks.rank]
        else:
            slices, oversized = micro_slices(rows, lengths, self.algo.micro_batch_size, budget, min_width)
        if oversized and not self._warned_oversized:
            self._warned_oversized = True  # once per run: the row still trains, alone in its micro-batch
            log.warning("backend.micro_batch_tokens=%d is below the longest row (%d tokens): such rows train "
                        "alone in their micro-batch", budget, int(lengths.max()))
        return slices

    def _rank_token_imbalance(self, lengths: torch.Tensor) -> float:
        """max/mean over ranks of the tokens (padding rows included) each trains per epoch."""
        tokens = [0.0] * self.ranks.world_size
        for mini in torch.tensor_split(torch.arange(lengths.numel()), self.algo.mini_batches):
            if mini.numel():
                for r, share in enumerate(rank_shares(lengths[mini], self.ranks.world_size, self.conf.balance_ranks)):
                    tokens[r] += float(lengths[mini][share].sum())
        return imbalance(tokens)

    # ------------------------------------------------------------------ training
    def train_step_blocking(self, batch: TrainBatch) -> dict[str, float]:
        world = self.ranks.world_size
        if world == 1:
            return self._train(batch)
        padded = pad_rows(batch, world, self.algo.mini_batches)
        metrics = self._train(padded)
        _, real = pad_plan(batch.input_ids.shape[0], world, self.algo.mini_batches)
        self.last_row_gaps = [g for g, r in zip(self.last_row_gaps, real) if r]  # the batch's own rows
        metrics["perf/rank_token_imbalance"] = self._rank_token_imbalance(padded.attention_mask.sum(-1))
        return metrics

    def _train(self, batch: TrainBatch) -> dict[str, float]:
        algo = self.algo
        tensors = {
            "input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
            "response_mask": batch.response_mask.float(), "advantages": batch.advantages.float(),
            "rollout_logprobs": batch.rollout_logprobs.float(), "model_steps": batch.model_steps,
        }
        tensors = {k: v.to(self.device) for k, v in tensors.items()}
        num_rows = tensors["input_ids"].shape[0]
        if int(tensors["response_mask"].sum()) == 0:
            raise ValueError(f"train_step {batch.train_step}: the batch has no response tokens to train on")
        max_len = batch.max_response_len or int(tensors["response_mask"].sum(-1).max())
        updates = algo.ppo_epochs * algo.mini_batches
        if updates > 1 and algo.proximal == "recompute":
            tensors["old_logprobs"] = self._logprobs_no_grad(tensors, batch.temperature)
        critic_metrics = self._gae_advantages(tensors, batch) if self.critic is not None else {}
        # algo.critic.warmup_steps: the first steps train the critic only.
        train_policy = self.critic is None or batch.train_step > algo.critic.warmup_steps
        self._updates_done = 0
        lr = self.policy.optimizer.param_groups[0]["lr"]
        # Mean |engine - trainer| log-prob per row (first epoch): which groups an on-policy gap comes from.
        self._row_gap = torch.zeros(num_rows, dtype=torch.float64)

        sums = Sums()
        for epoch in range(algo.ppo_epochs):
            for mini in torch.tensor_split(torch.arange(num_rows), algo.mini_batches):
                if mini.numel() == 0:
                    continue
                if self.critic is not None:
                    self._critic_update(tensors, mini, sums)
                if train_policy:
                    self._policy_update(tensors, mini, batch, sums, epoch, max_len, updates)
        with warnings.catch_warnings():  # critic warmup: the schedule counts a step without a policy update
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()
        self._reduce_sums(sums)
        self.last_row_gaps = self._row_gap.tolist()
        return {
            "train/loss": sums.ratio("loss", "updates"),
            "train/pg_loss": sums.ratio("pg_loss", "updates"),
            "train/kl": sums.ratio("kl_sum", "tokens"),
            "train/entropy": sums.ratio("entropy_sum", "tokens"),
            "train/grad_norm": sums.ratio("grad_norm", "updates"),
            "train/clip_frac": sums.ratio("clipped_sum", "tokens"),
            "train/lr": lr,
            "train/tis_ratio_mean": sums.ratio("ratio_sum", "tis_tokens"),
            "train/tis_truncated_frac": sums.ratio("truncated_sum", "tis_tokens"),
            "train/logprob_diff_rollout": sums.ratio("abs_diff_sum", "tis_tokens"),
            "train/logprob_diff_rollout_max": sums.maxes.get("abs_diff_max", 0.0),
            "train/rejected_frac": sums.ratio("rejected_sum", "tis_tokens"),
            "train/num_updates": sums.v.get("updates", 0.0),
            # Forward/backward passes of this rank over the step (all epochs and mini-batches): explain's count.
            "train/micro_batches": sums.v.get("micro_batches", 0.0),
            # Updates not applied because the loss or gradient was non-finite (the trainer counts the step).
            "train/skipped_updates": sums.v.get("skipped_updates", 0.0),
            # 0 when an applied update left a NaN/inf weight (a finite but far too high LR): the run stops.
            "train/weights_finite": float(self.weights_finite()),
            "train/response_tokens": float(tensors["response_mask"].sum()),
            "perf/padding_frac": 1.0 - sums.ratio("sample_tokens", "computed_tokens") if train_policy else 0.0,
            **critic_metrics, **self._critic_step_metrics(sums),
        }

    def _policy_update(self, tensors: dict[str, torch.Tensor], mini: torch.Tensor, batch: TrainBatch, sums: Sums,
                       epoch: int, max_len: int, updates: int) -> None:
        """One optimizer step of the policy on a mini-batch, micro-batch by micro-batch."""
        den = loss_denominator(tensors["response_mask"][mini], self.algo.loss_agg)
        self.policy.zero_grad()
        step_loss = step_pg = 0.0
        for idx, mb in self._micro_batches(tensors, mini):
            mb["rows"] = idx
            loss, pg = self._micro_step(mb, batch.temperature, den, max_len, sums, first_epoch=epoch == 0,
                                        train_step=batch.train_step, updates=updates)
            sums.add("computed_tokens", computed_ids(mb).numel())
            sums.add("sample_tokens", mb["attention_mask"].sum())
            step_loss += loss
            step_pg += pg
            sums.add("micro_batches", 1)
        grad_norm, skipped = self.policy.step(f"train_step {batch.train_step}")
        self._updates_done += 1
        sums.add("skipped_updates", float(skipped))
        sums.add("grad_norm", grad_norm)
        sums.add("loss", step_loss)
        sums.add("pg_loss", step_pg)
        sums.add("updates", 1)

    def _micro_step(self, mb: dict[str, torch.Tensor], temperature: float, denominator: float, max_len: int,
                    sums: Sums, first_epoch: bool, train_step: int = 0, updates: int = 1) -> tuple[float, float]:
        """Forward + backward of one micro-batch; returns its share of (loss, pg_loss)."""
        algo, mask = self.algo, mb["response_mask"]
        logprobs, entropy = self._token_scores(self.policy, mb, temperature,
                                               "grad" if algo.entropy_coef > 0 else "detached")
        # The proximal policy: the clip is taken against it, the TIS weight is its ratio to the rollout's.
        old = proximal_logprobs(algo.proximal, current=logprobs, behaviour=mb["rollout_logprobs"],
                                model_steps=mb["model_steps"], train_step=train_step,
                                updates_done=self._updates_done, updates_per_step=updates,
                                start_of_step=mb.get("old_logprobs"))

        # Off-policy correction (rollout vs trainer log-probs): a detached per-token weight.
        weights, tis = tis_weights(old, mb["rollout_logprobs"], mask, algo.tis_cap, algo.tis_level)
        if algo.rejection != "none":
            keep, rejected = rejection_mask(old, mb["rollout_logprobs"], mask, algo.rejection_low,
                                            algo.rejection_high, algo.rejection)
            weights = weights * keep
            tis.update(rejected)
        pg_tok, clipped = compute_policy_loss(logprobs, old, mb["advantages"], mask, algo)
        pg_tok = pg_tok * weights
        loss_tok = pg_tok
        if algo.kl_coef > 0:
            with torch.no_grad():
                ref_lp = self._reference_scores(mb, temperature)
            kl_tok = kl_penalty(logprobs, ref_lp, algo.kl_estimator, algo.kl_clamp)
            loss_tok = loss_tok + algo.kl_coef * kl_tok
            sums.add("kl_sum", masked(kl_tok.detach(), mask).sum())
        if algo.entropy_coef > 0:
            loss_tok = loss_tok - algo.entropy_coef * entropy
            entropy = entropy.detach()

        loss = aggregate_loss(loss_tok, mask, algo.loss_agg, max_response_len=max_len, denominator=denominator)
        self.policy.backward(loss)
        with torch.no_grad():
            pg = aggregate_loss(pg_tok.detach(), mask, algo.loss_agg, max_response_len=max_len,
                                denominator=denominator)
        sums.add("entropy_sum", masked(entropy, mask).sum())
        sums.add("clipped_sum", (clipped & (mask > 0)).sum())
        sums.add("tokens", mask.sum())
        if first_epoch:  # every sample is seen once per epoch; measure the mismatch once
            sums.add("ratio_sum", tis["ratio_sum"])
            sums.add("truncated_sum", tis["truncated_sum"])
            sums.add("abs_diff_sum", tis["abs_diff_sum"])
            sums.max("abs_diff_max", tis["abs_diff_max"])
            self._row_gap[mb["rows"]] = tis["row_abs_diff"].double().cpu()
            sums.add("tis_tokens", tis["tokens"])
            sums.add("rejected_sum", tis.get("rejected_sum", 0.0))
        return float(loss.detach()), float(pg)

    def _reduce_sums(self, sums: Sums) -> None:
        """Combine the metric sums (and per-row gaps) of the ranks; alone, nothing to do."""
        if self.ranks.world_size == 1:
            return
        keys = sorted(k for k in sums.v if k not in SAME_ON_EVERY_RANK)
        values = torch.tensor([sums.v[k] for k in keys], dtype=torch.float64)
        self.ranks.sum_(values)
        sums.v.update(zip(keys, values.tolist()))
        worst = torch.tensor([sums.maxes.get("abs_diff_max", 0.0)], dtype=torch.float64)
        self.ranks.max_(worst)
        sums.maxes["abs_diff_max"] = float(worst)
        self.ranks.sum_(self._row_gap)  # each rank filled its own rows, zeros elsewhere

    def weights_finite(self) -> bool:
        """Every parameter finite, on every rank (checked after each step and before any checkpoint is written)."""
        return self.policy.all_finite()

    # ------------------------------------------------------------------ critic (algo.advantage=gae)
    def _values(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """[b, t] values of a micro-batch's response tokens (0 elsewhere)."""
        packed = mb.get("packed")
        if packed is None:
            values = self.critic.forward(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"])
        else:
            values = packed.unpack(self.critic.forward(input_ids=packed.input_ids, attention_mask=None,
                                                       position_ids=packed.position_ids))
        return values * mb["response_mask"]

    @torch.no_grad()
    def _gae_advantages(self, tensors: dict[str, torch.Tensor], batch: TrainBatch) -> dict[str, float]:
        """Values, token rewards, GAE, returns of the whole batch (before any update this step); writes
        tensors["advantages"] (whitened), ["returns"], ["old_values"]; returns the critic's value metrics."""
        algo, mask = self.algo, tensors["response_mask"]
        if batch.scores is None:
            raise ValueError(f"train_step {batch.train_step}: algo.advantage=gae needs the batch's scores")
        values = self._per_token_no_grad(tensors, self._values)
        rewards = last_token_rewards(batch.scores.to(self.device), mask)
        metrics: dict[str, float] = {}
        if algo.kl_reward_coef > 0:  # verl's use_kl_in_reward: k1 of the policy that sampled against the reference
            old = tensors.get("old_logprobs")
            if old is None:
                old = self._logprobs_no_grad(tensors, batch.temperature)
            ref = self._per_token_no_grad(tensors, lambda mb: self._reference_scores(mb, batch.temperature))
            kl = (old - ref) * mask
            rewards = rewards - algo.kl_reward_coef * kl
            metrics["critic/kl_reward"] = float(masked_mean(kl, mask))
        advantages, returns = gae_advantages(rewards, values, mask, algo.gamma, algo.lam)
        tensors["advantages"] = masked_whiten(advantages, mask)
        tensors["returns"], tensors["old_values"] = returns, values
        metrics.update({
            "critic/values_mean": float(masked_mean(values, mask)),
            "critic/returns_mean": float(masked_mean(returns, mask)),
            "critic/advantages_raw_mean": float(masked_mean(advantages, mask)),
            "critic/vf_explained_var": explained_variance(values, returns, mask),
        })
        return metrics

    def _critic_update(self, tensors: dict[str, torch.Tensor], mini: torch.Tensor, sums: Sums) -> None:
        """One critic optimizer step on a mini-batch: clipped value loss, mean over its response tokens."""
        den = float(tensors["response_mask"][mini].sum())
        if den == 0:
            return
        self.critic.zero_grad()
        for _, mb in self._micro_batches(tensors, mini):
            mask = mb["response_mask"]
            loss_tok, clipped = clipped_value_loss(self._values(mb), mb["old_values"], mb["returns"],
                                                   self.algo.critic.cliprange_value)
            loss = (loss_tok * mask).sum() / den
            self.critic.backward(loss)
            sums.add("vf_loss", loss.detach())
            sums.add("vf_clipped", (clipped & (mask > 0)).sum())
            sums.add("vf_tokens", mask.sum())
        sums.add("critic_grad_norm", self.critic.step("critic")[0])
        sums.add("critic_updates", 1)

    def _critic_step_metrics(self, sums: Sums) -> dict[str, float]:
        if self.critic is None:
            return {}
        return {
            "critic/value_loss": sums.ratio("vf_loss", "critic_updates"),
            "critic/vf_clip_frac": sums.ratio("vf_clipped", "vf_tokens"),
            "critic/grad_norm": sums.ratio("critic_grad_norm", "critic_updates"),
            "critic/lr": self.critic.optimizer.param_groups[0]["lr"],
        }

    def critic_weights_blocking(self) -> dict[str, torch.Tensor] | None:
        """The critic's full state dict on rank 0, None elsewhere (every rank calls it)."""
        return self.critic.full_state_dict()

    # ------------------------------------------------------------------ weights and state
    def get_weights_blocking(self) -> dict[str, torch.Tensor] | None:
        """What the engines load (rank 0; None on other ranks, which must call it too: it may gather)."""
        return self._weights(copy=True)

    def weights_to_copy_now(self) -> dict[str, torch.Tensor] | None:
        """`get_weights_blocking` without its snapshot where the weights are whole in this process: the live
        tensors, for a caller that copies them before the next step can change them (`ray.put`; a training
        actor runs one call at a time). Saves one copy of the model per object-store sync. Runners that
        gather their weights (ZeRO-3, FSDP2) and LoRA (only the adapter) copy anyway."""
        return self._weights(copy=False)

    def _weights(self, copy: bool) -> dict[str, torch.Tensor] | None:
        if self.peft_model is None:
            return self.policy.full_state_dict(copy=copy)
        # LoRA: only what changed (model.lora.sync); the whole model's tensors only where they are sent.
        state = self.policy.full_state_dict(copy=False) if self._lora_sync.begin() else None
        with self.policy.gathered():
            return self._lora_sync.weights(self.peft_model, state) if self.ranks.rank == 0 else None

    def weight_checksums(self) -> dict[str, torch.Tensor] | None:
        if self.peft_model is not None or self.ranks.world_size > 1:
            return None
        return weight_checksums(self.policy.module.state_dict())

    def save_blocking(self, directory: str) -> None:
        require_finite_weights(self.weights_finite(), directory)  # every rank: a collective
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.policy.save(out, lambda state: write_policy(self.policy.module, self.tokenizer, state, out,
                                                          adapter=self.peft_model is not None), STATE_FILE, {
            "scheduler": self.scheduler.state_dict(),
            "lr_plan": self.lr_plan.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        })
        if self.critic is not None:
            (out / CRITIC_DIR).mkdir(exist_ok=True)
            self.critic.save(out / CRITIC_DIR, lambda state: critic_files.write_weights(state, out / CRITIC_DIR),
                             critic_files.STATE_FILE, {})

    def load_blocking(self, directory: str) -> None:
        src = Path(directory)
        lora.check_resume(src, self.lora_conf, lora.targets_of(self.peft_model))
        dtype = next(self.policy.module.parameters()).dtype
        state = self.policy.load(src, lambda: read_policy(self.peft_model, src, dtype), STATE_FILE,
                                 strict=self.peft_model is None)
        if self.critic is not None:
            self._load_critic(src / CRITIC_DIR)
        self.scheduler.load_state_dict(state["scheduler"])
        self.restore_lr_plan(state.get("lr_plan"))
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    def _load_critic(self, directory: Path) -> None:
        if not (directory / critic_files.WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"critic checkpoint {directory}: {critic_files.WEIGHTS_FILE} is missing (a "
                                    f"checkpoint of a run without algo.advantage=gae cannot resume with a critic)")
        self.critic.load(directory, lambda: critic_files.read_weights(directory), critic_files.STATE_FILE)
        # The optimizer's LR follows this run's algo.critic.lr (as the policy's follows algo.lr).
        for group in self.critic.optimizer.param_groups:
            group["lr"] = self.algo.critic.lr

    def restore_lr_plan(self, saved: dict[str, Any] | None) -> None:
        """After loading optimizer and scheduler: this run's optimizer settings apply from the resumed
        step (lr_plan.apply_optimizer_settings), and the saved plan continues, re-planned if total_steps
        changed. What changed is logged."""
        optimizer = self.policy.optimizer
        step = self.scheduler.last_epoch
        was_lr = optimizer.param_groups[0]["lr"]
        old_base = self.scheduler.base_lrs[0]
        current = was_lr / old_base if old_base else 1.0  # where the old schedule had got to
        changes = apply_optimizer_settings(optimizer, self.scheduler, self.algo)
        self.lr_plan, message = replan(saved, step, self.total_steps, current, self.algo)
        if message:
            log.info(message)
        lr = self.algo.lr * planned(step, self.lr_plan, self.algo)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if changes or not math.isclose(lr, was_lr, rel_tol=1e-9, abs_tol=0.0):
            log.warning("resumed at step %d with this run's optimizer settings (applied from here on)%s; "
                        "the LR is %.4g (the checkpoint's was %.4g)", step,
                        ": " + "; ".join(changes) if changes else "", lr, was_lr)
