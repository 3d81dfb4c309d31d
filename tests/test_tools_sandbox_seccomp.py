"""The sandbox's seccomp filter: its syscall numbers against libseccomp's tables (for both
arches), its program run by a reference classic-BPF interpreter written from the kernel's
documented semantics, and the live kernel's answer inside bwrap with and without it."""

import ctypes
import errno
import os
import struct
import subprocess

import pytest

from orchestrax.tools.sandbox import SandboxConfig, build_argv
from orchestrax.tools.sandbox_seccomp import (AUDIT_ARCH, BLOCKED, CLONE, CLONE3,
                                              CLONE_NAMESPACE_FLAGS, RET_ALLOW, RET_ERRNO,
                                              RET_KILL_PROCESS, build_filter, native_arch)

ARCHES = ("x86_64", "aarch64")
NATIVE = native_arch()
EPERM, ENOSYS = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS


def libseccomp_number(arch: str, name: str) -> int | None:
    """libseccomp's number for `name` on `arch` (it ships with apt on Debian); None if the arch
    has no such syscall (libseccomp answers with a negative pseudo-number)."""
    lib = ctypes.CDLL("libseccomp.so.2")
    resolve = lib.seccomp_syscall_resolve_name_arch
    resolve.argtypes, resolve.restype = [ctypes.c_uint32, ctypes.c_char_p], ctypes.c_int
    nr = resolve(AUDIT_ARCH[arch], name.encode())
    return nr if nr >= 0 else None


@pytest.mark.parametrize("arch", ARCHES)
def test_syscall_numbers_match_libseccomp(arch):
    column = ARCHES.index(arch)
    for name, numbers in BLOCKED.items():
        assert numbers[column] == libseccomp_number(arch, name), (arch, name)
    assert CLONE[arch] == libseccomp_number(arch, "clone")
    assert CLONE3[arch] == libseccomp_number(arch, "clone3")


def run_bpf(prog: bytes, nr: int, arch: int, arg0: int = 0, args: tuple[int, ...] = ()) -> int:
    """Classic BPF as the kernel runs a seccomp filter, for the opcodes a filter may use here;
    `args` (all six, zero-filled) replaces `arg0` when given."""
    six = (tuple(args) + (0,) * 6)[:6] if args else (arg0, 0, 0, 0, 0, 0)
    data = struct.pack("<iIQ6Q", nr, arch, 0, *six)
    insns = [struct.unpack("<HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:                          # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code in (0x15, 0x35, 0x45):         # jeq / jge / jset #k
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        elif code == 0x06:                        # ret #k
            return k
        else:
            raise AssertionError(f"opcode {code:#x} at {pc - 1} is not expected in the filter")


@pytest.mark.parametrize("arch", ARCHES)
def test_filter_verdict_for_every_syscall_number(arch):
    prog = build_filter(arch)
    column = ARCHES.index(arch)
    blocked = {n[column] for n in BLOCKED.values() if n[column] is not None}
    audit = AUDIT_ARCH[arch]
    for nr in range(600):
        verdict = run_bpf(prog, nr, audit)
        if nr in blocked:
            assert verdict == EPERM, (arch, nr)
        elif nr == CLONE3[arch]:
            assert verdict == ENOSYS
        else:
            assert verdict == RET_ALLOW, (arch, nr)
    # clone: namespace flags refused one by one, a fork's or a thread's flags allowed
    for bit in range(32):
        flag = 1 << bit
        want = EPERM if flag & CLONE_NAMESPACE_FLAGS else RET_ALLOW
        assert run_bpf(prog, CLONE[arch], audit, arg0=flag | 17) == want, (arch, hex(flag))
    # CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID|CHILD_CLEARTID
    threads = 0x3D0F00
    assert run_bpf(prog, CLONE[arch], audit, arg0=threads) == RET_ALLOW
    assert bin(CLONE_NAMESPACE_FLAGS).count("1") == 8
    # another ABI on the same kernel (i386 on x86_64, arm32 on aarch64): the process is killed
    for foreign in (0x40000003, 0x40000028, *AUDIT_ARCH.values()):
        if foreign != audit:
            assert run_bpf(prog, 39, foreign) == RET_KILL_PROCESS
    if arch == "x86_64":  # x32 numbers: refused whatever they map to
        assert run_bpf(prog, 0x40000000 | 39, audit) == EPERM


def test_unsupported_arch_is_named():
    with pytest.raises(ValueError, match="riscv64.*allowed"):
        build_filter("riscv64")


PROBE = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = {{n: v[{ARCHES.index(NATIVE)}] for n, v in {dict(BLOCKED)!r}.items()}}
params = (ctypes.c_uint32 * 30)()
for name, args in [("ptrace", (0, 0, 0, 0)), ("keyctl", (0, -3, 1)),
                   ("io_uring_setup", (8, ctypes.addressof(params)))]:
    ret = libc.syscall(nr[name], *[ctypes.c_long(a) for a in args])
    print(name, "ok" if ret >= 0 else ctypes.get_errno())
"""


def test_the_live_kernel_refuses_with_the_filter_and_not_without():
    """The same probe inside bwrap, with and without the filter: without it these calls succeed
    (so the probe can tell), with it every one gets EPERM."""
    cfg = SandboxConfig()
    read_fd, write_fd = os.pipe()
    with open(write_fd, "wb") as w:
        w.write(build_filter())
    try:
        with_filter = subprocess.run(build_argv(cfg, seccomp_fd=read_fd), input=PROBE, text=True,
                                     capture_output=True, pass_fds=(read_fd,), timeout=30)
    finally:
        os.close(read_fd)
    without = subprocess.run(build_argv(cfg), input=PROBE, text=True, capture_output=True,
                             timeout=30)
    names = ("ptrace", "keyctl", "io_uring_setup")
    assert without.stdout.splitlines() == [f"{n} ok" for n in names], without
    assert with_filter.stdout.splitlines() == [f"{n} {errno.EPERM}" for n in names], with_filter
