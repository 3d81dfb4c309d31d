# expect: done
# On x86_64, the x32 ABI numbers (| 0x40000000) reach the same kernel code under other
# numbers: a filter that only checks the plain numbers would let unshare through.
import platform
if platform.machine() == "x86_64":
    def x32(nr, *args):
        ret = libc.syscall(ctypes.c_long(0x40000000 | nr), *[ctypes.c_long(a) for a in args])
        if ret < 0:
            raise OSError(ctypes.get_errno(), "x32")
        return ret
    attempt("x32 unshare", lambda: x32(272, 0x10000000))
    attempt("x32 getpid", lambda: x32(39))
print("DONE")
