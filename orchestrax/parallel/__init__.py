"""Meshes, logical-axis sharding rules and multi-host start-up."""

from orchestrax.parallel.distributed import (allgather_json, barrier, exit_on_error,
                                             initialize)
from orchestrax.parallel.mesh import MeshConfig, make_mesh
from orchestrax.parallel.rules import (DEFAULT_RULES, Rules, activation_sharding, check_divisible,
                                       constrain, fitted_spec, logical_to_spec,
                                       tree_shardings)

__all__ = ["DEFAULT_RULES", "MeshConfig", "Rules", "activation_sharding", "allgather_json",
           "barrier", "check_divisible", "constrain", "exit_on_error", "fitted_spec", "initialize",
           "logical_to_spec", "make_mesh", "tree_shardings"]
