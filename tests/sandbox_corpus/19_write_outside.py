# expect: done
# Writes to host paths; the test checks on the host that none of them appeared. The /proc/*/root
# paths lead to the sandbox's own /tmp (pid 1 is bwrap's init): writing there is allowed, and the
# host's /tmp must still not get the file.
for path in ["__CANARY__", "/usr/__CANARY_NAME__", "/__CANARY_NAME__", "/etc/__CANARY_NAME__"]:
    attempt(f"write {path}", lambda path=path: open(path, "w").write("pwned"))
for path in ["/proc/1/root/tmp/__CANARY_NAME__", "/proc/self/root/tmp/__CANARY_NAME__"]:
    open(path, "w").write("inside")
    print("wrote inside", path)
print("DONE")
