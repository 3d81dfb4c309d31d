"""Chat rendering, tool-call parsing, tool execution and token-in/token-out episodes.

Modules: `chat` (Qwen3 format), `codec` (token ids), `parser` (tool calls outside <think>),
`executor` (asyncio limits/retries), `episode` (`run_episode`, `run_episodes`), `pool` (episodes
in worker processes), `scripted` (tiny tokenizer and its chat template, scripted sampler),
`subagent` (the orchestrator and its sub-agents). Arguments are validated by
`orchestrax.tools.schema`. What an episode leaves behind (`Trajectory`) and what it is asked
(`Task`) live in `orchestrax.data.records`, below this package and `orchestrax.envs`.
Nothing is imported here, so importing one module does not pull in the others.
"""
