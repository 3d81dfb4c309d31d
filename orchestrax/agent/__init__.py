"""Chat rendering, tool-call parsing, tool execution and token-in/token-out episodes.

Modules: `chat` (Qwen3 format), `parser` (tool calls outside <think>), `schema` (argument
validation), `executor` (asyncio limits/retries), `episode` (`run_episode`, `run_episodes`),
`trajectory` (what an episode leaves behind), `testing` (tiny tokenizer, scripted sampler, tools).
Nothing is imported here: `orchestrax.envs.base` imports `trajectory`, and `episode` imports it back.
"""
