# expect: done
# TCP to a host server on loopback and to the internet, UDP DNS, a raw socket.
import socket
for addr in [("127.0.0.1", __PORT__), ("1.1.1.1", 80), ("10.0.0.1", 22)]:
    attempt(f"tcp {addr}", lambda addr=addr: socket.create_connection(addr, timeout=1).send(b"hi"))
def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1)
    s.sendto(b"\x00" * 12, ("8.8.8.8", 53))
    return s.recv(512)
attempt("udp dns", dns)
attempt("raw socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("packet socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
print("interfaces", [n for _, n in socket.if_nameindex()])
print("DONE")
