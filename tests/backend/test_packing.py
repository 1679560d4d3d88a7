"""Packed rows (rlharness/backend/packing.py): the layout, the bin packing, and a real model's packed
forward against its padded one: the same logits at every token, and no sample sees another."""

from __future__ import annotations

import random

import pytest
import torch

from rlharness.backend.packing import PackedRows, first_fit_decreasing, honours_packing, packed_budget_slices

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


def test_packed_budget_slices_hold_at_most_the_budget():
    rows, lengths = torch.arange(10, 20), torch.tensor([50, 10, 40, 30, 20, 5, 60, 15, 25, 45])
    groups, oversized = packed_budget_slices(rows, lengths, 100)
    assert sorted(torch.cat(groups).tolist()) == rows.tolist() and oversized == 0
    assert all(int(lengths[g - 10].sum()) <= 100 for g in groups)
    assert len(groups) == 3  # 300 tokens
    assert packed_budget_slices(rows[:1], torch.tensor([120]), 100)[1] == 1


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


def test_an_attention_that_ignores_the_samples_bounds_is_caught(tiny_model_dir):
    """A custom attention (transformers' AttentionInterface) that attends causally across the whole row."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def whole_row(module, query, key, value, attention_mask, **kwargs):
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)

    AttentionInterface.register("whole_row_causal", whole_row)
    AttentionMaskInterface.register("whole_row_causal", sdpa_mask)
    for attn, honoured in (("eager", True), ("sdpa", True), ("whole_row_causal", False)):
        model = _model(tiny_model_dir, attn)
        assert honours_packing(model, model.config.vocab_size, "cpu") is honoured, attn
