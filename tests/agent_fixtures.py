"""Test helpers for the agent layer: the original Qwen3 chat templates (read from the installed
`trl` wheel, a dev-only dependency, to cross-check our renderer) and `SleepTool`, a real async tool
with scripted latency, failures and cost; `write_tiny_run`, a run directory as `orchestrax train`
leaves one, for eval and export tests. Production fixtures (tiny tokenizer, scripted sampler)
are in `orchestrax.agent.scripted`."""

from __future__ import annotations

import asyncio
import importlib.resources
import time

from orchestrax.tools.tool import Pricing, ToolError, ToolResult, ToolSpec


def qwen3_chat_template(*, training: bool = False) -> str:
    """The original Qwen3 chat template shipped in the `trl` wheel.

    `training=True` gives trl's prefix-preserving variant, which keeps every assistant turn's
    think block: exactly what a token-in/token-out rollout saw.
    """
    name = "qwen3_training.jinja" if training else "qwen3.jinja"
    return importlib.resources.files("trl").joinpath("chat_templates", name).read_text()


class SleepTool:
    """A real async tool for tests and benches: sleeps `latency_s` (asyncio), then returns an
    observation; the first `fail_first` calls raise `ToolError(transient=transient)`, or a
    ValueError with `crash=True`. Tracks calls and peak concurrency."""

    def __init__(self, name: str, *, latency_s: float = 0.0, cost: float = 0.0,
                 fail_first: int = 0, transient: bool = True, crash: bool = False,
                 report_latency: float | None = None, observation: str | None = None,
                 parameters: dict | None = None):
        self.spec = ToolSpec(
            name=name, description=f"Test tool {name}.", latency_s=latency_s,
            pricing=Pricing(usd_per_call=cost),
            parameters=parameters or {"type": "object", "properties": {"q": {"type": "string"}}})
        self.latency_s, self.cost, self.fail_first = latency_s, cost, fail_first
        self.transient, self.crash, self.report_latency = transient, crash, report_latency
        self.observation = observation
        self.calls = self.active = self.max_active = 0
        self.starts: list[float] = []

    async def __call__(self, arguments: dict):
        self.calls += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.starts.append(time.monotonic())
        try:
            await asyncio.sleep(self.latency_s)
            if self.calls <= self.fail_first:
                if self.crash:
                    raise ValueError(f"{self.spec.name} crashed")
                raise ToolError(f"{self.spec.name} is unavailable", transient=self.transient)
            text = self.observation if self.observation is not None else (
                f"{self.spec.name} result for {arguments.get('q', '')}")
            return ToolResult(observation=text, cost=self.cost, latency=self.report_latency)
        finally:
            self.active -= 1


def write_tiny_run(run, *, name: str, env, rollout, seed: int = 7, stop_scale: float = 1.0,
                   **fields):
    """`run` as `orchestrax train` leaves it: model card (random tiny Qwen3 of `seed`), one
    whole checkpoint at step 1, and train_config.json with `env`, `rollout` and any other
    TrainConfig `fields`. `stop_scale` multiplies <|im_end|>'s (tied) embedding row: at 12 the
    random model stops after a few to a few dozen tokens, so episode lengths depend on every
    sampled token. Returns the model config."""
    from orchestrax import models
    from orchestrax.agent.scripted import tiny_qwen3_tokenizer
    from orchestrax.train import run_info
    from orchestrax.train.checkpoint import Checkpointer
    from orchestrax.train.train_config import TrainConfig
    from orchestrax.train.setup import write_model_card
    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    write_model_card(run / "model", cfg, tok)
    ckpt = Checkpointer(run / "checkpoints", every=1)
    params = models.init_params(cfg, seed)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    params["embed"] = params["embed"].at[end].multiply(stop_scale)
    ckpt.maybe_save(1, {"params": params}, {"phase": "rl", "step": 1}, force=True)
    ckpt.close()
    run_info.write(run, TrainConfig(name=name, out_dir=str(run), model=cfg, env=env,
                                    rollout=rollout, **fields))
    return cfg
