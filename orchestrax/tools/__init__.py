"""The orchestrator's actions. Each tool is an async callable with a `ToolSpec` (base.py).

base.py         the shared interface (ToolSpec, Pricing, ToolResult, ToolError, Tool)
specs.py        the JSON form of a spec; argument checking against its JSON schema
sandbox.py      bubblewrap sandbox for untrusted Python; python_tool.py the code interpreter
embed.py, bm25.py, search_index.py, local_search.py, search_eval.py   local search
web_search.py   Tavily client;  chat_client.py, llm_tool.py   LLM-as-tool;  describe.py
sheets.py + pricing/*.json   pricing sheets;  catalog.py   build_catalog;  randomize.py
"""
