"""Hand-worked checks of the pieces behind the OpenAI-compatible route: stop-string matching on
streamed tokens, Qwen3 tool-call blocks -> `tool_calls`, and request parsing."""

import json

import pytest

from orchestrax.rollout import openai_chat as oai
from orchestrax.rollout.detok import StopMatcher
from orchestrax.rollout.validate import ProtocolError, ServeLimits

PIECES = {1: "ab", 2: "c", 3: "de", 4: "f", 5: "g\u00e9", 6: "END", 7: "xy"}


def decode(ids):
    return "".join(PIECES[i] for i in ids)


def test_stop_string_cuts_text_and_tokens_and_holds_back_a_possible_prefix():
    m = StopMatcher(decode, stops=("cde", "zz"))
    assert m.feed([1]) == ""           # "ab": 2 chars held back (len("cde") - 1)
    assert m.feed([2]) == "a"          # "abc": "bc" could still start "cde"
    assert m.feed([3, 4]) == "b"       # "abcdef": "cde" found at 2 -> final text "ab"
    assert (m.matched, m.kept_tokens, m.final_text) == ("cde", 3, "ab")
    assert m.feed([5]) == "" and m.flush() == ""


def test_no_stop_trim_keeps_the_stop_and_flush_releases_the_tail():
    m = StopMatcher(decode, stops=("END",), no_stop_trim=True)
    assert m.feed([1, 2]) == "a" and m.feed([6, 7]) == "bcEND"
    assert m.kept_tokens == 3 and m.final_text == "abcEND"
    plain = StopMatcher(decode, stops=("qq",))
    assert plain.feed([1, 3]) == "abd" and plain.flush() == "e" and plain.matched is None


def test_earliest_stop_wins_and_partial_characters_wait():
    m = StopMatcher(decode, stops=("f", "de"))
    m.feed([1, 3, 4])
    assert m.matched == "de" and m.final_text == "ab" and m.kept_tokens == 2
    broken = StopMatcher(lambda ids: "ok\ufffd"[:len(ids) + 2])
    assert broken.feed([0]) == "ok" and broken.flush() == "\ufffd"


def test_tool_call_blocks_become_tool_calls():
    text = ('Let me check.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "x"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
            '<tool_call>not json</tool_call>')
    content, calls = oai.split_tool_calls(text, parallel=True)
    assert content == "Let me check.\n\n<tool_call>not json</tool_call>"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("lookup", {"word": "x"}), ("add", {"a": 1})]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    _, first_only = oai.split_tool_calls(text, parallel=False)
    assert [c["function"]["name"] for c in first_only] == ["lookup"]
    assert oai.split_tool_calls("plain answer", parallel=True) == ("plain answer", [])


def test_parse_chat_defaults_and_names():
    call = oai.parse_chat({"messages": [{"role": "user", "content": "hi"}], "model": "m",
                           "user": "ignored", "metadata": {"x": 1}}, vocab_size=100)
    assert call.sampling.max_new_tokens == oai.DEFAULT_MAX_TOKENS
    assert call.sampling.temperature == 1.0 and call.n == 1 and call.tools is None
    assert call.parallel_tool_calls and not call.stream and not call.include_usage
    call = oai.parse_chat({"messages": [{"role": "user", "content": "hi"}], "stop": "END",
                           "stream": True, "stream_options": {"include_usage": True},
                           "max_completion_tokens": 7, "max_tokens": 99, "seed": 3,
                           "tools": [{"type": "function", "function": {"name": "f"}}],
                           "tool_choice": "none"}, vocab_size=100)
    assert call.stop == ("END",) and call.include_usage and call.sampling.max_new_tokens == 7
    assert call.sampling.sampling_seed == 3 and call.tools is None
    with pytest.raises(ProtocolError, match="stop"):
        oai.parse_chat({"messages": [{"role": "user", "content": "hi"}], "stop": ["a"] * 5},
                       vocab_size=100, limits=ServeLimits(max_stop=4))
    with pytest.raises(ProtocolError, match=r"stop_token_ids\[0\]"):
        oai.parse_chat({"messages": [{"role": "user", "content": "hi"}],
                        "stop_token_ids": [100]}, vocab_size=100)
