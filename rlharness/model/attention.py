"""Whether transformers has an attention implementation, and whether it can run on a device (what
rlharness/launch/devices.py checks for each model of a run before it starts).

transformers only finds out when it loads the model, after the run directory, the engine and the
trainer exist: a misspelt name or a missing flash-attn package then ends the run with a traceback,
flex_attention on a CPU with a torch compile error of several hundred lines. transformers is
imported only for a name not known here (one that user code may have registered): a refused start
should not pay for importing torch.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util

# transformers' own implementations (its AttentionInterface keys, and eager, built into each model); each
# also as "paged|<it>" (for its paged KV cache).
KNOWN = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4")
# The distribution transformers loads each flash implementation from (transformers.utils.import_utils); without
# it transformers can fetch the kernel from the Hub with the `kernels` package.
FLASH_DISTRIBUTIONS = {"flash_attention_2": "flash-attn", "flash_attention_3": "flash-attn-3",
                       "flash_attention_4": "flash-attn-4"}


def unknown_attention(name: str) -> str | None:
    """Why transformers would not know the attention `name`; None where it does: one of its own, a Hub
    kernel (`org/name`, fetched by transformers' `kernels` integration) or one registered in this process
    (transformers' AttentionInterface; a model with code of its own may register one as it loads, so
    rlharness/launch/devices.py does not ask for such a model)."""
    if name.removeprefix("paged|") in KNOWN or "/" in name:
        return None
    from transformers import AttentionInterface

    registered = set(AttentionInterface().valid_keys())
    if name in registered:
        return None
    close = difflib.get_close_matches(name, sorted(registered | set(KNOWN)), n=1)
    return ("is not an attention transformers has (" + ", ".join(KNOWN) + ", paged|<one of them>, a Hub kernel "
            "org/name, or one the model's own code registers with transformers.AttentionInterface)"
            + (f"; did you mean {close[0]}?" if close else ""))


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def attention_problem(attention: str, device_key: str, device: str, trains: bool, generates: bool) -> str | None:
    """Why `attention` cannot run on `device` (the value of `device_key`) for a model that `trains` (backward
    passes) or `generates` (decoding with a KV cache); None where it can."""
    on_cpu = f"a CPU ({device_key}={device})"
    attention = attention.removeprefix("paged|")
    if attention in FLASH_DISTRIBUTIONS:
        if device == "cpu":
            return f"runs on CUDA devices only, not on {on_cpu}"
        package = FLASH_DISTRIBUTIONS[attention]
        if not _installed(package) and importlib.util.find_spec("kernels") is None:
            return f"needs the {package} package (or kernels, to fetch it from the Hub), and neither is installed here"
    if attention == "flex_attention" and device == "cpu":
        if trains:  # torch: "FlexAttention does not support backward on CPU"
            return f"has no backward pass on {on_cpu} (torch's FlexAttention)"
        if generates:  # measured, torch 2.13: inductor's C++ for its decoding kernel does not compile
            return f"cannot decode on {on_cpu} (torch 2.13's compiled FlexAttention fails to build there)"
    return None
