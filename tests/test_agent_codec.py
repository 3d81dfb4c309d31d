"""Codec: splitting at added tokens and caching the chat scaffolding gives exactly the
tokenizer's own ids, on any text; tokenizers whose added tokens have neighbour rules fall back
to the plain path."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings
from tokenizers import AddedToken, Tokenizer

from orchestrax.agent import chat
from orchestrax.agent.codec import Codec
from orchestrax.agent.scripted import QWEN3_ADDED_TOKENS, tiny_qwen3_tokenizer, tiny_tokenizer

TOKENIZER = tiny_qwen3_tokenizer()
CODEC = Codec(TOKENIZER)
ATOMS = [t for t, _ in QWEN3_ADDED_TOKENS] + [
    "\n", "\n\n", " ", "  ", "\t", "user", "assistant", "<", ">", "|", "<|", "|>", "</", "im_end",
    "tool_response", "é", "中文", "{\"a\": 1}", "0", "42", "Paris", " the", "'s", "\r\n"]


def _reference(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


def test_a_bare_tokenizer_gives_the_same_codec():
    bare = Codec(tiny_tokenizer())
    text = chat.tool_response_delta(["Paris é 42", "<|im_end|>"])
    assert bare.encode(text) == CODEC.encode(text) and bare.stop_ids == CODEC.stop_ids


def test_codec_uses_the_split_path_for_qwen3_tokens():
    assert CODEC._split is not None
    assert set(CODEC._pieces) >= {"user\n", "assistant\n", "\n"}


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(ATOMS), st.text(max_size=8)), max_size=30))
def test_encode_equals_the_tokenizer_on_any_text(parts):
    text = "".join(parts)
    assert CODEC.encode(text) == _reference(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=3), st.booleans())
def test_continuation_blocks_equal_the_tokenizer(observations, thinking):
    for text in (chat.tool_response_delta(observations, enable_thinking=thinking),
                 chat.user_delta(observations[0], enable_thinking=thinking)):
        assert CODEC.encode(text) == _reference(text)
        assert CODEC.decode(CODEC.encode(text)) == text


def test_added_tokens_with_neighbour_rules_fall_back_to_the_plain_path():
    tok = Tokenizer.from_str(tiny_tokenizer(512).to_str())
    tok.add_tokens([AddedToken("<tool_call>", rstrip=True, normalized=False)])
    codec = Codec(tok)
    assert codec._split is None
    text = "<tool_call>   {\"name\": \"x\"}"
    assert codec.encode(text) == tok.encode(text, add_special_tokens=False).ids
