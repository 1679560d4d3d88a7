"""Run a command with a spy on MKL's VML entry points: does any VML function's first call in a
process run on two threads at once? (the race behind issue 21, rlharness/core/vml_warmup.py)

    python scripts/vml_spy.py -- .venv/bin/python train.py total_steps=2

`scripts/vml_spy.c` (built here with gcc, preloaded into the command and every process it starts)
holds each function's first call for `--hold-ms` so that a second thread's call of it, if the
program makes one, lands inside: oneMKL 2024.2 picks the function's kernel in that first call, and
a thread calling in meanwhile can get the low-accuracy one (pytorch/pytorch#188792). Prints each
process's first calls and exits 1 if any was concurrent. Needs gcc and torch's MKL build (Linux x86).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("vml_spy.c")


def torch_cpu_library() -> Path:
    """libtorch_cpu.so of the torch this Python imports (MKL is linked into it), without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch is not installed in this Python")
    return Path(spec.submodule_search_locations[0]) / "lib" / "libtorch_cpu.so"


def build(out_dir: str | Path) -> Path:
    """Compile the spy into `out_dir`; returns the shared library's path."""
    out = Path(out_dir) / "vml_spy.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(out), str(SOURCE), "-ldl"], check=True,
                   capture_output=True, text=True)
    return out


def spy_env(spy: Path, report: Path, hold_ms: float = 100.0, base: dict | None = None) -> dict[str, str]:
    """The environment that runs a command (and its child processes) under the spy, writing to `report`."""
    env = dict(os.environ if base is None else base)
    env.update(LD_PRELOAD=str(spy), VML_SPY_LIB=str(torch_cpu_library()), VML_SPY_OUT=str(report),
               VML_SPY_HOLD_US=str(int(hold_ms * 1000)))
    return env


def read_report(report: Path) -> dict[int, dict[str, dict[str, int]]]:
    """Per process id: {"first": size of each function's first call, "concurrent": calls of a function
    made while its first call was running}."""
    found: dict[int, dict[str, dict[str, int]]] = {}
    if report.exists():
        for line in report.read_text().splitlines():
            what, name, n, pid = line.split()
            seen = found.setdefault(int(pid), {"first": {}, "concurrent": {}})
            if what == "first":
                seen["first"][name] = int(n)
            else:
                seen["concurrent"][name] = seen["concurrent"].get(name, 0) + 1
    return found


def concurrent_first_calls(report: Path) -> dict[int, dict[str, int]]:
    """The processes whose report shows a concurrent first call, with those calls."""
    return {pid: seen["concurrent"] for pid, seen in read_report(report).items() if seen["concurrent"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hold-ms", type=float, default=100.0, help="how long each first call is held")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give a command after --")
    with tempfile.TemporaryDirectory(prefix="vml-spy-") as tmp:
        report = Path(tmp) / "report.txt"
        rc = subprocess.call(command, env=spy_env(build(tmp), report, args.hold_ms))
        found = read_report(report)
    for pid, seen in found.items():
        print(f"process {pid}: first VML calls (elements) {seen['first']}")
        if seen["concurrent"]:
            print(f"process {pid}: CONCURRENT first calls (MKL may have run a low-accuracy kernel) "
                  f"{seen['concurrent']}")
    return rc or (1 if any(seen["concurrent"] for seen in found.values()) else 0)


if __name__ == "__main__":
    sys.exit(main())
