# expect: bounded
# A classic fork bomb: every process forks forever. The run's process cap stops it.
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
