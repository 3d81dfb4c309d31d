"""The multi-turn episode, token-in/token-out.

The prompt is rendered and tokenised once. After that the trajectory only grows by (a) exactly the
ids the sampler returned (loss mask 1, its logprobs) and (b) the ids of each continuation block we
render — tool responses, user replies, format-error notices — tokenised on their own (mask 0).
Continuation blocks start with the "\n" that follows `<|im_end|>`, so the ids equal what a
prefix-preserving render of the whole conversation tokenises to. Nothing is re-rendered. Message
content that spells a special token (a tool printing `<|im_end|>`, a question quoting
`<tool_call>`) is tokenised as text, in the prompt and in every block.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, Awaitable, Callable, Iterable, Sequence

from orchestrax.agent import chat
from orchestrax.checks import at_least
from orchestrax.agent.codec import Codec
from orchestrax.agent.executor import ToolExecutor
from orchestrax.agent.fanout import fan_out
from orchestrax.agent.parser import MAX_CALLS_PER_TURN, ToolCallParser
from orchestrax.data.records import EndReason, Task, ToolCallRecord, Trajectory, TurnRecord
from orchestrax.rollout.sampler import GenerateRequest, GenerateResult, Sampler, SamplingParams
from orchestrax.tools.tool import Tool

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeConfig:
    max_turns: int = 50
    context_tokens: int = 32_768      # prompt + everything appended; the episode ends at this
    max_new_tokens: int = 4_096       # per assistant turn (capped by the context left)
    max_format_errors: int = 3        # consecutive turns with a format error end the episode
    enable_thinking: bool = True
    sampling: SamplingParams = SamplingParams()  # its max_new_tokens/stop ids are set per turn
    sampler_attempts: int = 3         # a failed generate() is retried, then the episode ends
    sampler_backoff_s: float = 0.5
    max_calls_per_turn: int = MAX_CALLS_PER_TURN   # the rest become one error observation

    def __post_init__(self):
        at_least(self, 1, "max_turns", "context_tokens", "max_new_tokens", "max_format_errors",
                 "sampler_attempts", "max_calls_per_turn")
        at_least(self, 0, "sampler_backoff_s")
        if not isinstance(self.sampling, SamplingParams):
            raise ValueError("EpisodeConfig.sampling must be a SamplingParams")


@dataclasses.dataclass(frozen=True, kw_only=True)
class UserReply:
    text: str
    stop: bool = False                # True: the user ends the conversation (tau2's ###STOP###)


# Called with the readable messages so far (last one: the assistant's non-tool message).
UserResponder = Callable[[Sequence[dict[str, Any]]], Awaitable[UserReply]]


def prompt_messages(task: Task) -> list[dict[str, Any]]:
    """Task messages with the preference instruction appended to the system turn (created if the
    task has none)."""
    messages = [dict(m) for m in task.messages]
    if task.preference_instruction:
        if messages and messages[0].get("role") == "system":
            base = messages[0].get("content") or ""
            messages[0]["content"] = (base + "\n\n" if base else "") + task.preference_instruction
        else:
            messages.insert(0, {"role": "system", "content": task.preference_instruction})
    return messages


async def sample_turn(sampler: Sampler, ids: Sequence[int], sampling: SamplingParams,
                      stop_ids: Sequence[int], *, turn: int, max_new_tokens: int, rid: str,
                      attempts: int, backoff_s: float) -> tuple[GenerateResult, float] | str:
    """One assistant turn from the sampler, as Direct episodes and the sub-agent orchestrator
    both sample: `sampling` with the chat's stop ids added, `max_new_tokens` for this turn and
    the sampling seed offset by `turn` (so turns differ but a rerun repeats). A failed call is
    retried `attempts` times in all, backing off `backoff_s`·2^k seconds.

    Returns (result, wall-clock seconds of the call that succeeded), or why it failed: every
    attempt raised, or the result's logprobs do not match its output ids one to one.
    Cancellation propagates."""
    seed = sampling.sampling_seed
    request = GenerateRequest(input_ids=tuple(ids), rid=rid, sampling=dataclasses.replace(
        sampling, max_new_tokens=max_new_tokens,
        stop_token_ids=tuple(dict.fromkeys((*sampling.stop_token_ids, *stop_ids))),
        sampling_seed=None if seed is None else seed + turn))
    problem = ""
    for attempt in range(attempts):
        if attempt:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            start = time.perf_counter()
            (result,) = await sampler.generate([request])
            seconds = time.perf_counter() - start
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a dead server costs a retry, then this turn
            problem = f"sampler failed: {type(e).__name__}: {e}"
            continue
        if len(result.logprobs) != len(result.output_ids):
            return (f"sampler returned {len(result.output_ids)} output ids but "
                    f"{len(result.logprobs)} logprobs")
        return result, seconds
    return problem + f" ({attempts} attempts)"


@dataclasses.dataclass(frozen=True)
class NextTurn:
    """What follows an assistant turn: the episode ends (`end`, with `error` for "error"), or
    the next turn sees the user's reply `user` or the tool responses `observations`."""

    end: EndReason | None = None
    error: str | None = None
    user: str | None = None
    observations: tuple[str, ...] = ()


