# expect: done
# Stop or kill the namespace's init (bwrap): the kernel drops SIGSTOP/SIGKILL sent to a pid
# namespace's init from inside, so init must still be running; and the host still reaps the run.
import signal, time
for sig in (signal.SIGSTOP, signal.SIGKILL, signal.SIGTERM):
    try:
        os.kill(1, sig)
    except OSError as e:
        print("blocked", sig.name, e.errno)
time.sleep(0.1)
state = open("/proc/1/stat").read().rsplit(")", 1)[1].split()[0]
print("ESCAPED init stopped" if state in "Tt" else f"init state {state}")
print("DONE")
