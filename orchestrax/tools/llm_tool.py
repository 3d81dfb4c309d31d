"""LLM-as-tool: another model behind an OpenAI-compatible endpoint, in one of three role presets.

generalist: answers anything; math: a math specialist (answer in \\boxed{}); coder: writes a Python
program whose code is then run in the sandbox, and the observation is the code plus its output.
Cost is token usage through the pricing sheet (`Pricing(kind="per_token")`). Latency is the
sheet's figure, never the endpoint's measured response time (queueing at a provider is not the
policy's choice): output tokens x the sheet's seconds per output token, or the nominal
`latency_s` per call when the sheet gives no speed; the coder adds its sandbox run's own time.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from orchestrax.tools.tool import (Category, Clock, Pricing, ToolResult, ToolSpec, check_clock,
                                   clocked)
from orchestrax.tools import python_tool
from orchestrax.tools.chat_client import ChatEndpoint, chat
from orchestrax.tools.sandbox import SandboxConfig, check_available, run_python
from orchestrax.tools.specs import check_arguments, object_schema

Role = Literal["generalist", "math", "coder"]


@dataclasses.dataclass(frozen=True)
class RolePreset:
    category: Category
    system: str
    description: str


ROLES: dict[str, RolePreset] = {
    "generalist": RolePreset(
        "generalist",
        "You are a knowledgeable, careful assistant. Answer the question accurately and concisely "
        "and state the final answer clearly.",
        "A general-purpose language model: answers questions, reasons, summarises."),
    "math": RolePreset(
        "specialist",
        "You are an expert mathematician. Solve the problem step by step, check your work, and "
        "put the final answer in \\boxed{}.",
        "A mathematics specialist: solves math problems step by step; final answer in \\boxed{}."),
    "coder": RolePreset(
        "specialist",
        "You write Python 3 programs. Reply with exactly one ```python code block that solves the "
        "task and prints the result. Standard library only; no input(), files or network.",
        "A code-writing model: writes a Python program for the task; the program is executed in a "
        "sandbox and its code and output are returned."),
}

_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The last fenced code block (models often draft, then correct)."""
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1].strip() if blocks else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class LLMToolConfig:
    name: str
    role: Role
    chat: ChatEndpoint
    price_model: str | None = None       # key in the pricing sheet; None means chat.model
    description: str | None = None       # e.g. written by tools/describe_llm_tool.py
    sandbox: SandboxConfig = SandboxConfig()   # used by the coder role only
    latency_s: float = 5.0               # nominal per call: the spec, and the latency charged
                                         # when the sheet has no seconds per token

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"LLMToolConfig.role={self.role!r}; allowed: {sorted(ROLES)}")
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", self.name):
            raise ValueError(f"LLMToolConfig.name={self.name!r}; letters, digits, '_' and '-' only")

    @property
    def pricing_key(self) -> str:
        return self.price_model or self.chat.model


def llm_spec(config: LLMToolConfig, pricing: Pricing) -> ToolSpec:
    preset = ROLES[config.role]
    desc = config.description or f"{preset.description} Model: {config.pricing_key}."
    return ToolSpec(
        name=config.name, description=desc,
        parameters=object_schema({
            "query": {"type": "string", "minLength": 1,
                      "description": "the complete, self-contained task or question"},
            "context": {"type": "string", "description": "optional supporting information"}},
            ("query",)),
        category=preset.category, pricing=pricing, latency_s=config.latency_s)


class LLMTool:
    def __init__(self, config: LLMToolConfig, pricing: Pricing,
                 seconds_per_token: float | None = None, *, clock: Clock = "measured"):
        if pricing.kind != "per_token":
            raise ValueError(f"LLM tool {config.name!r}: pricing.kind={pricing.kind!r}; "
                             "LLM tools are billed 'per_token'")
        if config.role == "coder":
            check_available(config.sandbox)
        self.config = config
        self.spec = llm_spec(config, pricing)
        self.seconds_per_token = seconds_per_token
        self.clock = check_clock(clock)

    def latency(self, output_tokens: int) -> float:
        """Seconds charged for a reply of `output_tokens` tokens (see the module docstring)."""
        if self.seconds_per_token is None:
            return self.config.latency_s
        return self.seconds_per_token * output_tokens

    def messages(self, args: dict[str, Any]) -> list[dict[str, str]]:
        user = args["query"]
        if args.get("context"):
            user = f"{user}\n\nContext:\n{args['context']}"
        return [{"role": "system", "content": ROLES[self.config.role].system},
                {"role": "user", "content": user}]

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        args = check_arguments(self.spec, arguments)
        # retries=0: the executor already retries a transient failure of the tool.
        reply = await chat(self.config.chat, self.messages(args), retries=0)
        cost = self.spec.pricing.cost(input_tokens=reply.input_tokens,
                                      output_tokens=reply.output_tokens)
        observation, seconds = reply.text, self.latency(reply.output_tokens)
        if self.config.role == "coder":
            code = extract_code(reply.raw)
            if code is None:
                observation = f"[the model wrote no ```python block]\n{reply.text}"
            else:
                run = await run_python(code, self.config.sandbox)
                seconds += clocked(self.clock, run.seconds, python_tool.NOMINAL_S)
                observation = f"```python\n{code}\n```\nOutput:\n{run.observation()}"
        return ToolResult(observation=observation or "[empty reply]", cost=cost, latency=seconds,
                          input_tokens=reply.input_tokens, output_tokens=reply.output_tokens)
