"""The walls around the file-reading worker (worker.py), and the one the graph puts around
itself before it starts any: a parser bug that runs code (Pillow, pypdf, lxml are large C
and Python code fed with anyone's bytes) must not become the graph's API keys or its Redis.

What each wall stops, on Linux (elsewhere none applies and `confine` says so):

- the graph is not dumpable (`harden_parent`): a process of the same uid cannot read its
  `/proc/<pid>/environ` (the keys) or `/mem`, nor ptrace it, without CAP_SYS_PTRACE;
- the worker drops every capability, and runs as nobody (65534) when the graph is root and
  Python can still be loaded as nobody (else uid 0 without any capability);
- no network: a network namespace of its own (`unshare`, with a user namespace unless it is
  root) where the host allows it, and a seccomp filter that fails `socket()` in any case;
- the filter also fails fork/clone/exec, ptrace, signals to other processes, new
  namespaces, io_uring, bpf, perf and keyrings; RLIMIT_NPROC 0 stops forks too (not for
  uid 0, which the kernel exempts: the filter does it then), RLIMIT_NOFILE is small;
- an audit hook refuses sockets and processes to Python code: only a clearer error, NOT a
  wall (native code never meets it); the kernel's filter and namespace are the walls.

Everything here is done with ctypes (seccomp has no stdlib module): the BPF program is a
deny list checked against the syscall number, after refusing any other syscall ABI.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import struct
import sys
from collections.abc import Sequence
from typing import Any, Final

#: The uid and gid a worker started by a root graph runs as.
NOBODY: Final = 65534
#: Open files a worker may hold: its pipes, one module or library being loaded, slack.
MAX_OPEN_FILES: Final = 32

_PR_SET_DUMPABLE: Final = 4
_PR_SET_SECCOMP: Final = 22
_PR_SET_NO_NEW_PRIVS: Final = 38
_SECCOMP_MODE_FILTER: Final = 2
_CLONE_NEWUSER: Final = 0x10000000
_CLONE_NEWNET: Final = 0x40000000
_CAPABILITY_V3: Final = 0x20080522

# Classic BPF, as seccomp runs it on struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}.
_LD_ABS: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE: Final = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET: Final = 0x06  # BPF_RET | BPF_K
_NR_AT: Final = 0
_ARCH_AT: Final = 4
_ARG0_LOW_AT: Final = 16  # little-endian: the low 32 bits of args[0] (a pid_t is 32 bits)
_ALLOW: Final = 0x7FFF0000
_KILL_PROCESS: Final = 0x80000000
_X32_BIT: Final = 0x40000000


def _errno(code: int) -> int:
    return 0x00050000 | code  # SECCOMP_RET_ERRNO


#: The architectures the filter knows: AUDIT_ARCH value, and the column of _SYSCALLS.
_ARCHES: Final = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
#: (name, number on x86_64, on aarch64 (None: no such call, libc uses clone), errno it fails
#: with; None: allowed only towards this process, its first argument being its pid).
_SYSCALLS: Final[tuple[tuple[str, int, int | None, int | None], ...]] = (
    ("socket", 41, 198, errno.EACCES),
    ("socketpair", 53, 199, errno.EACCES),
    ("clone", 56, 220, errno.EPERM),
    ("clone3", 435, 435, errno.ENOSYS),  # ENOSYS: libc falls back to clone, refused above
    ("fork", 57, None, errno.EPERM),
    ("vfork", 58, None, errno.EPERM),
    ("execve", 59, 221, errno.EPERM),
    ("execveat", 322, 281, errno.EPERM),
    ("ptrace", 101, 117, errno.EPERM),
    ("process_vm_readv", 310, 270, errno.EPERM),
    ("process_vm_writev", 311, 271, errno.EPERM),
    ("rt_sigqueueinfo", 129, 138, errno.EPERM),
    ("rt_tgsigqueueinfo", 297, 240, errno.EPERM),
    ("pidfd_open", 434, 434, errno.EPERM),
    ("pidfd_getfd", 438, 438, errno.EPERM),
    ("pidfd_send_signal", 424, 424, errno.EPERM),
    ("unshare", 272, 97, errno.EPERM),
    ("setns", 308, 268, errno.EPERM),
    ("io_uring_setup", 425, 425, errno.ENOSYS),
    ("io_uring_enter", 426, 426, errno.ENOSYS),
    ("io_uring_register", 427, 427, errno.ENOSYS),
    ("bpf", 321, 280, errno.EPERM),
    ("perf_event_open", 298, 241, errno.EPERM),
    ("userfaultfd", 323, 282, errno.EPERM),
    ("keyctl", 250, 219, errno.EPERM),
    ("add_key", 248, 217, errno.EPERM),
    ("request_key", 249, 218, errno.EPERM),
    ("kill", 62, 129, None),
    ("tkill", 200, 130, None),
    ("tgkill", 234, 131, None),
)
#: What Python code in the worker is refused (events of sys.audit): a clear error for a
#: library that tries, not a wall.
_AUDIT_REFUSED: Final = frozenset(
    {
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.exec",
        "os.system",
        "subprocess.Popen",
        "pty.spawn",
    }
)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def harden_parent() -> bool:
    """Make this process (the graph) non-dumpable: its environment (API keys), memory and
    file descriptors under /proc are then closed to every process without CAP_SYS_PTRACE,
    its own workers included. Whether it took (False off Linux)."""
    libc = _libc()
    return libc is not None and _prctl(libc, _PR_SET_DUMPABLE, 0) == 0


def confine(memory_mb: int, cpu_seconds: int) -> dict[str, Any]:
    """Wall this process in before it reads a byte of the file (order matters: namespaces
    and the uid change need capabilities the later steps drop). What holds is returned, for
    the graph's log: {"uid", "net_namespace", "seccomp", "capabilities"}."""
    libc = _libc()
    net_namespace = False
    if libc is not None and os.geteuid() == 0:
        net_namespace = _unshare(libc, _CLONE_NEWNET)  # root with CAP_SYS_ADMIN
        if _nobody_can_run_python():
            _become(NOBODY)
    uid = os.getuid()  # in a user namespace of its own it would read 65534 (unmapped), whatever it is
    if libc is not None and not net_namespace:
        net_namespace = _unshare(libc, _CLONE_NEWUSER | _CLONE_NEWNET)
    if libc is not None:
        _drop_capabilities(libc)
        _prctl(libc, _PR_SET_DUMPABLE, 0)  # neither can another worker read this one's file
    limit(memory_mb, cpu_seconds)
    seccomp = libc is not None and _install_seccomp(libc, os.uname().machine, os.getpid())
    sys.addaudithook(_refuse_sockets_and_processes)
    return {
        "uid": uid,
        "net_namespace": net_namespace,
        "seccomp": seccomp,
        "capabilities": _capabilities_left(),
    }


