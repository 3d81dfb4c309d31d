"""Multi-host start-up (`jax.distributed.initialize` from arguments or the environment) and the
few host-side collectives the loop needs: a barrier and an all-gather of small JSON rows."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import jax
import numpy as np

log = logging.getLogger(__name__)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
    """Join the multi-host job; returns True when running multi-process.

    Order: explicit arguments; COORDINATOR_ADDRESS / NUM_PROCESSES / PROCESS_ID; then JAX's own
    cluster detection for SLURM (srun sets SLURM_*) and Cloud TPU VMs. A single process with
    none of these is left alone.
    """
    env = os.environ
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
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    elif int(env.get("SLURM_NTASKS", "1")) > 1 or env.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0:
        _cpu_collectives()
        jax.distributed.initialize()  # JAX reads SLURM_* / the TPU metadata itself
    else:
        return False
    log.info("process %d/%d, %d local of %d devices", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())
    return True


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

