"""Per-token log-probs and entropy of a Hugging Face causal LM on a padded batch (every training backend).

The model's own forward projects every position of every row onto the vocabulary
([rows, tokens, vocab] logits). The trainer only needs response positions, so where the
model allows it the decoder's final hidden states are taken instead, the response
positions gathered, and the vocabulary projection (the model's output embedding module,
so tied weights, LoRA layers and ZeRO-3 parameter gathering work unchanged) applied
chunk by chunk inside `rlharness.algo.logprobs.chunked_token_scores`.

"Where the model allows it": `lm_head(decoder(x))` must be the model's logits. Models
that scale or soft-cap their logits after the head are not, so the backend checks this
once on a short input (`head_reproduces_logits`) and otherwise takes the model's logits
for the response positions and chunks only the log-softmax. How the model runs (hidden states,
logits) is its runner's (rlharness/backend/runner.py: `ModelRunner.response_rows`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from rlharness.algo.logprobs import chunked_token_scores, scatter_positions

log = logging.getLogger(__name__)


def decoder_hidden_states(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor | None,
                          **extra: Any) -> torch.Tensor:
    """The final hidden states the model's lm_head would project (no logits computed); `extra`: more
    inputs (packed rows' `position_ids`)."""
    return model.get_decoder()(input_ids=ids, attention_mask=attn, use_cache=False, **extra).last_hidden_state


@torch.no_grad()
def head_reproduces_logits(runner) -> bool:
    """True when the output embedding of `runner.module` applied to `runner.hidden_states` gives
    `runner.logits` (`runner`: a `ModelRunner`, rlharness/backend/runner.py).

    Run in eval mode (no dropout draws: the training RNG stream is left untouched).
    """
    hf_model = runner.module
    try:
        head = hf_model.get_output_embeddings()
        if head is None:
            return False
        vocab = int(hf_model.config.get_text_config().vocab_size)
        ids = (torch.arange(1, 9) % vocab).unsqueeze(0).to(next(hf_model.parameters()).device)
        attn = torch.ones_like(ids)
        was_training = hf_model.training
        hf_model.eval()
        try:
            full = runner.logits(ids, attn)
            split = head(runner.hidden_states(ids, attn))
        finally:
            hf_model.train(was_training)
    except (AttributeError, NotImplementedError, TypeError, ValueError) as e:
        log.info("token scores: %s has no separable output head (%s); scoring from its logits",
                 type(hf_model).__name__, e)
        return False
    same = full.shape == split.shape and torch.allclose(full.float(), split.float(), rtol=1e-5, atol=1e-5)
    if not same:
        log.info("token scores: %s's logits are not lm_head(hidden states) (scaled or capped?); scoring from "
                 "its logits", type(hf_model).__name__)
    return same


def response_token_scores(rows_fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.nn.Module | None]],
                          ids: torch.Tensor, score_mask: torch.Tensor, *, temperature: float, entropy: str,
                          chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] log-probs and entropy (as `losses.token_logprobs` / `token_entropy`) at the positions where
    `score_mask` > 0, 0 elsewhere.

    `rows_fn(positions)` runs the model and returns the [N, D] rows at `positions` ([B, T - 1] bool:
    the distribution at t - 1 produced token t) with the head that projects them: final hidden states
    and the output embedding, or logits and None. `entropy`: see `rlharness.algo.logprobs.ENTROPY_MODES`.
    """
    positions = score_mask[:, 1:] > 0
    rows, head = rows_fn(positions)
    lp, ent = chunked_token_scores(rows, ids[:, 1:][positions], temperature=temperature, head=head,
                                   chunk_tokens=chunk_tokens, entropy=entropy)
    return scatter_positions(lp, positions), scatter_positions(ent, positions)
