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
import json
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
from orchestrax.rollout.base import GenerateRequest, GenerateResult, Sampler, SamplerConfig
from orchestrax.tools.base import Tool
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
    def __init__(self, sampler: Sampler, tokenizer: Any, *, name: str):
        self.sampler, self.codec, self.name = sampler, Codec(tokenizer), name
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


def _run_params(checkpoints: pathlib.Path, param_dtype: str) -> tuple[Any, int]:
    """(params, step) of a training run's newest whole checkpoint, restored by the trainer's own
    `Checkpointer`, read-only: a corrupt newest step is named in one log line (step and file)
    and the previous step restored, as when training resumes, but nothing in the run directory
    is moved (eval may read a run that is still training). Only the `params` subtree of the
    saved train state is read (the AdamW moments, twice the params' bytes, stay on disk), cast
    to `param_dtype` as it is read."""
    from orchestrax.train.checkpoint import Checkpointer
    ckpt = Checkpointer(checkpoints, every=0, read_only=True)
    try:
        target = {"params": _saved_params_shapes(checkpoints, param_dtype)}
        restored, _ = ckpt.restore(target, partial=True)
        return restored["params"], ckpt.restored_step
    finally:
        ckpt.close()


def _saved_params_shapes(checkpoints: pathlib.Path, param_dtype: str) -> Any:
    """ShapeDtypeStructs (`param_dtype`, on this process's first device) of the train state's
    `params`, from Orbax's metadata of the newest step whose metadata reads: eval has no model
    tree to build them from, and every step of a run saves the same tree (the restore then checks
    each step's files). Not the saved sharding: a run trained over a mesh of 8 devices is
    evaluated where it is read, on one (the embedded sampler's device)."""
    import jax
    import orbax.checkpoint as ocp
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    steps = sorted((int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()),
                   reverse=True)
    if not steps:
        raise FileNotFoundError(f"{checkpoints} holds no checkpoint")
    errors = []
    for step in steps:
        handler = ocp.StandardCheckpointHandler()
        try:
            tree = handler.metadata(checkpoints / str(step) / "state")["params"]
            return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, param_dtype,
                                                               sharding=device), tree)
        except Exception as e:  # noqa: BLE001 -- an unreadable step; the restore names it
            errors.append(f"step {step}: {type(e).__name__}: {e}")
        finally:
            handler.close()
    raise FileNotFoundError(f"{checkpoints}: no step's train-state metadata reads: "
                            + "; ".join(errors))


def _embedded(path: pathlib.Path, *, dtype: str, param_dtype: str, max_len: int,
              max_batch: int, seed: int):
    """(sampler, default tokenizer dir) for an HF directory or a training run directory."""
    from orchestrax import models
    if (path / "checkpoints").is_dir() and (path / "model" / "config.json").is_file():
        cfg = models.config_from_hf(json.loads((path / "model" / "config.json").read_text()),
                                    dtype=dtype, param_dtype=param_dtype)
        params, step = _run_params(path.resolve() / "checkpoints", param_dtype)
        tok_dir, version = path / "model", str(step)
    elif (path / "config.json").is_file():
        cfg, params = models.load_hf(path, dtype=dtype, param_dtype=param_dtype)
        tok_dir, version = path, "hf"
    else:
        raise FileNotFoundError(f"policy {str(path)!r}: neither an HF directory (config.json) nor "
                                "a training run directory (model/config.json + checkpoints/)")
    sampler = registry.build_sampler(SamplerConfig(
        backend="embedded", engine="static", max_batch=max_batch, max_len=max_len,
        weight_version=version, seed=seed), cfg, params)
    return sampler, tok_dir


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
    sampler, tok_dir = _embedded(path, dtype=dtype, param_dtype=param_dtype, max_len=max_len,
                                 max_batch=max_batch, seed=seed)
    return TokenPolicy(sampler, _tokenizer(tokenizer, tok_dir), name=path.name)

