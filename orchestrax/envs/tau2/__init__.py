"""tau2-bench / ToolScale domains: DB, domain tools, verifier, user simulators."""

from orchestrax.envs.tau2.db import DomainDB, Rejected, db_hash
from orchestrax.envs.tau2.domain import DomainTool, Tau2Domain, load_domain
from orchestrax.envs.tau2.env import Tau2Env
from orchestrax.envs.tau2.user import LLMUser, ScriptedUser

__all__ = ["DomainDB", "DomainTool", "LLMUser", "Rejected", "ScriptedUser", "Tau2Domain", "Tau2Env",
           "db_hash", "load_domain"]
