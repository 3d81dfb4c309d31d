"""Multi-host start-up (`jax.distributed.initialize` from arguments or the environment), the
end of a failed process (`exit_on_error`) and the few host-side collectives the loop needs: a
barrier and an all-gather of small JSON rows."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
from typing import Any, Iterator

import jax
import numpy as np

log = logging.getLogger(__name__)

# Seconds a process may go without a heartbeat to the coordination service before the service
# declares it dead and ends every other process of the job (JAX's default is 100). Heartbeats
# come from a C++ thread, so a long compile or a busy Python thread does not miss them; a
# process that died is noticed this long after, or at once where it was the coordinator
# (process 0) or a gloo (CPU) collective peer, whose sockets close with it. Override with
# HEARTBEAT_TIMEOUT_S or the argument.
HEARTBEAT_TIMEOUT_S = 60
_FIRST_FAILURE = "orchestrax/first_failure"   # coordination-service key: who failed first


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, heartbeat_timeout_s: int | None = None) -> bool:
    """Join the multi-host job; returns True when running multi-process.

    Order: explicit arguments; COORDINATOR_ADDRESS / NUM_PROCESSES / PROCESS_ID; then JAX's own
    cluster detection for SLURM (srun sets SLURM_*) and Cloud TPU VMs. A single process with
    none of these is left alone. `heartbeat_timeout_s` (else HEARTBEAT_TIMEOUT_S, else 60):
    how long after a process dies the others are ended.
    """
    env = os.environ
    if heartbeat_timeout_s is None:
        heartbeat_timeout_s = int(env.get("HEARTBEAT_TIMEOUT_S", HEARTBEAT_TIMEOUT_S))
    if heartbeat_timeout_s <= 0:
        raise ValueError(f"heartbeat_timeout_s={heartbeat_timeout_s}; allowed: seconds > 0")
    coordinator_address = coordinator_address or env.get("COORDINATOR_ADDRESS")
    if num_processes is None and env.get("NUM_PROCESSES"):
        num_processes = int(env["NUM_PROCESSES"])
    if process_id is None and env.get("PROCESS_ID"):
        process_id = int(env["PROCESS_ID"])
    if coordinator_address:
        if num_processes is None or process_id is None:
            raise ValueError("COORDINATOR_ADDRESS is set but NUM_PROCESSES / PROCESS_ID are not; "
                             "set all three (or none, under SLURM or on a TPU VM)")
        if num_processes == 1:
            return False
        _cpu_collectives()
        jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                   heartbeat_timeout_seconds=heartbeat_timeout_s)
    elif int(env.get("SLURM_NTASKS", "1")) > 1 or env.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0:
        _cpu_collectives()
        # JAX reads SLURM_* / the TPU metadata itself
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s)
    else:
        return False
    log.info("process %d/%d, %d local of %d devices", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())
    return True


@contextlib.contextmanager
def exit_on_error() -> Iterator[None]:
    """Multi-process: an exception inside ends this process at once with status 1, after
    logging it with the first failure of the job (this one, or another process's), and without
    JAX's exit-time shutdown barrier. Unwinding normally, a failed process would wait in that
    barrier (or in a collective a `finally` issues) while its peers wait in their next
    collective for it: the job hangs. Ended, its gloo peers fail at their next collective and
    the coordination service ends any other after `HEARTBEAT_TIMEOUT_S`."""
    try:
        yield
    except Exception as e:
        if jax.process_count() == 1:
            raise
        me = f"process {jax.process_index()} of {jax.process_count()}"
        first = _first_failure(f"{me}: {type(e).__name__}: {e}")
        log.critical("%s failed:", me, exc_info=e)
        # Last, so the tail of the log (what a launcher shows) names the job's first failure.
        log.critical("%s exits with status 1, so the other processes end too; first failure of "
                     "the job: %s", me, first or "not recorded")
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _first_failure(mine: str) -> str | None:
    """Record `mine` in the coordination service unless another process's failure is there
    already; return the one recorded (None if the service does not answer in 10 s: it died
    with process 0)."""
    from jax._src import distributed   # the client has no public handle
    client = distributed.global_state.client
    if client is None:
        return None
    found: list[str] = []

    def record() -> None:
        with contextlib.suppress(Exception):   # the key exists: another process failed first
            client.key_value_set(_FIRST_FAILURE, mine[:2000])
        with contextlib.suppress(Exception):
            found.append(client.key_value_try_get(_FIRST_FAILURE))

    thread = threading.Thread(target=record, daemon=True)
    thread.start()
    thread.join(timeout=10)
    return found[0] if found else None


def _cpu_collectives() -> None:
    """CPU devices of different processes reach each other only through gloo; without it a
    cross-process computation on CPU fails at its first collective. GPU and TPU clients ignore
    the setting."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")


def barrier(name: str) -> None:
    """Every process waits here until all have reached the barrier `name`; one process: no-op."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def allgather_json(obj: Any) -> list[Any]:
    """`obj` (JSON-serialisable) from every process, in process order; one process: `[obj]`."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int32(data.size))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [json.loads(bytes(row[:n]).decode()) for row, n in zip(rows, sizes)]

