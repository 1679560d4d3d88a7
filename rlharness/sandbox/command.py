"""The command line of one sandboxed call: bubblewrap's arguments (namespaces mode) and the stub's.

What the sandbox sees (namespaces mode): /usr and the interpreter's own prefixes, read-only; the
top-level links of a merged-/usr system (/bin, /lib, /lib64, /sbin) as links, or read-only binds
where they are directories; a new /proc of its own pid namespace, a minimal /dev, and a private
tmpfs on /tmp (`tmp_mb`), its working directory and the only writable place. No /etc, /home, /root,
/var, /run or /work: not the run directory, the checkpoints, the home directory or its keys. The
environment is cleared and set to a few plain values (bubblewrap itself starts with an empty one,
so the sandbox's /proc/1/environ holds nothing either).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from rlharness.config.schema import SandboxConf
from rlharness.sandbox.stub import STUB

# The environment of the code: no variable of the run's (keys, tokens, paths) reaches it.
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
       "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
MAX_CODE_BYTES = 100_000  # a tool call's program; anything longer is refused unrun


def stub_argv(conf: SandboxConf, code_fd: int, bpf_fd: int, in_namespace: bool) -> list[str]:
    """`python -I -c STUB <limits> <fds>`; in a namespace RLIMIT_NPROC also counts bubblewrap's init."""
    nproc = conf.max_processes + 1 if in_namespace else 0  # 0: not set (the rlimits mode forks nothing)
    limits = [math.ceil(conf.cpu_s), conf.memory_mb << 20, nproc, conf.max_open_files, conf.max_file_mb << 20]
    return [conf.python, "-I", "-c", STUB, *map(str, limits), str(bpf_fd), str(code_fd)]


def read_only_roots(python: str) -> list[str]:
    """What the interpreter needs besides /usr: the folders of its installation and of a venv it
    belongs to (a venv's python is a link into another installation), resolved."""
    roots = []
    exe = Path(python)
    for path in (exe.parent.parent, exe.resolve().parent.parent):
        path = path.resolve()
        if path != Path("/usr") and not path.is_relative_to("/usr") and path != Path("/"):
            roots.append(str(path))
    return sorted(set(roots))


def bwrap_argv(bwrap: str, conf: SandboxConf, seccomp_fd: int, status_fd: int) -> list[str]:
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for link in MERGED_USR_LINKS:
        if os.path.islink(link):
            argv += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            argv += ["--ro-bind", link, link]
    for root in read_only_roots(conf.python):
        argv += ["--ro-bind", root, root]
    # The new root (bubblewrap's own tmpfs, holding the mount points) is made read-only last: /tmp stays
    # the only writable place.
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(conf.tmp_mb << 20), "--perms", "1777",
             "--tmpfs", "/tmp", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in ENV.items():
        argv += ["--setenv", key, value]
    return argv + ["--seccomp", str(seccomp_fd), "--json-status-fd", str(status_fd), "--"]
