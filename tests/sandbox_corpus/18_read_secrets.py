# expect: done
# Host secrets: shadow, root's home, a secret file in the repo, the host's environment. What can
# be read is printed: the test checks on the host side that no secret is in it.
for path in ["/etc/shadow", "/root/.ssh/id_rsa", "/root/.bash_history", "__SECRET_PATH__",
             "/proc/1/environ", "/proc/self/environ", "/proc/1/root/etc/shadow", "/work",
             "/etc/passwd"]:
    try:
        print("read", path, open(path, "rb").read()[:300])
    except OSError as e:
        print("blocked", path, type(e).__name__)
print("environ", sorted(os.environ))
print("DONE")
