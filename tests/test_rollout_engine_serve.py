"""The continuous-batching engine behind `orchestrax serve` and the trainer's embedded sampler:
the same answers over real HTTP with requests joining a running batch as each alone, joining a
running batch, freeing a slot on disconnect, weight swaps, one compile per bucket; plus the
serve/trainer options that came with it (`--param-dtype`, `TrainConfig.remat`)."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import aiohttp
import chex
import jax
import numpy as np
import pytest

from orchestrax import cli, models, registry
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.rollout import engine as engine_mod
from orchestrax.rollout.sampler import GenerateRequest, SamplingParams
from orchestrax.rollout.embedded import ContinuousSampler
from orchestrax.rollout.server import ServerState, bound_port, start
from orchestrax.train import serve as serve_mod
from orchestrax.train import setup
from orchestrax.train.train_config import RolloutConfig, TrainConfig

TOK = tiny_qwen3_tokenizer()
CFG = models.tiny_config(vocab_size=len(TOK), tie_embeddings=False)


def params(seed):
    p = models.init_params(CFG, seed=seed)
    # A sharp head: greedy choices are far from ties, so batch mates cannot change them.
    return {**p, "lm_head": p["lm_head"] * 20.0}


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, len(TOK), n).tolist()


def continuous(p, **kw) -> ContinuousSampler:
    # 16-token chunks: the 40-token prompts below prefill in three chunks while others decode.
    return ContinuousSampler(CFG, p, **({"max_batch": 3, "max_len": 96, "prefill_chunk": 16,
                                         "decode_steps": 4} | kw))


async def serving(sampler, fn, **state_kw):
    runner = await start(ServerState(sampler=sampler, model_path="tiny", tokenizer=TOK,
                                     **state_kw), port=0)
    try:
        async with aiohttp.ClientSession() as http:
            return await fn(http, f"http://127.0.0.1:{bound_port(runner)}", sampler)
    finally:
        await runner.cleanup()


async def post(http, url, body):
    async with http.post(f"{url}/generate", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def test_requests_joining_a_running_batch_get_the_answers_they_get_alone():
    p = params(0)
    # Prompt lengths 3..40 with budgets 2..12; 3 slots for 6 greedy requests, so later ones
    # join while earlier ones decode.
    greedy = [{"input_ids": prompt(n, i), "return_logprob": True,
               "sampling_params": {"temperature": 0, "max_new_tokens": new}}
              for i, (n, new) in enumerate([(3, 9), (40, 5), (17, 12), (8, 7), (25, 2),
                                            (11, 10)])]
    sampled_n = {"input_ids": prompt(6, 9), "return_logprob": True,
                 "sampling_params": {"temperature": 0.8, "max_new_tokens": 6, "n": 2,
                                     "sampling_seed": 4}}

    async def calls(http, url, sampler, together=True):
        if together:
            first = await asyncio.gather(*(post(http, url, b) for b in greedy),
                                         post(http, url, sampled_n))
        else:
            first = [await post(http, url, b) for b in (*greedy, sampled_n)]
        ref = first[0]["output_ids"]
        # A stop id (the fourth token of the first answer) and a stop string (its decoded
        # fifth token): both cut the answer, identically together and alone.
        stop_id = {**greedy[0], "sampling_params": {**greedy[0]["sampling_params"],
                                                    "stop_token_ids": [ref[3]]}}
        stop_text = TOK.decode([ref[4]])
        stop_str = {**greedy[0], "sampling_params": {**greedy[0]["sampling_params"],
                                                     "stop": stop_text}}
        return first, await post(http, url, stop_id), await post(http, url, stop_str), stop_text

    # The reference: each call alone, in an engine without a prefix cache.
    alone = asyncio.run(serving(continuous(p, prefix_cache=False),
                                lambda *a: calls(*a, together=False)))
    cont = asyncio.run(serving(continuous(p), calls))
    for s, c in zip([*alone[0][:-1], alone[1], alone[2]], [*cont[0][:-1], cont[1], cont[2]]):
        assert c["output_ids"] == s["output_ids"]
        assert c["meta_info"]["finish_reason"] == s["meta_info"]["finish_reason"]
        np.testing.assert_allclose([t[0] for t in c["meta_info"]["output_token_logprobs"]],
                                   [t[0] for t in s["meta_info"]["output_token_logprobs"]],
                                   atol=1e-5, rtol=0)
    for c, b in zip(cont[0], greedy):
        assert len(c["output_ids"]) == b["sampling_params"]["max_new_tokens"]
    # n = 2: two distinct draws, each equal to its draw alone (per-row seed keys).
    s_n, c_n = alone[0][-1], cont[0][-1]
    assert len(c_n) == 2 and c_n[0]["output_ids"] != c_n[1]["output_ids"]
    assert [x["output_ids"] for x in c_n] == [x["output_ids"] for x in s_n]
    ref = cont[0][0]["output_ids"]
    k = ref.index(ref[3])
    assert cont[1]["output_ids"] == ref[:k + 1]
    assert cont[1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": ref[3]}
    stop_text = cont[3]
    assert cont[2]["meta_info"]["finish_reason"]["type"] == "stop"
    assert stop_text not in cont[2]["text"] and len(cont[2]["output_ids"]) <= 5


def test_a_request_joins_the_running_batch_and_finishes_first():
    async def main():
        sampler = continuous(params(0), max_batch=2)
        long = asyncio.create_task(sampler.generate([GenerateRequest(
            input_ids=tuple(prompt(5, 1)),
            sampling=SamplingParams(temperature=0, max_new_tokens=60))]))
        while sampler.stats["tokens"] < 4:      # the long row is decoding
            await asyncio.sleep(0.001)
        short = (await sampler.generate([GenerateRequest(
            input_ids=tuple(prompt(9, 2)),
            sampling=SamplingParams(temperature=0, max_new_tokens=3))]))[0]
        running = not long.done()
        return short, running, (await long)[0], sampler
    short, running_when_short_ended, long, sampler = asyncio.run(main())
    assert running_when_short_ended and len(short.output_ids) == 3
    assert len(long.output_ids) == 60 and long.finish_reason == "length"
    # idle: the slot cache stays (its prefixes serve the next turn) until the weights go
    assert sampler.engine._state is not None
    head = weakref.ref(sampler.params["lm_head"])
    sampler.drop_params()
    assert sampler.engine._state is None
    # ...and the weights themselves: nothing keeps them for the trainer's step to run beside
    gc.collect()
    assert head() is None


def test_client_disconnect_frees_its_slot_for_the_next_request():
    # The engine may not step past the first event until the server saw the client leave: how
    # many tokens the row makes before the disconnect is noticed no longer depends on the load.
    left = threading.Event()

    def gated(step):
        def wrapped(hold=()):
            if step.__self__.stats["decode_dispatches"]:
                assert left.wait(120), "the server never noticed the client leave"
            return step(hold)
        return wrapped

    async def fn(http, url, sampler):
        sampler.engine.step = gated(sampler.engine.step)
        # One slot: the second request can only run once the first's slot is free.
        async with http.post(f"{url}/generate", json={
                "input_ids": prompt(5, 3), "stream": True,
                "sampling_params": {"temperature": 0, "max_new_tokens": 480}}) as r:
            await r.content.readline()          # the first event: the row is decoding
            (first,) = sampler._live.values()
            first.future.add_done_callback(lambda _: left.set())
            r.close()                           # the client goes away mid-decode
        nxt = await asyncio.wait_for(post(http, url, {
            "input_ids": prompt(7, 4), "sampling_params": {"temperature": 0,
                                                           "max_new_tokens": 4}}), 120)
        return nxt, dict(sampler.engine.stats), sampler.outstanding
    nxt, stats, outstanding = asyncio.run(serving(
        continuous(params(0), max_batch=1, max_len=512), fn))
    assert len(nxt["output_ids"]) == 4 and outstanding == 0
    # The first row stopped at the disconnect: its first event (1 + 4 tokens), at most the one
    # step that was running when the client left (4), then the second request's 4.
    assert stats["tokens"] <= 5 + 4 + 4, stats


def test_weight_updates_swap_params_and_version(tmp_path):
    req = {"input_ids": prompt(6, 5), "sampling_params": {"temperature": 0,
                                                           "max_new_tokens": 8}}

    async def fn(http, url, sampler):
        before = await post(http, url, req)
        models.save_hf(CFG, params(1), tmp_path / "v1", dtype="float32")
        async with http.post(f"{url}/update_weights_from_disk",
                             json={"model_path": str(tmp_path / "v1"),
                                   "weight_version": "v1"}) as r:
            assert (await r.json())["success"] is True
        after_disk = await post(http, url, req)
        # The trainer's in-process push (Sampler.publish) onto the same sampler.
        await sampler.publish(params(0), "v2")
        after_push = await post(http, url, req)
        info = await (await http.get(f"{url}/server_info")).json()
        return before, after_disk, after_push, info
    before, after_disk, after_push, info = asyncio.run(serving(
        continuous(params(0)), fn, weight_roots=(str(tmp_path),)))
    assert [x["meta_info"]["weight_version"] for x in (before, after_disk, after_push)] == \
        ["0", "v1", "v2"]
    assert after_disk["output_ids"] != before["output_ids"]
    assert after_push["output_ids"] == before["output_ids"]    # params(0) again
    assert info["engine"] == "continuous" and info["weight_version"] == "v2"


def test_one_compile_per_bucket_through_the_sampler(monkeypatch):
    cfg = CFG.replace(num_layers=1)   # a config no other test compiled for
    p = models.init_params(cfg, 2)
    spans, chunks, traces = set(), set(), {"decode": 0, "prefill": 0}

    def decode_impl(cfg, params, s, keep_R, run_R, *, n_steps, n_top, span, filtering):
        traces["decode"] += 1          # runs once per trace, not per call
        return engine_mod._decode_impl(cfg, params, s, keep_R, run_R, n_steps=n_steps,
                                       n_top=n_top, span=span, filtering=filtering)

    def prefill_impl(cfg, params, s, slot_P, ids_PC, *rest, n_top, span, filtering):
        traces["prefill"] += 1
        return engine_mod._prefill_impl(cfg, params, s, slot_P, ids_PC, *rest, n_top=n_top,
                                        span=span, filtering=filtering)

    # Upper bounds: S buckets 16..128 (four); (rows, chunk, span) buckets: chunks 8, 16, 32
    # read spans 16..128, each a row a dispatch or three (3 x 32 <= BATCHED_PREFILL_TOKENS):
    # at most 2 x 3 x 4; the exact counts (one trace per bucket used) are checked at the end.
    monkeypatch.setattr(engine_mod, "_decode", engine_mod._jit(
        chex.assert_max_traces(decode_impl, n=4), ("cfg", "n_steps", "n_top", "span",
                                                    "filtering")))
    jitted = engine_mod._jit(chex.assert_max_traces(prefill_impl, n=24),
                             ("cfg", "n_top", "span", "filtering"))

    def prefill(cfg, params, s, slot_P, ids_PC, *rest, n_top, span, filtering):
        chunks.add((ids_PC.shape, span))
        return jitted(cfg, params, s, slot_P, ids_PC, *rest, n_top=n_top, span=span,
                      filtering=filtering)
    monkeypatch.setattr(engine_mod, "_prefill", prefill)
    sampler = ContinuousSampler(cfg, p, max_batch=3, max_len=128, prefill_chunk=32,
                                min_chunk=8, decode_steps=2)
    real_span = sampler.engine.span
    monkeypatch.setattr(sampler.engine, "span",
                        lambda hold=(): spans.add(real_span(hold)) or real_span(hold))

    async def main():
        reqs = [GenerateRequest(input_ids=tuple(prompt(n, 20 + i)), sampling=SamplingParams(
            temperature=0.5 * (i % 3), max_new_tokens=new, sampling_seed=i))
            for i, (n, new) in enumerate([(3, 5), (70, 9), (12, 30), (31, 11), (5, 1),
                                          (50, 4), (20, 60)])]
        return await sampler.generate(reqs)
    results = asyncio.run(main())
    assert [len(r.output_ids) for r in results] == [5, 9, 30, 11, 1, 4, 60]
    assert {c for (_, c), _ in chunks} == {8, 16, 32} and 128 in spans and len(spans) >= 2
    assert traces == {"decode": len(spans), "prefill": len(chunks)}


def test_remat_option_is_validated_and_applied_and_the_sampler_is_the_engine(tmp_path):
    with pytest.raises(TypeError, match="'engine'"):   # one embedded batcher: no field picks it
        RolloutConfig(engine="static")
    with pytest.raises(ValueError, match="TrainConfig.remat='most'; allowed: none, full"):
        TrainConfig(name="t", hf_path=str(tmp_path), remat="most")
    with pytest.raises(ValueError, match="TrainConfig.remat='full' is for hf_path runs"):
        TrainConfig(name="t", model=CFG, remat="full")
    models.save_hf(CFG, params(0), tmp_path, dtype="float32")
    run = TrainConfig(name="t", hf_path=str(tmp_path), remat="full", steps=0,
                      rollout=RolloutConfig(context_tokens=96, sampler_max_batch=2))
    model_cfg, p = setup.load_params(run, None)
    assert model_cfg.remat == "full" and model_cfg.vocab_size == CFG.vocab_size
    sampler = registry.build_sampler(setup.sampler_config(run), model_cfg, p)
    assert isinstance(sampler, ContinuousSampler) and sampler.max_batch == 2


def serve_args(*argv: str) -> serve_mod.ServeConfig:
    return cli.command_config(cli.build_parser().parse_args(["serve", "--max-len", "64", *argv]))


def test_serve_param_dtype_casts_once_and_float32_keeps_greedy_outputs(tmp_path):
    assert serve_mod.param_dtype("auto", "cpu") == "float32"
    assert serve_mod.param_dtype("auto", "gpu") == "bfloat16"
    assert serve_mod.param_dtype("float32", "gpu") == "float32"
    models.save_hf(CFG, params(0), tmp_path, dtype="float32")    # fp32 master weights on disk
    TOK.save_pretrained(tmp_path)
    bf16 = serve_mod.build_state(serve_args("--model", str(tmp_path), "--param-dtype",
                                            "bfloat16"))
    assert isinstance(bf16.sampler, ContinuousSampler)
    # Served with its layers unstacked, as the embedded sampler's own copy (no weight slice
    # copied out of a stacked array per decode step); a weight update loads the same way.
    assert isinstance(bf16.sampler.params["layers"], tuple)
    assert isinstance(bf16.load_weights(str(tmp_path))[1]["layers"], tuple)
    leaves = jax.tree.leaves(bf16.sampler.params)
    assert {str(x.dtype) for x in leaves} == {"bfloat16"}
    ref = jax.tree.leaves(models.unstack_layers(params(0)))
    assert all(np.array_equal(np.asarray(a), np.asarray(b.astype("bfloat16")))
               for a, b in zip(leaves, ref))
    # On CPU "auto" is float32: the tiny server serves exactly init_params, and its greedy
    # answers are those of a sampler built over those params.
    tiny = serve_mod.build_state(serve_args("--tiny", "--seed", "3"))
    direct = models.init_params(models.tiny_config(vocab_size=len(TOK)), seed=3)
    assert all(a.dtype == np.float32 and np.array_equal(a, b) for a, b in
               zip(jax.tree.leaves(tiny.sampler.params),
                   jax.tree.leaves(models.unstack_layers(direct))))
    req = GenerateRequest(input_ids=tuple(prompt(7, 6)),
                          sampling=SamplingParams(temperature=0, max_new_tokens=6))

    async def both():
        cfg = tiny.sampler.cfg
        out = (await tiny.sampler.generate([req]))[0]
        ref = (await ContinuousSampler(cfg, direct, max_len=64).generate([req]))[0]
        half = (await bf16.sampler.generate([req]))[0]
        await tiny.sampler.aclose()
        return out, ref, half
    out, ref, half = asyncio.run(both())
    assert out.output_ids == ref.output_ids
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    assert len(half.output_ids) == 6 and np.all(np.isfinite(half.logprobs))
