"""`agent.entrypoint=pkg.mod:fn`: the user's agent program, checked by name before a run starts.

Refused in one line (`ConfigError`, naming the key) when the module does not import (whatever
it raises, `SystemExit` included), the name is missing, not a function (a class, a builtin such
as `os:system`, a number), or cannot be called as `fn(row, client)`: `train.py` checks it before
a run directory is made. An `async def` gets an async client, a plain `def` the synchronous one;
both run in agent processes (rlharness/agent/agent_pool.py), never in the trainer's.
"""

from __future__ import annotations

import importlib
import inspect
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
    except BaseException as exc:  # noqa: BLE001 - any import failure (sys.exit too) is the user's entrypoint's
        raise ConfigError(f"{key}={spec!r} is not allowed: module {module_name!r} does not import "
                          f"({type(exc).__name__}: {exc})") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ConfigError(f"{key}={spec!r} is not allowed: {module_name!r} has no attribute {attr!r}")
    why = _not_an_agent(fn)
    if why is not None:
        raise ConfigError(f"{key}={spec!r} is not allowed: {attr!r} {why}; an agent program is "
                          f"`async def {attr.rsplit('.', 1)[-1]}(row, client)` (or a plain def)")
    return fn


def _not_an_agent(fn: Any) -> str | None:
    """Why `fn` cannot be called as an agent program, or None."""
    if not callable(fn):
        return f"is a {type(fn).__name__}, not a callable"
    if inspect.isclass(fn):
        return "is a class"
    if inspect.isbuiltin(fn) or inspect.ismethoddescriptor(fn):
        return "is a builtin"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return "has no signature that can be read"
    try:
        signature.bind({}, None)
    except TypeError as exc:
        return f"cannot be called as fn(row, client) ({exc})"
    return None
