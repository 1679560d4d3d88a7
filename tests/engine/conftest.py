"""A tiny char-level Llama with *large* random weights: its greedy outputs vary from token
to token and it emits EOS now and then (the default 0.02 init just repeats one token),
so comparisons against `model.generate` have teeth."""

from __future__ import annotations

import asyncio
import threading

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


class ForwardGate:
    """Holds an hf engine's thread before a chosen forward of `model` until the test has queued its
    command (an abort, a weight load, a stop): the command then lands after exactly that forward, on
    any machine (the engine takes commands between forwards). A test that instead polled the token
    count and then sent the command raced the engine thread, which may finish first."""

    def __init__(self, model) -> None:
        self._forwards, self._at = 0, None
        self._reached, self._go = threading.Event(), threading.Event()
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, _module, _args) -> None:  # on the engine's thread
        if self._at is None:
            return
        self._forwards += 1
        if self._forwards == self._at:
            self._reached.set()
            self._go.wait()

    def hold_at(self, forward: int) -> None:
        """Hold the thread before its `forward`-th forward from now."""
        self._reached.clear()
        self._go.clear()
        self._forwards, self._at = 0, forward

    async def command(self, engine, call):
        """Once the thread is held, start `call` (an engine command's coroutine), let the thread go
        as soon as the command is queued, and return its result."""
        await asyncio.to_thread(self._reached.wait)
        queued = engine._inbox.qsize()
        task = asyncio.ensure_future(call)
        while engine._inbox.qsize() == queued and not task.done():
            await asyncio.sleep(0)
        self.release()
        return await task

    def release(self) -> None:
        self._at = None
        self._go.set()

    def remove(self) -> None:
        self.release()
        self._handle.remove()


@pytest.fixture
def forward_gate(lively):
    gate = ForwardGate(lively[0])
    yield gate
    gate.remove()
