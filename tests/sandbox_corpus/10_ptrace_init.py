# expect: done
# ptrace-stop bwrap's init (pid 1 of the namespace), or a sibling, or ourselves.
PTRACE_TRACEME, PTRACE_ATTACH, PTRACE_SEIZE = 0, 16, 0x4206
attempt("ptrace attach 1", lambda: syscall("ptrace", PTRACE_ATTACH, 1, 0, 0))
attempt("ptrace seize 1", lambda: syscall("ptrace", PTRACE_SEIZE, 1, 0, 0))
attempt("ptrace traceme", lambda: syscall("ptrace", PTRACE_TRACEME, 0, 0, 0))
attempt("process_vm_readv 1", lambda: syscall("process_vm_readv", 1, 0, 0, 0, 0, 0))
attempt("read /proc/1/mem", lambda: open("/proc/1/mem", "rb").read(16))
print("DONE")
