"""MKL VML's cos and sin of a saved float32 tensor at a chosen accuracy (HA, LA or EP), called in
the MKL inside libtorch_cpu.so: `python ep.py IN.pt OUT.pt EP`. Run it with
MKL_ENABLE_INSTRUCTIONS=AVX2 for the AVX2 EP kernel that a raced first call runs on an AVX-512
Intel CPU (pytorch/pytorch#188792); on AMD CPUs MKL has one kernel for every accuracy."""

from __future__ import annotations

import ctypes
import os
import sys

import torch

MODES = {"LA": 0x1, "HA": 0x2, "EP": 0x3}
FLAGS = 0x00140000 | 0x00000100  # VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE, as torch passes them
_mkl = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))


def vml(function: str, x: torch.Tensor, mode: str) -> torch.Tensor:
    x = x.detach().contiguous().float()
    out = torch.empty_like(x)
    fn = getattr(_mkl, function)
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong]
    fn(x.numel(), x.data_ptr(), out.data_ptr(), MODES[mode] | FLAGS)
    return out


if __name__ == "__main__":
    src, dst, mode = sys.argv[1:4]
    x = torch.load(src)
    torch.save({"cos": vml("vmsCos", x, mode), "sin": vml("vmsSin", x, mode)}, dst)
