# expect: exit
# 100 MB on stdout and on stderr: the host keeps the first bytes and drains the rest.
import sys
chunk = "o" * (1 << 20)
for _ in range(100):
    sys.stdout.write(chunk)
    sys.stderr.write(chunk)
print("DONE")
