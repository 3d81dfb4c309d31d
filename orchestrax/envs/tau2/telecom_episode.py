"""One telecom episode: the agent's 13 CRM tools and the simulated user's 30 phone tools, all
bound to one `TelecomState` that starts from the task's initial state.

    ep = TelecomEpisode(dom, task)
    agent_tools, user_tools = ep.agent_tools(), ep.user_tools()   # orchestrax `Tool`s
    ... the agent loop calls agent_tools, the user simulator calls user_tools ...
    ep.reward()     # the benchmark's reward from the calls both sides made, in order

Every call is logged with its side, so the reward replays exactly what happened.
"""

from __future__ import annotations

from typing import Any

from orchestrax.envs.tau2.telecom import Side, TelecomDomain
from orchestrax.envs.tau2.functions import DomainFunction, tool_result, tool_spec
from orchestrax.tools.tool import ToolResult


class TelecomEpisode:
    def __init__(self, domain: TelecomDomain, task: dict):
        self.domain, self.task = domain, task
        self.state = domain.initial_state(task)
        self.calls: list[dict[str, Any]] = []  # {"requestor", "name", "arguments"}, in order
        self.has_user = False  # a simulated user is bound to this episode's phone

    def agent_tools(self) -> list["TelecomTool"]:
        return [TelecomTool(self, "assistant", f) for f in self.domain.tool_functions("assistant")]

    def user_tools(self) -> list["TelecomTool"]:
        return [TelecomTool(self, "user", f) for f in self.domain.tool_functions("user")]

    def reward(self) -> float:
        """Recomputed from a fresh state and the logged calls (the benchmark's way), so it does
        not depend on this episode's state having been left alone."""
        return self.domain.reward(self.task, self.calls)


class TelecomTool:
    """A telecom function on one side of an episode; implements `orchestrax.tools.tool.Tool`.
    Refusals and bad arguments raise `ToolError` (see `tool_result`)."""

    def __init__(self, episode: TelecomEpisode, side: Side, fn: DomainFunction):
        self.spec = tool_spec(fn)
        self.side, self._episode = side, episode

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        ep = self._episode
        ep.calls.append({"requestor": self.side, "name": self.spec.name, "arguments": arguments})
        out = ep.domain.call(ep.state, self.side, self.spec.name, arguments)
        return tool_result(out.ok, out.observation)
