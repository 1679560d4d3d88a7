"""Packed rows (rlharness/backend/packing.py): the layout, the bin packing, and a real model's packed
forward against its padded one: the same logits at every token, and no sample sees another."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from rlharness.backend.learner import Learner
from rlharness.backend.micro_batches import token_budget_slices
from rlharness.backend.packing import (PackedRows, first_fit_decreasing, honours_packing, next_fit,
                                       packed_budget_slices, row_width)
from rlharness.config.schema import AlgoConf, ConfigError, CriticConf, ModelConf, TorchBackendConf

SMOLLM2 = "assets/smollm2-135m-instruct"


def _padded(lengths: list[int], vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, vocab, (n,), generator=g)
        mask[i, :n] = 1
    return ids, mask


def _lengths(seed: int, rows: int = 9) -> list[int]:
    rng = random.Random(seed)
    return [max(1, int(rng.lognormvariate(2.5, 0.8))) for _ in range(rows)]  # a long tail


def test_first_fit_decreasing_fills_bins_and_keeps_every_item_once():
    lengths = [7, 3, 5, 2, 2, 8, 1]
    bins = first_fit_decreasing(lengths, 8)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 8 for b in bins)
    assert len(bins) == 4  # 29 tokens in bins of 8: the fewest possible
    assert first_fit_decreasing([9, 1], 8) == [[0], [1]]  # too long: alone


def test_packed_budget_slices_fill_the_padded_rows_padding():
    rows, lengths = torch.arange(10, 20), torch.tensor([50, 10, 40, 30, 20, 5, 60, 15, 25, 45])
    groups, oversized = packed_budget_slices(rows, lengths, 120)
    assert sorted(torch.cat(groups).tolist()) == rows.tolist() and oversized == 0
    # Padded: 60 50 | 45 40 | 30 25 20 15 | 10 5, 350 tokens computed. Packed: the same micro-batches but
    # the last, whose samples fill the others' padding (10 after 50, 5 after 40): 330 tokens computed.
    sizes = [[int(lengths[i - 10]) for i in g] for g in groups]
    assert sizes == [[60, 50, 10], [45, 40, 5], [30, 25, 20, 15]]
    assert [len(next_fit(s, row_width(s, 0))) for s in sizes] == [2, 2, 4]
    assert packed_budget_slices(rows[:1], torch.tensor([120]), 100)[1] == 1


@pytest.mark.parametrize("seed", range(20))
def test_packed_micro_batches_compute_no_more_than_padded_ones(seed):
    """Each sample once, every micro-batch within the budget (or one row), and against the padded rows'
    token-budget micro-batches: no more tokens computed, no more attention scores (rows x width^2)."""
    lengths = _lengths(seed, rows=8 + 8 * (seed % 8))
    budget = (2 + seed % 5) * max(lengths) // 2
    rows = torch.arange(len(lengths))
    groups, _ = packed_budget_slices(rows, torch.tensor(lengths), budget)
    assert sorted(torch.cat(groups).tolist()) == rows.tolist()
    padded, _ = token_budget_slices(rows, torch.tensor(lengths), budget)
    cost = {"packed": [0, 0], "padded": [0, 0]}
    for name, plan in (("packed", groups), ("padded", padded)):
        for g in plan:
            sizes = [lengths[int(i)] for i in g]
            width = row_width(sizes, 0)
            n_rows = len(next_fit(sizes, width)) if name == "packed" else len(g)
            assert n_rows * width <= budget or n_rows == 1
            cost[name][0] += n_rows * width
            cost[name][1] += n_rows * width ** 2
    assert cost["packed"][0] <= cost["padded"][0] and cost["packed"][1] <= cost["padded"][1]


def test_flash_attention_packs_one_row_of_the_budget_per_micro_batch():
    lengths = _lengths(4, rows=64)
    budget = 4 * max(lengths)
    ids, mask = _padded(lengths, 50, 4)
    groups, _ = packed_budget_slices(torch.arange(64), torch.tensor(lengths), budget, min_width=budget)
    for g in groups:
        packed = PackedRows.pack(ids[g], mask[g], budget, in_order=True)
        assert packed.input_ids.shape == (1, budget)
        assert torch.equal(packed.unpack(packed.input_ids[..., None])[..., 0] * mask[g], ids[g])
    assert len(groups) == -(-sum(lengths) // budget)  # as few rows as the tokens need, here


def test_next_fit_gives_first_fit_decreasing_bins_back():
    lengths = _lengths(3, rows=40)
    bins = first_fit_decreasing(lengths, max(lengths))
    order = [i for b in bins for i in b]
    assert [[order[i] for i in b] for b in next_fit([lengths[i] for i in order], max(lengths))] == bins


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_layout_round_trips(seed):
    lengths = _lengths(seed)
    ids, mask = _padded(lengths, 50, seed)
    packed = PackedRows.pack(ids, mask)
    assert packed.input_ids.shape[1] == max(lengths)
    assert torch.equal(packed.unpack(packed.input_ids[..., None])[..., 0] * mask, ids)
    assert packed.padding == packed.input_ids.numel() - sum(lengths)
    assert packed.padding < (mask == 0).sum()  # less padding than the padded rows
    # Every sample's positions start at 0, as in its own row.
    assert torch.equal(packed.unpack(packed.position_ids[..., None])[..., 0] * mask,
                       (mask.cumsum(-1) - 1).clamp(min=0) * mask)


def _model(path: str, attn: str, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=dtype).eval()


def _models(tiny_model_dir):
    from pathlib import Path

    paths = [tiny_model_dir] + ([SMOLLM2] if (Path(SMOLLM2) / "config.json").is_file() else [])
    return [(p, attn) for p in paths for attn in ("eager", "sdpa")]


@pytest.mark.timeout(600)
def test_a_packed_forward_gives_each_sample_its_own_rows_logits(tiny_model_dir):
    for path, attn in _models(tiny_model_dir):
        model = _model(path, attn)
        lengths = _lengths(3, rows=6)
        ids, mask = _padded(lengths, model.config.vocab_size, 3)
        packed = PackedRows.pack(ids, mask)
        positions = mask[:, 1:].bool()  # every real token that has a successor
        with torch.no_grad():
            padded = model(input_ids=ids, attention_mask=mask).logits[:, :-1][positions]
            ours = packed.rows_at(model(**packed.forward_inputs()).logits, positions)
        assert (ours - padded).abs().max() < 1e-5 * max(1.0, float(padded.abs().max())), (path, attn)


@pytest.mark.timeout(600)
def test_two_packed_samples_cannot_see_each_other(tiny_model_dir):
    """Change one sample of a packed row: every other sample's log-probs stay what they were."""
    for path, attn in _models(tiny_model_dir):
        model = _model(path, attn)
        ids, mask = _padded([6, 9, 4], model.config.vocab_size, 7)
        changed = ids.clone()
        changed[0, :6] = (changed[0, :6] + 1) % model.config.vocab_size  # the first sample, every token
        outs = []
        for rows in (ids, changed):
            packed = PackedRows.pack(rows, mask, width=19)  # all three in one row
            assert packed.input_ids.shape[0] == 1
            with torch.no_grad():
                outs.append(torch.log_softmax(packed.unpack(model(**packed.forward_inputs()).logits), -1))
        assert torch.equal(outs[0][1:], outs[1][1:]), (path, attn)  # the others: bit for bit
        assert not torch.allclose(outs[0][0], outs[1][0])  # the changed one did change


