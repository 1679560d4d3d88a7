"""Chosen-token log-probs and entropy, chunk by chunk: never a [rows, tokens, vocab] float32 tensor.

At a 49k vocabulary the full-vocabulary log-softmax of one micro-batch is the trainer's
largest tensor (16 rows x 300 tokens x 49,152 x 4 bytes = 0.94 GB, and autograd keeps
more than one of them). Only two numbers per token are needed: the log-prob of the
token that was sampled and the entropy of the distribution it was sampled from. So the
scored positions are gathered first (a flat [N, hidden] or [N, vocab] tensor: response
tokens only, no prompt or padding positions), and the vocabulary projection, the
float32 upcast and the softmax run on `chunk_tokens` of them at a time (TRL's
`selective_log_softmax` and verl's chunked/fused kernels do the same). With gradients
and more than one chunk, each chunk runs under activation checkpointing, so its logits
are dropped after the forward and recomputed during the backward: the peak holds one
chunk's logits, not N. Not where the head narrows its rows (vocabulary <= hidden size, the
embedded tiny models): there the logits are smaller than what a checkpoint keeps.

The per-token formulas are exactly `token_logprobs` / `token_entropy` (`losses.py`),
applied to fewer rows, so the numbers are those of the plain computation.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

# entropy: "none" (not computed), "detached" (a metric: no gradient), "grad" (part of the loss).
ENTROPY_MODES = ("none", "detached", "grad")


def _scores(rows: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor] | None, targets: torch.Tensor,
            temperature: float, entropy: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of `targets`, entropy) for one chunk of rows (hidden states, or logits when `head` is None)."""
    logits = rows if head is None else head(rows)
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    lp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)
    if entropy == "none":
        return lp, torch.zeros_like(lp)
    with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
        logp = torch.log_softmax(z, dim=-1)
        ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def _widens(head: Callable[[torch.Tensor], torch.Tensor], width: int) -> bool:
    """Whether `head` projects `width`-wide rows onto more than `width` logits (not known: assumed so).
    Read from the module's `out_features` (nn.Linear, peft's LoRA layers), not its weight's shape,
    which ZeRO-3 partitions."""
    out = getattr(head, "out_features", None)
    return not isinstance(out, int) or out > width


def chunked_token_scores(rows: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                         head: Callable[[torch.Tensor], torch.Tensor] | None = None, chunk_tokens: int = 1024,
                         entropy: str = "detached") -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each row's target token and the entropy of each row's distribution, both [N] float32.

    rows: [N, hidden] final hidden states with `head` (the vocabulary projection, e.g. the
    model's lm_head module), or [N, vocab] logits with `head=None`. targets: [N] token ids.
    `temperature` divides the logits (the sampling temperature the engine used).
    `entropy`: one of ENTROPY_MODES; with "none" the entropy returned is zeros.
    """
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy={entropy!r}: expected one of {ENTROPY_MODES}")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 to score tokens")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1")
    if rows.dim() != 2 or targets.shape != rows.shape[:1]:
        raise ValueError(f"rows {tuple(rows.shape)} and targets {tuple(targets.shape)} disagree: expected [N, D] "
                         f"and [N]")
    n = rows.shape[0]
    if n == 0:  # still part of the graph: a backward through it reaches the model (zero gradients)
        empty = rows[:, 0].float()
        return empty, empty.detach() if entropy != "grad" else empty
    # Recompute-in-backward only pays when there is more than one chunk to keep apart, and when the
    # head widens its rows: a checkpointed chunk keeps its [n, D] input instead of its [n, V] logits,
    # which saves nothing where V <= D (the embedded default model: 24 tokens, 128 hidden) and costs a
    # second head pass per chunk in the backward. The numbers are the same either way.
    recompute = (torch.is_grad_enabled() and rows.requires_grad and n > chunk_tokens
                 and (head is None or _widens(head, rows.shape[1])))
    lps, ents = [], []
    for start in range(0, n, chunk_tokens):
        part, tgt = rows[start:start + chunk_tokens], targets[start:start + chunk_tokens]
        if recompute:
            lp, ent = checkpoint(_scores, part, head, tgt, temperature, entropy, use_reentrant=False)
        else:
            lp, ent = _scores(part, head, tgt, temperature, entropy)
        lps.append(lp)
        ents.append(ent)
    if len(lps) == 1:
        return lps[0], ents[0]
    return torch.cat(lps), torch.cat(ents)


def scatter_positions(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[N] values back to a [B, T] tensor: `positions` ([B, T - 1] bool, True N times) marks token
    positions 1..T-1 (the shift of `token_logprobs`); everything else, position 0 included, is 0."""
    out = values.new_zeros(positions.shape).masked_scatter(positions, values)
    return torch.nn.functional.pad(out, (1, 0))
