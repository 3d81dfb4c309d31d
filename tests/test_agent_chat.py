"""Our Qwen3 renderer against the original template (from the installed trl wheel) run by
transformers' apply_chat_template, on a tokenizer that has Qwen3's special tokens."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from agent_fixtures import qwen3_chat_template

from orchestrax.agent import chat
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.tools.tool import Pricing, ToolSpec

SEARCH = ToolSpec(name="search", description="Search the local wiki.",
                  parameters={"type": "object", "properties": {"query": {"type": "string"}},
                              "required": ["query"]},
                  pricing=Pricing(usd_per_call=0.001))
PYTHON = {"type": "function", "function": {
    "name": "python", "description": "Run code — returns stdout.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}


def hf_render(messages, *, tools=None, training=False, **kw):
    tok = tiny_qwen3_tokenizer()
    schemas = [chat.tool_schema(t) for t in tools] if tools else None
    return tok.apply_chat_template(messages, tools=schemas, tokenize=False,
                                   chat_template=qwen3_chat_template(training=training), **kw)


CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hi there"}],
    "system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "<think>\nhello?\n</think>\n\nHello!"}],
    "tool_episode": [
        {"role": "system", "content": "You route queries.\nPrefer cheap tools."},
        {"role": "user", "content": "Capital of France, and 2+2?"},
        {"role": "assistant",
         "content": "<think>\nTwo lookups.\n</think>\n\nLet me check.",
         "tool_calls": [{"type": "function", "function": {"name": "search",
                                                            "arguments": {"query": "France"}}},
                        {"type": "function", "function": {"name": "python",
                                                            "arguments": '{"code": "2+2"}'}}]},
        {"role": "tool", "content": "Paris is the capital."},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "<think>\ndone\n</think>\n\n<answer>Paris, 4</answer>"}],
    "tool_call_no_content": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"name": "search", "arguments": {"query": "météo Paris"}}]},
        {"role": "tool", "content": "sunny"}],
    "reasoning_field_and_old_turns": [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "<think>\nold thoughts\n</think>\n\nA1"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "reasoning_content": "\nnew thoughts\n", "content": "A2"},
        {"role": "user", "content": "<tool_response>\nx\n</tool_response>"}],
    "empty_think_mid_episode": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\n\n</think>\n\n",
         "tool_calls": [{"function": {"name": "search", "arguments": {"query": "q"}}}]},
        {"role": "tool", "content": "r"},
        {"role": "assistant", "content": "<think>\n\n</think>\n\nfinal"}],
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [(), (SEARCH, PYTHON)], ids=["no_tools", "tools"])
@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("training", [False, True], ids=["original", "training"])
def test_render_matches_qwen3_template(name, tools, thinking, training):
    msgs = CONVERSATIONS[name]
    for gen in (False, True):
        ours = chat.render_messages(msgs, tools=tools, add_generation_prompt=gen,
                                    enable_thinking=thinking, keep_thinking=training)
        ref = hf_render(msgs, tools=tools, training=training, add_generation_prompt=gen,
                        enable_thinking=thinking)
        assert ours == ref


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [(), (SEARCH, PYTHON)], ids=["no_tools", "tools"])
@pytest.mark.parametrize("thinking", [True, False])
def test_tiny_tokenizer_template_renders_like_ours(name, tools, thinking):
    """`orchestrax serve --tiny` renders chat requests with the tiny tokenizer's own template."""
    tok = tiny_qwen3_tokenizer()
    schemas = [chat.tool_schema(t) for t in tools] or None
    for gen in (False, True):
        ours = chat.render_messages(CONVERSATIONS[name], tools=tools, add_generation_prompt=gen,
                                    enable_thinking=thinking)
        assert tok.apply_chat_template(CONVERSATIONS[name], tools=schemas, tokenize=False,
                                       add_generation_prompt=gen, enable_thinking=thinking) == ours


