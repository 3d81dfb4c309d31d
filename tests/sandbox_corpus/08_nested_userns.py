# expect: done
# A nested user namespace would give full capabilities inside (and tmpfs over /usr).
import subprocess
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
attempt("unshare(NEWUSER)", lambda: syscall("unshare", CLONE_NEWUSER))
attempt("unshare(NEWUSER|NEWNS)", lambda: syscall("unshare", CLONE_NEWUSER | CLONE_NEWNS))
p = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs none /usr && echo mounted"],
                   capture_output=True, text=True)
print("ESCAPED unshare -rm" if "mounted" in p.stdout else "blocked unshare -rm", p.returncode)
print("DONE")
