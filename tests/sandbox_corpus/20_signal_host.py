# expect: done
# Signals to a host process by pid, and to every process this one may signal (kill -1): only the
# sandbox's own processes can be reached; the host victim must survive.
import signal, time
attempt("kill host victim", lambda: os.kill(__VICTIM_PID__, signal.SIGKILL))
visible = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("visible pids", visible[:10])
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
os.kill(-1, signal.SIGKILL)   # spares the caller and the namespace's init
print("own child", os.waitpid(child, 0)[1] & 0x7F)
print("DONE")
