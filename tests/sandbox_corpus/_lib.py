"""Shared by the corpus programs: prepended to each before it runs (the sandbox sees one file).

`attempt(name, fn)` runs one escape attempt: success prints 'ESCAPED name', which the test treats
as a breach; an OSError (or a -1 from a raw syscall) is the expected outcome."""
import ctypes, errno, os, platform, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ARCH = {"x86_64": 0, "aarch64": 1}[platform.machine()]
NR = {name: nrs[ARCH] for name, nrs in {
    "ptrace": (101, 117), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "bpf": (321, 280), "perf_event_open": (298, 241), "unshare": (272, 97), "setns": (308, 268),
    "mount": (165, 40), "pivot_root": (155, 41), "io_uring_setup": (425, 425),
    "userfaultfd": (323, 282), "clone": (56, 220), "clone3": (435, 435), "kexec_load": (246, 104),
    "init_module": (175, 105), "open_tree": (428, 428), "fsopen": (430, 430),
    "process_vm_readv": (310, 270), "syslog": (103, 116), "chroot": (161, 51),
}.items()}


def syscall(name, *args):
    """The raw syscall; raises OSError on -1 like os.* functions do."""
    ret = libc.syscall(NR[name], *[ctypes.c_long(a) for a in args])
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return ret


def attempt(name, fn):
    try:
        out = fn()
    except (OSError, MemoryError, ValueError, PermissionError) as e:
        print("blocked", name, type(e).__name__, getattr(e, "errno", ""), flush=True)
        return None
    print("ESCAPED", name, repr(out)[:200], flush=True)
    return out
