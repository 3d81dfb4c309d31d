"""The code-interpreter tool: runs the policy's Python in the sandbox and returns its output."""

from __future__ import annotations

from typing import Any

from orchestrax.tools.tool import Clock, Pricing, ToolResult, ToolSpec, check_clock, clocked
from orchestrax.tools.sandbox import SandboxConfig, check_available, run_python
from orchestrax.tools.specs import check_arguments, object_schema

DEFAULT_PRICING = Pricing(kind="per_second", usd_per_second=1e-4)
NOMINAL_S = 0.1  # a sandbox run's seconds under the "nominal" clock


def python_spec(pricing: Pricing = DEFAULT_PRICING, *, name: str = "python") -> ToolSpec:
    return ToolSpec(
        name=name,
        description=("Execute Python 3 code in an isolated sandbox (no network, no files outside a "
                     "private /tmp, standard library only) and return what it prints. "
                     "Use print() to see results."),
        parameters=object_schema({"code": {"type": "string", "description": "Python source"}},
                                 ("code",)),
        category="basic", pricing=pricing, latency_s=NOMINAL_S)


class PythonTool:
    """`await tool({"code": ...})`; cost is billed on the sandbox's wall seconds (`clock`
    "measured") or on the spec's nominal latency ("nominal": the same code costs the same on
    any machine and under any load)."""

    def __init__(self, config: SandboxConfig = SandboxConfig(), *,
                 pricing: Pricing = DEFAULT_PRICING, name: str = "python",
                 clock: Clock = "measured"):
        check_available(config)  # refuse at construction, not mid-episode
        self.config, self.clock = config, check_clock(clock)
        self.spec = python_spec(pricing, name=name)

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        code = check_arguments(self.spec, arguments)["code"]
        result = await run_python(code, self.config)
        seconds = clocked(self.clock, result.seconds, self.spec.latency_s)
        return ToolResult(observation=result.observation(), latency=seconds,
                          cost=self.spec.pricing.cost(seconds=seconds))
