"""QA environment: loaders for every shipped file and user-supplied shapes, the three graders."""

from __future__ import annotations

import asyncio
import json
import re
import socket

import pytest

from orchestrax.data.records import Trajectory
from orchestrax.tools.chat_client import ChatEndpoint
from orchestrax.envs.qa import QAConfig, QAEnv, default_grader, load_jsonl
from orchestrax.envs.qa_grading import exact_match, last_boxed, math_match, normalize_answer, parse_verdict
from loopback import ScriptedChatServer

SHIPPED = {"aime_2024_2025": 60, "frames_824": 824, "musique_500": 500, "bamboogle_125": 125}


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_files_load(shared_data, name):
    path = shared_data / "qa" / f"{name}.jsonl"
    tasks = load_jsonl(path)
    assert len(tasks) == SHIPPED[name] == len({t.task_id for t in tasks})
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for task, row in zip(tasks, raw):
        assert task.answer == (row["answer"],)
        assert task.messages[-1] == {"role": "user", "content": row.get("problem", row.get("question"))}
        assert task.task_id == f"{name}/{row.get('id', row.get('idx'))}"
    assert default_grader(path) == ("math" if name.startswith("aime") else "exact")


def test_user_supplied_shapes(tmp_path):
    gaia = _write(tmp_path / "gaia_val.jsonl", [
        {"task_id": "c61d", "Question": "How many legs?", "Final answer": "4", "file_name": ""}])
    hle = _write(tmp_path / "hle.jsonl", [
        {"id": "h1", "question": "Name it.", "answer": ["Ada Lovelace", "Augusta Ada King"],
         "answer_type": "exactMatch"}])
    gpqa = _write(tmp_path / "gpqa_diamond.jsonl", [{"idx": 7, "problem": "Which?", "answer": 3.5}])
    (t_gaia,), (t_hle,), (t_gpqa,) = load_jsonl(gaia), load_jsonl(hle), load_jsonl(gpqa)
    assert (t_gaia.task_id, t_gaia.answer, t_gaia.metadata["file_name"]) == ("gaia_val/c61d", ("4",), "")
    assert t_hle.answer == ("Ada Lovelace", "Augusta Ada King")
    assert t_gpqa.answer == ("3.5",) and t_gpqa.task_id == "gpqa_diamond/7"
    assert exact_match("augusta ada king", t_hle.answer) == 1.0


@pytest.mark.parametrize("rows, message", [
    ([{"id": 1, "question": "q"}], r"no answer field; expected one of \['answer', 'final_answer', 'Final answer'\]"),
    ([{"question": "q", "answer": "a"}], "no id field"),
    ([{"id": 1, "text": "q", "answer": "a"}], "no question field"),
    ([{"id": 1, "question": "q", "answer": "a"}, {"id": 1, "question": "r", "answer": "b"}], ":2: duplicate id"),
    ([{"id": 1, "question": " ", "answer": "a"}], "empty question"),
])
def test_bad_rows_name_the_problem(tmp_path, rows, message):
    with pytest.raises(ValueError, match=message):
        load_jsonl(_write(tmp_path / "bad.jsonl", rows))


