"""Multi-host start-up: `jax.distributed.initialize` from arguments or the environment."""

from __future__ import annotations

import logging
import os

import jax

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
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    elif int(env.get("SLURM_NTASKS", "1")) > 1 or env.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0:
        jax.distributed.initialize()  # JAX reads SLURM_* / the TPU metadata itself
    else:
        return False
    log.info("process %d/%d, %d local of %d devices", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())
    return True
