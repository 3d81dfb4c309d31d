"""`orchestrax serve` under hostile requests: every sampling integer is bounded at the protocol,
a request that fails while it is served fails alone (both routes), the inputs that
used to answer 500 answer 400 naming the field, unsafe start options are refused, bodies are
parsed off the event loop, and a giant call cannot hold a small one back (the fair queue)."""

import asyncio
import dataclasses
import json
import threading

import aiohttp
import numpy as np
import pytest
from loopback import post, run_serve

from orchestrax import cli, models
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.rollout import http_io
from orchestrax.rollout.sampler import GenerateRequest, SamplingParams
from orchestrax.rollout.embedded import ContinuousSampler
from orchestrax.rollout.fair import FairQueue
from orchestrax.rollout.server import ServerState

TOK = tiny_qwen3_tokenizer()
CFG = models.tiny_config(vocab_size=len(TOK), tie_embeddings=False)
PARAMS = models.init_params(CFG, seed=0)
MSGS = [{"role": "user", "content": "hi"}]


def sampler16() -> ContinuousSampler:
    return ContinuousSampler(CFG, PARAMS, max_batch=16, max_len=96, prefill_chunk=16,
                             decode_steps=4)


def serve(fn, **state_kw):
    return run_serve(lambda: ServerState(sampler=sampler16(), model_path="tiny",
                                         tokenizer=TOK, **state_kw), fn)


def good_generate(i):
    return {"input_ids": [5, 17, 40 + i, 3], "sampling_params": {
        "temperature": 0.9, "max_new_tokens": 5, "sampling_seed": i}}


def good_chat(i):
    return {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 5,
            "temperature": 0.9, "seed": i}


def test_an_out_of_range_top_k_is_its_own_400_and_the_15_others_are_unchanged():
    """A top_k of 2**31 overflowed the int32 row and failed every request in flight (500)."""
    bad_g = good_generate(99)
    bad_g["sampling_params"]["top_k"] = 2**31
    bad_c = good_chat(99) | {"top_k": 2**31}

    async def fn(http, url, st):
        def goods():
            return [*(post(http, url, good_generate(i)) for i in range(15)),
                    *(post(http, url, good_chat(i), "/v1/chat/completions") for i in range(15))]
        alone = await asyncio.gather(*goods())
        mixed = await asyncio.gather(post(http, url, bad_g), *goods(),
                                     post(http, url, bad_c, "/v1/chat/completions"))
        over_vocab = await post(http, url, good_chat(0) | {"top_k": len(TOK) + 1},
                                "/v1/chat/completions")
        return alone, mixed, over_vocab

    alone, mixed, over_vocab = serve(fn)
    together = mixed[1:-1]
    assert [s for s, _ in together] == [200] * 30
    assert [b["output_ids"] for _, b in together[:15]] == [b["output_ids"] for _, b in alone[:15]]
    assert [b["choices"][0]["message"] for _, b in together[15:]] == \
        [b["choices"][0]["message"] for _, b in alone[15:]]
    for status, body in (mixed[0], mixed[-1], over_vocab):
        assert status == 400, body
        assert "top_k" in body["error"]["message"]
        assert f"[1, {len(TOK)}]" in body["error"]["message"]


def poisoned(sampler, request):
    """Queue `request` past admission (as a request the checks missed would arrive) and return
    its future: the sampler must fail it alone when it is served."""
    p = sampler._admit(dataclasses.replace(request, sampling=SamplingParams()))
    p.request = request
    sampler._enqueue([p])
    return p.future


