"""Resolve MKL VML's kernel dispatch once per process, before two threads can race it.

PyTorch's CPU build sends contiguous float32/float64 unary ops (`cos`, `sin`, `exp`, `log`,
`sqrt`, `tanh`, ...) to MKL's vector math library, one call per intra-op thread on its chunk.
oneMKL 2024.2 (the MKL inside torch 2.13's wheels) picks each function's kernel lazily, on that
function's first call; when that first call runs on two threads at once, one thread can run the
low-accuracy AVX2 "EP" kernel for its whole chunk, about 1000 ulp off, although high accuracy
was asked for (pytorch/pytorch#188792, Intel CPUs with AVX-512; on AMD CPUs MKL runs one
generic kernel for every accuracy, so nothing changes there). The next call is exact, so
the error is silent and transient.

In a resumed run this was the perturbed first step of issue 21 (docs/notes/resume_race.md): the
engine's first prefill (32 rows x 8 tokens) was the process's first `cos`/`sin` (rotary
embeddings), split in two chunks of 16 rows; the worker thread's chunk (the last 16 requests)
got EP values, so those rows' keys and queries, hence every log-prob of those 4 groups, were off
by 1e-4..3e-3 while the trainer recomputed them exactly. A fresh run's first forward is the
step-0 evaluation, where the same error goes unseen.

One call of each on a single element, from one thread, resolves the dispatch for the process
(what pytorch/pytorch#188791 does inside ATen).
"""

from __future__ import annotations

import threading

# The torch ops that reach MKL VML (vms*/vmd*) in torch 2.13, read with breakpoints on the VML
# entry points: each was called for float32 and float64.
VML_OPS = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10", "log2", "sin",
           "sqrt", "tan", "tanh", "trunc")

_lock = threading.Lock()
_done = False


def warm_up_vml() -> None:
    """Call every VML-backed op once on one element per dtype (idempotent; microseconds)."""
    global _done
    if _done:
        return
    import torch  # not at the top: a refused start never imports torch

    with _lock:
        if _done:
            return
        with torch.inference_mode():
            for dtype in (torch.float32, torch.float64):
                x = torch.full((1,), 0.5, dtype=dtype)  # inside every op's domain
                for op in VML_OPS:
                    getattr(torch, op)(x)
        _done = True
