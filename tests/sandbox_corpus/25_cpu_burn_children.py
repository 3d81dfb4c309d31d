# expect: bounded
# Several children spin: CPU time is limited per process, the wall clock for the run.
for _ in range(8):
    if os.fork() == 0:
        while True:
            pass
while True:
    pass