def _register_whole_row_attention() -> str:
    """A custom attention (transformers' AttentionInterface) that attends causally across the whole row."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def whole_row(module, query, key, value, attention_mask, **kwargs):
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)

    AttentionInterface.register("whole_row_causal", whole_row)
    AttentionMaskInterface.register("whole_row_causal", sdpa_mask)
    return "whole_row_causal"


def test_an_attention_that_ignores_the_samples_bounds_is_caught(tiny_model_dir):
    whole_row = _register_whole_row_attention()
    for attn, honoured in (("eager", True), ("sdpa", True), (whole_row, False)):
        model = _model(tiny_model_dir, attn)
        assert honours_packing(model, model.config.vocab_size, "cpu") is honoured, attn


# ----------------------------------------------------------------------------- the learner on packed rows
def _multi_turn_batch(algo: AlgoConf, seed: int, groups: int = 4, k: int = 4):
    """Groups of mixed prompt and response lengths (a long tail), some responses with tool-output spans
    (loss mask 0 inside the response: a multi-turn sample)."""
    from rlharness.core.types import Group, RolloutState, Status
    from rlharness.trainer.batch import build_train_batch

    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(4, 24) for _ in range(rng.randint(3, 12))]
        samples = []
        for i in range(k):
            n = min(40, max(1, int(rng.lognormvariate(2.0, 0.9))))
            mask = [1] * n
            if n > 6 and rng.random() < 0.5:  # a tool's output in the middle: no loss there
                start = rng.randrange(1, n - 3)
                mask[start:start + 3] = [0, 0, 0]
            samples.append(RolloutState(
                uid=f"{g}-{i}", group_id=str(g), task="t", prompt_index=g, epoch=0, prompt_text="",
                prompt_ids=list(prompt), response_ids=[rng.randrange(4, 24) for _ in range(n)],
                response_mask=mask, response_logprobs=[-rng.uniform(2.0, 4.0) for _ in range(n)],
                response_model_steps=[0] * n, reward={"score": float(rng.random() < 0.5)},
                status=Status.COMPLETED, finish_reason="stop"))
        out.append(Group.from_samples(samples))
    return build_train_batch(out, algo, pad_token_id=0, train_step=1, max_response_len=40, temperature=1.0)[0]


def _learner(model_dir: str, algo: AlgoConf, packing: bool | None, budget: int | None = None, attn: str = "eager"):
    return Learner(TorchBackendConf(packing=packing, micro_batch_tokens=budget),
                   ModelConf(path=model_dir, attn_implementation=attn), algo, total_steps=10, seed=0)


def _same_gradients(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        if q.grad is not None:
            assert float((p.grad - q.grad).abs().max()) <= 1e-5 * float(q.grad.abs().max()) + 1e-12, name


@pytest.mark.timeout(600)
@pytest.mark.parametrize("budget,one_row", [(None, False), (60, False), (60, True)])
def test_packed_training_is_the_padded_computation(tiny_model_dir, budget, one_row):
    """Log-probs, entropy, KL to the reference model, loss and gradients: to 1e-5 (float32). `one_row`:
    micro-batches of one row of the budget, the layout flash-attention gets (here with eager attention)."""
    algo = AlgoConf(name="grpo", lr=1e-3, micro_batch_size=5, kl_coef=0.05, entropy_coef=0.01)
    batch = _multi_turn_batch(algo, seed=5)
    assert (batch.response_mask.diff(dim=-1) > 0).sum(-1).max() >= 1  # a response resumes after a tool span
    padded, packed = _learner(tiny_model_dir, algo, False, budget), _learner(tiny_model_dir, algo, None, budget)
    assert packed.packing and not padded.packing
    if one_row:
        packed._packed_min_width = lambda: budget
    rows = packed._rows({"input_ids": batch.input_ids, "attention_mask": batch.attention_mask},
                        torch.arange(batch.input_ids.shape[0]))
    assert rows["packed"].input_ids.numel() < batch.input_ids.numel()  # less padding computed
    tensors = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
               "response_mask": batch.response_mask.float()}
    for a, b in ((padded._logprobs_no_grad(tensors, 1.0), packed._logprobs_no_grad(tensors, 1.0)),
                 (padded._per_token_no_grad(tensors, lambda mb: padded._reference_scores(mb, 1.0)),
                  packed._per_token_no_grad(tensors, lambda mb: packed._reference_scores(mb, 1.0)))):
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())
    want, got = padded.train_step_blocking(batch), packed.train_step_blocking(batch)
    for key in ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/grad_norm",
                "train/response_tokens"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    _same_gradients(packed.model, padded.model)
    if budget is None:  # the same rows per micro-batch: packed computes less padding
        assert 0 <= got["perf/padding_frac"] < want["perf/padding_frac"]


@pytest.mark.timeout(600)
def test_the_critic_trains_on_packed_rows_as_on_padded_ones(tiny_model_dir):
    algo = AlgoConf(name="ppo", advantage="gae", lr=1e-3, micro_batch_size=6, critic=CriticConf(lr=1e-3))
    batch = _multi_turn_batch(algo, seed=6)
    padded, packed = _learner(tiny_model_dir, algo, False), _learner(tiny_model_dir, algo, True)
    want, got = padded.train_step_blocking(batch), packed.train_step_blocking(batch)
    for key in ("critic/values_mean", "critic/returns_mean", "critic/value_loss", "critic/grad_norm",
                "train/loss", "train/grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    _same_gradients(packed.critic.module, padded.critic.module)


def test_packing_an_attention_that_ignores_the_bounds_is_refused_or_falls_back(tiny_model_dir, caplog):
    whole_row = _register_whole_row_attention()
    algo = AlgoConf(name="grpo")
    with pytest.raises(ConfigError, match=rf"^backend.packing=true is not allowed: model {tiny_model_dir} with "
                                          rf"model.attn_implementation={whole_row} lets packed samples attend"):
        _learner(tiny_model_dir, algo, True, attn=whole_row)
    with caplog.at_level(logging.WARNING):
        assert not _learner(tiny_model_dir, algo, None, attn=whole_row).packing
    assert caplog.text.count("backend.packing: model") == 1
