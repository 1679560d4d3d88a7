"""Inside an agent process: run the user's agent program, one sample at a time.

The process (forked by rlharness/agent/agent_spawner.py for agent_pool.py) reads one job per
line from its socket, a JSON object `{"entrypoint", "row", "base_url", "client", "sys_path"}`,
calls the program and writes one reply line: `{"answer": str}` or `{"reward": float}`, or
`{"error": "<Type>: <message>", "traceback": ..., "output": ...}` when it raised anything
(`SystemExit` and every other `BaseException` included). What the program prints goes into the
reply's `output` (its last 4 kB, kept for a failure's ledger row), never to the run's console.

The program is `fn(row, client)`: an async function gets an async client and runs in an event
loop of its own per sample (tasks it leaves behind are cancelled with it); a plain function gets
the synchronous client. `client` is `openai.AsyncOpenAI`/`OpenAI` on `<base_url>/v1`, or
`anthropic.AsyncAnthropic`/`Anthropic` on `<base_url>` (`agent.client`), without retries (a
retried request would be a second call) and without a timeout (a call may wait at the gateway
while the run syncs weights). A program that blocks, loops or hangs is killed from outside.

Only the standard library is imported here: the client packages are imported by the fork server.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import inspect
import io
import json
import math
import os
import signal
import sys
import traceback
from typing import Any, Callable

OUTPUT_TAIL_CHARS = 4096
_entrypoints: dict[str, Callable[..., Any]] = {}


class _Tail(io.TextIOBase):
    """A text stream keeping only its last OUTPUT_TAIL_CHARS characters."""

    def __init__(self) -> None:
        self.text = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.text = (self.text + str(s))[-OUTPUT_TAIL_CHARS:]
        return len(s)


def entrypoint(spec: str) -> Callable[..., Any]:
    fn = _entrypoints.get(spec)
    if fn is None:
        module_name, _, attr = spec.partition(":")
        fn = importlib.import_module(module_name)
        for part in attr.split("."):
            fn = getattr(fn, part)
        _entrypoints[spec] = fn
    return fn


def is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def make_client(kind: str, base_url: str, sync: bool) -> Any:
    if kind == "anthropic":
        import anthropic as sdk

        cls, url = (sdk.Anthropic if sync else sdk.AsyncAnthropic), base_url
    else:
        import openai as sdk

        cls, url = (sdk.OpenAI if sync else sdk.AsyncOpenAI), base_url + "/v1"
    http = (sdk.DefaultHttpxClient if sync else sdk.DefaultAsyncHttpxClient)(verify=False, timeout=None)
    return cls(base_url=url, api_key="rlharness", max_retries=0, timeout=None, http_client=http)


def plain_result(result: Any) -> dict[str, Any]:
    """The program's return value as the reply carries it: a number is the reward, anything else the answer."""
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        try:
            return {"reward": float(result)}
        except OverflowError:  # an int past float's range: out of range, like inf
            return {"reward": math.inf if result > 0 else -math.inf}
    return {"answer": "" if result is None else str(result)}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    tail = _Tail()
    try:
        with contextlib.redirect_stdout(tail), contextlib.redirect_stderr(tail):
            for path in job.get("sys_path", ()):
                if path not in sys.path:
                    sys.path.append(path)
            fn = entrypoint(job["entrypoint"])
            row = job["row"]
            if is_async(fn):
                async def call() -> Any:
                    return await fn(row, make_client(job["client"], job["base_url"], sync=False))

                result = asyncio.run(call())
            else:
                result = fn(row, make_client(job["client"], job["base_url"], sync=True))
                if inspect.isawaitable(result):  # a plain function that returned a coroutine
                    async def wait(aw=result) -> Any:
                        return await aw

                    result = asyncio.run(wait())
            return {**plain_result(result), "output": tail.text}
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt...: this sample fails, the run goes on
        return {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-8000:],
                "output": tail.text}


def die_with_parent() -> None:
    """SIGKILL when our parent (the fork server, or the run for the server) is gone: a killed run leaves no
    agent running."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def worker_main(sock) -> None:
    """The process's body: jobs in, replies out, until the socket closes."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's to handle; it kills us itself
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # output written below Python's streams (C code, subprocesses) is dropped
    os.dup2(devnull, 2)
    stream = sock.makefile("rwb")
    for line in stream:
        reply = run_job(json.loads(line))
        stream.write(json.dumps(reply).encode() + b"\n")
        stream.flush()
