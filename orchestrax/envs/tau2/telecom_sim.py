"""The telecom user simulator: an LLM customer who also operates their own phone.

It is a `UserResponder` like `user.LLMUser`, with one addition: before answering the agent it
may use the phone's 30 tools, by writing

    <tool_call>{"name": "check_status_bar", "arguments": {}}</tool_call>

(the Qwen3/Hermes convention, so any OpenAI-compatible chat endpoint works without a tool API).
Each call runs on the episode's phone (`TelecomEpisode`, shared with the agent's CRM tools) and
its result comes back as `<tool_response>...</tool_response>`; text without a tool call is the
user's message to the agent. The user's own tool exchanges are kept per turn and replayed to
the endpoint in their place, since the agent never sees them.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

import aiohttp

from orchestrax.agent.episode import UserReply
from orchestrax.envs.tau2.telecom_episode import TelecomEpisode
from orchestrax.envs.tau2.user import GREETING, flip_roles, is_stop, user_system_prompt
from orchestrax.tools.tool import ToolError
from orchestrax.tools.chat_client import ChatEndpoint, ChatError, chat

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

_PHONE = """You have your phone with you. To use it, write one or more lines of the form
<tool_call>{{"name": "<tool>", "arguments": {{...}}}}</tool_call>
and nothing else in that message; you will get each result back before you continue. When
you speak to the agent, write plain text with no tool call. Report only what the tools show.
Your phone's tools:
{tools}"""


def phone_prompt(task: dict, episode: TelecomEpisode) -> str:
    tools = "\n".join(json.dumps(t.spec.to_openai()["function"]) for t in episode.user_tools())
    return f"{user_system_prompt(task)}\n\n{_PHONE.format(tools=tools)}"


class TelecomLLMUser:
    """One episode's simulated telecom customer. `max_tool_rounds`: phone-use rounds allowed
    before one message to the agent (beyond it the reply's text is sent as it is)."""

    def __init__(self, task: dict, endpoint: ChatEndpoint, episode: TelecomEpisode, *,
                 session: aiohttp.ClientSession | None = None, max_tool_rounds: int = 8):
        if max_tool_rounds < 0:
            raise ValueError(f"max_tool_rounds={max_tool_rounds}; must be >= 0")
        self.system = phone_prompt(task, episode)
        self.endpoint, self.session, self.episode = endpoint, session, episode
        self.tools = {t.spec.name: t for t in episode.user_tools()}
        self.max_tool_rounds = max_tool_rounds
        self.rounds: list[list[dict[str, str]]] = []  # per reply: the phone exchanges before it
        self.usage = [0, 0]

    def _conversation(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
        convo = flip_roles(messages)
        if not convo or convo[0]["role"] != "user":
            convo.insert(0, {"role": "user", "content": GREETING})
        out, replies = [], 0
        for m in convo:
            if m["role"] == "assistant" and replies < len(self.rounds):
                out += self.rounds[replies]
                replies += 1
            out.append(m)
        return out

    async def _run(self, call_text: str) -> str:
        try:
            call = json.loads(call_text)
            name, arguments = call["name"], call.get("arguments", {})
        except (json.JSONDecodeError, KeyError, TypeError):
            return f"Error: not a tool call: {call_text[:200]!r}; write " \
                   '{"name": ..., "arguments": {...}}'
        tool = self.tools.get(name)
        if tool is None:
            return f"Error: no phone tool {name!r}; tools: {sorted(self.tools)}"
        try:
            return (await tool(arguments)).observation
        except ToolError as e:
            return f"Error: {e}"

    async def __call__(self, messages: Sequence[dict[str, Any]]) -> UserReply:
        convo = self._conversation(messages)
        exchanges: list[dict[str, str]] = []
        self.rounds.append(exchanges)
        for _ in range(self.max_tool_rounds + 1):
            try:
                reply = await chat(self.endpoint, [{"role": "system", "content": self.system},
                                                   *convo, *exchanges], session=self.session)
            except ChatError as e:
                return UserReply(text=f"(user simulator unavailable: {e}) ###STOP###", stop=True)
            self.usage[0] += reply.input_tokens
            self.usage[1] += reply.output_tokens
            calls = _CALL.findall(reply.text)
            if not calls or len(exchanges) >= 2 * self.max_tool_rounds:
                text = _CALL.sub("", reply.text).strip()
                return UserReply(text=text, stop=is_stop(text))
            results = [await self._run(c) for c in calls]
            exchanges += [{"role": "assistant", "content": reply.text},
                          {"role": "user", "content": "\n".join(
                              f"<tool_response>\n{r}\n</tool_response>" for r in results)}]
        raise AssertionError("unreachable: the last round returns")


class EpisodeBook:
    """Pairs what an episode runner asks for separately — `tools(task)`, then `user(task)`,
    then `reward(task, agent_calls)` — onto one `TelecomEpisode`, so the agent's CRM tools, the
    simulated user's phone and the verdict share one state.

    `user` takes the newest episode of that task still without a user (runners build the tools
    and the user back to back); `reward` takes the open episode whose logged agent calls equal
    the trajectory's, else the oldest open one of that task. At most `keep` episodes stay open
    (tools built only to read their names are never verified)."""

    def __init__(self, domain: Any, keep: int = 256):
        self.domain, self.keep = domain, keep
        self._open: list[TelecomEpisode] = []

    def _add(self, task: dict) -> TelecomEpisode:
        ep = TelecomEpisode(self.domain, task)
        self._open.append(ep)
        del self._open[:-self.keep]
        return ep

    def tools(self, task: dict) -> list:
        return self._add(task).agent_tools()

    def user(self, task: dict, endpoint: ChatEndpoint) -> TelecomLLMUser:
        waiting = [ep for ep in self._open if ep.task is task and not ep.has_user]
        ep = waiting[-1] if waiting else self._add(task)
        ep.has_user = True
        return TelecomLLMUser(task, endpoint, ep)

    def reward(self, task: dict, agent_calls: list[dict]) -> float:
        mine = [ep for ep in self._open if ep.task is task]
        if not mine:  # no episode was opened: score the agent's calls alone
            return self.domain.reward(task, [{"requestor": "assistant", **c} for c in agent_calls])
        wanted = [(c["name"], c["arguments"]) for c in agent_calls]
        ep = next((e for e in mine if [(c["name"], c["arguments"]) for c in e.calls
                                       if c["requestor"] == "assistant"] == wanted), mine[0])
        self._open.remove(ep)
        return ep.reward()
