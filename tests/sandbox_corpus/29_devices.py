# expect: done
# Raw devices: host memory, kernel log, disks; mknod to make one.
import stat
for path in ["/dev/mem", "/dev/kmem", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/port"]:
    attempt(f"open {path}", lambda path=path: os.open(path, os.O_RDONLY))
attempt("mknod /tmp/mem", lambda: os.mknod("/tmp/mem", stat.S_IFCHR | 0o600, os.makedev(1, 1)))
attempt("syslog read", lambda: syscall("syslog", 3, 0, 0))
print("listing /dev", sorted(os.listdir("/dev")))
print("DONE")
