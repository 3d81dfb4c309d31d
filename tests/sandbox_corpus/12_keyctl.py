# expect: done
# The kernel keyring: shared across the host user's sessions, a known attack surface.
KEY_SPEC_SESSION_KEYRING, KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_GET_KEYRING_ID = -3, 1, 0
attempt("keyctl get session", lambda: syscall("keyctl", KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1))
attempt("keyctl join", lambda: syscall("keyctl", KEYCTL_JOIN_SESSION_KEYRING, 0))
user = ctypes.c_char_p(b"user")
attempt("add_key", lambda: syscall("add_key", ctypes.cast(user, ctypes.c_void_p).value,
                                   ctypes.cast(ctypes.c_char_p(b"k"), ctypes.c_void_p).value,
                                   0, 0, KEY_SPEC_SESSION_KEYRING))
attempt("request_key", lambda: syscall("request_key", ctypes.cast(user, ctypes.c_void_p).value, 0, 0, 0))
print("DONE")
