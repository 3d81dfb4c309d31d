"""Sub-agent mode ("Can Small Agents Collaborate"): an orchestrator that dispatches one sub-task
at a time to specialised sub-agents and reads their results from a structured memory."""

from orchestrax.agent.subagent.accounting import ModelCall, QueryAccount
from orchestrax.agent.subagent.files import FileReadTool
from orchestrax.agent.subagent.memory import Memory, MemoryLimits, orchestrator_messages, render
from orchestrax.agent.subagent.orchestrator import (THINKING, OrchestratorConfig, SubagentRollout,
                                                    TurnSample, run_query, thinking_flags)
from orchestrax.agent.subagent.roles import (ROLES, SubAgent, SubAgentConfig, SubAgentReport,
                                             assign_tools, build_subagents, holdable,
                                             query_tools)
from orchestrax.agent.subagent.system import ABLATIONS, SystemConfig

__all__ = [
    "ABLATIONS", "FileReadTool", "Memory", "MemoryLimits", "ModelCall", "OrchestratorConfig",
    "QueryAccount", "ROLES", "SubAgent", "SubAgentConfig", "SubAgentReport", "SubagentRollout",
    "SystemConfig", "THINKING", "TurnSample", "assign_tools", "build_subagents", "holdable",
    "orchestrator_messages", "render", "query_tools", "run_query", "thinking_flags",
]
