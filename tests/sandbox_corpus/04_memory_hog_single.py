# expect: done
# One process asks for 10 GiB: the address-space limit refuses it with a MemoryError.
attempt("alloc 10 GiB", lambda: len(bytearray(10 << 30)))
attempt("alloc 64 GiB mmap", lambda: __import__("mmap").mmap(-1, 64 << 30))
print("DONE")
