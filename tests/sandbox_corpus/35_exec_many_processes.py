# expect: bounded
# Many exec'd programs at once (not forks of this one): the run's process cap refuses the rest.
import subprocess
procs = []
for _ in range(100):
    try:
        procs.append(subprocess.Popen(["sleep", "60"]))
    except OSError as e:
        print("refused after", len(procs), e.strerror, flush=True)
        break
for p in procs:
    p.wait()
