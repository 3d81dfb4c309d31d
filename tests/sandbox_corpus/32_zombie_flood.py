# expect: bounded
# Children that are never reaped keep their pids: the run's cap counts them.
n = 0
while True:
    try:
        if os.fork() == 0:
            os._exit(0)
        n += 1
    except OSError:
        print("zombies", n, flush=True)
        import time
        time.sleep(60)