class TurnRules:
    """What happens after an assistant turn, the same in the token loop here and in a text-space
    loop (`eval.policy.ChatPolicy`): no tool call is the answer (or goes to the simulated user);
    tool calls run, several at once; format errors count toward `max_format_errors` and come
    back as tool responses. The trajectory's readable `messages` grow by what the next turn
    sees; how it is rendered (token ids, chat messages) is the loop's business."""

    def __init__(self, tools: Sequence[Tool], config: EpisodeConfig, executor: ToolExecutor,
                 user: UserResponder | None):
        self.tools = {t.spec.name: t for t in tools}
        self.parser = ToolCallParser([t.spec for t in tools], config.max_calls_per_turn)
        self.config, self.executor, self.user = config, executor, user
        self.format_streak = 0

    async def after(self, traj: Trajectory, record: TurnRecord, turn: int) -> NextTurn:
        """`record` (the turn's text, already in `traj.turns`) gets its tool calls and format
        error; `turn` counts from 0."""
        parsed = self.parser.parse(record.text)
        if not parsed.calls:
            self.format_streak = 0
            if self.user is None:
                traj.final_answer = parsed.answer or None  # empty: no answer (paper §3.2)
                return NextTurn(end="answer")
            try:
                reply = await self.user(traj.messages)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a broken user simulator ends this episode only
                return NextTurn(end="error",
                                error=f"user responder failed: {type(e).__name__}: {e}")
            if reply.stop:
                traj.final_answer = parsed.answer or None
                return NextTurn(end="user_stop")
            traj.messages.append({"role": "user", "content": reply.text})
            return NextTurn(user=reply.text)
        record.tool_calls = await self._run_calls(parsed.calls)
        record.format_error = parsed.format_error
        observations = [c.observation for c in record.tool_calls]
        if record.format_error is not None:
            return self.format_error(traj, observations)
        self.format_streak = 0
        if turn == self.config.max_turns - 1:
            return NextTurn(end="max_turns")
        traj.messages.extend({"role": "tool", "content": o} for o in observations)
        return NextTurn(observations=tuple(observations))

    def format_error(self, traj: Trajectory, observations: Sequence[str]) -> NextTurn:
        """Count the streak; the errors go back as tool responses unless the episode ends."""
        self.format_streak += 1
        if self.format_streak >= self.config.max_format_errors:
            return NextTurn(end="format_errors")
        if len(traj.turns) >= self.config.max_turns:
            return NextTurn(end="max_turns")
        traj.messages.extend({"role": "tool", "content": o} for o in observations)
        return NextTurn(observations=tuple(observations))

    async def _run_calls(self, calls) -> list[ToolCallRecord]:
        valid = [c for c in calls if c.error is None]
        done = iter(await self.executor.call_many(
            [(self.tools[c.name], c.arguments) for c in valid]) if valid else [])
        return [next(done) if c.error is None else
                ToolCallRecord(name=c.name, arguments=c.arguments, observation=c.error, ok=False)
                for c in calls]


