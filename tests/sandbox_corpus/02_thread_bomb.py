# expect: bounded
# Threads are tasks too: they count against the run's pids cap and RLIMIT_NPROC.
import threading, time
n = 0
while True:
    try:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        n += 1
    except RuntimeError:
        print("threads refused after", n, flush=True)
        time.sleep(60)
