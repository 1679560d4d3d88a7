"""Batched next-token sampling with per-row temperature, top-p, top-k and greedy rows.

The returned log-probability is that of the temperature-scaled distribution *before*
top-p/top-k truncation (temperature 1 for greedy rows): the quantity the trainer
recomputes from its own forward pass, so importance ratios compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlharness.engine.base import SamplingParams


@dataclass
class RowParams:
    """Sampling parameters of the rows of a batch, as tensors, with fast-path flags."""

    temperature: torch.Tensor  # [B] float, 1.0 on greedy rows
    top_p: torch.Tensor  # [B] float
    top_k: torch.Tensor  # [B] long, vocab size where off
    greedy: torch.Tensor  # [B] bool
    all_greedy: bool
    any_greedy: bool
    any_truncation: bool  # some row uses top-p < 1 or top-k
    all_temperature_one: bool
    seeds: torch.Tensor | None = None  # [B] long; rows with a per-request seed (None: none has one)
    seeded: torch.Tensor | None = None  # [B] bool

    @classmethod
    def from_params(cls, params: list[SamplingParams], vocab_size: int, device,
                    seeds: list[int | None] | None = None) -> "RowParams":
        """One row per request: its sampling settings and its seed (`GenerateRequest.seed`)."""
        seeds = seeds if seeds is not None else [None] * len(params)
        greedy = [p.greedy or p.temperature <= 0 for p in params]
        temps = [1.0 if g else float(p.temperature) for p, g in zip(params, greedy)]
        top_p = [1.0 if g else float(p.top_p) for p, g in zip(params, greedy)]
        top_k = [vocab_size if g or p.top_k <= 0 else min(int(p.top_k), vocab_size)
                 for p, g in zip(params, greedy)]
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            top_k=torch.tensor(top_k, dtype=torch.long, device=device),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            all_greedy=all(greedy),
            any_greedy=any(greedy),
            any_truncation=any(p < 1.0 for p in top_p) or any(k < vocab_size for k in top_k),
            all_temperature_one=all(t == 1.0 for t in temps),
            seeds=(torch.tensor([s or 0 for s in seeds], dtype=torch.long, device=device)
                   if any(s is not None for s in seeds) else None),
            seeded=(torch.tensor([s is not None for s in seeds], dtype=torch.bool, device=device)
                    if any(s is not None for s in seeds) else None),
        )


def _truncate_sorted(sorted_logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) the tail of descending-sorted logits outside top-k and the top-p nucleus."""
    vocab = sorted_logits.shape[-1]
    rank = torch.arange(vocab, device=sorted_logits.device)
    drop = rank[None, :] >= top_k[:, None]
    probs = sorted_logits.softmax(-1)
    # Keep a token while the mass strictly before it is < top_p; the top token always stays.
    mass_before = probs.cumsum(-1) - probs
    drop |= mass_before >= top_p[:, None]
    drop[:, 0] = False
    return sorted_logits.masked_fill(drop, float("-inf"))


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_MIX = [_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)]


def counter_uniform(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A uniform in (0, 1) per row from (seed, position): splitmix64 on int64 (wrapping).

    It depends on nothing but the row's own seed and the token's position in its
    sequence, so a request draws the same tokens whichever requests share its batch,
    and a continuation (prompt + partial response) draws what an uninterrupted run would.
    """
    x = seeds * _MIX[0] + positions.long() * _MIX[1]
    for shift, mult in ((30, _MIX[1]), (27, _MIX[2])):
        x = (x ^ ((x >> shift) & ((1 << (64 - shift)) - 1))) * mult
    x = x ^ ((x >> 31) & ((1 << 33) - 1))
    top53 = (x >> 11) & ((1 << 53) - 1)
    return (top53.double() + 0.5) / float(1 << 53)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    cdf = probs.double().cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1)


def sample_next(logits: torch.Tensor, rows: RowParams, generator: torch.Generator | None,
                positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row from `logits` [B, V]; returns (token ids [B], logprobs [B]).

    Rows with a per-request seed draw by inverse CDF from `counter_uniform(seed,
    position)` (`positions`: the index in its sequence of the token being sampled);
    the others from `generator`.
    """
    logits = logits.float()
    scaled = logits if rows.all_temperature_one else logits / rows.temperature[:, None]
    logprobs = scaled.log_softmax(-1)
    if rows.all_greedy:
        tokens = logits.argmax(-1)
    else:
        order = None
        if rows.any_truncation:
            sorted_logits, order = scaled.sort(-1, descending=True)
            probs = _truncate_sorted(sorted_logits, rows.top_p, rows.top_k).softmax(-1)
        else:
            probs = logprobs.exp()
        if rows.seeded is not None and positions is not None:
            drawn = _inverse_cdf(probs, counter_uniform(rows.seeds, positions))
            if not bool(rows.seeded.all()):
                drawn = torch.where(rows.seeded, drawn,
                                    torch.multinomial(probs, 1, generator=generator).squeeze(-1))
        else:
            drawn = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        tokens = drawn if order is None else order.gather(-1, drawn[:, None]).squeeze(-1)
        if rows.any_greedy:
            tokens = torch.where(rows.greedy, logits.argmax(-1), tokens)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
