# expect: done
# clone() with namespace flags, and clone3 (whose flags the filter cannot read).
import signal
for flag, name in [(0x10000000, "NEWUSER"), (0x20000000, "NEWPID"), (0x40000000, "NEWNET"),
                   (0x00020000, "NEWNS"), (0x00000080, "NEWTIME")]:
    def go(flag=flag):
        pid = syscall("clone", flag | signal.SIGCHLD, 0, 0, 0, 0)
        if pid == 0:
            os._exit(0)
        return pid
    attempt(f"clone({name})", go)
attempt("clone3", lambda: syscall("clone3", 0, 0))
# a plain fork still works
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork ok", os.waitpid(pid, 0)[1] >> 8)
print("DONE")