def test_thinking_off_generation_prompt_has_empty_think_block():
    out = chat.render_messages([{"role": "user", "content": "x"}], add_generation_prompt=True,
                               enable_thinking=False)
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tools_json_inside_system_turn():
    out = chat.render_messages([{"role": "user", "content": "x"}], tools=[SEARCH])
    system = out.split("<|im_end|>")[0]
    line = system.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(line) == SEARCH.to_openai()


def test_deltas_continue_a_full_render():
    base = CONVERSATIONS["tool_episode"][:3]
    head = chat.render_messages(base[:2], tools=[SEARCH], add_generation_prompt=True)
    assistant = chat.render_messages(base, tools=[SEARCH])[len(head):]
    assert assistant.endswith("<|im_end|>\n")
    delta = chat.tool_response_delta(["Paris is the capital.", "4"])
    full = chat.render_messages(CONVERSATIONS["tool_episode"][:5], tools=[SEARCH],
                                add_generation_prompt=True)
    # The sampler's output stops at <|im_end|>; the delta carries the "\n" after it.
    assert head + assistant[:-1] + delta == full
    user = chat.user_delta("thanks", enable_thinking=False)
    assert user == "\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match=r"messages\[1\]\.role='robot'"):
        chat.render_messages([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}])
    with pytest.raises(ValueError, match="empty"):
        chat.render_messages([])
    with pytest.raises(ValueError, match="observations"):
        chat.tool_response_delta([])


_text = st.lists(st.sampled_from(list("ab \n<>/{}\"é") + ["</think>", "<think>", "\n\n"]),
                max_size=12).map("".join)
_call = st.fixed_dictionaries({"name": st.sampled_from(["search", "python"]),
                               "arguments": st.dictionaries(st.sampled_from(["q", "n"]),
                                                            st.integers() | _text, max_size=2)})
_message = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"), "content": _text}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": _text}),
    st.fixed_dictionaries({"role": st.just("system"), "content": _text}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": _text},
                          optional={"tool_calls": st.lists(_call, max_size=2)}),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(_message, min_size=1, max_size=6), tools=st.booleans(),
       thinking=st.booleans(), training=st.booleans())
def test_render_matches_template_on_random_conversations(messages, tools, thinking, training):
    tools = (SEARCH, PYTHON) if tools else ()
    ours = chat.render_messages(messages, tools=tools, add_generation_prompt=True,
                                enable_thinking=thinking, keep_thinking=training)
    ref = hf_render(messages, tools=tools, training=training, add_generation_prompt=True,
                    enable_thinking=thinking)
    assert ours == ref
    if not training:
        own = tiny_qwen3_tokenizer().apply_chat_template(
            messages, tools=[chat.tool_schema(t) for t in tools] or None, tokenize=False,
            add_generation_prompt=True, enable_thinking=thinking)
        assert own == ours
        parts = chat.prompt_parts(messages, tools=tools, enable_thinking=thinking)
        assert "".join(parts) == ours
        assert len(parts) == 1 or parts[1::2] == [m["content"] for m in messages
                                                  if m["role"] != "assistant" and m["content"]]


def test_tiny_tokenizer_is_deterministic_saves_and_reloads(tmp_path):
    from transformers import AutoTokenizer

    from orchestrax.agent.scripted import QWEN3_ADDED_TOKENS, _build
    tok = tiny_qwen3_tokenizer()
    again = _build.__wrapped__(512)
    assert tok.get_vocab() == again.get_vocab(with_added_tokens=True) and len(tok) == 512
    text = chat.render_messages(CONVERSATIONS["tool_episode"], tools=[SEARCH])
    ids = tok.encode(text, add_special_tokens=False)
    for piece, _ in QWEN3_ADDED_TOKENS[1:]:
        assert tok.convert_tokens_to_ids(piece) in ids or piece not in text
    assert tok.decode(ids) == text
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.encode(text, add_special_tokens=False) == ids
    assert loaded.eos_token == "<|im_end|>" and loaded.pad_token == "<|endoftext|>"
    with pytest.raises(ValueError, match="vocab_size=100"):
        tiny_qwen3_tokenizer(vocab_size=100)
