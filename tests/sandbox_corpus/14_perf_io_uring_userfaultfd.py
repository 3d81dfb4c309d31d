# expect: done
# perf_event_open, io_uring, userfaultfd: attack surface a Python program never needs.
attr = (ctypes.c_uint32 * 32)(1, 112)        # PERF_TYPE_SOFTWARE, size
attempt("perf_event_open", lambda: syscall("perf_event_open", ctypes.addressof(attr), 0, -1, -1, 0))
params = (ctypes.c_uint32 * 30)()
attempt("io_uring_setup", lambda: syscall("io_uring_setup", 8, ctypes.addressof(params)))
attempt("userfaultfd", lambda: syscall("userfaultfd", 0))
print("DONE")
