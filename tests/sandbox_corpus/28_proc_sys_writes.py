# expect: done
# Kernel knobs through /proc: sysrq, core_pattern (a classic container escape), sysctl.
for path in ["/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern",
             "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/sys/kernel/uevent_helper"]:
    attempt(f"write {path}", lambda path=path: open(path, "w").write("1"))
attempt("sethostname", lambda: __import__("socket").sethostname("pwned"))
print("DONE")
