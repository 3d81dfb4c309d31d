# expect: done
# File descriptors: RLIMIT_NOFILE refuses more than the cap.
fds = []
def open_many():
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
attempt("unbounded fds", open_many)
print("opened", len(fds))
print("DONE")
