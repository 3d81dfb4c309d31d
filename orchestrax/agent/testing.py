"""Tiny fixtures shared by tests, benches and the CPU demo: a Qwen3-style tokenizer, the original
Qwen3 chat templates (read from the installed `trl` wheel), and a scripted `Sampler`.

Nothing here downloads anything: the tokenizer is a byte-level BPE trained in-process on a small
built-in text, with Qwen3's special tokens added on top (same strings, same special/non-special
split as the real `tokenizer_config.json`).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.resources
from typing import Callable, Sequence

from orchestrax.rollout.base import GenerateRequest, GenerateResult

# Qwen2/Qwen3 pre-tokenizer regex: newlines never merge into the following word, so a delta that
# starts or ends on a newline tokenises the same alone as inside a full render.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# (text, special) in the order Qwen3 assigns ids after its regular vocabulary.
QWEN3_ADDED_TOKENS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)

_WORDS = (
    "the a an of to in is and or for with on at by from as that this it be are was were you your "
    "we our they their can will would should call tool tools function functions name arguments "
    "answer question user assistant system search python code result results error time cost "
    "latency price model query number string integer boolean object array type description "
    "properties required value values area triangle base height unit weather city date find get "
    "calculate compute return list files file order orders user_id product flight reservation "
    "Paris London Tokyo Berlin yes no true false null think final please thanks observation step"
).split()


def _corpus() -> list[str]:
    """Deterministic training text: English-ish sentences, JSON tool calls and the tool prompt."""
    lines = []
    for i in range(600):
        words = [_WORDS[(i * 7 + j * 13) % len(_WORDS)] for j in range(3 + i % 9)]
        lines.append(" ".join(words).capitalize() + (". " if i % 3 else "? ") + str(i * 37 % 1000))
        lines.append('{"name": "%s", "arguments": {"%s": %d, "%s": "%s"}}'
                     % (words[0], words[1 % len(words)], i, words[2 % len(words)], words[-1]))
    lines.append("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n")
    lines.append("For each function call, return a json object with function name and arguments "
                 "within <tool_call></tool_call> XML tags:\n")
    return lines


@functools.lru_cache(maxsize=4)
def _build_tokenizer(vocab_size: int):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(QWEN3_ADDED_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    for text, special in QWEN3_ADDED_TOKENS:
        added = AddedToken(text, special=special, normalized=False)
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False)


def tiny_qwen3_tokenizer(vocab_size: int = 512):
    """A `PreTrainedTokenizerFast` with Qwen3's special tokens; `len(tok)` <= vocab_size.

    Built once per vocab_size and cached: treat the returned object as read-only.
    """
    if vocab_size < 300:
        raise ValueError(f"tiny_qwen3_tokenizer vocab_size={vocab_size}; must be >= 300 "
                         "(256 byte symbols + Qwen3's 9 added tokens + merges)")
    return _build_tokenizer(vocab_size)


def qwen3_chat_template(*, training: bool = False) -> str:
    """The original Qwen3 chat template shipped in the `trl` wheel (dev dependency).

    `training=True` gives trl's prefix-preserving variant, which keeps every assistant turn's
    think block: exactly what a token-in/token-out rollout saw.
    """
    name = "qwen3_training.jinja" if training else "qwen3.jinja"
    return importlib.resources.files("trl").joinpath("chat_templates", name).read_text()


class ScriptedSampler:
    """A real `Sampler` that replays scripted assistant turns as token ids.

    `script(request_index, input_ids) -> text` picks the next turn's text (default: cycle through
    `turns`); the text is tokenised and `<|im_end|>` appended as the stop token, like a model that
    stopped on it. Logprobs are a deterministic function of (position, token) so tests can check
    they land on the right trajectory positions. `delay_s` simulates a sampler's latency.
    """

    def __init__(self, tokenizer, turns: Sequence[str] = (), *,
                 script: Callable[[int, Sequence[int]], str] | None = None, delay_s: float = 0.0):
        if not turns and script is None:
            raise ValueError("ScriptedSampler needs `turns` or `script`")
        self._tokenizer = tokenizer
        self._turns = tuple(turns)
        self._script = script
        self._delay_s = delay_s
        self._im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._cache: dict[str, tuple[int, ...]] = {}
        self.calls = 0

    def _ids(self, text: str) -> tuple[int, ...]:
        if text not in self._cache:
            self._cache[text] = tuple(self._tokenizer.encode(text, add_special_tokens=False))
        return self._cache[text]

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        if self._delay_s:
            await asyncio.sleep(self._delay_s)
        results = []
        for request in requests:
            n = self.calls
            self.calls += 1
            text = (self._script(n, request.input_ids) if self._script is not None
                    else self._turns[n % len(self._turns)])
            ids = self._ids(text) + (self._im_end,)
            stop = set(request.sampling.stop_token_ids)
            cut = next((i + 1 for i, t in enumerate(ids) if t in stop), None)
            limit = request.sampling.max_new_tokens
            if cut is not None and cut <= limit:
                ids, reason = ids[:cut], "stop"
            else:
                ids, reason = ids[:limit], "length"
            logprobs = tuple(scripted_logprob(len(request.input_ids) + i, t)
                             for i, t in enumerate(ids))
            results.append(GenerateResult(output_ids=ids, logprobs=logprobs, finish_reason=reason,
                                          prompt_tokens=len(request.input_ids), rid=request.rid))
        return results


def scripted_logprob(position: int, token_id: int) -> float:
    """The logprob `ScriptedSampler` reports for `token_id` at absolute `position` (always < 0)."""
    return -0.001 * (1 + (position * 31 + token_id) % 997)


class SleepTool:
    """A real async tool for tests and benches: sleeps `latency_s` (asyncio), then returns an
    observation; the first `fail_first` calls raise `ToolError(transient=transient)`, or a
    ValueError with `crash=True`. Tracks calls and peak concurrency."""

    def __init__(self, name: str, *, latency_s: float = 0.0, cost: float = 0.0,
                 fail_first: int = 0, transient: bool = True, crash: bool = False,
                 report_latency: float | None = None, observation: str | None = None,
                 parameters: dict | None = None):
        from orchestrax.tools.base import Pricing, ToolSpec
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
        import time

        from orchestrax.tools.base import ToolError, ToolResult
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
