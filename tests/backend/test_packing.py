"""Packed rows (rlharness/backend/packing.py): the layout, the bin packing, and a real model's packed
forward against its padded one: the same logits at every token, and no sample sees another."""

from __future__ import annotations

import logging
import math
import random

import pytest
import torch

from rlharness.backend.learner import Learner
from rlharness.backend.packing import (PackedRows, choose_capacity, first_fit_decreasing, honours_packing, next_fit,
                                       packed_budget_slices, packing_cost, row_width)
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


def test_packed_budget_slices_group_whole_rows_of_one_width():
    rows, lengths = torch.arange(10, 20), torch.tensor([50, 10, 40, 30, 20, 5, 60, 15, 25, 45])
    groups, oversized = packed_budget_slices(rows, lengths, 120, capacity=60)
    assert sorted(torch.cat(groups).tolist()) == rows.tolist() and oversized == 0
    # 300 tokens in rows of 60: 60 | 50 10 | 45 15 | 40 20 | 30 25 5, two rows (120 tokens) per micro-batch
    packed = [next_fit([int(lengths[i - 10]) for i in g], 60) for g in groups]
    assert [len(p) for p in packed] == [2, 2, 1]
    assert packed_budget_slices(rows[:1], torch.tensor([120]), 100, capacity=120)[1] == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rows_narrower_than_the_longest_sample_put_each_longer_sample_in_a_row_of_its_own(seed):
    lengths = _lengths(seed, rows=48)
    ids, mask = _padded(lengths, 50, seed)
    rows, capacity, budget = torch.arange(len(lengths)), sorted(lengths)[len(lengths) // 2], 3 * max(lengths)
    groups, oversized = packed_budget_slices(rows, torch.tensor(lengths), budget, capacity)
    assert sorted(torch.cat(groups).tolist()) == rows.tolist() and oversized == 0
    widths = []
    for g in groups:
        sizes = [lengths[int(i)] for i in g]
        packed = PackedRows.pack(ids[g], mask[g], capacity, in_order=True)
        widths.append(packed.input_ids.shape[1])
        assert widths[-1] == row_width(sizes, capacity)  # the capacity, or a longer sample's own length
        assert packed.input_ids.numel() <= budget  # the micro-batch within the token budget
        assert torch.equal(packed.unpack(packed.input_ids[..., None])[..., 0] * mask[g], ids[g])
        # A sample longer than the capacity shares its row with nothing.
        for r in range(packed.input_ids.shape[0]):
            in_row = [b for b in range(len(g)) if (packed.index[b][packed.index[b] >= 0] // widths[-1] == r).any()]
            assert len(in_row) == 1 or all(sizes[b] <= capacity for b in in_row)
    assert widths == sorted(widths, reverse=True) and widths[0] == max(lengths) > capacity


def test_the_capacity_trades_padding_against_attention():
    lengths = _lengths(4, rows=64)
    budget = 4 * max(lengths)
    # Flash attention's variable-length path: no cost for width, so the least padding (rows of the budget).
    assert choose_capacity(lengths, budget, math.inf) >= max(lengths)
    # Dense attention that costs as much as the rest at 40 tokens: narrower rows than the longest sample.
    narrow = choose_capacity(lengths, budget, 40.0)
    assert narrow < max(lengths)
    assert packing_cost(lengths, budget, narrow, 40.0) < packing_cost(lengths, budget, max(lengths), 40.0)
    assert choose_capacity(lengths, None, 40.0) == max(lengths)  # micro_batch_size's path: the longest


def test_next_fit_gives_first_fit_decreasing_bins_back():
    lengths = _lengths(3, rows=40)
    bins = first_fit_decreasing(lengths, max(lengths))
    order = [i for b in bins for i in b]
    assert [[order[i] for i in b] for b in next_fit([lengths[i] for i in order], max(lengths))] == bins


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_mini_batch_is_bin_packed_with_less_padding_than_per_micro_batch_rows(seed):
    """Rows of one width over the whole mini-batch leave less padding than packing each token-budget
    micro-batch into rows as wide as its own longest sample; every sample placed once, no row too wide."""
    lengths = _lengths(seed, rows=64)
    ids, mask = _padded(lengths, 50, seed)
    rows, width, budget = torch.arange(len(lengths)), max(lengths), 4 * max(lengths)
    per_micro_batch = [PackedRows.pack(ids[torch.tensor(g)], mask[torch.tensor(g)])
                       for g in first_fit_decreasing(lengths, budget)]  # the layout before
    groups, _ = packed_budget_slices(rows, torch.tensor(lengths), budget, width)
    whole = [PackedRows.pack(ids[g], mask[g], width, in_order=True) for g in groups]
    assert sorted(torch.cat(groups).tolist()) == rows.tolist()
    assert all(p.input_ids.shape[1] == width and p.input_ids.numel() <= budget for p in whole)
    for g, p in zip(groups, whole):  # each sample's tokens exactly once, in its own place
        assert torch.equal(p.unpack(p.input_ids[..., None])[..., 0] * mask[g], ids[g])
    assert sum(p.padding for p in whole) < sum(p.padding for p in per_micro_batch)
    assert len(first_fit_decreasing(lengths, width)) == sum(p.input_ids.shape[0] for p in whole)


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
@pytest.mark.parametrize("budget,narrow", [(None, False), (60, False), (60, True)])
def test_packed_training_is_the_padded_computation(tiny_model_dir, budget, narrow):
    """Log-probs, entropy, KL to the reference model, loss and gradients: to 1e-5 (float32). `narrow`:
    rows of the median sample's length, so the longer samples are rows of their own."""
    algo = AlgoConf(name="grpo", lr=1e-3, micro_batch_size=5, kl_coef=0.05, entropy_coef=0.01)
    batch = _multi_turn_batch(algo, seed=5)
    assert (batch.response_mask.diff(dim=-1) > 0).sum(-1).max() >= 1  # a response resumes after a tool span
    padded, packed = _learner(tiny_model_dir, algo, False, budget), _learner(tiny_model_dir, algo, None, budget)
    assert packed.packing and not padded.packing
    if narrow:
        median = int(batch.attention_mask.sum(-1).median())
        packed._packed_capacity = lambda *_: median
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
