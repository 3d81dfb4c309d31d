"""The sandbox's seccomp filter as a classic-BPF program for `bwrap --seccomp FD`.

Built here, not with libseccomp, so nothing beyond the standard library is needed. The program:
kill the process for any foreign syscall ABI (i386 on x86_64, arm32 on aarch64, and x86_64's x32
numbers get EPERM), EPERM for the kernel-attack-surface, escape, untracked-memory and new-session
syscalls in `BLOCKED`, EPERM for `clone` with any namespace flag, ENOSYS for `clone3` (its flags
sit behind a pointer the filter cannot read; glibc then falls back to `clone`), EPERM for `socket`
of the VSOCK family (the one family that reaches a hypervisor from a private network namespace),
EPERM for `setsockopt` of a socket buffer size (so every socket holds at most the host's default
buffers, which the uid-mode memory bound counts), ALLOW for everything else.
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_NR_OFFSET, _ARCH_OFFSET, _ARG0_LOW_OFFSET = 0, 4, 16
# little-endian only (both supported arches): the low 32 bits of args[0] come first

_LD_W_ABS = 0x20    # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15       # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35       # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45      # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06       # BPF_RET | BPF_K

RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

_X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000 | 0x00000080

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# name: (x86_64, aarch64); None where the arch has no such syscall.
# Grouped by why: escape via namespaces/mounts; reaching other processes; kernel attack surface
# that a Python program never needs (keys, BPF, perf, io_uring, userfaultfd); host administration.
BLOCKED: dict[str, tuple[int | None, int | None]] = {
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "chroot": (161, 51), "open_tree": (428, 428),
    "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "fanotify_init": (300, 262),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "reboot": (169, 142),
    "swapon": (167, 224), "swapoff": (168, 225), "acct": (163, 89), "syslog": (103, 116),
    "quotactl": (179, 60), "quotactl_fd": (443, 443), "lookup_dcookie": (212, 18),
    "vhangup": (153, 58), "uselib": (134, None), "iopl": (172, None), "ioperm": (173, None),
    # Memory no bound sees in uid mode (no cgroup): a memfd filled by write() is in no mapping
    # and on no mount, and a SysV segment outlives every process that attached it. POSIX shm
    # lives in the run's /dev/shm tmpfs instead, which is size-capped and counted.
    "memfd_create": (319, 279), "memfd_secret": (447, 447), "shmget": (29, 194),
    # A session of its own is a scheduler autogroup of its own, which takes a CPU share as large
    # as the trainer's whatever the run's nice value: without a cgroup, N sessions would take N
    # shares. The run stays the one session bwrap made for it.
    "setsid": (112, 157),
}
CLONE = {"x86_64": 56, "aarch64": 220}
SOCKET = {"x86_64": 41, "aarch64": 198}
AF_VSOCK = 40
SETSOCKOPT = {"x86_64": 54, "aarch64": 208}
SOL_SOCKET = 1
# SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE
BUFFER_OPTIONS = (7, 8, 32, 33)
_ARG1_LOW_OFFSET, _ARG2_LOW_OFFSET = 24, 32
CLONE3 = {"x86_64": 435, "aarch64": 435}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _ret(value: int) -> bytes:
    return _insn(_RET_K, value)


def native_arch() -> str:
    machine = platform.machine()
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
        machine.lower())
    if arch is None:
        raise ValueError(f"seccomp filter: machine {machine!r} is not supported; "
                         f"allowed: {sorted(AUDIT_ARCH)}")
    return arch


def build_filter(arch: str | None = None) -> bytes:
    """The filter as packed `struct sock_filter` records (8 bytes each), native byte order of the
    supported little-endian arches, ready to be written to the fd bwrap reads."""
    arch = arch or native_arch()
    if arch not in AUDIT_ARCH:
        raise ValueError(f"seccomp filter: arch={arch!r}; allowed: {sorted(AUDIT_ARCH)}")
    column = 0 if arch == "x86_64" else 1
    eperm = _ret(RET_ERRNO | errno.EPERM)
    prog = [_insn(_LD_W_ABS, _ARCH_OFFSET),
            _insn(_JEQ_K, AUDIT_ARCH[arch], jt=1),
            _ret(RET_KILL_PROCESS),
            _insn(_LD_W_ABS, _NR_OFFSET)]
    if arch == "x86_64":  # x32 numbers reach the same kernel code under other numbers
        prog += [_insn(_JGE_K, _X32_SYSCALL_BIT, jf=1), eperm]
    for nr in sorted(numbers[column] for numbers in BLOCKED.values()
                     if numbers[column] is not None):
        prog += [_insn(_JEQ_K, nr, jf=1), eperm]
    prog += [_insn(_JEQ_K, CLONE3[arch], jf=1), _ret(RET_ERRNO | errno.ENOSYS),
             # socket(AF_VSOCK, ...): the family is args[0]
             _insn(_JEQ_K, SOCKET[arch], jf=3),
             _insn(_LD_W_ABS, _ARG0_LOW_OFFSET),
             _insn(_JEQ_K, AF_VSOCK, jf=1),
             _ret(RET_ERRNO | errno.EAFNOSUPPORT),
             # setsockopt(fd, SOL_SOCKET, one of BUFFER_OPTIONS, ...)
             _insn(_JEQ_K, SETSOCKOPT[arch], jf=8),
             _insn(_LD_W_ABS, _ARG1_LOW_OFFSET),
             _insn(_JEQ_K, SOL_SOCKET, jf=6),
             _insn(_LD_W_ABS, _ARG2_LOW_OFFSET),
             _insn(_JEQ_K, BUFFER_OPTIONS[0], jt=3),
             _insn(_JEQ_K, BUFFER_OPTIONS[1], jt=2),
             _insn(_JEQ_K, BUFFER_OPTIONS[2], jt=1),
             _insn(_JEQ_K, BUFFER_OPTIONS[3], jf=1),
             eperm,
             _insn(_LD_W_ABS, _NR_OFFSET),
             _insn(_JEQ_K, CLONE[arch], jt=1),
             _ret(RET_ALLOW),
             _insn(_LD_W_ABS, _ARG0_LOW_OFFSET),
             _insn(_JSET_K, CLONE_NAMESPACE_FLAGS, jf=1),
             eperm,
             _ret(RET_ALLOW)]
    return b"".join(prog)
