"""`orchestrax eval`: measure a policy (trained checkpoint, SGLang server or any OpenAI-compatible
endpoint) on task sets, with the ToolOrchestra paper's metrics.

Sits at the train level of the layers: it may import every package below it, and only the CLI
imports it.
"""
