# expect: exit
# Bytes that are not UTF-8 on both streams, then a lone surrogate that cannot be encoded.
import sys
sys.stdout.buffer.write(b"\xff\xfe\xed\xa0\x80 half\n")
sys.stdout.flush()
sys.stderr.buffer.write(b"\xc3\x28\n")
print("\ud800")
