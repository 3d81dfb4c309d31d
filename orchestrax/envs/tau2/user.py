"""User simulators for tau2 tasks: one driven by any OpenAI-compatible endpoint, one scripted.

Both are `orchestrax.agent.episode.UserResponder`s: called with the episode's readable
messages (last one: the agent's message to the user), they return the next `UserReply`.
The user ends the conversation by saying ###STOP### (goal reached), ###TRANSFER### (handed
to a human) or ###OUT-OF-SCOPE### (the scenario does not cover what was asked).
"""

from __future__ import annotations

from typing import Any, Sequence

import aiohttp

from orchestrax.agent.episode import UserReply
from orchestrax.tools.chat_client import ChatEndpoint, ChatError, chat
from orchestrax.envs.tau2.verify import visible_text

STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
GREETING = "Hi! How can I help you today?"

_GUIDELINES = """You are role-playing a customer who contacts a customer-service agent.
Stay in character and follow the scenario below exactly.
- Write one message at a time, as a customer would; never speak as the agent.
- Use only information given in the scenario; anything it does not mention you do not know.
- Do not recite the scenario; say things in your own words, and give details only when asked.
- When your goal is met, reply with ###STOP###.
- If you are transferred to a human agent, reply with ###TRANSFER###.
- If the conversation needs information the scenario does not give you, reply with ###OUT-OF-SCOPE###."""


def is_stop(text: str) -> bool:
    return any(token in text for token in STOP_TOKENS)


def render_scenario(task: dict) -> str:
    """The task's `user_scenario` as plain text (persona, then the instructions' fields)."""
    scenario = task.get("user_scenario") or {}
    lines = []
    if scenario.get("persona"):
        lines += ["Persona:", scenario["persona"]]
    instructions = scenario.get("instructions")
    if isinstance(instructions, str):
        lines += ["Instructions:", instructions]
    elif isinstance(instructions, dict):
        for key, title in (("domain", "Domain"), ("reason_for_call", "Reason for call"),
                           ("known_info", "Known info"), ("unknown_info", "Unknown info"),
                           ("task_instructions", "Task instructions")):
            if instructions.get(key):
                lines += [f"{title}:", str(instructions[key]).strip()]
    else:
        raise ValueError(f"task {task.get('id')!r}: user_scenario.instructions must be a string "
                         f"or an object, got {type(instructions).__name__}")
    return "\n".join(lines)


def user_system_prompt(task: dict) -> str:
    return f"{_GUIDELINES}\n\n<scenario>\n{render_scenario(task)}\n</scenario>"


def flip_roles(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The episode seen from the user's side: the agent's visible words become "user" turns,
    the simulated user's own earlier words "assistant" turns; system and tool traffic dropped."""
    out = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            continue
        if m.get("role") == "assistant":
            text = visible_text(content).strip()
            if text:
                out.append({"role": "user", "content": text})
        elif m.get("role") == "user":
            out.append({"role": "assistant", "content": content})
    return out


class LLMUser:
    """A simulated user for one episode (one per episode: it holds no other state than the
    task). Endpoint failures after retries end the episode as a user stop with the error text
    rather than crashing the rollout."""

    def __init__(self, task: dict, endpoint: ChatEndpoint, session: aiohttp.ClientSession | None = None):
        self.system = user_system_prompt(task)
        self.endpoint, self.session = endpoint, session
        self.usage = [0, 0]  # input, output tokens spent

    async def __call__(self, messages: Sequence[dict[str, Any]]) -> UserReply:
        convo = flip_roles(messages)
        if not convo or convo[0]["role"] != "user":
            convo.insert(0, {"role": "user", "content": GREETING})
        try:
            reply = await chat(self.endpoint, [{"role": "system", "content": self.system}, *convo],
                               session=self.session)
        except ChatError as e:
            return UserReply(text=f"(user simulator unavailable: {e}) ###STOP###", stop=True)
        self.usage[0] += reply.input_tokens
        self.usage[1] += reply.output_tokens
        return UserReply(text=reply.text, stop=is_stop(reply.text))


class ScriptedUser:
    """Says `lines` in order, one per call, then ###STOP###. For tests and replays."""

    def __init__(self, lines: Sequence[str]):
        self.lines = list(lines)
        self.heard: list[str] = []  # the agent messages this user answered

    async def __call__(self, messages: Sequence[dict[str, Any]]) -> UserReply:
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        self.heard.append(visible_text(last["content"]) if last and isinstance(last.get("content"), str) else "")
        if len(self.heard) > len(self.lines):
            return UserReply(text="###STOP###", stop=True)
        text = self.lines[len(self.heard) - 1]
        return UserReply(text=text, stop=is_stop(text))
