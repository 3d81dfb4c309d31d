# expect: done
# Host files through /proc: pid 1 is bwrap's init inside the namespace; its root is the sandbox.
for path in ["/proc/1/root/work", "/proc/1/cwd/../../etc/shadow", "/proc/self/cwd/../root"]:
    attempt(f"list {path}", lambda path=path: os.listdir(path))
addresses = {l.split()[0] for l in open("/proc/kallsyms")} if os.path.exists("/proc/kallsyms") else set()
print("ESCAPED kernel addresses" if addresses - {"0000000000000000"} else "blocked kallsyms")
print("mounts", len(open("/proc/self/mounts").read().splitlines()))
print("DONE")
