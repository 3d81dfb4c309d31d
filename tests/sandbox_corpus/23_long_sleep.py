# expect: timed_out
# Never returns on its own: the wall clock kills it.
import time
time.sleep(3600)
