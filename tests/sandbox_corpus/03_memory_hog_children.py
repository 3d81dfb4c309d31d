# expect: memory_limit
# 4 children x 300 MB of touched pages: per-process RLIMIT_AS allows each; the run's memory cap
# (512 MB in the corpus) must stop the sum. test_tools_sandbox_limits runs the 4 x 800 MB.
import os, time
for _ in range(4):
    if os.fork() == 0:
        x = b"x" * (300 << 20)
        time.sleep(2)
        os._exit(0)
for _ in range(4):
    print(os.wait(), flush=True)
