# expect: done
# An abstract unix socket the host listens on (abstract names live in the network namespace),
# and the usual daemon sockets on the file system.
import socket
def connect(addr):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    s.connect(addr)
    s.send(b"hi")
    return "connected"
attempt("abstract host socket", lambda: connect(b"\0__ABSTRACT__"))
for path in ["/run/docker.sock", "/var/run/docker.sock", "/run/dbus/system_bus_socket",
             "/run/systemd/private"]:
    attempt(path, lambda path=path: connect(path))
print("DONE")
