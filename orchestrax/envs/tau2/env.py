"""tau2 domains as an `orchestrax.envs.environment.Environment`.

An episode: `task = await env.open(env.tasks("train")[i], user)` adds the agent's greeting and
the simulated user's first message (tau2 conversations start with the user, so with a user
endpoint `tasks()` stops at the system prompt); the agent loop runs with `env.tools(task)` (one
fresh DB shared by all of that episode's tools) and `user`; then `await env.verify(task,
trajectory)`. Without a user endpoint each task opens with its scenario as the user's message and
the episode ends at the policy's answer, as a single-turn task does.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping

from orchestrax.agent.episode import UserResponder
from orchestrax.data.records import Task, Trajectory
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.envs.environment import EnvConfig, Environment
from orchestrax.envs.tau2.domain import Tau2Domain, load_domain
from orchestrax.envs.tau2.telecom import TelecomDomain
from orchestrax.envs.tau2.telecom_sim import EpisodeBook
from orchestrax.envs.tau2.user import GREETING, LLMUser, render_scenario
from orchestrax.envs.tau2.verify import GoldCache, Verdict, check, trajectory_calls, trajectory_texts
from orchestrax.tools.tool import Tool
from orchestrax.tools.randomize import instance_tools

_AGENT_PROMPT = """You are a customer service agent. Help the user under the policy below.
In each turn either send one message to the user or make tool calls, not both.
Act only on what the policy allows; ask for explicit confirmation before any change.

<policy>
{policy}
</policy>"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tau2Config(EnvConfig):
    """A tau2-format domain folder (tau2-bench's retail/airline/telecom, or a ToolScale domain):
    see `Tau2Env` for the fields' meaning."""

    domain: str                          # the folder: db, tasks, split_tasks.json, policy
    user: ChatEndpoint | None = None     # the simulated user's endpoint; None: no user
    completeness: bool = True            # False: score exactly as tau2-bench does

    def __post_init__(self):
        if not self.domain.strip():
            raise ValueError("Tau2Config.domain=''; give the path of a tau2-format domain folder")


class Tau2Env(Environment):
    """`domain`: a loaded Tau2Domain or its folder. Without `user_endpoint` there is no
    simulated user: each task's scenario is its first user message. `completeness=False`
    scores exactly as tau2-bench does (for reporting benchmark numbers); True adds the
    ToolScale operation-completeness check (for training). `tools`: the orchestrator's own
    catalog (LLMs, search, code), offered next to the domain's functions; calls to them do not
    touch the database and are not part of the verdict."""

    def __init__(self, domain: Tau2Domain | str | pathlib.Path, *,
                 user_endpoint: ChatEndpoint | None = None, completeness: bool = True,
                 tools: Mapping[str, Tool] | None = None):
        self.domain = load_domain(domain) if isinstance(domain, (str, pathlib.Path)) else domain
        # dual control: each episode's CRM tools, phone-using user and verdict share a state
        self._telecom = EpisodeBook(self.domain) if isinstance(self.domain, TelecomDomain) else None
        own = ({f.name for f in self.domain.tool_functions("assistant")} if self._telecom
               else {t.spec.name for t in self.domain.tools()})
        self.catalog: dict[str, Tool] = dict(tools or {})
        clash = sorted(set(self.catalog) & own)
        if clash:
            raise ValueError(f"Tau2Env tools {clash} have the names of {self.domain.name} domain "
                             "functions; rename them in the catalog")
        self.user_endpoint = user_endpoint
        self.completeness = completeness
        self._gold = GoldCache(self.domain)
        self._by_id = {t["id"]: t for t in self.domain.tasks}

    def tasks(self, split: str = "train") -> list[Task]:
        """`split`: a key of split_tasks.json (train/test/base), "eval" (= test) or "all"."""
        split = "test" if split == "eval" else split
        if split == "all":
            ids = [t["id"] for t in self.domain.tasks]
        elif split in self.domain.splits:
            ids = [i for i in self.domain.splits[split] if i in self._by_id]
        else:
            raise ValueError(f"tau2 {self.domain.name} split={split!r}; allowed: "
                             f"{sorted(self.domain.splits) + ['all', 'eval']}")
        system = {"role": "system", "content": _AGENT_PROMPT.format(policy=self.domain.policy.strip())}
        return [Task(task_id=f"tau2/{self.domain.name}/{i}", messages=self._opening(system, i),
                     metadata={"domain": self.domain.name, "tau2_id": i}) for i in ids]

    def _opening(self, system: dict, tau2_id: str) -> tuple[dict, ...]:
        """A user endpoint speaks first at `open`; without one the scenario is the request."""
        if self.user_endpoint is not None:
            return (system,)
        return (system, {"role": "user", "content": render_scenario(self._by_id[tau2_id])})

    def raw(self, task: Task) -> dict:
        """The task's tau2 record (user_scenario, evaluation_criteria, ...)."""
        tau2_id = task.metadata.get("tau2_id")
        if tau2_id not in self._by_id:
            raise KeyError(f"Task {task.task_id!r} is not a task of tau2 domain {self.domain.name}")
        return self._by_id[tau2_id]

    def user(self, task: Task) -> UserResponder:
        """A fresh LLM-driven user for one episode of `task`."""
        if self.user_endpoint is None:
            raise ValueError("Tau2Environment has no user_endpoint; pass a ChatEndpoint or use "
                             "tau2.user.ScriptedUser")
        if self._telecom is not None:  # telecom: the user gets the episode's phone
            return self._telecom.user(self.raw(task), self.user_endpoint)
        return LLMUser(self.raw(task), self.user_endpoint)

    def user_for(self, task: Task) -> UserResponder | None:
        """The agent loop's hook: an LLM user per episode, or None without an endpoint (the
        task's messages already carry its scenario)."""
        return None if self.user_endpoint is None else self.user(task)

    async def open(self, task: Task, user: UserResponder) -> Task:
        """`task`'s system prompt, the agent's greeting and the user's first message (which
        takes the place of the scenario a task of a userless env opens with)."""
        system, greeting = task.messages[:1], {"role": "assistant", "content": GREETING}
        reply = await user([*system, greeting])
        return dataclasses.replace(task, messages=(*system, greeting,
                                                   {"role": "user", "content": reply.text}))

    def tools(self, task: Task) -> list[Tool]:
        """The domain's functions (one fresh DB), then the catalog or the instance's subset."""
        own = self._telecom.tools(self.raw(task)) if self._telecom else self.domain.tools()
        return [*own, *instance_tools(self.catalog, task)]

    def check(self, task: Task, trajectory: Trajectory) -> Verdict:
        if self._telecom is not None:  # telecom scores env assertions, not DB hashes
            raise ValueError("Tau2Env.check gives retail/airline verdicts; telecom has only "
                             "verify (its reward)")
        texts = trajectory_texts(trajectory) + [m["content"] for m in trajectory.messages
                                                if m.get("role") == "assistant"
                                                and isinstance(m.get("content"), str)]
        calls = [c for c in trajectory_calls(trajectory) if c["name"] not in self.catalog]
        return check(self.domain, self.raw(task), calls, texts, self._gold)

    async def verify(self, task: Task, trajectory: Trajectory) -> float:
        if self._telecom is not None:  # tau2's telecom reward: env assertions (x gold actions)
            return self._telecom.reward(self.raw(task), [
                c for c in trajectory_calls(trajectory) if c["name"] not in self.catalog])
        verdict = self.check(task, trajectory)
        return float(verdict.passed if self.completeness else verdict.benchmark_passed)