class _Episode:
    """Mutable state of one episode; `run` is the loop."""

    def __init__(self, sampler: Sampler, codec: Codec, task: Task, tools: Sequence[Tool],
                 config: EpisodeConfig, executor: ToolExecutor, user: UserResponder | None):
        self.sampler, self.codec, self.task, self.config = sampler, codec, task, config
        self.rules = TurnRules(tools, config, executor, user)
        messages = prompt_messages(task)
        ids = codec.encode_prompt(chat.prompt_parts(messages, tools=[t.spec for t in tools],
                                                    enable_thinking=config.enable_thinking))
        self.traj = Trajectory(task_id=task.task_id, prompt_len=len(ids), token_ids=ids,
                               loss_mask=[0] * len(ids), logprobs=[0.0] * len(ids),
                               messages=messages)

    def _append(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None):
        self.traj.token_ids.extend(ids)
        self.traj.loss_mask.extend([mask] * len(ids))
        self.traj.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def _end(self, reason: EndReason, error: str | None = None) -> Trajectory:
        self.traj.end_reason, self.traj.error = reason, error
        return self.traj

    def _continue(self, parts: Sequence[str]) -> bool:
        """Append a continuation block (`chat.*_parts`, mask 0) if the context has room for it
        plus one generated token; False means the budget is spent."""
        ids = self.codec.encode_parts(parts)
        if len(self.traj.token_ids) + len(ids) >= self.config.context_tokens:
            return False
        self._append(ids, 0)
        return True

    async def run(self) -> Trajectory:
        cfg, traj, codec = self.config, self.traj, self.codec
        if len(traj.token_ids) >= cfg.context_tokens:   # unplayable at this budget: not a zero
            return self._end("error", f"the prompt ({len(traj.token_ids)} tokens) leaves no "
                                      f"room in context_tokens={cfg.context_tokens}; raise it")
        for turn in range(cfg.max_turns):
            room = cfg.context_tokens - len(traj.token_ids)
            if room < 1:
                return self._end("context")
            generated = await sample_turn(
                self.sampler, traj.token_ids, cfg.sampling, codec.stop_ids, turn=turn,
                max_new_tokens=min(cfg.max_new_tokens, room), rid=f"{self.task.task_id}/{turn}",
                attempts=cfg.sampler_attempts, backoff_s=cfg.sampler_backoff_s)
            if isinstance(generated, str):
                return self._end("error", generated)
            result, seconds = generated
            out = list(result.output_ids)
            self._append(out, 1, result.logprobs)
            stopped = result.finish_reason == "stop" and bool(out) and out[-1] in codec.stop_ids
            text = codec.decode(out[:-1] if stopped else out)
            record = TurnRecord(text=text, tokens_in=len(traj.token_ids) - len(out),
                                tokens_out=len(out), generation_s=seconds,
                                weight_version=result.weight_version)
            traj.turns.append(record)
            traj.messages.append({"role": "assistant", "content": text})
            if result.finish_reason == "abort":
                return self._end("error", "generation aborted by the sampler")
            if not stopped:
                if len(traj.token_ids) >= cfg.context_tokens:
                    return self._end("context")
                # Cut off at max_new_tokens: close the turn ourselves (mask 0) and say so.
                self._append([codec.im_end], 0)
                record.format_error = (f"Error: the response was cut off after {len(out)} tokens "
                                       "without finishing; keep turns shorter.")
                if not self._go_on(self.rules.format_error(traj, [record.format_error])):
                    return traj
                continue
            if not self._go_on(await self.rules.after(traj, record, turn)):
                return traj
        return self._end("max_turns")

    def _go_on(self, nxt: "NextTurn") -> bool:
        """Apply what the rules say follows a turn: end the episode, or append the user's reply
        or the tool responses (mask 0). False: the episode ended."""
        if nxt.end is not None:
            self._end(nxt.end, nxt.error)
            return False
        thinking = self.config.enable_thinking
        parts = (chat.user_parts(nxt.user, enable_thinking=thinking) if nxt.user is not None
                 else chat.tool_response_parts(list(nxt.observations), enable_thinking=thinking))
        if not self._continue(parts):
            self._end("context")
            return False
        return True


async def run_episode(sampler: Sampler, tokenizer, task: Task, tools: Sequence[Tool], *,
                      config: EpisodeConfig = EpisodeConfig(),
                      executor: ToolExecutor | None = None,
                      user: UserResponder | None = None) -> Trajectory:
    """Run one episode to its end and return the trajectory (never raises except on
    cancellation or bad configuration: whatever goes wrong once the prompt is built, a bug
    included, ends this episode with `end_reason="error"`). Share one `executor` across
    episodes so its limits are global; `tokenizer` is a `tokenizers.Tokenizer`, a transformers
    fast tokenizer or a `Codec`."""
    codec = tokenizer if isinstance(tokenizer, Codec) else Codec(tokenizer)
    episode = _Episode(sampler, codec, task, tools, config, executor or ToolExecutor(), user)
    try:
        return await episode.run()
    except asyncio.CancelledError:
        raise
    except Exception as e:  # `_append` keeps the columns aligned, so the prefix is usable
        log.warning("episode %s failed", task.task_id, exc_info=True)
        episode.traj.final_answer = None
        return episode._end("error", f"episode failed: {type(e).__name__}: {e}")


async def run_episodes(sampler: Sampler, tokenizer,
                       jobs: Iterable[tuple[Task, Sequence[Tool]]], *,
                       config: EpisodeConfig = EpisodeConfig(),
                       executor: ToolExecutor | None = None,
                       max_in_flight: int = 4096,
                       user_for: Callable[[Task], UserResponder | None] | None = None,
                       ) -> list[Trajectory]:
    """Run many episodes with at most `max_in_flight` alive at once (`fan_out`: jobs pulled
    lazily, memory bounded by those in flight plus the finished trajectories); results in job
    order."""
    if max_in_flight < 1:
        raise ValueError(f"run_episodes max_in_flight={max_in_flight}; must be >= 1")
    codec = tokenizer if isinstance(tokenizer, Codec) else Codec(tokenizer)
    executor = executor or ToolExecutor()

    async def one(job: tuple[Task, Sequence[Tool]]) -> Trajectory:
        task, tools = job
        return await run_episode(sampler, codec, task, tools, config=config, executor=executor,
                                 user=user_for(task) if user_for is not None else None)

    return await fan_out(one, jobs, max_in_flight=max_in_flight)
