"""Task environments (tasks, tools, verifier): `tau2` (retail/airline domains), `qa` (JSONL
questions with graders), `routing` (synthetic tool routing for the CPU demo). Import the
submodule you need; nothing heavy is imported here."""