def limit(memory_mb: int, cpu_seconds: int) -> None:
    """The rlimits. Set in the worker, not as a preexec_fn in the graph: that would stop
    subprocess from using vfork (slow for a large parent) and is unsafe with threads."""
    _lower(resource.RLIMIT_AS, memory_mb * 1024 * 1024, memory_mb * 1024 * 1024)
    _lower(resource.RLIMIT_CPU, cpu_seconds, cpu_seconds + 1)  # SIGXCPU, then SIGKILL
    _lower(resource.RLIMIT_CORE, 0, 0)  # a crash never writes the file to disk
    _lower(resource.RLIMIT_FSIZE, 0, 0)  # nor does anything else (Python ignores SIGXFSZ)
    _lower(resource.RLIMIT_NOFILE, MAX_OPEN_FILES, MAX_OPEN_FILES)
    _lower(resource.RLIMIT_NPROC, 0, 0)  # no process or thread (the kernel exempts uid 0)


def _lower(which: int, soft: int, hard: int) -> None:
    """Never above a hard limit already set (a container's): raising it would fail."""
    _, current = resource.getrlimit(which)
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(which, (soft, hard))


def seccomp_program(machine: str, own_pid: int) -> bytes | None:
    """The BPF filter for `machine` (os.uname().machine), as bytes of struct sock_filter; None
    for an architecture whose syscall numbers are not known here. Another ABI than the
    native one (x86's int 0x80, x32) kills the process: its numbers would mean other calls."""
    if machine not in _ARCHES:
        return None
    arch, column = _ARCHES[machine]
    code: list[tuple[int, int, int, int]] = [
        (_LD_ABS, 0, 0, _ARCH_AT),
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, _KILL_PROCESS),
        (_LD_ABS, 0, 0, _NR_AT),
    ]
    if machine == "x86_64":
        code += [(_JGE, 0, 1, _X32_BIT), (_RET, 0, 0, _KILL_PROCESS)]
    for _name, *numbers, fails_with in _SYSCALLS:
        number = numbers[column]
        if number is None:
            continue
        if fails_with is not None:
            code += [(_JEQ, 0, 1, number), (_RET, 0, 0, _errno(fails_with))]
        else:  # the syscall's first argument (pid, tgid or tid) must be this process
            code += [
                (_JEQ, 0, 4, number),
                (_LD_ABS, 0, 0, _ARG0_LOW_AT),
                (_JEQ, 1, 0, own_pid),
                (_RET, 0, 0, _errno(errno.EPERM)),
                (_RET, 0, 0, _ALLOW),
            ]
    code.append((_RET, 0, 0, _ALLOW))
    return b"".join(struct.pack("=HBBI", op, jt, jf, k) for op, jt, jf, k in code)


