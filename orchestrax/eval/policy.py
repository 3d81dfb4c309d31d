"""Policies `orchestrax eval` can measure, behind one `episode()` method.

- `TokenPolicy`: token-in/token-out through the agent's own episode loop, on any `Sampler`
  (the embedded JAX sampler on an HF directory or a training run's Orbax checkpoint, or SGLang /
  `orchestrax serve` over HTTP). This is exactly how the trainer rolls out.
- `ChatPolicy`: any OpenAI-compatible endpoint plus a model name, so prompted baselines (a hosted
  model, a Qwen3-8B behind SGLang's chat API) go through the same tasks, tools and metrics. The
  endpoint gets the same system turn as a trained policy (the Qwen3 tools block, rendered by
  `agent.chat`) and answers in text with `<tool_call>` blocks; tool results go back as
  `<tool_response>` blocks in a user turn, the way Qwen3's template renders tool messages.
  Native `tool_calls` are not used, so every model sees the same protocol.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any, Protocol, Sequence

import aiohttp

from orchestrax import registry
from orchestrax.agent import chat
from orchestrax.agent.codec import Codec
from orchestrax.agent.episode import (EpisodeConfig, TurnRules, UserResponder, prompt_messages,
                                      run_episode)
from orchestrax.agent.executor import ToolExecutor
from orchestrax.data.records import Task, Trajectory, TurnRecord
from orchestrax.rollout.sampler import GenerateRequest, GenerateResult, Sampler, SamplerConfig
from orchestrax.tools.tool import Tool
from orchestrax.tools.chat_client import ChatEndpoint, ChatError
from orchestrax.tools.chat_client import chat as chat_completion


@dataclasses.dataclass(kw_only=True)
class PolicyEpisode:
    trajectory: Trajectory
    turn_seconds: list[float]          # wall time of each assistant turn's generation


class Policy(Protocol):
    name: str

    async def episode(self, task: Task, tools: Sequence[Tool], *, config: EpisodeConfig,
                      user: UserResponder | None = None) -> PolicyEpisode: ...

    async def aclose(self) -> None: ...


class _TimedSampler:
    """One episode's view of a shared sampler that records each successful call's wall time."""

    def __init__(self, inner: Sampler):
        self.inner, self.seconds = inner, []

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        t0 = time.monotonic()
        out = await self.inner.generate(requests)
        self.seconds.append(time.monotonic() - t0)
        return out


class TokenPolicy:
    """`step`: the training step of the checkpoint the sampler holds (a run dir), else None."""

    def __init__(self, sampler: Sampler, tokenizer: Any, *, name: str, step: int | None = None):
        self.sampler, self.codec, self.name, self.step = sampler, Codec(tokenizer), name, step
        self._executor: ToolExecutor | None = None

    async def episode(self, task, tools, *, config, user=None) -> PolicyEpisode:
        self._executor = self._executor or ToolExecutor()  # made inside the running loop
        timed = _TimedSampler(self.sampler)
        traj = await run_episode(timed, self.codec, task, tools, config=config,
                                 executor=self._executor, user=user)
        return PolicyEpisode(trajectory=traj, turn_seconds=timed.seconds)

    async def aclose(self) -> None:
        await self.sampler.aclose()


def _tool_responses(observations: Sequence[str]) -> str:
    return "\n".join(f"<tool_response>\n{o}\n</tool_response>" for o in observations)


class ChatPolicy:
    def __init__(self, endpoint: ChatEndpoint, *, name: str | None = None):
        self.endpoint, self.name = endpoint, name or endpoint.model
        self._executor: ToolExecutor | None = None
        self._session: aiohttp.ClientSession | None = None

    async def episode(self, task, tools, *, config, user=None) -> PolicyEpisode:
        self._executor = self._executor or ToolExecutor()
        self._session = self._session or aiohttp.ClientSession()
        specs = [t.spec for t in tools]
        rules = TurnRules(tools, config, self._executor, user)
        messages = prompt_messages(task)
        wire = [dict(m) for m in messages]
        system = wire[0]["content"] if wire and wire[0]["role"] == "system" else None
        if specs:
            body = chat.system_prompt(system, specs)
            body = body.removeprefix(f"{chat.IM_START}system\n").removesuffix(f"{chat.IM_END}\n")
            wire = [{"role": "system", "content": body}] + wire[1 if system is not None else 0:]
        traj = Trajectory(task_id=task.task_id, messages=list(messages))
        seconds: list[float] = []
        for turn in range(config.max_turns):
            try:
                reply = await chat_completion(self.endpoint, wire, session=self._session,
                                              max_tokens=config.max_new_tokens,
                                              temperature=config.sampling.temperature)
            except ChatError as e:
                traj.end_reason, traj.error = "error", f"policy endpoint failed: {e}"
                break
            seconds.append(reply.seconds)
            record = TurnRecord(text=reply.raw, tokens_in=reply.input_tokens,
                                tokens_out=reply.output_tokens)
            traj.turns.append(record)
            wire.append({"role": "assistant", "content": reply.raw})
            traj.messages.append({"role": "assistant", "content": reply.raw})
            nxt = await rules.after(traj, record, turn)
            if nxt.end is not None:
                traj.end_reason, traj.error = nxt.end, nxt.error
                break
            # Qwen3's template renders tool results as <tool_response> blocks in a user turn.
            wire.append({"role": "user", "content": nxt.user if nxt.user is not None
                         else _tool_responses(nxt.observations)})
        traj.end_reason = traj.end_reason or "max_turns"
        return PolicyEpisode(trajectory=traj, turn_seconds=seconds)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _tokenizer(spec: str | None, fallback: pathlib.Path | None):
    if spec is None and fallback is None:
        raise ValueError("--tokenizer is required for an sglang: policy ('tiny' or a HF "
                         "tokenizer directory): token-in/token-out needs the server's tokenizer")
    return registry.build_tokenizer(spec or str(fallback))


def _embedded(path: pathlib.Path, *, dtype: str, param_dtype: str, max_len: int,
              max_batch: int, seed: int):
    """(sampler, default tokenizer dir, checkpoint step or None) for an HF directory or a
    training run directory (its newest whole checkpoint's params only, through the trainer's
    one reader)."""
    from orchestrax.rollout.embedded import sampler_layout
    from orchestrax.train.checkpoint import load_model
    model = load_model(path, dtype=dtype, param_dtype=param_dtype, field="--policy")
    sampler = registry.build_sampler(SamplerConfig(
        backend="embedded", max_batch=max_batch, max_len=max_len,
        weight_version=model.version, seed=seed), model.cfg, sampler_layout(model.params))
    return sampler, model.tokenizer_dir, int(model.version) if model.version.isdigit() else None


PARAM_DTYPES = ("float32", "bfloat16")   # what serve's --param-dtype offers


def load_policy(spec: str, *, model: str | None = None, tokenizer: str | None = None,
                api_key_env: str | None = None, dtype: str = "float32",
                param_dtype: str = "float32", max_len: int = 32_768, max_batch: int = 64,
                seed: int = 0) -> Policy:
    """`spec`: `openai:URL` (needs `model`), `sglang:URL` (needs `tokenizer`), or a directory
    (an HF checkpoint or a training run's out_dir) for the embedded sampler, which computes in
    `dtype` and holds its params in `param_dtype` (a run's fp32 master weights are cast as they
    are read: "bfloat16" halves the params' resident memory; Orbax still reads fp32 chunks)."""
    if param_dtype not in PARAM_DTYPES:
        raise ValueError(f"load_policy param_dtype={param_dtype!r}; allowed: {PARAM_DTYPES}")
    kind, sep, rest = spec.partition(":")
    if sep and kind == "openai":
        if not model:
            raise ValueError(f"--policy {spec}: an openai: policy needs --model NAME")
        return ChatPolicy(ChatEndpoint(base_url=rest, model=model, api_key_env=api_key_env))
    if sep and kind == "sglang":
        return TokenPolicy(registry.build_sampler(SamplerConfig(backend="sglang", urls=(rest,))),
                           _tokenizer(tokenizer, None), name=rest)
    if spec.startswith(("http://", "https://")):
        raise ValueError(f"--policy {spec}: say which API the server speaks: sglang:{spec} "
                         f"(token ids, /generate) or openai:{spec} (chat completions)")
    path = pathlib.Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"--policy {spec}: not a directory, and not sglang:URL or "
                                "openai:URL")
    sampler, tok_dir, step = _embedded(path, dtype=dtype, param_dtype=param_dtype,
                                       max_len=max_len, max_batch=max_batch, seed=seed)
    return TokenPolicy(sampler, _tokenizer(tokenizer, tok_dir), name=path.name, step=step)

