"""`agent.entrypoint=pkg.mod:fn`: the user's agent program, imported by name.

Refused in one line (`ConfigError`, naming the key) when the module does not import, the
name is missing or not callable: `train.py` checks it before a run directory is made.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from rlharness.config.schema import ConfigError


def load_entrypoint(spec: str, key: str) -> Callable[..., Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{key}={spec!r} is not allowed: write module:function (e.g. my_pkg.my_agent:run)")
    if os.getcwd() not in sys.path:  # as `python -m` would: the user's package, where they run the command
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's entrypoint's
        raise ConfigError(f"{key}={spec!r} is not allowed: module {module_name!r} does not import "
                          f"({type(exc).__name__}: {exc})") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ConfigError(f"{key}={spec!r} is not allowed: {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ConfigError(f"{key}={spec!r} is not allowed: {attr!r} is a {type(fn).__name__}, not a callable")
    return fn
