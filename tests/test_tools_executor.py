"""The real tools behind the agent's `ToolExecutor`: malformed calls become observations, a dead
LLM server costs retries and not a crash, an executor timeout kills the sandboxed run."""

import asyncio
import shutil

import pytest

from orchestrax.agent.executor import ExecutorConfig, ToolExecutor, ToolLimits
from orchestrax.tools.catalog import CatalogConfig, build_catalog
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.tools.llm_tool import LLMToolConfig
from orchestrax.tools.sandbox import SandboxConfig
from tests.processes import our_sandbox_processes

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
SANDBOX = SandboxConfig(wall_timeout_s=60, cpu_seconds=60)


def test_real_tools_through_the_executor():
    tools = build_catalog(CatalogConfig(python=SANDBOX, web=None, llms=(LLMToolConfig(
        name="gpt5", role="generalist",
        chat=ChatEndpoint(base_url="http://127.0.0.1:9", model="gpt-5", timeout_s=2)),)))
    ex = ToolExecutor(ExecutorConfig(per_tool={
        "python": ToolLimits(timeout_s=1.0, max_attempts=1),
        "gpt5": ToolLimits(timeout_s=5.0, max_attempts=2, backoff_s=0.05)}))

    async def scenario():
        before = our_sandbox_processes(SANDBOX)
        ok, bad, slow, dead = await ex.call_many([
            (tools["python"], {"code": "print(2 ** 10)"}),
            (tools["python"], {"source": "print(1)"}),
            (tools["python"], {"code": "while True: pass"}),
            (tools["gpt5"], {"query": "hi"})])
        # no grace period: a sandbox run that returns or is cancelled has no process left
        return ok, bad, slow, dead, our_sandbox_processes(SANDBOX) - before

    ok, bad, slow, dead, live = asyncio.run(scenario())
    assert ok.ok and ok.observation == "1024" and ok.cost > 0
    assert not bad.ok and "code" in bad.observation
    assert not slow.ok and "timed out" in slow.observation
    assert not dead.ok and "2 attempts" in dead.observation and "unreachable" in dead.observation
    assert live == set()
