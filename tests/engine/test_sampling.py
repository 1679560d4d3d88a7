"""sample_next: truncation keeps exactly the top-k / top-p nucleus; logprobs are pre-truncation."""

from __future__ import annotations

import math

import torch

from rlharness.engine.base import SamplingParams
from rlharness.engine.sampling import RowParams, sample_next

# Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 over tokens 0..4.
PROBS = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])
LOGITS = PROBS.log()


def _draw(params: SamplingParams, n: int = 2000, seed: int = 0):
    rows = RowParams.from_params([params] * n, vocab_size=5, device="cpu")
    g = torch.Generator().manual_seed(seed)
    return sample_next(LOGITS.expand(n, 5).clone(), rows, g)


def test_top_k_keeps_only_the_k_most_likely():
    tokens, _ = _draw(SamplingParams(top_k=2))
    assert set(tokens.tolist()) == {0, 1}


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    tokens, _ = _draw(SamplingParams(top_p=0.7))  # 0.5 < 0.7 <= 0.75: tokens 0 and 1
    assert set(tokens.tolist()) == {0, 1}
    tokens, _ = _draw(SamplingParams(top_p=0.76))
    assert set(tokens.tolist()) == {0, 1, 2}
    tokens, _ = _draw(SamplingParams(top_p=0.3))  # the top token always stays
    assert set(tokens.tolist()) == {0}


def test_logprobs_are_of_the_tempered_untruncated_distribution():
    tokens, logprobs = _draw(SamplingParams(temperature=2.0, top_k=2), n=50)
    want = (LOGITS / 2.0).log_softmax(-1)
    assert torch.allclose(logprobs, want[tokens], atol=1e-6)
    tokens, logprobs = _draw(SamplingParams(greedy=True, temperature=0.3), n=3)
    assert tokens.tolist() == [0, 0, 0]
    assert torch.allclose(logprobs, torch.full((3,), math.log(0.5)), atol=1e-6)


def test_plain_sampling_follows_the_distribution_and_is_seeded():
    tokens, _ = _draw(SamplingParams(), n=20000)
    freq = torch.bincount(tokens, minlength=5).float() / 20000
    assert torch.allclose(freq, PROBS, atol=0.02)
    assert torch.equal(_draw(SamplingParams(), seed=3)[0], _draw(SamplingParams(), seed=3)[0])


def test_mixed_rows_each_get_their_own_parameters():
    params = [SamplingParams(greedy=True), SamplingParams(top_k=1), SamplingParams(temperature=0.0),
              SamplingParams(top_p=0.5)]
    rows = RowParams.from_params(params * 100, vocab_size=5, device="cpu")
    tokens, _ = sample_next(LOGITS.expand(400, 5).clone(), rows, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0}
