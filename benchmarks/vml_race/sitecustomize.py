"""Loaded by benchmarks/vml_race_simulation.py's lives (PYTHONPATH): with EP_VARIANT="cos:1" (or
"sin:0", "cos+sin:1", ...), the hf-engine thread's first cos/sin of at least 4096 values gets MKL's
AVX2 EP values (ep.py, in a subprocess with MKL_ENABLE_INSTRUCTIONS=AVX2) in chunk 0 or 1 of the
two-thread split: what a raced first VML call leaves (docs/notes/resume_race.md)."""

import os
import sys
import threading

VARIANT = os.environ.get("EP_VARIANT", "none")
if VARIANT != "none":
    import subprocess
    import tempfile

    import torch

    _ops, _chunk = VARIANT.split(":")[0].split("+"), int(VARIANT.split(":")[1])
    _done: set[str] = set()

    def _ep_values(x: torch.Tensor, name: str) -> torch.Tensor:
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(x.detach().contiguous().clone(), f"{tmp}/in.pt")
            env = {k: v for k, v in os.environ.items() if k != "EP_VARIANT"}
            env["MKL_ENABLE_INSTRUCTIONS"] = "AVX2"
            subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "ep.py"), f"{tmp}/in.pt",
                            f"{tmp}/out.pt", "EP"], env=env, check=True)
            return torch.load(f"{tmp}/out.pt")[name].reshape(-1)

    def _spoil(name: str):
        exact = getattr(torch.Tensor, name)

        def op(self, *args, **kwargs):
            out = exact(self, *args, **kwargs)
            if (name in _ops and name not in _done and self.numel() >= 4096
                    and threading.current_thread().name == "hf-engine"):
                _done.add(name)
                flat, ep = out.view(-1), _ep_values(self, name)
                half = (flat.numel() + 1) // 2  # at::parallel_for's chunks on two threads
                part = slice(half, None) if _chunk == 1 else slice(0, half)
                changed = int((flat[part] != ep[part]).sum())
                flat[part] = ep[part]
                print(f"EP values in chunk {_chunk} of the first {name} {tuple(self.shape)}: {changed} changed",
                      file=sys.stderr, flush=True)
            return out
        setattr(torch.Tensor, name, op)

    _spoil("cos")
    _spoil("sin")
