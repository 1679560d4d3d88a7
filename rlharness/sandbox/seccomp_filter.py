"""The seccomp filter of a sandboxed call, compiled to BPF with libseccomp (`pyseccomp`, its ctypes binding).

A deny list in the manner of Flatpak's (which bubblewrap is built for): everything is allowed but the
system calls a Python program has no use for and a sandbox escape or a denial of service would need.
They fail with EPERM (the code gets an OSError, never a killed process): kernel and namespace
administration (mount, unshare, setns, clone with namespace flags, keyctl, bpf, perf_event_open,
userfaultfd, io_uring, module loading, reboot, clock setting...), reading or writing another process
(ptrace, process_vm_*, pidfd_*), terminal injection (TIOCSTI), and network sockets: `socket()` for any
family but AF_UNIX fails with EAFNOSUPPORT. `clone3` answers ENOSYS so the C library falls back to
`clone`, whose flags a filter can see. System calls of a foreign architecture (the 32-bit ABI) kill
the process (libseccomp's default for them).

In the `rlimits` isolation mode (no namespaces) the filter also refuses new processes (fork, vfork,
clone without CLONE_THREAD) and signals to any process but the caller's own.
"""

from __future__ import annotations

import errno
import functools
import os

# Unknown names are skipped (an older kernel's libseccomp may not know a newer call).
DENIED = (
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "mount_setattr", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "syslog",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm", "quotactl",
    "name_to_handle_at", "open_by_handle_at", "lookup_dcookie", "uselib", "vhangup", "ptrace",
    "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "kcmp", "personality", "landlock_create_ruleset",
)
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000,
                   0x00000080)  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
CLONE_THREAD = 0x00010000
AF_UNIX = 1
TIOCSTI, TIOCLINUX = 0x5412, 0x541C


def _add(f, action, name: str, *args) -> None:
    import pyseccomp

    try:
        pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    except (OSError, ValueError):
        return
    f.add_rule(action, name, *args)


def build_filter(allow_fork: bool, own_pid: int | None = None) -> bytes:
    """The BPF program (bytes) for one call; `allow_fork=False` and `own_pid` for the rlimits mode."""
    import pyseccomp as s

    f = s.SyscallFilter(defaction=s.ALLOW)
    eperm = s.ERRNO(errno.EPERM)
    for name in DENIED:
        _add(f, eperm, name)
    _add(f, s.ERRNO(errno.EAFNOSUPPORT), "socket", s.Arg(0, s.NE, AF_UNIX))
    _add(f, s.ERRNO(errno.ENOSYS), "clone3")
    for flag in NAMESPACE_FLAGS:
        _add(f, eperm, "clone", s.Arg(0, s.MASKED_EQ, flag, flag))
    for request in (TIOCSTI, TIOCLINUX):
        _add(f, eperm, "ioctl", s.Arg(1, s.MASKED_EQ, 0xFFFFFFFF, request))
    if not allow_fork:
        _add(f, eperm, "fork")
        _add(f, eperm, "vfork")
        _add(f, eperm, "clone", s.Arg(0, s.MASKED_EQ, CLONE_THREAD, 0))
    if own_pid is not None:  # signals only to itself
        _add(f, eperm, "kill", s.Arg(0, s.NE, own_pid))
        _add(f, eperm, "tgkill", s.Arg(0, s.NE, own_pid))
        _add(f, eperm, "tkill")
    fd = os.memfd_create("seccomp-bpf")
    with os.fdopen(fd, "w+b") as fh:
        f.export_bpf(fh)
        fh.seek(0)
        return fh.read()


@functools.lru_cache(maxsize=None)
def namespaces_filter() -> bytes:
    """The filter of the namespaces mode, the same for every call: compiled once per process."""
    return build_filter(allow_fork=True)


def missing() -> str | None:
    """Why a filter cannot be built here (pyseccomp or libseccomp missing), else None."""
    try:
        namespaces_filter()
    except (ImportError, OSError, RuntimeError) as exc:
        return f"cannot build the seccomp filter ({type(exc).__name__}: {exc}); scripts/setup.sh installs " \
               f"pyseccomp and Debian's libseccomp2"
    return None