def test_a_request_that_fails_while_served_fails_alone():
    goods = [GenerateRequest(input_ids=(5, 17, 40 + i, 3), sampling=SamplingParams(
        temperature=0.9, max_new_tokens=5, sampling_seed=i)) for i in range(15)]
    bad = GenerateRequest(input_ids=(5, 6, 7), sampling=SamplingParams(top_k=2**31))

    async def main():
        sampler = sampler16()
        alone = [r for (r,) in await asyncio.gather(*(sampler.generate([g]) for g in goods))]
        together = asyncio.gather(*(sampler.generate([g]) for g in goods[:7]))
        fut = poisoned(sampler, bad)
        rest = asyncio.gather(*(sampler.generate([g]) for g in goods[7:]))
        got = [r for (r,) in await together] + [r for (r,) in await rest]
        with pytest.raises((OverflowError, ValueError)):
            await fut
        after = (await sampler.generate([goods[0]]))[0]   # the sampler went on serving
        await sampler.aclose()
        return alone, got, after

    alone, got, after = asyncio.run(main())
    assert [r.output_ids for r in got] == [r.output_ids for r in alone]
    np.testing.assert_allclose([lp for r in got for lp in r.logprobs],
                               [lp for r in alone for lp in r.logprobs], atol=1e-5)
    assert after.output_ids == alone[0].output_ids


def test_the_engine_drops_the_row_of_a_request_that_fails_and_goes_on():
    from orchestrax.rollout.engine import ContinuousEngine
    eng = ContinuousEngine(CFG, PARAMS, max_batch=4, max_len=64, prefill_chunk=16,
                           decode_steps=4)
    goods = [GenerateRequest(input_ids=(5, 6, 7 + i), rid=f"g{i}", sampling=SamplingParams(
        temperature=0.7, max_new_tokens=6, sampling_seed=i)) for i in range(3)]
    alone = [eng.generate([g])[0] for g in goods]
    eng.submit(goods[0])
    eng.submit(dataclasses.replace(goods[1], rid="bad"))
    eng._queue[-1].request = GenerateRequest(   # past submit's checks, as a missed value would
        input_ids=(5, 6), rid="bad", sampling=SamplingParams(top_k=2**31))
    eng.submit(goods[2])
    results, failures = {}, {}
    while eng.busy:
        results.update((r.rid, r) for r in eng.step())
        failures.update(eng.failures)
    assert list(failures) == ["bad"] and isinstance(failures["bad"], OverflowError)
    assert [results[g.rid].output_ids for g in (goods[0], goods[2])] == \
        [alone[0].output_ids, alone[2].output_ids]


