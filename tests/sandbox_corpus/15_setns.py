# expect: done
# Join another namespace through /proc (only our own are visible: pid namespace).
import glob
for path in sorted(glob.glob("/proc/1/ns/*")):
    def go(path=path):
        fd = os.open(path, os.O_RDONLY)
        return syscall("setns", fd, 0)
    attempt(f"setns {path}", go)
# pid 1 is bwrap's init in our own pid namespace: its root is the sandbox's root
print("pid 1 sees", sorted(os.listdir("/proc/1/root")) == sorted(os.listdir("/")))
print("DONE")
