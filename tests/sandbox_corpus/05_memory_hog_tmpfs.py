# expect: done
# Memory through the file systems: several children fill /dev/shm and /tmp with 8 MB files (one
# file stays under RLIMIT_FSIZE): each tmpfs stops at its size cap, whoever writes.
for i in range(4):
    if os.fork() == 0:
        for d in ("/dev/shm", "/tmp"):
            try:
                for j in range(1000):
                    with open(f"{d}/fill{i}_{j}", "wb") as f:
                        f.write(b"z" * (8 << 20))
            except OSError as e:
                print(d, i, e.strerror, flush=True)
        os._exit(0)
for _ in range(4):
    os.wait()
print("DONE")