def nobody_can_read(paths: Sequence[str]) -> bool:
    """Whether every one of `paths` (directories listed, files opened) is readable with the
    current effective ids; False at the first that is not."""
    for path in paths:
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                with open(path, "rb"):
                    pass
        except OSError:
            return False
    return True


# --- the steps ---------------------------------------------------------------------------------


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _prctl(libc: ctypes.CDLL, option: int, arg: int, pointer: ctypes.c_void_p | None = None) -> int:
    """prctl(2) is variadic: every argument passed at its full width."""
    third = pointer if pointer is not None else ctypes.c_ulong(0)
    return int(
        libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), third, ctypes.c_ulong(0), ctypes.c_ulong(0))
    )


def _unshare(libc: ctypes.CDLL, flags: int) -> bool:
    """A new namespace, if this host lets this process make one (containers often do not:
    Docker's and Kubernetes' default seccomp profiles refuse it without CAP_SYS_ADMIN)."""
    return int(libc.unshare(ctypes.c_int(flags))) == 0


def _nobody_can_run_python() -> bool:
    """Whether Python can go on importing as nobody: its stdlib and site-packages (sys.path)
    must be readable by nobody. A development install under /root is not; then the worker
    stays uid 0, without capabilities. Tried with the effective ids, then given back."""
    paths = [p for p in sys.path if p and os.path.exists(p)]
    try:
        os.setgroups([])
        os.setegid(NOBODY)
        os.seteuid(NOBODY)
    except PermissionError:  # uid 0 without CAP_SETUID/CAP_SETGID: it cannot change ids at all
        os.setegid(0)
        return False
    try:
        return nobody_can_read(paths)
    finally:
        os.seteuid(0)
        os.setegid(0)


def _become(uid: int) -> None:
    """Real, effective and saved ids all: no way back to root."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    """Empty effective, permitted and inheritable sets (a user namespace gives all of them
    inside it; a uid 0 that could not become nobody has all of them outside)."""
    header = _CapHeader(_CAPABILITY_V3, 0)
    data = (_CapData * 2)()
    libc.capset(ctypes.byref(header), ctypes.byref(data))


def _capabilities_left() -> bool:
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"CapEff:"):
                    return int(line.split()[1], 16) != 0
    except (OSError, ValueError, IndexError):
        pass
    return False


def _install_seccomp(libc: ctypes.CDLL, machine: str, own_pid: int) -> bool:
    program = seccomp_program(machine, own_pid)
    if program is None:
        return False
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if _prctl(libc, _PR_SET_NO_NEW_PRIVS, 1) != 0:
        return False
    pointer = ctypes.c_void_p(ctypes.addressof(fprog))
    return _prctl(libc, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, pointer) == 0


def _refuse_sockets_and_processes(event: str, _args: tuple[Any, ...]) -> None:
    if event in _AUDIT_REFUSED:
        raise PermissionError(f"{event} is not allowed while a file is read")
