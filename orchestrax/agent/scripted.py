"""What production takes from the tiny fixtures: the tiny Qwen3-style tokenizer (`orchestrax serve
--tiny`, the CPU demo, `tokenizer="tiny"` runs), its chat template, and the scripted `Sampler`
that plays SFT demonstrations through the real episode loop.

Nothing here downloads anything: the tokenizer is a byte-level BPE trained in-process on a small
built-in text, with Qwen3's special tokens added on top (same strings, same special/non-special
split as the real `tokenizer_config.json`). `tiny_tokenizer` builds it with the `tokenizers`
library alone, which is all an episode worker needs; `tiny_qwen3_tokenizer` wraps it for
transformers (a server's chat endpoint, `save_pretrained`) and imports transformers only then.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Callable, Sequence

from orchestrax.agent.codec import Codec
from orchestrax.rollout.sampler import GenerateRequest, GenerateResult, Sampler

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
def _build(vocab_size: int):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

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
    return tok


def _check_size(vocab_size: int) -> None:
    if vocab_size < 300:
        raise ValueError(f"tiny tokenizer vocab_size={vocab_size}; must be >= 300 "
                         "(256 byte symbols + Qwen3's 9 added tokens + merges)")


def tiny_tokenizer(vocab_size: int = 512):
    """The tiny tokenizer as a bare `tokenizers.Tokenizer` (no transformers import); built once
    per vocab_size and cached: treat it as read-only."""
    _check_size(vocab_size)
    return _build(vocab_size)


@functools.lru_cache(maxsize=4)
def tiny_qwen3_tokenizer(vocab_size: int = 512):
    """`tiny_tokenizer` as a transformers `PreTrainedTokenizerFast` whose chat template is
    `CHAT_TEMPLATE`; `len(tok) <= vocab_size`. Cached: treat it as read-only."""
    _check_size(vocab_size)
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(
        tokenizer_object=_build(vocab_size), eos_token="<|im_end|>", pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE)


def load_codec(spec: str) -> Codec:
    """The `Codec` for a run's `tokenizer` setting without transformers: "tiny", or a directory
    holding a Hugging Face `tokenizer.json` (every fast tokenizer saves one)."""
    if spec == "tiny":
        return Codec(tiny_tokenizer())
    import pathlib

    from tokenizers import Tokenizer
    path = pathlib.Path(spec) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"tokenizer={spec!r}: no tokenizer.json in that directory; give 'tiny' "
                         "or a directory saved by a Hugging Face fast tokenizer")
    return Codec(Tokenizer.from_file(str(path)))


# Our own Jinja rendering of the Qwen3 chat format for the tiny tokenizer: the same text as
# `chat.render_messages(..., keep_thinking=False)` (tests/test_agent_chat.py checks it), so a
# server's chat endpoint and the episode loop agree. Every piece of output comes from an
# expression with whitespace trimmed on both sides, so the layout here adds nothing.
CHAT_TEMPLATE = """
{%- set n = messages | length -%}
{%- set ns = namespace(last_query=n - 1, found=false) -%}
{%- for m in messages[::-1] -%}
  {%- set c = m.content if m.content is string else '' -%}
  {%- if not ns.found and m.role == 'user' and m.content is string
        and not (c.startswith('<tool_response>') and c.endswith('</tool_response>')) -%}
    {%- set ns.last_query = n - 1 - loop.index0 -%}
    {%- set ns.found = true -%}
  {%- endif -%}
{%- endfor -%}
{%- set first_is_system = messages[0].role == 'system' -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if first_is_system -%}
    {{- (messages[0].content if messages[0].content is string else '') + '\n\n' -}}
  {%- endif -%}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' -}}
  {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif first_is_system -%}
  {{- '<|im_start|>system\n' + (messages[0].content if messages[0].content is string else '')
      + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
  {%- set i = loop.index0 -%}
  {%- set content = m.content if m.content is string else '' -%}
  {%- if m.role == 'user' or (m.role == 'system' and i > 0) -%}
    {{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' -}}
  {%- elif m.role == 'assistant' -%}
    {%- set reasoning = '' -%}
    {%- if m.reasoning_content is string -%}
      {%- set reasoning = m.reasoning_content -%}
    {%- elif '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
      {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- set after_query = i > ns.last_query -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if (after_query and i == n - 1) or (after_query and reasoning) -%}
      {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
    {%- else -%}
      {{- content -}}
    {%- endif -%}
    {%- for call in (m.tool_calls or []) -%}
      {%- if (loop.first and content) or not loop.first -%}{{- '\n' -}}{%- endif -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
      {{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if i == 0 or messages[i - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
    {%- if i == n - 1 or messages[i + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and not enable_thinking -%}
    {{- '<think>\n\n</think>\n\n' -}}
  {%- endif -%}
{%- endif -%}
"""


class ScriptedSampler(Sampler):
    """A real `Sampler` that replays scripted assistant turns as token ids.

    `script(request_index, input_ids) -> text` picks the next turn's text (default: cycle through
    `turns`); the text is tokenised and `<|im_end|>` appended as the stop token, like a model that
    stopped on it. Logprobs are a deterministic function of (position, token) so tests can check
    they land on the right trajectory positions. `delay_s` simulates a sampler's latency.
    """

    def __init__(self, tokenizer, turns: Sequence[str] = (), *,
                 script: Callable[[int, Sequence[int]], str] | None = None, delay_s: float = 0.0):
        """`tokenizer`: a `Codec`, a `tokenizers.Tokenizer` or a transformers fast tokenizer."""
        if not turns and script is None:
            raise ValueError("ScriptedSampler needs `turns` or `script`")
        self._codec = tokenizer if isinstance(tokenizer, Codec) else Codec(tokenizer)
        self._turns = tuple(turns)
        self._script = script
        self._delay_s = delay_s
        self._im_end = self._codec.im_end
        self._cache: dict[str, tuple[int, ...]] = {}
        self.calls = 0

    def _ids(self, text: str) -> tuple[int, ...]:
        if text not in self._cache:
            self._cache[text] = tuple(self._codec.encode(text))
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
