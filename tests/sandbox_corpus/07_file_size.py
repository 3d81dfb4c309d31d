# expect: done
# One file past RLIMIT_FSIZE: EFBIG (SIGXFSZ is ignored so the write fails instead of killing).
import signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
def big():
    with open("/tmp/f", "wb") as f:
        f.seek(1 << 30)
        f.write(b"x")
    return "1 GiB sparse file"
attempt("huge file", big)
print("DONE")