def test_inputs_that_answered_500_answer_400_naming_the_field(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    nested = []
    for _ in range(70):   # parses fine, but deeper than ServeLimits.max_json_depth
        nested = [nested]
    nested_ok_json_too_deep = json.dumps({"input_ids": [5], "x": nested})

    async def fn(http, url, st):
        return [
            (await post(http, url, '{"input_ids": ' + deep + "}"), "nests"),
            (await post(http, url, nested_ok_json_too_deep), "nests"),
            (await post(http, url, '{"text": "a \\ud800 b", "sampling_params": '
                        '{"max_new_tokens": 2}}'), "text"),
            (await post(http, url, '{"text": ["ok", "\\udfff"]}'), "text[1]"),
            (await post(http, url, '{"messages": [{"role": "user", "content": "\\ud800"}]}',
                        "/v1/chat/completions"), "messages[0].content"),
            (await post(http, url, {"messages": MSGS, "chat_template_kwargs":
                                    {"return_tensors": "np"}}, "/v1/chat/completions"),
             "chat_template_kwargs.return_tensors"),
            (await post(http, url, {"messages": MSGS, "chat_template_kwargs":
                                    {"tokenize": False}}, "/v1/chat/completions"),
             "chat_template_kwargs.tokenize"),
            (await post(http, url, {"model_path": str(tmp_path) + "\0x"},
                        "/update_weights_from_disk"), "model_path"),
            (await post(http, url, {"input_ids": [5], "sampling_params":
                                    {"max_new_tokens": 2**31}}), "max_new_tokens"),
        ]

    for (status, body), field in serve(fn, weight_roots=(str(tmp_path),)):
        assert status == 400, (field, body)
        assert field in body["error"]["message"], (field, body)


@pytest.mark.parametrize("argv, message", [
    (["--api-key", ""], "--api-key"),
    (["--api-key", "  "], "--api-key"),
    (["--weight-root", "/nonexistent/weights"], "--weight-root '/nonexistent/weights'"),
    (["--host", "999.1.1.1"], "--host '999.1.1.1' is not an IP address"),
    (["--host", "bad host"], "--host 'bad host'"),
])
def test_serve_refuses_unsafe_start_options_in_one_line(argv, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--tiny", *argv])
    assert str(e.value).startswith("orchestrax serve: ") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_an_empty_api_key_from_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("ORCHESTRAX_SERVE_API_KEY", "")
    with pytest.raises(SystemExit, match="ORCHESTRAX_SERVE_API_KEY"):
        cli.main(["serve", "--tiny"])


def test_bodies_are_parsed_and_checked_off_the_event_loop(monkeypatch):
    threads = []
    real_json, real_generate = http_io.parse_json, __import__(
        "orchestrax.rollout.server", fromlist=["parse_generate"]).parse_generate

    def spy(real):
        def wrapped(*a, **kw):
            threads.append(threading.current_thread() is threading.main_thread())
            return real(*a, **kw)
        return wrapped

    monkeypatch.setattr(http_io, "parse_json", spy(real_json))
    monkeypatch.setattr("orchestrax.rollout.server.parse_generate", spy(real_generate))

    async def fn(http, url, st):
        return await post(http, url, {"input_ids": [5] * 50, "sampling_params":
                                      {"max_new_tokens": 2}})

    status, _ = serve(fn)
    assert status == 200 and threads == [False, False]


def test_the_fair_queue_lets_a_small_request_pass_a_giant_backlog():
    async def main():
        q = FairQueue()
        for i in range(1024):
            q.put_nowait(("giant", i), "giant", 4000)
        taken = [q.get_nowait() for _ in range(3)]
        q.put_nowait(("small", 0), "small", 50)
        order = [q.get_nowait() for _ in range(5)]
        # Idle clients bank no credit: one that comes back late does not jump the others.
        for i in range(5):
            q.put_nowait(("late", i), "late", 50)
        q.put_nowait(("small", 1), "small", 50)
        later = [q.get_nowait()[0] for _ in range(4)]
        return taken, order, later, q.qsize()

    taken, order, later, left = asyncio.run(main())
    assert taken == [("giant", 0), ("giant", 1), ("giant", 2)]
    assert order == [("small", 0), ("giant", 3), ("giant", 4), ("giant", 5), ("giant", 6)]
    # "small" comes back after the giant took 4 more turns: it resumes level with "late" (a
    # new client), not ahead of it with credit from its idle time.
    assert later == ["late", "small", "late", "late"]
    assert left == 1024 - 3 + 1 - 5 + 6 - 4


def test_a_giant_call_delays_a_small_one_by_a_bounded_number_of_turns():
    """One call of 48 requests is queued first; a small call that arrives once the giant has
    started finishes after at most two batches' worth of the giant's requests (FIFO: all)."""
    giant = [GenerateRequest(input_ids=(5, 6, 7, i % 50), sampling=SamplingParams(
        temperature=0.0, max_new_tokens=4, stop_token_ids=())) for i in range(48)]
    small = GenerateRequest(input_ids=(9, 9), sampling=SamplingParams(max_new_tokens=2))

    async def main():
        sampler = ContinuousSampler(CFG, PARAMS, max_batch=4, max_len=64, prefill_chunk=16,
                                    decode_steps=4)
        done_giants = []

        async def one(r):
            await sampler.generate([r], client="giant")
            done_giants.append(r)

        tasks = [asyncio.create_task(one(r)) for r in giant]
        while not sampler._live and not any(
                t.done() for t in tasks):
            await asyncio.sleep(0.001)   # until the giant call is being served
        await sampler.generate([small], client="small")
        before_small = len(done_giants)
        await asyncio.gather(*tasks)
        await sampler.aclose()
        return before_small

    assert asyncio.run(main()) <= 2 * 4 + 4


def test_the_fair_queue_shares_by_peer_then_name_then_call():
    q = FairQueue()
    for i in range(6):   # one peer floods under six names, one call each
        q.put_nowait(("a", i), ("10.0.0.1", f"name{i}", object()), 10)
    for i in range(3):   # one call of three requests: they share that call's turn
        q.put_nowait(("c", i), ("10.0.0.2", "", "call"), 10)
    for i in range(3):
        q.put_nowait(("b", i), ("10.0.0.2", "", object()), 10)
    order = [q.get_nowait() for _ in range(len(q))]
    # Peers alternate whatever the names; within 10.0.0.2 its four calls take turns.
    assert [x for x, _ in order] == ["a", "c", "a", "b", "a", "b", "a", "b", "a", "c", "a", "c"]
    assert [x for x in order if x[0] != "a"] == [("c", 0), ("b", 0), ("b", 1), ("b", 2),
                                                  ("c", 1), ("c", 2)]
    assert q.empty()


def test_a_client_is_its_peer_and_its_name_not_its_http_calls():
    """Twelve one-request HTTP calls of one named client are queued first, then three calls
    under another name and three from a second peer address without a name; one slot serves
    them in the fair queue's order. Keyed by HTTP call, all eleven waiting giant calls went
    first; keyed by client, the six others are all served before the giant's fifth."""
    served, gate = [], threading.Event()

    def body(tag):
        return {"input_ids": [tag, 5, 6], "sampling_params": {"max_new_tokens": 2,
                                                              "temperature": 0.0}}

    async def fn(http, url, st):
        eng, sampler = st.sampler.engine, st.sampler
        submit, step, enqueue = eng.submit, eng.step, sampler._enqueue
        eng.submit = lambda r, on_tokens=None: (served.append(r.input_ids[0]),
                                                submit(r, on_tokens))[1]
        eng.step = lambda hold=(): (gate.wait(120), step(hold))[1]   # until all are queued
        queued = {12: asyncio.Event(), 18: asyncio.Event()}

        def counting(pendings, client=None):
            enqueue(pendings, client)
            if sampler.outstanding in queued:
                queued[sampler.outstanding].set()
        sampler._enqueue = counting
        try:
            giant = [asyncio.create_task(post(http, url, body(1),
                                              headers={"X-Client-Id": "giant"}))
                     for _ in range(12)]
            await queued[12].wait()
            peer = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
            async with aiohttp.ClientSession(connector=peer) as other:
                rest = [*(post(http, url, body(2), headers={"X-Client-Id": "small"})
                          for _ in range(3)), *(post(other, url, body(3)) for _ in range(3))]
                rest = [asyncio.create_task(c) for c in rest]
                await queued[18].wait()
                gate.set()
                return await asyncio.gather(*giant, *rest)
        finally:
            gate.set()

    out = run_serve(lambda: ServerState(sampler=ContinuousSampler(
        CFG, PARAMS, max_batch=1, max_len=32, prefill_chunk=16, decode_steps=2),
        model_path="tiny", tokenizer=TOK), fn)
    assert [s for s, _ in out] == [200] * 18
    assert sorted(served) == [1] * 12 + [2] * 3 + [3] * 3
    last_other = max(i for i, tag in enumerate(served) if tag != 1)
    assert served[:last_other].count(1) <= 4, served



POISON_SEED = 666   # marks the poisoned request of a call, on either route


def poison_engine(eng, kind: str) -> None:
    """Make the request seeded POISON_SEED fail inside `eng` once it is decoding: its row's
    own host work raises ("row": its token hook, from its first decode step on), or every
    decode dispatch it is live in raises before running ("dispatch": a device fault one row
    causes, which the engine cannot attribute)."""
    submit, decode = eng.submit, eng._decode_once

    def poisoned_submit(r, on_tokens=None):
        if kind != "row" or r.sampling.sampling_seed != POISON_SEED:
            return submit(r, on_tokens)
        calls = []

        def hook(*event):
            calls.append(event)
            if len(calls) > 1:
                raise RuntimeError("poisoned row")
            on_tokens(*event)
        return submit(r, hook)

    def poisoned_decode(finished, hold=()):
        if kind == "dispatch" and any(j is not None and j.request.sampling.sampling_seed
                                      == POISON_SEED for j in eng._slots):
            raise RuntimeError("poisoned dispatch")
        return decode(finished, hold)

    eng.submit, eng._decode_once = poisoned_submit, poisoned_decode


def greedy_generate(i, seed=None):
    return {"input_ids": [5, 17, 40 + i, 3], "sampling_params": {
        "temperature": 0.0, "max_new_tokens": 9, "sampling_seed": seed}}


def greedy_chat(i, seed=None):
    return {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 9,
            "temperature": 0.0, "seed": seed}


@pytest.mark.parametrize("kind", ["row", "dispatch"])
def test_a_request_poisoned_inside_the_engine_fails_alone_on_both_routes(kind):
    """15 greedy requests and one poisoned one in flight together, on /generate and on chat:
    the poisoned one fails (500), the 15 get the tokens they got alone, and the server goes
    on serving. Before, a failure in one row's decode failed every live row."""
    routes = {"/generate": (greedy_generate, lambda b: b["output_ids"]),
              "/v1/chat/completions": (greedy_chat, lambda b: b["choices"][0]["message"])}

    async def fn(http, url, st):
        poison_engine(st.sampler.engine, kind)
        out = {}
        for path, (body, answer) in routes.items():
            alone = [answer((await post(http, url, body(i), path))[1]) for i in range(15)]
            calls = [post(http, url, body(i), path) for i in range(15)]
            calls.insert(7, post(http, url, body(99, seed=POISON_SEED), path))
            mixed = await asyncio.gather(*calls)
            bad = mixed.pop(7)
            after = await post(http, url, body(0), path)
            out[path] = (alone, [s for s, _ in mixed], [answer(b) for _, b in mixed], bad[0],
                         answer(after[1]))
        return out, st.sampler.stats

    out, stats = serve(fn)
    for path, (alone, statuses, together, bad_status, after) in out.items():
        assert statuses == [200] * 15, path
        assert together == alone, path
        assert bad_status == 500, path
        assert after == alone[0], path
    assert (stats["reruns"] > 0) == (kind == "dispatch")


def test_the_engine_drops_a_row_whose_own_work_raises_and_goes_on():
    """One row whose host work raises from its first decode step, one whose prompt breaks its
    slot planning, among 15 good rows in one engine: the two are the step's failures, the 15
    finish with the tokens they got alone, and the engine serves the next request."""
    from orchestrax.rollout.engine import ContinuousEngine
    eng = ContinuousEngine(CFG, PARAMS, max_batch=16, max_len=64, prefill_chunk=16,
                           decode_steps=4)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=9)
    goods = [GenerateRequest(input_ids=(5, 6, 7 + i), rid=f"g{i}", sampling=greedy)
             for i in range(15)]
    alone = [eng.generate([g])[0] for g in goods]
    calls = []

    def hook(*event):
        calls.append(event)
        if len(calls) > 1:
            raise RuntimeError("poisoned row")

    for g in goods[:7]:
        eng.submit(g)
    eng.submit(GenerateRequest(input_ids=(5, 6, 40), rid="bad-row", sampling=greedy),
               on_tokens=hook)
    eng.submit(GenerateRequest(input_ids=(5, 6, 41), rid="bad-plan", sampling=greedy))
    eng._queue[-1].request = GenerateRequest(   # past submit's checks, as a missed value would
        input_ids=("x", "y"), rid="bad-plan", sampling=greedy)
    for g in goods[7:]:
        eng.submit(g)
    results, failures = {}, {}
    while eng.busy:
        results.update((r.rid, r) for r in eng.step())
        failures.update(eng.failures)
    assert sorted(failures) == ["bad-plan", "bad-row"]
    assert "poisoned row" in str(failures["bad-row"]) and len(calls) == 2
    assert [results[g.rid].output_ids for g in goods] == [r.output_ids for r in alone]
    assert eng.generate([goods[3]])[0].output_ids == alone[3].output_ids


def test_the_fair_queue_takes_the_next_client_a_predicate_allows():
    q = FairQueue()
    for i in range(3):
        q.put_nowait(("giant", i), ("10.0.0.1", "", "giant"), 4000)
    q.put_nowait(("small", 0), ("10.0.0.1", "", "small"), 10)
    # the giant call is first in turn, but refused: the small one goes; then nothing qualifies
    refuse_giant = lambda path: path[-1] != "giant"   # noqa: E731
    assert q.take(refuse_giant) == ("small", 0)
    assert q.take(refuse_giant) is None and len(q) == 3
    # the predicate judges whole paths, never a peer alone
    assert q.take(lambda path: path != ("10.0.0.1",)) == ("giant", 0)
    assert [q.take(lambda path: True) for _ in range(3)] == [("giant", 1), ("giant", 2), None]


@pytest.mark.parametrize("reserve, giants_first", [(0, 4), (1, 0)])
def test_a_giant_call_cannot_take_every_slot(reserve, giants_first):
    """Four slots, one call of 12 long requests: with a slot kept from any one client, a small
    request that arrives while the giant runs starts at the next step and finishes before any
    giant row; with none kept it waits for the first four giant rows to finish."""
    giant = [GenerateRequest(input_ids=(5, 6, 7, i), sampling=SamplingParams(
        temperature=0.0, max_new_tokens=60, stop_token_ids=())) for i in range(12)]
    small = GenerateRequest(input_ids=(9, 9), sampling=SamplingParams(max_new_tokens=2))

    async def main():
        sampler = ContinuousSampler(CFG, PARAMS, max_batch=4, max_len=96, prefill_chunk=16,
                                    decode_steps=4, reserve_slots=reserve)
        done_giants, held = [], []

        async def one(r):
            await sampler.generate([r], client="giant")
            done_giants.append(r)

        tasks = [asyncio.create_task(one(r)) for r in giant]
        while len(sampler._live) < 4 - reserve:
            await asyncio.sleep(0.001)   # until the giant holds its slots
        held.append(len(sampler._live))
        await sampler.generate([small], client="small")
        before_small = len(done_giants)
        await asyncio.gather(*tasks)
        await sampler.aclose()
        return before_small, held

    before_small, held = asyncio.run(main())
    assert held == [4 - reserve] and before_small == giants_first


@pytest.mark.parametrize("broken", ["step", "spans"])
def test_a_step_that_fails_with_any_rows_fails_its_requests_once_and_serving_goes_on(broken):
    """A wrapper passing a wrong argument breaks every step (`engine.step`, or `engine.spans`,
    read before each step): the 8 requests of one call end with a 500 naming the TypeError
    after one failed step and one try with no request (no reruns), and a good request after
    the engine is mended gets the tokens it got before. Before, the broken `spans` ended the
    sampler's loop and every request hung; the broken `step` was rerun in halves, 15 steps."""
    calls = []

    async def fn(http, url, st):
        eng = st.sampler.engine
        before = await post(http, url, greedy_generate(0))
        original = getattr(eng, broken)

        def wrong(*args):   # passes one argument too many
            calls.append(args)
            return original(*args, "extra")
        setattr(eng, broken, wrong)
        body = {"input_ids": [[5, 17, 40 + i, 3] for i in range(8)],
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 9}}
        failed = await asyncio.wait_for(post(http, url, body), 120)   # guards a hang only
        setattr(eng, broken, original)
        after = await post(http, url, greedy_generate(0))
        return before, failed, after, dict(st.sampler.stats)

    before, (status, body), after, stats = serve(fn)
    assert status == 500
    assert "TypeError" in body["error"]["message"]
    assert "with no request in it" in body["error"]["message"]
    assert stats["reruns"] == 0 and stats["faults"] == 1
    assert len(calls) == 2   # the failed step and the try without requests
    assert after[0] == before[0] == 200
    assert after[1]["output_ids"] == before[1]["output_ids"]
