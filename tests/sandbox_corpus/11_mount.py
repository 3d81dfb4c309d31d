# expect: done
# mount a tmpfs over /usr, remount a read-only bind rw, the new mount API, chroot, pivot_root.
MS_REMOUNT, MS_BIND = 32, 4096
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]


def mount(src, dst, fstype, flags):
    if libc.mount(src, dst, fstype, flags, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return "mounted"


attempt("mount tmpfs /usr", lambda: mount(b"none", b"/usr", b"tmpfs", 0))
attempt("remount /usr rw", lambda: mount(None, b"/usr", None, MS_REMOUNT | MS_BIND))
attempt("remount / rw", lambda: mount(None, b"/", None, MS_REMOUNT))
ROOT, TMPFS = ctypes.c_char_p(b"/"), ctypes.c_char_p(b"tmpfs")
AT_FDCWD, OPEN_TREE_CLONE = -100, 1
attempt("open_tree /", lambda: syscall("open_tree", AT_FDCWD, ctypes.cast(ROOT, ctypes.c_void_p).value,
                                       OPEN_TREE_CLONE))
attempt("fsopen tmpfs", lambda: syscall("fsopen", ctypes.cast(TMPFS, ctypes.c_void_p).value, 0))
attempt("chroot /tmp", lambda: os.chroot("/tmp"))
attempt("pivot_root", lambda: syscall("pivot_root", 0, 0))
print("DONE")
