"""A sandbox for untrusted Python: `run(code, stdin="", limits=None) -> Result`.

Each call is a process of its own. In the default isolation (`limits.isolation="namespaces"`)
bubblewrap gives it new user, pid, network, IPC, UTS and mount namespaces (an empty network,
a file system of /usr and the interpreter, read-only, and a private tmpfs), a seccomp filter
refuses the system calls it has no use for, and rlimits bound its CPU time, memory, processes,
open files and file size; the caller bounds its wall time and output. What isolates what, and
what it does not protect against: docs/concepts/sandbox.md.

Sandboxes are started ahead (`limits.warm` of them per set of limits, each for one call only:
warm.py), so a call's wall time is mostly its program's.

`check_available(limits)` says, once per process and limits, whether this machine can run the
sandbox at all (bubblewrap installed, namespaces allowed, the interpreter readable): callers
ask it at start and refuse to run without it.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import astuple

from rlharness.config.schema import SandboxConf
from rlharness.sandbox import seccomp_filter, warm
from rlharness.sandbox.call import REASONS, Result, finish, refused, start


def run(code: str, stdin: str = "", limits: SandboxConf | None = None) -> Result:
    """Run `code` with the Python of `limits.python` in a sandbox of its own (a warm one if one waits);
    never raises for anything the code does: the Result says why it stopped."""
    conf = limits if limits is not None else SandboxConf()
    refusal = refused(code)
    if refusal is not None:
        return refusal
    started = warm.take(conf) or start(conf)
    return finish(started, code, stdin, conf.wall_s, conf.max_output_bytes)


class SandboxUnavailable(RuntimeError):
    """This machine cannot run the sandbox as configured; the message says why and what to do."""


PROBE = "import sys; print(sum(range(10)), sys.version_info[0])"


@functools.lru_cache(maxsize=None)
def _probe(key: tuple) -> str | None:
    conf = SandboxConf(*key)
    if conf.isolation == "namespaces" and shutil.which("bwrap") is None:
        return "bwrap (bubblewrap) is not installed: run scripts/setup.sh (apt-get install bubblewrap)"
    problem = seccomp_filter.missing()
    if problem:
        return problem
    result = finish(start(conf), PROBE, "", conf.wall_s, conf.max_output_bytes)  # a cold start, not the pool's
    if result.reason == "ok" and result.stdout.split() == ["45", "3"]:
        return None
    detail = (result.stderr.strip().splitlines() or [result.reason])[-1]
    if conf.isolation == "namespaces":
        return (f"a trial call in bubblewrap failed ({result.reason}: {detail}); this machine may not allow user "
                f"namespaces (a container), or the sandbox user cannot read agent.sandbox.python={conf.python}")
    return f"a trial call failed ({result.reason}: {detail})"


def check_available(limits: SandboxConf | None = None) -> None:
    """Raise SandboxUnavailable unless a trial call runs in this sandbox; the answer is kept per limits."""
    conf = limits if limits is not None else SandboxConf()
    problem = _probe(astuple(conf))
    if problem:
        hint = ("; or set agent.sandbox.isolation=rlimits, the weaker mode for machines without namespaces "
                "(docs/concepts/sandbox.md)") if conf.isolation == "namespaces" else ""
        raise SandboxUnavailable(f"agent.sandbox.isolation={conf.isolation} cannot run here: {problem}{hint}")


__all__ = ["REASONS", "Result", "SandboxConf", "SandboxUnavailable", "check_available", "run"]
