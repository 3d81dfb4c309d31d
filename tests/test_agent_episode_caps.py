"""Caps on what one model turn can make the episode do or echo back: calls per turn (the excess
is one error observation) and every model-written name or value clipped in an error message."""

import json

import pytest
from test_agent_hostile import PARSER, call, play

from orchestrax.agent.episode import EpisodeConfig
from orchestrax.agent.parser import MAX_ECHO_CHARS, ToolCallParser


def test_an_unknown_tool_named_with_a_megabyte_is_echoed_clipped():
    name = "n" * 200_000   # (a whole megabyte is past the scripted turn's token budget)
    traj = play([call(name, "{}"), "<answer>x</answer>"])
    (record,) = traj.turns[0].tool_calls
    assert not record.ok and "unknown tool" in record.observation
    assert len(record.observation) < 3 * MAX_ECHO_CHARS
    assert "(200000 characters)" in record.observation
    # the tool response the model reads next is as short
    assert all(len(m["content"]) < 3 * MAX_ECHO_CHARS for m in traj.messages
               if m["role"] == "tool")


@pytest.mark.parametrize("body", [
    '{"name": "echo", "arguments": {"q": ' + json.dumps(["v" * 100_000]) + "}}",
    '{"name": "' + "e" * 100_000 + '", "arguments": [1, 2]}',
    '{"name": "' + "e" * 100_000 + '", "arguments": ' + "[" * 70 + "]" * 70 + "}",
])
def test_every_echoed_name_or_value_is_clipped(body):
    (parsed,) = PARSER.parse(f"<tool_call>\n{body}\n</tool_call>").calls
    assert parsed.error is not None and len(parsed.error) < 4 * MAX_ECHO_CHARS, parsed.error[:300]


def test_calls_past_the_cap_become_one_error_observation():
    turn = "".join(call("echo", json.dumps({"q": str(i)})) for i in range(100))
    traj = play([turn, "<answer>x</answer>"], config=EpisodeConfig(max_calls_per_turn=5))
    records = traj.turns[0].tool_calls
    assert [r.observation for r in records[:5]] == ["0", "1", "2", "3", "4"]
    assert len(records) == 6 and not records[5].ok
    assert "100 tool calls in one turn; at most 5 run per turn" in records[5].observation
    assert "the last 95 were not run" in records[5].observation


def test_the_cap_is_checked():
    with pytest.raises(ValueError, match="max_calls_per_turn"):
        EpisodeConfig(max_calls_per_turn=0)
    with pytest.raises(ValueError, match="max_calls=0"):
        ToolCallParser([], max_calls=0)
