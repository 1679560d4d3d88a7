"""A tiny char-level Llama with *large* random weights: its greedy outputs vary from token
to token and it emits EOS now and then (the default 0.02 init just repeats one token),
so comparisons against `model.generate` have teeth."""

from __future__ import annotations

import pytest
import torch


def lively_model(seed: int = 0, std: float = 0.25, layers: int = 2):
    from rlharness.model.tiny import build_char_tokenizer, build_tiny_llama

    tok = build_char_tokenizer()
    model = build_tiny_llama(len(tok), layers=layers, seed=seed, pad_token_id=tok.pad_token_id,
                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std, generator=g)
    return model, tok


@pytest.fixture(scope="session")
def lively():
    return lively_model()


def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos_token_id) -> list[int]:
    """`model.generate(do_sample=False)` on one unpadded prompt; the response ids."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, pad_token_id=0,
                         top_k=None, top_p=None, temperature=None)
    return out[0, len(prompt_ids):].tolist()


def full_forward_logprobs(model, prompt_ids: list[int], response_ids: list[int],
                          temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / T) of each response token from one forward pass over prompt+response."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(response_ids)[:, None]).squeeze(-1).tolist()
