# expect: done
# Disk: the writable space is two size-capped tmpfs; / and /dev are read-only.
def fill(path):
    with open(path, "wb") as f:
        for _ in range(1 << 12):
            f.write(b"d" * (1 << 20))
    return "wrote 4 GiB"
attempt("fill /tmp", lambda: fill("/tmp/big"))
attempt("write /", lambda: open("/x", "w").write("x"))
attempt("write /dev", lambda: open("/dev/x", "w").write("x"))
attempt("mkdir /usr/x", lambda: __import__("os").mkdir("/usr/x"))
print("DONE")
