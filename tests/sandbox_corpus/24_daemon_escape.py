# expect: done
# Double fork and setsid (refused by the filter: then in the run's session): a daemon that
# outlives its parent must still die with the run.
import time
if os.fork() == 0:
    try:
        os.setsid()
    except OSError:
        pass
    if os.fork() == 0:
        os.close(1); os.close(2)
        time.sleep(3600)
    os._exit(0)
os.wait()
print("DONE")
