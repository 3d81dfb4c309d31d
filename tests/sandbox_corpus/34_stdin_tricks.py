# expect: done
# The terminal: TIOCSTI pushes characters into the controlling terminal's input (blocked by
# --new-session); we have no terminal at all.
import fcntl, termios
for fd in (0, 1, 2):
    attempt(f"TIOCSTI fd {fd}", lambda fd=fd: fcntl.ioctl(fd, termios.TIOCSTI, b"x"))
attempt("open /dev/tty", lambda: os.open("/dev/tty", os.O_RDWR))
print("DONE")
