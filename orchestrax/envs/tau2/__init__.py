"""tau2-bench / ToolScale domains: DB, domain tools, verifier, user simulators."""

from orchestrax.envs.tau2.db import DomainDB, Rejected, db_hash
from orchestrax.envs.tau2.domain import DomainTool, Tau2Domain, load_domain

__all__ = ["DomainDB", "DomainTool", "Rejected", "Tau2Domain", "db_hash", "load_domain"]
