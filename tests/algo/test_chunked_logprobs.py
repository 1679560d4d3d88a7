"""Chunked chosen-token log-probs and entropy equal the plain full-vocabulary computation (values and gradients)."""

from __future__ import annotations

import pytest
import torch

from rlharness.algo.logprobs import chunked_token_scores, scatter_positions


def plain_scores(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """The textbook computation over the whole [N, vocab] block: log_softmax, gather, -sum p log p."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def _grads(loss: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [g.float() for g in torch.autograd.grad(loss, tensors)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_scores_from_logits_equal_plain(dtype, temperature, chunk):
    gen = torch.Generator().manual_seed(0)
    n, vocab = 23, 301
    logits = (3 * torch.randn(n, vocab, generator=gen)).to(dtype).requires_grad_(True)
    targets = torch.randint(0, vocab, (n,), generator=gen)
    w_lp, w_ent = torch.randn(n, generator=gen), torch.randn(n, generator=gen)

    lp, ent = chunked_token_scores(logits, targets, temperature=temperature, chunk_tokens=chunk, entropy="grad")
    ref_lp, ref_ent = plain_scores(logits, targets, temperature)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    got = _grads((w_lp * lp + w_ent * ent).sum(), logits)
    ref = _grads((w_lp * ref_lp + w_ent * ref_ent).sum(), logits)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_scores_through_the_head_equal_plain_with_recompute(dtype, temperature):
    """hidden -> head chunk by chunk (checkpointed: several chunks) vs the full logits; gradients
    reach the hidden states and the head's weight exactly as through the full computation."""
    gen = torch.Generator().manual_seed(1)
    n, hidden, vocab = 40, 16, 257
    head = torch.nn.Linear(hidden, vocab, bias=False).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=gen).to(dtype))
    h = torch.randn(n, hidden, generator=gen).to(dtype).requires_grad_(True)
    targets = torch.randint(0, vocab, (n,), generator=gen)
    w_lp, w_ent = torch.randn(n, generator=gen), torch.randn(n, generator=gen)

    lp, ent = chunked_token_scores(h, targets, temperature=temperature, head=head, chunk_tokens=8, entropy="grad")
    got = _grads((w_lp * lp + w_ent * ent).sum(), h, head.weight)
    ref_lp, ref_ent = plain_scores(head(h), targets, temperature)
    ref = _grads((w_lp * ref_lp + w_ent * ref_ent).sum(), h, head.weight)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)  # hidden states: row by row, exact
    # The head's weight gradient is a sum over rows: in float32 it matches to 1e-5; in bfloat16 autograd
    # adds the chunks' bf16 gradients (one rounding per chunk), so it matches to bf16's resolution.
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7 * float(ref[1].abs().max())
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=tol)


def test_entropy_modes():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 11, generator=gen, requires_grad=True)
    targets = torch.randint(0, 11, (5,), generator=gen)
    lp, ent = chunked_token_scores(logits, targets, entropy="detached", chunk_tokens=2)
    assert lp.requires_grad and not ent.requires_grad
    torch.testing.assert_close(ent, plain_scores(logits, targets, 1.0)[1])
    _, none = chunked_token_scores(logits, targets, entropy="none")
    assert torch.equal(none, torch.zeros(5))
    with pytest.raises(ValueError, match="entropy="):
        chunked_token_scores(logits, targets, entropy="full")
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_scores(logits, targets, temperature=0.0)


def test_scatter_positions_shifts_by_one():
    positions = torch.tensor([[False, True, True], [True, False, False]])
    out = scatter_positions(torch.tensor([1.0, 2.0, 3.0]), positions)
    assert torch.equal(out, torch.tensor([[0.0, 0.0, 1.0, 2.0], [0.0, 3.0, 0.0, 0.0]]))


@pytest.mark.parametrize("vocab, passes_per_chunk", [(8, 1), (64, 2)])
def test_a_chunk_is_recomputed_in_the_backward_only_when_the_head_widens_its_rows(vocab, passes_per_chunk):
    """A head no wider than its rows (the embedded default: vocabulary 24, hidden 128) runs once per
    chunk: recomputing it saves no memory. A widening head (real vocabularies) is recomputed in the
    backward. Values and gradients are bit-identical to an unchunked pass either way."""
    gen = torch.Generator().manual_seed(3)
    n, hidden, chunk = 20, 16, 8
    head = torch.nn.Linear(hidden, vocab, bias=False)
    calls = []
    head.register_forward_hook(lambda *_: calls.append(1))
    h = torch.randn(n, hidden, generator=gen).requires_grad_(True)
    targets = torch.randint(0, vocab, (n,), generator=gen)
    lp, ent = chunked_token_scores(h, targets, head=head, chunk_tokens=chunk, entropy="detached")
    got = _grads(lp.sum(), h, head.weight)
    assert len(calls) == 3 * passes_per_chunk  # 3 chunks; the forward's pass, then the backward's
    ref_lp, ref_ent = plain_scores(head(h), targets, 1.0)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    whole_lp, _ = chunked_token_scores(h, targets, head=head, chunk_tokens=n, entropy="detached")
    assert torch.equal(got[0], _grads(whole_lp.sum(), h)[0])
