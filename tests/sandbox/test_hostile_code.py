"""Hostile code in the sandbox (rlharness/sandbox): each case fails only its own call, with a reason,
and nothing outside the sandbox changes (files, processes, the caller's memory, the network).

Every case runs for real in bubblewrap (the default isolation). The network cases only ever try
127.0.0.1, an abstract socket of this machine, and 192.0.2.1 (TEST-NET-1, documentation only, never
routed): nothing is sent off this machine even if the sandbox failed. Limits that bound a failure
are generous (a loaded 2-core box runs slowly); no assertion is on a time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rlharness.config.schema import SandboxConf
from rlharness.sandbox import SandboxUnavailable, check_available, run
from tests.helpers import HANG_S

pytestmark = pytest.mark.timeout(300)

try:
    check_available()
    UNAVAILABLE = None
except SandboxUnavailable as exc:  # a machine without bubblewrap or user namespaces
    UNAVAILABLE = str(exc)
needs_sandbox = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"sandbox unavailable: {UNAVAILABLE}")

LIMITS = SandboxConf(cpu_s=2, wall_s=60)


def tree(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


@pytest.fixture
def run_dir():
    """A run directory with a checkpoint and a secret, its modes letting anyone read and write. Not
    under /tmp: the sandbox's /tmp is its own, where the same path would be the sandbox's file."""
    top = Path(tempfile.mkdtemp(prefix="rlharness-test-run-", dir="/var/tmp"))
    d = top / "run"
    (d / "checkpoints" / "step_00000001").mkdir(parents=True)
    (d / "checkpoints" / "step_00000001" / "DONE").write_text("ok")
    (d / "secret.txt").write_text("run-secret-" + uuid.uuid4().hex)
    for p in [top, d, *d.rglob("*")]:
        p.chmod(0o777 if p.is_dir() else 0o666)
    yield d
    shutil.rmtree(top)


def live_processes_with(marker: str) -> list[int]:
    """Processes of this machine whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def wait_until_none(marker: str, limit_s: float = HANG_S) -> list[int]:
    """Poll until no process holds `marker` (the namespace's teardown is quick but not instant; the
    limit is one only a process that outlives its call reaches)."""
    deadline = time.monotonic() + limit_s
    while (found := live_processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@needs_sandbox
def test_fork_bomb_is_bounded_and_leaves_no_process():
    marker = "forkbomb-" + uuid.uuid4().hex
    code = f"# {marker}\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run(code, limits=LIMITS)
    assert result.reason in ("cpu_time", "wall_time"), result
    assert wait_until_none(marker) == []


@needs_sandbox
def test_fork_bomb_gets_at_most_max_processes():
    # The children stay until the call ends (the namespace goes with it): they cannot exit before the
    # parent has met its limit, however slow the machine.
    code = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(3600)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)\n")
    result = run(code, limits=SandboxConf(max_processes=4, wall_s=60))
    assert result.reason == "ok", result
    assert result.stdout.split() == ["3", "11"]  # itself + 3 children = 4; then EAGAIN


@needs_sandbox
def test_endless_loop_stops_at_its_cpu_limit():
    result = run("while True:\n    pass\n", limits=SandboxConf(cpu_s=1, wall_s=120))
    assert result.reason == "cpu_time" and result.signal is not None, result


@needs_sandbox
def test_sleeping_forever_stops_at_its_wall_limit():
    result = run("import time\ntime.sleep(3600)\n", limits=SandboxConf(wall_s=1))
    assert result.reason == "wall_time", result


@needs_sandbox
def test_a_10_gb_allocation_is_a_memory_error():
    result = run("x = bytearray(10 * 2**30)\nprint('allocated')\n", limits=LIMITS)
    assert result.reason == "memory" and "MemoryError" in result.stderr and result.stdout == "", result


