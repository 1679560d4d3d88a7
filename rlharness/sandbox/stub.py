"""The program the sandbox's interpreter runs first (`python -I -c STUB ...`): it lowers its own
rlimits, loads the seccomp filter where bubblewrap did not (the rlimits mode), then runs the code.

It runs under the sandbox's interpreter (by default Debian's /usr/bin/python3), not the run's: the
standard library only, Python 3.8 or newer. Arguments: CPU seconds, address-space bytes, processes
(0 = not set), open files, file bytes, the fd of the BPF program (-1 = none), the fd the program
comes on (its length as 8 bytes, then its UTF-8 text). A sandbox started ahead (warm.py) waits
there, its interpreter loaded, until it is given its program.

The rlimits are set here, inside, after bubblewrap built the namespaces: RLIMIT_NPROC counts the
processes of the sandbox's own user namespace only when it is set by a process already in it (set
before, it would be shared by every sandbox of the machine). A MemoryError is reported by exit
status MEMORY_EXIT so the caller can name it.
"""

MEMORY_EXIT = 86

STUB = r"""
import os, resource, sys
cpu, memory, nproc, nofile, fsize, bpf_fd, code_fd = (int(a) for a in sys.argv[1:8])
def read(fd, size):
    chunks = []
    while size is None or size > 0:
        chunk = os.read(fd, 65536 if size is None else min(size, 65536))
        if not chunk:
            break
        chunks.append(chunk)
        size = None if size is None else size - len(chunk)
    return b"".join(chunks)
if bpf_fd >= 0:
    import ctypes
    program = read(bpf_fd, None)
    os.close(bpf_fd)
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    ulong = ctypes.c_ulong
    # PR_SET_NO_NEW_PRIVS, then PR_SET_SECCOMP with SECCOMP_MODE_FILTER.
    if (libc.prctl(38, ulong(1), ulong(0), ulong(0), ulong(0)) != 0
            or libc.prctl(22, ulong(2), ctypes.byref(fprog), ulong(0), ulong(0)) != 0):
        sys.stderr.write("sandbox: cannot load the seccomp filter: " + os.strerror(ctypes.get_errno()) + "\n")
        os._exit(125)
limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory),
          (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_FSIZE, fsize)]
if nproc:
    limits.append((resource.RLIMIT_NPROC, nproc))
for which, soft in limits:
    # CPU: SIGXCPU at the soft limit, SIGKILL a second later (the hard one) if it is caught.
    resource.setrlimit(which, (soft, soft + 1 if which == resource.RLIMIT_CPU else soft))
header = read(code_fd, 8)
if len(header) != 8:
    os._exit(0)  # never given a program: discarded unused
code = read(code_fd, int.from_bytes(header, "little")).decode("utf-8", "surrogatepass")
os.close(code_fd)
sys.argv = ["<code>"]
try:
    exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except MemoryError:
    try:
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(MEMORY_EXIT)
""".replace("MEMORY_EXIT", str(MEMORY_EXIT))
