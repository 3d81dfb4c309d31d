"""tau2-bench / ToolScale domains: DB, domain tools, verifier, user simulators; telecom's
dual-control domain (agent CRM + simulated phone) in `telecom*`."""

from orchestrax.envs.tau2.db import DomainDB, Rejected, db_hash
from orchestrax.envs.tau2.domain import DomainTool, Tau2Domain, load_domain
from orchestrax.envs.tau2.env import Tau2Config, Tau2Env
from orchestrax.envs.tau2.telecom import TaskReplay, TelecomDomain, load_telecom
from orchestrax.envs.tau2.telecom_episode import TelecomEpisode, TelecomTool
from orchestrax.envs.tau2.user import LLMUser, ScriptedUser

__all__ = ["DomainDB", "DomainTool", "LLMUser", "Rejected", "ScriptedUser", "TaskReplay",
           "Tau2Config", "Tau2Domain", "Tau2Env", "TelecomDomain", "TelecomEpisode", "TelecomTool", "db_hash",
           "load_domain", "load_telecom"]