@needs_sandbox
def test_100_mb_printed_is_cut_at_the_cap_without_filling_the_callers_memory():
    """A fresh process calls the sandbox; its peak RSS grows by far less than the 100 MB printed."""
    probe = (
        "import resource, sys\n"
        "from rlharness.config.schema import SandboxConf\n"
        "from rlharness.sandbox import run\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "r = run(\"import sys\\nfor _ in range(100):\\n    sys.stdout.write('x' * 2**20)\\n\", "
        "limits=SandboxConf(max_output_bytes=4096, wall_s=60))\n"
        "grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024\n"
        "print(r.reason, len(r.stdout), grown_mb)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    reason, length, grown_mb = out.stdout.split()
    assert (reason, int(length)) == ("output_limit", 4096)
    assert float(grown_mb) < 30, out.stdout


@needs_sandbox
def test_reading_secrets_finds_nothing(run_dir, monkeypatch):
    secret_env = "env-secret-" + uuid.uuid4().hex
    monkeypatch.setenv("RLHARNESS_TEST_SECRET", secret_env)
    home = Path(os.path.expanduser("~"))
    paths = ["/etc/shadow", str(run_dir / "secret.txt"), str(home / ".ssh"), str(home / ".ssh" / "id_rsa"),
             str(run_dir / "checkpoints" / "step_00000001" / "DONE")]
    code = ("import os\nfor p in %r:\n    try:\n        print(p, 'READ', open(p).read() if os.path.isfile(p) "
            "else os.listdir(p))\n    except OSError as e:\n        print(p, type(e).__name__)\n"
            "print('environ', open('/proc/1/environ', 'rb').read(), open('/proc/self/environ', 'rb').read())\n"
            "print(sorted(os.listdir('/')))\n" % (paths,))
    result = run(code, limits=LIMITS)
    assert result.reason == "ok", result
    lines = result.stdout.splitlines()
    for path, line in zip(paths, lines):
        assert line == f"{path} FileNotFoundError", line
    assert secret_env not in result.stdout and "run-secret" not in result.stdout
    assert "RLHARNESS_TEST_SECRET" not in result.stdout and "WANDB" not in result.stdout
    assert lines[-1] == str(sorted(["bin", "dev", "lib", "lib64", "proc", "sbin", "tmp", "usr"]
                                   if Path("/lib64").exists() else ["bin", "dev", "lib", "proc", "sbin", "tmp", "usr"]))


@needs_sandbox
def test_sockets_to_localhost_an_abstract_socket_and_outside_are_refused():
    """A real listener on 127.0.0.1 and on an abstract unix socket (both per network namespace)
    receive nothing; 192.0.2.1 (never routed) is refused inside."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    abstract_name = "\0rlharness-test-" + uuid.uuid4().hex
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(abstract_name)
    unix.listen()
    port = tcp.getsockname()[1]
    code = ("import socket\n"
            "for family, address in [(socket.AF_INET, ('127.0.0.1', %d)), (socket.AF_INET, ('192.0.2.1', 80)),\n"
            "                        (socket.AF_INET6, ('::1', %d)), (socket.AF_UNIX, %r)]:\n"
            "    try:\n"
            "        s = socket.socket(family)\n"
            "        s.settimeout(5)\n"
            "        s.connect(address)\n"
            "        print('CONNECTED')\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__, e.errno)\n" % (port, port, abstract_name))
    try:
        result = run(code, limits=LIMITS)
        for listener in (tcp, unix):
            listener.setblocking(False)
            with pytest.raises(BlockingIOError):
                listener.accept()
    finally:
        tcp.close()
        unix.close()
    assert result.reason == "ok", result
    assert "CONNECTED" not in result.stdout
    # Network sockets are refused by the seccomp filter (EAFNOSUPPORT); the abstract unix socket lives
    # in another network namespace (ECONNREFUSED).
    assert result.stdout.split("\n")[:4] == ["OSError 97", "OSError 97", "OSError 97", "ConnectionRefusedError 111"]


@needs_sandbox
def test_writing_into_the_checkpoint_folder_and_anywhere_else_fails(run_dir):
    before = tree(run_dir)
    targets = [str(run_dir / "checkpoints" / "step_00000001" / "DONE"), str(run_dir / "checkpoints" / "evil"),
               "/usr/evil", "/evil"]
    code = ("import os\nfor p in %r:\n    try:\n        os.makedirs(os.path.dirname(p), exist_ok=True)\n"
            "        open(p, 'w').write('x')\n        print(p, 'WROTE')\n    except OSError as e:\n"
            "        print(p, type(e).__name__)\n"
            "open('/tmp/scratch', 'w').write('ok')\nprint(open('/tmp/scratch').read())\n"
            % (targets,))
    result = run(code, limits=LIMITS)
    assert result.reason == "ok", result
    assert result.stdout.splitlines()[:-1] == [f"{p} OSError" for p in targets]  # read-only everywhere
    assert result.stdout.splitlines()[-1] == "ok"  # but its own /tmp
    assert tree(run_dir) == before


@needs_sandbox
def test_killing_its_parent_or_anyone_else_fails():
    me = os.getpid()
    code = ("import os, signal\nfor pid in (os.getppid(), 1, %d, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
            "        print(pid, 'sent')\n    except OSError as e:\n        print(pid, type(e).__name__)\n" % me)
    result = run(code, limits=LIMITS)
    # Its parent is the pid namespace's init, which ignores signals from inside; this process is
    # not in its namespace; kill(-1) reaches the namespace's processes but init and itself: none.
    assert result.reason == "ok", result
    assert result.stdout.splitlines() == ["1 sent", "1 sent", f"{me} ProcessLookupError", "-1 ProcessLookupError"]
    os.kill(me, 0)  # still here


@needs_sandbox
def test_a_setsid_daemon_does_not_outlive_its_call():
    marker = "daemon-" + uuid.uuid4().hex
    code = (f"# {marker}\nimport os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        sys.stdout.close()\n        sys.stderr.close()\n        os.close(1)\n        os.close(2)\n"
            "        time.sleep(3600)\n    os._exit(0)\nprint('parent done')\n")
    result = run(code, limits=LIMITS)
    assert result.reason == "ok" and result.stdout == "parent done\n", result
    assert wait_until_none(marker) == []


@needs_sandbox
def test_bad_calls_fail_alone_and_the_next_call_works():
    # LIMITS, not the defaults: the default 10 s of wall time is near what a Python start takes on a busy box.
    assert run("1/0", limits=LIMITS).reason == "error"
    assert run("print('x' * 10)", limits=replace_conf(LIMITS, max_output_bytes=5)).reason == "output_limit"
    assert run("x" * 200_000, limits=LIMITS).reason == "code_refused"
    assert run("print(input()[::-1])", stdin="abc\n", limits=LIMITS).stdout == "cba\n"
    good = run("print(2**100)", limits=LIMITS)
    assert (good.reason, good.stdout, good.exit_status) == ("ok", f"{2**100}\n", 0)


@pytest.mark.parametrize("key, value", [("cpu_s", 0), ("wall_s", -1.0), ("wall_s", float("inf")),
                                        ("cpu_s", float("nan")), ("memory_mb", 0), ("max_processes", -3),
                                        ("max_output_bytes", 0), ("tmp_mb", 0), ("max_open_files", 0),
                                        ("max_file_mb", 0), ("isolation", "none")])
def test_limits_that_cannot_work_are_refused_naming_the_key(key, value):
    from rlharness.config.schema import ConfigError

    with pytest.raises(ConfigError, match=f"agent.sandbox.{key}="):
        SandboxConf(**{key: value})


# ----------------------------------------------------------------------------- the weaker mode
RLIMITS = SandboxConf(isolation="rlimits", cpu_s=2, wall_s=60)


def test_rlimits_mode_refuses_processes_sockets_and_signals_to_others():
    me = os.getpid()
    code = ("import os, socket\nfor name, attempt in [('fork', os.fork), ('socket', lambda: socket.socket()),\n"
            "                      ('kill', lambda: os.kill(%d, 9)), ('parent', lambda: os.kill(os.getppid(), 9))]:\n"
            "    try:\n        attempt()\n        print(name, 'DONE')\n    except OSError as e:\n"
            "        print(name, type(e).__name__)\n" % me)
    result = run(code, limits=RLIMITS)
    assert result.reason == "ok", result
    assert "DONE" not in result.stdout and len(result.stdout.splitlines()) == 4, result.stdout
    assert run("while True:\n    pass\n", limits=replace_conf(RLIMITS, cpu_s=1, wall_s=120)).reason == "cpu_time"
    assert run("x = bytearray(10 * 2**30)", limits=RLIMITS).reason == "memory"


def replace_conf(conf: SandboxConf, **changes) -> SandboxConf:
    from dataclasses import replace

    return replace(conf, **changes)