def test_bad_json_line_is_located(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"id": 1, "question": "q", "answer": "a"}\n{oops\n')
    with pytest.raises(ValueError, match=r"broken.jsonl:2: not JSON"):
        load_jsonl(path)


def test_normalised_exact_match():
    assert normalize_answer("  The Eiffel-Tower!! ") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert exact_match("The Titan IIIE.", ["Titan IIIE"]) == 1.0
    assert exact_match("James Madison", ["james madison"]) == 1.0
    assert exact_match("I think it is \\boxed{1999}.", ["1999"]) == 1.0
    assert exact_match("Titan II", ["Titan IIIE"]) == 0.0
    assert exact_match("", ["x"]) == 0.0 and exact_match(None, ["x"]) == 0.0
    assert last_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("no box") is None


def test_math_verify_on_every_aime_answer(shared_data):
    env = QAEnv(QAConfig(path=str(shared_data / "qa" / "aime_2024_2025.jsonl")))
    assert env.grader == "math"
    for task in env.tasks("all"):
        gold = task.answer[0]
        assert math_match(f"So the answer is $\\boxed{{{gold}}}$.", task.answer) == 1.0, task.task_id
        assert math_match(gold, task.answer) == 1.0
        assert math_match(str(int(gold) + 1), task.answer) == 0.0
    assert math_match("\\boxed{33}", ["033"]) == 1.0
    assert math_match("$\\frac{1}{2}$", ["0.5"]) == 1.0
    assert math_match("\\boxed{\\sqrt{8}}", ["2\\sqrt{2}"]) == 1.0
    assert math_match("\\boxed{x+1", ["1"]) == 0.0  # malformed LaTeX is a miss, not a crash


def _judge(body):
    """A real HTTP judge: CORRECT when the response mentions the reference (case-insensitive)."""
    prompt = body["messages"][0]["content"]
    gold = re.search(r"Reference answer: (.*)", prompt).group(1).lower()
    response = re.search(r"Response: (.*)", prompt).group(1).lower()
    ok = any(g in response for g in gold.split(" or "))
    return f"Compared them.\nVERDICT: {'CORRECT' if ok else 'INCORRECT'}"


def test_llm_judge_over_loopback(shared_data):
    path = str(shared_data / "qa" / "bamboogle_125.jsonl")

    async def main():
        async with ScriptedChatServer(_judge) as srv:
            env = QAEnv(QAConfig(path=path, grader="judge",
                                         judge=ChatEndpoint(base_url=srv.base_url, model="judge")))
            task = env.tasks("all")[0]  # Citibank / James Madison
            right = await env.verify(task, Trajectory(task_id=task.task_id,
                                                      final_answer="It was President James Madison."))
            wrong = await env.verify(task, Trajectory(task_id=task.task_id, final_answer="Jefferson"))
            empty = await env.verify(task, Trajectory(task_id=task.task_id, final_answer=None))
            return right, wrong, empty, srv.requests, env.judge_failures

    right, wrong, empty, requests, failures = asyncio.run(main())
    assert (right, wrong, empty) == (1.0, 0.0, 0.0)
    assert len(requests) == 2 and failures == 0  # an empty answer is not sent to the judge
    prompt = requests[0]["messages"][0]["content"]
    assert "Citibank" in prompt and "james madison" in prompt and "James Madison." in prompt
    assert requests[0]["model"] == "judge" and requests[0]["temperature"] == 0.0


def test_judge_failure_falls_back_to_exact_match(shared_data):
    path = str(shared_data / "qa" / "bamboogle_125.jsonl")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]

    async def main():
        env = QAEnv(QAConfig(path=path, grader="judge", judge=ChatEndpoint(
            base_url=f"http://127.0.0.1:{dead}/v1", model="j", max_retries=1, backoff_s=0.01)))
        task = env.tasks("all")[0]
        exact = await env.grade(task, "James Madison")
        loose = await env.grade(task, "It was James Madison")
        async with ScriptedChatServer(lambda body: "I refuse to give a verdict") as srv:
            env2 = QAEnv(QAConfig(path=path, grader="judge",
                                          judge=ChatEndpoint(base_url=srv.base_url, model="j")))
            unparsable = await env2.grade(task, "James Madison")
        return exact, loose, env.judge_failures, unparsable, env2.judge_failures

    assert asyncio.run(main()) == (1.0, 0.0, 2, 1.0, 1)
    assert parse_verdict("x\nVERDICT: correct") == 1.0 and parse_verdict("VERDICT: INCORRECT") == 0.0


def test_splits_are_stable_and_disjoint(shared_data):
    cfg = QAConfig(path=str(shared_data / "qa" / "musique_500.jsonl"))
    a, b = QAEnv(cfg), QAEnv(cfg)
    train, test = a.tasks("train"), a.tasks("test")
    assert [t.task_id for t in train] == [t.task_id for t in b.tasks("train")]
    assert not {t.task_id for t in train} & {t.task_id for t in test}
    assert len(train) + len(test) == 500 and 60 < len(test) < 140
    assert [t.task_id for t in a.tasks("eval")] == [t.task_id for t in test]
    via_fields = QAEnv(path=cfg.path)
    assert [t.task_id for t in via_fields.tasks("test")] == [t.task_id for t in test]
    assert a.tools(train[0]) == []
    with pytest.raises(ValueError, match="allowed: train, test, eval, all"):
        a.tasks("dev")


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="grader='fuzzy'; allowed: exact, math, judge"):
        QAConfig(path="x.jsonl", grader="fuzzy")
    with pytest.raises(ValueError, match="QAConfig.judge"):
        QAConfig(path="x.jsonl", grader="judge")
    with pytest.raises(ValueError, match="test_fraction"):
        QAConfig(path="x.jsonl", test_fraction=1.5)
