# expect: done
# bpf(): maps and programs are kernel attack surface (and can read kernel memory when allowed).
BPF_MAP_CREATE, BPF_PROG_LOAD = 0, 5
attr = (ctypes.c_uint32 * 32)(2, 4, 4, 16)   # BPF_MAP_TYPE_ARRAY, key 4, value 4, 16 entries
attempt("bpf map create", lambda: syscall("bpf", BPF_MAP_CREATE, ctypes.addressof(attr), 128))
attempt("bpf prog load", lambda: syscall("bpf", BPF_PROG_LOAD, ctypes.addressof(attr), 128))
print("DONE")
