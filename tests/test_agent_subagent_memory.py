"""Structured memory: the four sections fill as the orchestrator and sub-agents write, and the
renderer shows compact records only."""

import pytest

from orchestrax.agent.subagent.memory import (Memory, MemoryLimits, clip, orchestrator_messages,
                                              render)


def test_sections_fill_in_order_and_render_compactly():
    m = Memory(query="Who wrote X and when was he born?")
    assert "(not yet written)" in render(m) and render(m).count("(none)") == 3
    m.set_analysis("Need the author, then his birth year.\nSearch twice.")
    m.set_analysis("a second analysis is ignored")
    assert m.query_analysis == "Need the author, then his birth year. Search twice."

    assert m.open_goal("web_searcher", "Find the author of X") == 1
    assert [g.status for g in m.sub_goals] == ["pending"]
    step = m.close_goal(agent="web_searcher", result="X was written by Y.", ok=True)
    assert (step.step, step.agent, step.sub_goal, step.ok) == (1, "web_searcher",
                                                              "Find the author of X", True)
    assert m.open_goal("web_searcher", "Birth year of Y") == 2
    m.close_goal(agent="web_searcher", result="search failed: timeout " + "z" * 500, ok=False)
    m.note_error("Error: unknown tool 'video'.")

    assert [g.status for g in m.sub_goals] == ["done", "failed"]
    assert [s.ok for s in m.steps] == [True, False, False]
    # Only successful results enter the tool-results section.
    assert [(r.step, r.result) for r in m.tool_results] == [(1, "X was written by Y.")]
    # Briefs are capped (MemoryLimits.brief_chars) with an ellipsis.
    assert len(m.steps[1].brief) == MemoryLimits().brief_chars and m.steps[1].brief.endswith("...")

    text = render(m)
    headers = ["## Query analysis", "## Previous steps", "## Tool results", "## Sub-goals"]
    assert [text.index(h) for h in headers] == sorted(text.index(h) for h in headers)
    assert "1. [web_searcher] Find the author of X -> ok: X was written by Y." in text
    assert "2. [web_searcher] Birth year of Y -> FAILED: search failed" in text
    assert "3. [orchestrator] (none) -> FAILED: Error: unknown tool 'video'." in text
    assert "Step 1 (web_searcher): X was written by Y." in text
    assert "- [failed] Birth year of Y (web_searcher)" in text

    system, user = orchestrator_messages("SYS", m)
    assert system == {"role": "system", "content": "SYS"}
    assert user["role"] == "user" and user["content"] == text
    assert user["content"].startswith("Question: Who wrote X and when was he born?")


def test_close_without_open_and_bad_limits_are_errors():
    with pytest.raises(ValueError, match="no pending sub-goal"):
        Memory(query="q").close_goal(agent="coder", result="r", ok=True)
    with pytest.raises(ValueError, match=r"MemoryLimits.result_chars=3; must be >= 16"):
        MemoryLimits(result_chars=3)


def test_clip():
    assert clip("a  b\n c", 10) == "a b c"
    assert clip("abcdefghijklmnopqrstuvwxyz", 10) == "abcdefg..."
    assert len(clip("x" * 100, 16)) == 16
