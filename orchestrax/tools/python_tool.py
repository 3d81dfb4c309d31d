"""The code-interpreter tool: runs the policy's Python in the sandbox and returns its output."""

from __future__ import annotations

from typing import Any

from orchestrax.tools.base import Pricing, ToolResult, ToolSpec
from orchestrax.tools.sandbox import SandboxConfig, check_available, run_python
from orchestrax.tools.specs import check_arguments, object_schema

DEFAULT_PRICING = Pricing(kind="per_second", usd_per_second=1e-4)


def python_spec(pricing: Pricing = DEFAULT_PRICING, *, name: str = "python") -> ToolSpec:
    return ToolSpec(
        name=name,
        description=("Execute Python 3 code in an isolated sandbox (no network, no files outside a "
                     "private /tmp, standard library only) and return what it prints. "
                     "Use print() to see results."),
        parameters=object_schema({"code": {"type": "string", "description": "Python source"}},
                                 ("code",)),
        category="basic", pricing=pricing, latency_s=0.1)


class PythonTool:
    """`await tool({"code": ...})`; cost is billed on the sandbox's wall seconds."""

    def __init__(self, config: SandboxConfig = SandboxConfig(), *,
                 pricing: Pricing = DEFAULT_PRICING, name: str = "python"):
        check_available(config)  # refuse at construction, not mid-episode
        self.config = config
        self.spec = python_spec(pricing, name=name)

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        code = check_arguments(self.spec, arguments)["code"]
        result = await run_python(code, self.config)
        return ToolResult(observation=result.observation(), latency=result.seconds,
                          cost=self.spec.pricing.cost(seconds=result.seconds))
