"""The continuously batching engine (rollout/engine.py) against a full forward and against
itself alone, on the tiny random model; plus a smoke run of bench/gpu.py."""

from __future__ import annotations

import functools
import math
import os
import re
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from orchestrax import models, parallel
from orchestrax.rollout import engine as engine_mod
from orchestrax.rollout import sampling
from orchestrax.rollout.sampler import GenerateRequest, SamplingParams
from orchestrax.rollout.engine import ContinuousEngine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = models.tiny_config()


@pytest.fixture(scope="module")
def params():
    return models.init_params(CFG, 0)


def prompt(n: int, seed: int) -> tuple[int, ...]:
    return tuple(np.random.default_rng(seed).integers(0, CFG.vocab_size, n).tolist())


def req(n, seed, *, new=8, t=0.0, rid=None, stop=(), sampling_seed=None, top=0):
    return GenerateRequest(input_ids=prompt(n, seed), rid=rid, top_logprobs=top,
                           sampling=SamplingParams(temperature=t, max_new_tokens=new,
                                                   stop_token_ids=stop,
                                                   sampling_seed=sampling_seed))


def full_forward_logp(params, r: GenerateRequest, out_ids, temperature: float) -> np.ndarray:
    """log_softmax(logits / T) of each output token, from one forward over prompt + output."""
    ids = jnp.asarray([list(r.input_ids) + list(out_ids)], jnp.int32)
    logits = models.jit_forward(CFG, params, ids)[0, len(r.input_ids) - 1:-1]
    logp = jax.nn.log_softmax(logits / temperature, axis=-1)
    return np.asarray(jnp.take_along_axis(logp, jnp.asarray(out_ids)[:, None], axis=-1)[:, 0])


def greedy_reference(params, r: GenerateRequest, out_ids) -> None:
    """Independent reference: one forward over prompt + output; greedy means each output token
    is the argmax at the position before it."""
    ids = jnp.asarray([list(r.input_ids) + list(out_ids)], jnp.int32)
    logits = models.jit_forward(CFG, params, ids)[0, len(r.input_ids) - 1:-1]
    assert tuple(np.asarray(jnp.argmax(logits, axis=-1)).tolist()) == tuple(out_ids)


def test_greedy_equals_forward_argmax(params):
    # Prompt lengths 3..40 with a 16-token chunk: one- and three-chunk prefills; 2 slots for 4
    # requests, so two of them join a running batch.
    reqs = [req(3, 1, new=9), req(40, 2, new=5), req(17, 3, new=12), req(8, 4, new=7)]
    eng = ContinuousEngine(CFG, params, max_batch=2, max_len=96, prefill_chunk=16)
    got = eng.generate(reqs)
    for r, g in zip(reqs, got):
        assert len(g.output_ids) == r.sampling.max_new_tokens and g.finish_reason == "length"
        greedy_reference(params, r, g.output_ids)
        np.testing.assert_allclose(g.logprobs, full_forward_logp(params, r, g.output_ids, 1.0),
                                   atol=1e-5, rtol=0)


def test_logprobs_equal_full_forward_log_softmax(params):
    reqs = [req(5, 10, new=10, t=0.7, sampling_seed=1), req(21, 11, new=6, t=1.3,
                                                            sampling_seed=2),
            req(9, 12, new=8, t=0.0)]
    got = ContinuousEngine(CFG, params, max_batch=3, max_len=64, prefill_chunk=16).generate(reqs)
    for r, g in zip(reqs, got):
        t = r.sampling.temperature or 1.0   # greedy reports T = 1
        np.testing.assert_allclose(g.logprobs, full_forward_logp(params, r, g.output_ids, t),
                                   atol=1e-5, rtol=0)


def test_the_samplers_unstacked_copy_gives_the_same_tokens_logprobs_and_scores(params):
    # The embedded sampler's copy keeps its layers unstacked (sampler_copy): the engine reads
    # it as it reads stacked params, to the bit; the prompt scorer's forward runs its layers
    # one after another instead of under a scan (XLA fuses them differently: ~1e-6 apart).
    from orchestrax.rollout.embedded import sampler_copy
    copy = sampler_copy(CFG, params)
    assert isinstance(copy["layers"], tuple) and len(copy["layers"]) == CFG.num_layers
    reqs = [req(5, 40, new=8, t=0.9, sampling_seed=4), req(23, 41, new=8), req(9, 42, new=8)]
    want = ContinuousEngine(CFG, params, max_batch=2, max_len=64, prefill_chunk=16)
    got = ContinuousEngine(CFG, copy, max_batch=2, max_len=64, prefill_chunk=16)
    for a, b in zip(want.generate(reqs), got.generate(reqs)):
        assert a.output_ids == b.output_ids and a.logprobs == b.logprobs
    ids = jnp.asarray([prompt(12, 43)], jnp.int32)
    np.testing.assert_allclose(models.hidden_states(CFG, copy, ids),
                               models.hidden_states(CFG, params, ids), atol=1e-5, rtol=0)


def test_mixed_temperatures_and_seeds_reproducible_per_row(params):
    reqs = [req(6, 20, new=12, t=1.0, sampling_seed=7), req(13, 21, new=12, t=0.5,
                                                            sampling_seed=8),
            req(4, 22, new=12, t=0.0), req(30, 23, new=12, t=2.0, sampling_seed=9)]
    together = ContinuousEngine(CFG, params, max_batch=4, max_len=64,
                                prefill_chunk=16).generate(reqs)
    # Each alone, in an engine whose other slots run unrelated requests, reversed order.
    for r, g in zip(reversed(reqs), reversed(together)):
        eng = ContinuousEngine(CFG, params, max_batch=2, max_len=64, prefill_chunk=16)
        eng.submit(req(11, 99, new=3, t=1.0, sampling_seed=123))
        eng.step()
        rid = eng.submit(r)
        alone = {x.rid: x for x in eng.run()}[rid]
        assert alone.output_ids == g.output_ids
    # The sampled rows are not all greedy (the seeds matter).
    greedy = ContinuousEngine(CFG, params, max_batch=4, max_len=64).generate(
        [req(6, 20, new=12), req(30, 23, new=12)])
    assert greedy[0].output_ids != together[0].output_ids or \
        greedy[1].output_ids != together[3].output_ids


def test_requests_arriving_together_prefill_their_short_chunks_in_shared_dispatches(
        params, monkeypatch):
    calls = []
    batched = engine_mod._prefill

    def prefill(cfg, params, s, slot_P, ids_PC, *rest, **kw):
        calls.append((int(np.sum(slot_P < 8)), ids_PC.shape))
        return batched(cfg, params, s, slot_P, ids_PC, *rest, **kw)
    monkeypatch.setattr(engine_mod, "_prefill", prefill)
    # Chunks of 32 from min_chunk 16 (8 rows x 32 <= BATCHED_PREFILL_TOKENS, so both sizes
    # are batched): prompts of 5 and 9 tokens are one 16-token chunk, 20 and 30 one 32-token
    # chunk, 40 two and 70 three; greedy rows, seeded T = 1 ones, one top-k.
    reqs = [req(5, 40, new=6), req(20, 41, new=6, t=1.0, sampling_seed=1),
            req(40, 42, new=6), req(9, 43, new=6, t=1.0, sampling_seed=2),
            req(70, 44, new=6),
            GenerateRequest(input_ids=prompt(30, 45), sampling=SamplingParams(
                temperature=1.0, top_k=5, max_new_tokens=6, sampling_seed=3))]
    eng = ContinuousEngine(CFG, params, max_batch=8, max_len=128, prefill_chunk=32)
    together = eng.generate(reqs)
    # Step 1: the two 16-token chunks in one dispatch of 8 rows, the four first 32-token
    # chunks in another; step 2: the second chunks of the 40- and 70-token prompts; step 3:
    # the 70's last, alone in a one-row dispatch.
    assert calls == [(2, (8, 16)), (4, (8, 32)), (2, (8, 32)), (1, (1, 32))]
    assert eng.stats["prefill_chunks"] == 9 and eng.stats["prefill_dispatches"] == 4
    assert eng.stats["prefill_tokens"] == sum(len(r.input_ids) for r in reqs)
    for r, got in zip(reqs, together):
        alone = ContinuousEngine(CFG, params, max_batch=1, max_len=128,
                                 prefill_chunk=32).generate([r])[0]
        assert got.output_ids == alone.output_ids and len(got.output_ids) == 6
        np.testing.assert_allclose(got.logprobs, alone.logprobs, atol=1e-5, rtol=0)
        if r.sampling.temperature == 0:
            greedy_reference(params, r, got.output_ids)
        np.testing.assert_allclose(
            got.logprobs, full_forward_logp(params, r, got.output_ids,
                                            r.sampling.temperature or 1.0), atol=1e-5, rtol=0)


def test_a_prefill_row_out_of_range_writes_nothing(params):
    # forward_slots on cache rows (2, R): row 2 takes its tokens, every other row (and the
    # mask) is bit-identical, and row 2 gets what a pass of row 2 alone writes.
    cache = models.init_slots(CFG, 4, 32)
    rng = np.random.default_rng(0)
    cache = cache._replace(k=tuple(jnp.asarray(rng.normal(size=x.shape), x.dtype)
                                   for x in cache.k),
                           mask_RS=jnp.asarray((rng.random(cache.mask_RS.shape) < 0.5)
                                               & (np.arange(32) < 16)))
    ids = jnp.asarray(rng.integers(0, CFG.vocab_size, (2, 8)), jnp.int32)
    valid = jnp.ones((2, 8), jnp.bool_)
    index = jnp.asarray([16, 16], jnp.int32)
    logits, got = models.forward_slots(CFG, params, ids, valid, cache, index, span=32,
                                       rows_B=jnp.asarray([2, 4], jnp.int32))
    logits1, one = models.forward_slots(CFG, params, ids[:1], valid[:1], cache, index[:1],
                                        span=32, rows_B=jnp.asarray([2], jnp.int32))
    np.testing.assert_array_equal(logits[0], logits1[0])
    for new, old, alone in zip(got.k + got.v + (got.mask_RS,), cache.k + cache.v
                               + (cache.mask_RS,), one.k + one.v + (one.mask_RS,)):
        np.testing.assert_array_equal(np.asarray(new)[[0, 1, 3]], np.asarray(old)[[0, 1, 3]])
        np.testing.assert_array_equal(new, alone)
        assert not np.array_equal(np.asarray(new)[2], np.asarray(old)[2])


def test_request_arriving_mid_decode_finishes_before_the_longest_row(params):
    eng = ContinuousEngine(CFG, params, max_batch=2, max_len=96, prefill_chunk=16)
    long_rid = eng.submit(req(10, 30, new=40, rid="long"))
    done = []
    for _ in range(5):
        done += eng.step()
    assert not done and len(eng._slots[0].ids) == 6   # prefill token + 5 decode steps
    eng.submit(req(25, 31, new=3, rid="late"))
    order = []
    while eng.busy:
        order += [(r.rid, len(eng._slots[0].ids) if eng._slots[0] else None)
                  for r in eng.step()]
    assert [rid for rid, _ in order] == ["late", long_rid]
    # When "late" finished, "long" was still running with well under its 40 tokens.
    assert order[0][1] is not None and order[0][1] < 15


def test_abort_frees_the_slot_for_a_queued_request(params):
    eng = ContinuousEngine(CFG, params, max_batch=1, max_len=64, prefill_chunk=16)
    eng.submit(req(7, 40, new=50, rid="a"))
    eng.submit(req(5, 41, new=4, rid="b"))
    results = []
    for _ in range(3):
        results += eng.step()
    assert eng.slot_of("a") == 0 and eng.slot_of("b") is None
    assert eng.abort("a") == 1 and eng.slot_of("a") is None
    results += eng.step()
    assert eng.slot_of("b") == 0
    results += eng.run()
    by = {r.rid: r for r in results}
    assert len(by["b"].output_ids) == 4 and by["b"].finish_reason == "length"
    # b in a reused slot decodes exactly as b alone in a fresh engine
    alone = ContinuousEngine(CFG, params, max_batch=1, max_len=64, prefill_chunk=16)
    assert alone.generate([req(5, 41, new=4)])[0].output_ids == by["b"].output_ids
    assert eng.abort("nope") == 0


def test_abort_result_and_queued_abort_reach_the_stream_hook(params):
    seen: dict[str, list] = {"a": [], "q": []}
    finals = {}

    def hook(rid, ids, lps, top, result):
        seen[rid] += ids
        if result is not None:
            finals[rid] = result

    eng = ContinuousEngine(CFG, params, max_batch=1, max_len=64, prefill_chunk=16)
    # 7 + 40 leaves room to pad the prompt to one 16-token chunk: one step prefills it.
    eng.submit(req(7, 50, new=40, rid="a"), on_tokens=hook)
    eng.submit(req(7, 51, new=40, rid="q"), on_tokens=hook)
    eng.step(), eng.step()
    eng.abort("q"), eng.abort("a")
    assert finals["a"].finish_reason == "abort" and len(finals["a"].output_ids) == 3
    assert tuple(seen["a"]) == finals["a"].output_ids
    assert finals["q"].finish_reason == "abort" and finals["q"].output_ids == ()
    assert not eng.busy


def test_stop_ids_streaming_and_top_logprobs(params):
    first = ContinuousEngine(CFG, params, max_batch=2, max_len=64).generate(
        [req(9, 60, new=10, t=1.0, sampling_seed=5)])[0]
    stop_at = first.output_ids[3]
    k = first.output_ids.index(stop_at)              # first occurrence
    streamed, streamed_top = [], []
    eng = ContinuousEngine(CFG, params, max_batch=2, max_len=64, decode_steps=3,
                           top_logprobs=4)

    def hook(rid, ids, lps, top, res):
        streamed.extend(ids)
        streamed_top.extend(top)
    rid = eng.submit(req(9, 60, new=10, t=1.0, sampling_seed=5, stop=(stop_at,), top=2),
                     on_tokens=hook)
    res = {r.rid: r for r in eng.run()}[rid]
    assert res.output_ids == first.output_ids[:k + 1] and res.finish_reason == "stop"
    assert tuple(streamed) == res.output_ids and tuple(streamed_top) == res.top_logprobs
    assert len(res.top_logprobs) == len(res.output_ids)
    for (tok, lp), top in zip(zip(res.output_ids, res.logprobs), res.top_logprobs):
        assert len(top) == 2 and top[0][1] >= top[1][1]
        assert lp <= top[0][1] + 1e-6


def test_bad_requests_are_refused_naming_the_field(params):
    eng = ContinuousEngine(CFG, params, max_batch=1, max_len=32, prefill_chunk=16)
    with pytest.raises(ValueError, match="input_ids has 40 tokens"):
        eng.submit(GenerateRequest(input_ids=prompt(40, 0)))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.submit(GenerateRequest(input_ids=(1, CFG.vocab_size)))
    with pytest.raises(ValueError, match="top_logprobs=3"):
        eng.submit(GenerateRequest(input_ids=(1, 2), top_logprobs=3))
    with pytest.raises(ValueError, match="ContinuousEngine.max_batch=0"):
        ContinuousEngine(CFG, params, max_batch=0)


def test_a_prompt_near_the_context_limit_is_prefilled_in_buckets_filled_out_from_behind(params):
    eng = ContinuousEngine(CFG, params, max_batch=2, max_len=64, prefill_chunk=32, min_chunk=8)
    assert eng._chunking(20) == (32, ((32, 0),))           # one bucket, left-padded
    # 45 in whole 32-token chunks would pad to 64 = max_len: unpadded, 32 then the last 13 as a
    # 16-token bucket that re-feeds the 3 positions before them.
    assert eng._chunking(45) == (45, ((32, 0), (16, 3)))
    assert eng._chunking(61) == (61, ((32, 0), (32, 3)))
    assert eng._chunking(63) == (63, ((32, 0), (32, 1)))
    # The output budget is min(new, max_len - n): 45 + 19 = 64 leaves no padding.
    assert eng._chunking(45, 64 - 19 + 1) == (45, ((32, 0), (16, 3)))
    # Too few positions behind the rest: its largest bucket first, the rest fills out of it.
    assert eng._chunking(20, 21) == (20, ((16, 0), (8, 4)))
    # After a reused prefix, the positions behind are the prefix's.
    assert eng._chunking(3, 4, before=16) == (3, ((8, 5),))
    # Shorter than min_chunk on an empty slot with no room: one token a chunk.
    assert eng._chunking(5, 6) == (5, ((1, 0),) * 5)
    for n, new in ((45, 10), (45, 19), (61, 3), (63, 1), (20, 44), (5, 59)):
        r = req(n, 90 + n, new=new)
        got = eng.generate([r, req(5, 91, new=12)])[0]
        assert len(got.output_ids) == new
        greedy_reference(params, r, got.output_ids)
        np.testing.assert_allclose(got.logprobs, full_forward_logp(params, r, got.output_ids, 1.0),
                                   atol=1e-5, rtol=0)


def test_a_next_turn_fills_out_its_chunk_from_the_prefix_holes_and_all(params, monkeypatch):
    eng = ContinuousEngine(CFG, params, max_batch=1, max_len=64, prefill_chunk=32, min_chunk=8)
    held = []
    monkeypatch.setattr(eng, "_held", lambda *a: held.append(ContinuousEngine._held(eng, *a))
                        or held[-1])
    greedy = functools.partial(SamplingParams, temperature=0.0)
    # Turn 1 on an empty slot: 9 tokens padded to 16 (holes at 0..6, tokens at 7..15), one
    # reply token (sampled by the prefill, never fed).
    ids = prompt(9, 40)
    got = eng.generate([GenerateRequest(input_ids=ids, sampling=greedy(max_new_tokens=1))])[0]
    assert eng._content[0].pos == list(range(7, 16))
    # Turn 2: the reply and 16 new tokens after the 9 cached ones, 17 new in all, go at 16..32
    # with no hole: one 32-token chunk that re-feeds positions 1..15, the first six of them
    # holes (the padding would have left holes at 16..30 and put the next turn at 48).
    ids = ids + got.output_ids + prompt(16, 41)
    r = GenerateRequest(input_ids=ids, sampling=greedy(max_new_tokens=8))
    got = eng.generate([r])[0]
    assert got.cached_tokens == 9 and len(got.output_ids) == 8
    assert len(held) == 1 and held[0][1].tolist() == [False] * 6 + [True] * 9
    assert eng._content[0].pos == list(range(7, 16 + 17 + 7))
    greedy_reference(params, r, got.output_ids)
    np.testing.assert_allclose(got.logprobs, full_forward_logp(params, r, got.output_ids, 1.0),
                               atol=1e-5, rtol=0)


def test_an_episode_keeps_its_prefix_to_the_end_of_the_slot(params):
    # 10 turns of 2 new tokens each (the reply's last, one tool token) after a 16-token
    # prompt, in one 64-position slot: each turn takes 3 positions. Padded to a bucket of 8,
    # a turn took 9, and from the sixth on no turn fit after the prefix: each was prefilled
    # whole from position 0 again.
    eng = ContinuousEngine(CFG, params, max_batch=1, max_len=64, prefill_chunk=16, min_chunk=8)
    greedy = functools.partial(SamplingParams, temperature=0.0)
    ids, cached = prompt(16, 50), []
    for turn in range(10):
        r = GenerateRequest(input_ids=ids, sampling=greedy(max_new_tokens=2))
        got = eng.generate([r])[0]
        cached.append(got.cached_tokens)
        ids = ids + got.output_ids + prompt(1, 60 + turn)
    assert cached == [0] + [16 + 3 * t - 2 for t in range(1, 10)]
    assert eng.stats["prefill_tokens"] == 16 + 9 * 2
    greedy_reference(params, r, got.output_ids)
    np.testing.assert_allclose(got.logprobs, full_forward_logp(params, r, got.output_ids, 1.0),
                               atol=1e-5, rtol=0)


def test_one_decode_compile_per_s_bucket_and_one_prefill_compile_per_chunk_bucket(monkeypatch):
    cfg = CFG.replace(num_layers=1)   # a config no other test compiled for
    p = models.init_params(cfg, 1)
    # S buckets 32, 64 and 128 (max_len): at most three decode traces.
    spans = []
    monkeypatch.setattr(engine_mod, "_decode", engine_mod._jit(
        chex.assert_max_traces(engine_mod._decode_impl, n=3), ("cfg", "n_steps", "n_top",
                                                                "span", "filtering")))
    # Prompts of 3..70 tokens in 32-token chunks: (chunk, span) buckets (16, 32) for the short
    # ones, (32, 32), (32, 64), (32, 128) for the chunks of the long ones, each a row a
    # dispatch or three (both chunk sizes are batched, 3 x 32 <= BATCHED_PREFILL_TOKENS): at
    # most eight prefill traces.
    monkeypatch.setattr(engine_mod, "_prefill", engine_mod._jit(
        chex.assert_max_traces(engine_mod._prefill_impl, n=8), ("cfg", "n_top", "span",
                                                                 "filtering")))
    eng = ContinuousEngine(cfg, p, max_batch=3, max_len=128, prefill_chunk=32)
    results = []
    for i, (n, new) in enumerate([(3, 5), (70, 9), (16, 2), (31, 11), (12, 1), (50, 4)]):
        eng.submit(req(n, 70 + i, new=new, t=0.5 * (i % 3), sampling_seed=i))
        spans.append(eng.span())
        results += eng.step()
    while eng.busy:
        spans.append(eng.span())
        results += eng.step()
    assert {32, 128} <= set(spans)
    assert sorted(len(r.output_ids) for r in results) == [1, 2, 4, 5, 9, 11]


@pytest.mark.slow
def test_bench_gpu_smoke(tmp_path):
    out = tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "gpu.py"), "--smoke", "--results",
         str(out), "--cache-dir", str(tmp_path / "xla")], capture_output=True, text=True,
        timeout=600,
        env={**os.environ, "XLA_FLAGS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = out.read_text()
    for field in ("train_step", "sampler@", "pool start", "memory"):
        assert field in line, line
    assert "FAILED" not in line and "TIMEOUT" not in line, line


# --- prefix cache -------------------------------------------------------------------------------
def _episode_group(params, *, prefix_cache: bool, turns: int = 2, g: int = 3,
                   max_batch: int = 4, cfg: models.ModelConfig = CFG):
    """G samples of one 20-token prompt, each played `turns` turns: the next turn's prompt is
    the previous prompt + its reply + a 5-token 'tool output'. Returns (results per turn,
    the engine)."""
    eng = ContinuousEngine(cfg, params, max_batch=max_batch, max_len=160, prefill_chunk=16,
                           min_chunk=8, prefix_cache=prefix_cache)
    prompts = [prompt(20, 5)] * g
    out = []
    for turn in range(turns):
        reqs = [GenerateRequest(input_ids=p, sampling=SamplingParams(
            temperature=0.0 if i == 0 else 1.0, max_new_tokens=5, sampling_seed=10 * turn + i))
            for i, p in enumerate(prompts)]
        res = eng.generate(reqs)
        out.append(res)
        prompts = [p + r.output_ids + prompt(5, 100 + 10 * turn + i)
                   for i, (p, r) in enumerate(zip(prompts, res))]
    return out, eng


def test_prefix_cache_same_tokens_and_logprobs_and_exact_counters(params):
    cached, on = _episode_group(params, prefix_cache=True)
    plain, off = _episode_group(params, prefix_cache=False)
    on, off = on.stats, off.stats
    for turn_c, turn_p in zip(cached, plain):
        for c, p in zip(turn_c, turn_p):
            assert c.output_ids == p.output_ids     # greedy row 0, seeded T = 1 rows 1, 2
            np.testing.assert_allclose(c.logprobs, p.logprobs, atol=1e-5, rtol=0)
    # By hand. Turn 1: the first sample prefills the 20-token prompt; the other two wait for
    # it, then copy its first 19 tokens (a prompt's last token is always computed) and
    # prefill 1 each. Turn 2 (20 + 5 + 5 = 30 tokens): each sample's own slot holds its
    # prompt + the first 4 reply tokens (the 5th was sampled, never fed): 24 cached, 6
    # computed each.
    assert [r.cached_tokens for r in cached[0]] == [0, 19, 19]
    assert [r.cached_tokens for r in cached[1]] == [24, 24, 24]
    assert on["prefill_tokens"] == 20 + 1 + 1 + 3 * 6 and on["cached_tokens"] == 38 + 72
    assert on["prefix_copies"] == 2
    assert off["prefill_tokens"] == 3 * 20 + 3 * 30 and off["cached_tokens"] == 0
    assert all(r.cached_tokens == 0 for turn in plain for r in turn)


def test_prefix_cache_under_eviction_stays_exact(params):
    # Two slots for three samples over three turns: kept prefixes are evicted and recomputed.
    cached, on = _episode_group(params, prefix_cache=True, turns=3, max_batch=2)
    plain, _ = _episode_group(params, prefix_cache=False, turns=3, max_batch=2)
    on = on.stats
    for turn_c, turn_p in zip(cached, plain):
        for c, p in zip(turn_c, turn_p):
            assert c.output_ids == p.output_ids
            np.testing.assert_allclose(c.logprobs, p.logprobs, atol=1e-5, rtol=0)
    # Slot 0 went to the third sample in turn 1, so the first one finds only the shared prompt.
    assert 0 < on["cached_tokens"] and any(r.cached_tokens < 24 for r in cached[1])


def test_new_weights_make_kept_prefixes_stale(params):
    eng = ContinuousEngine(CFG, params, max_batch=2, max_len=96, prefill_chunk=16, min_chunk=8)
    first = eng.generate([req(20, 7, new=4)])[0]
    again = GenerateRequest(input_ids=prompt(20, 7) + first.output_ids,
                            sampling=SamplingParams(temperature=0.0, max_new_tokens=4))
    assert eng.generate([again])[0].cached_tokens == 23
    other = models.init_params(CFG, 1)
    eng.params = other
    res = eng.generate([again])[0]
    assert res.cached_tokens == 0
    fresh = ContinuousEngine(CFG, other, max_batch=2, max_len=96, prefill_chunk=16,
                             min_chunk=8).generate([again])[0]
    assert res.output_ids == fresh.output_ids


# --- several devices ----------------------------------------------------------------------------
def _collective_bytes(hlo: str) -> list[int]:
    """Result bytes of each collective in an optimized HLO text."""
    out = []
    for m in re.finditer(r"= (\w+)\[([\d,]*)\][^=]*? (?:all-gather|all-reduce|reduce-scatter|"
                         r"all-to-all|collective-permute)(?:-start)?\(", hlo):
        size = {"pred": 1, "bf16": 2}.get(m.group(1), 4)
        out.append(size * math.prod(int(d) for d in m.group(2).split(",") if d))
    return out


def test_slot_cache_splits_its_kv_heads_over_the_params_mesh_with_the_same_samples():
    # Eight kv heads over the eight fake devices of an fsdp mesh (the params split their embed
    # axis there): each device holds one head of every slot.
    cfg = CFG.replace(num_heads=8, num_kv_heads=8)
    mesh = parallel.make_mesh(parallel.MeshConfig())
    assert mesh.shape["fsdp"] == 8
    one = models.init_params(cfg, 0)
    plain, _ = _episode_group(one, prefix_cache=True, cfg=cfg)
    split = models.shard_params(cfg, one, mesh)
    placed, eng = _episode_group(split, prefix_cache=True, cfg=cfg)
    assert eng.stats["prefix_copies"] > 0 and eng.stats["cached_tokens"] > 0
    for turn_p, turn_s in zip(plain, placed):
        for p, s in zip(turn_p, turn_s):
            assert p.output_ids == s.output_ids     # greedy row 0, seeded T = 1 rows 1, 2
            np.testing.assert_allclose(p.logprobs, s.logprobs, atol=1e-5, rtol=0)
    state = eng._state                      # after prefills, prefix copies and decodes
    for x in state.k + state.v:             # a [R, K, S, H] buffer per layer
        assert x.sharding.spec == P(None, "fsdp")
        assert x.addressable_shards[0].data.shape == (4, 1, 160, 32)
    assert state.mask_RS.sharding.spec == P()
    # No collective in either step moves cache: each is at most a few rows of activations,
    # far below one layer's k of one slot (8 heads x 160 positions x 32).
    layer_slot = 8 * 160 * 32 * 4
    keep = np.ones((4,), np.bool_)
    decode = engine_mod._decode.lower(cfg, split, state, keep, keep, n_steps=2, n_top=0,
                                      span=64, filtering=True).compile()
    prefill = _lower_prefill(cfg, split, state, rows=1, chunk=16, span=64, filtering=True)
    prefill3 = _lower_prefill(cfg, split, state, rows=3, chunk=16, span=64, filtering=True)
    # A prefill of 3 rows moves 3 rows' activations ([3, 16, 8 heads, 32] at most).
    for compiled, rows in ((decode, 1), (prefill.compile(), 1), (prefill3.compile(), 3)):
        sizes = _collective_bytes(compiled.as_text())
        assert sizes and max(sizes) < rows * layer_slot / 8, sizes


def _lower_prefill(cfg, params, state, *, rows, chunk, span, filtering):
    """`_prefill` of `rows` rows (slots 0, 1, ...) of `chunk` tokens, lowered."""
    settings = jax.tree.map(lambda x: None if x is None else np.zeros((rows,) + x.shape[1:],
                                                                      x.dtype),
                            state._replace(k=None, v=None))
    at, on = np.zeros((rows,), np.int32), np.ones((rows,), np.bool_)
    return engine_mod._prefill.lower(
        cfg, params, state, np.arange(rows, dtype=np.int32), np.zeros((rows, chunk), np.int32),
        np.ones((rows, chunk), np.bool_), at, at, on, on, settings, n_top=0, span=span,
        filtering=filtering)


def test_kv_heads_the_mesh_does_not_divide_are_said_in_one_line(caplog):
    from orchestrax.rollout.embedded import ContinuousSampler
    # Two kv heads over an 8-device fsdp axis: the cache stays whole on every device.
    cfg = CFG.replace(num_heads=4, num_kv_heads=2)
    mesh = parallel.make_mesh(parallel.MeshConfig())
    kv = 2 * cfg.num_layers * 4 * 2 * 160 * cfg.head_dim * 4      # K and V of 4 x 160, fp32
    line = engine_mod.cache_split_shortfall(cfg, 4, 160, mesh)
    assert line == (f"slot cache: 2 kv heads do not divide over mesh axes {{'fsdp': 8}}, so its "
                    f"K and V stay whole on every device: {kv / 2**20:.1f} MiB a device instead "
                    f"of {kv / 8 / 2**20:.1f} MiB (max_batch=4 x max_len=160); tensor=2 x "
                    f"fsdp=4 would split them 2 ways")
    whole = engine_mod.state_bytes_per_device(cfg, 4, 160)
    assert engine_mod.state_bytes_per_device(cfg, 4, 160, mesh) == whole
    # Over tensor 2 x fsdp 4 they split over tensor alone.
    two = parallel.make_mesh(parallel.MeshConfig(axes=(("data", 1), ("fsdp", -1), ("tensor", 2))))
    assert "split 2 ways, not 8: " in engine_mod.cache_split_shortfall(cfg, 4, 160, two)
    assert engine_mod.state_bytes_per_device(cfg, 4, 160, two) == whole - kv // 2
    eight = cfg.replace(num_heads=8, num_kv_heads=8)
    assert engine_mod.cache_split_shortfall(eight, 4, 160, mesh) is None
    assert engine_mod.cache_split_shortfall(cfg, 4, 160, None) is None
    # The embedded sampler says it where it is built, on its params' mesh.
    with caplog.at_level("WARNING", logger="orchestrax.rollout.embedded"):
        ContinuousSampler(cfg, models.shard_params(cfg, models.init_params(cfg, 0), mesh),
                          max_batch=4, max_len=160)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [line]


# --- sampling without a host read -----------------------------------------------------------------
def _before(logits_BV, *, temperature_B, top_k_B, top_p_B, seeds_B, step):
    """The draw as it was made before `filtering`: every row filtered when any asks (a
    lax.cond on the device, its predicate read by the host each step), else none."""
    v = logits_BV.shape[-1]
    t_B = jnp.where(temperature_B <= 0, 1.0, temperature_B)
    scaled = logits_BV / t_B[:, None]
    asks = jnp.any(sampling.filters(top_k_B, top_p_B, v))
    filtered = jax.lax.cond(asks, sampling.filter_top_k_top_p, lambda x, *_: x, scaled, top_k_B,
                            top_p_B)
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, (v,), jnp.float32))(
        sampling.row_keys(seeds_B, step))
    token = jnp.where(temperature_B <= 0, jnp.argmax(logits_BV, -1),
                      jnp.argmax(filtered + gumbel, -1))
    return token, jnp.take_along_axis(jax.nn.log_softmax(scaled, -1), token[:, None], -1)[:, 0]


@pytest.mark.parametrize("kind", ["greedy", "temperature", "top_k", "top_p", "mixed"])
def test_sampling_draws_as_before_with_the_filter_chosen_on_the_host(kind):
    rows, v = 6, 256
    t = {"greedy": [0.0] * rows, "mixed": [0.0, 1.0, 0.7, 1.3, 1.0, 0.5]}.get(kind, [0.9] * rows)
    k = {"top_k": [5, 20, 1, 50, 255, 8], "mixed": [-1, -1, 40, -1, 10, -1]}.get(kind, [-1] * rows)
    p = {"top_p": [0.9, 0.5, 0.99, 0.1, 0.8, 0.95],
         "mixed": [1.0, 1.0, 1.0, 0.9, 0.7, 1.0]}.get(kind, [1.0] * rows)
    settings = dict(temperature_B=jnp.asarray(t, jnp.float32), top_k_B=jnp.asarray(k, jnp.int32),
                    top_p_B=jnp.asarray(p, jnp.float32),
                    seeds_B=jnp.arange(rows, dtype=jnp.uint32) + 11)
    # In the mixed batch rows 1 and 5 ask for neither: they now skip the filter that let
    # their whole vocabulary through before, and draw the same.
    filtering = bool(sampling.filters(np.asarray(k), np.asarray(p), v).any())
    assert filtering == (kind in ("top_k", "top_p", "mixed"))
    for step in range(20):
        logits = jax.random.normal(jax.random.key(step), (rows, v)) * 3.0
        want = _before(logits, step=jnp.full((rows,), step), **settings)
        token, logprob, _, _ = jax.jit(functools.partial(
            sampling.sample_step, n_top=0, filtering=filtering))(
                logits, step=jnp.full((rows,), step), **settings)
        np.testing.assert_array_equal(token, want[0])
        np.testing.assert_allclose(logprob, want[1], atol=1e-6, rtol=0)


def test_a_decode_step_asks_the_host_nothing(params):
    # lax.cond lowers to an HLO conditional, whose predicate XLA:GPU reads on the host every
    # step; the compiled decode and prefill hold none, with the sort or without it.
    eng = ContinuousEngine(CFG, params, max_batch=2, max_len=64, prefill_chunk=16)
    eng.generate([req(5, 1, new=2)])
    keep = np.ones((2,), np.bool_)
    for filtering in (False, True):
        decode = engine_mod._decode.lower(CFG, params, eng._state, keep, keep, n_steps=2,
                                          n_top=0, span=32, filtering=filtering)
        prefills = [_lower_prefill(CFG, params, eng._state, rows=p, chunk=16, span=32,
                                   filtering=filtering) for p in (1, 2)]
        for lowered in (decode, *prefills):
            text = lowered.compile().as_text()
            assert not re.search(r"\bconditional\(", text)
            assert bool(re.search(r"\bsort\(", text)) == filtering
    # The engine picks the sort only for dispatches whose rows ask for it, and samples the
    # same tokens either way for a row that does not ask.
    plain = req(7, 2, new=6, t=0.8, sampling_seed=3)
    nucleus = GenerateRequest(input_ids=prompt(9, 3), sampling=SamplingParams(
        temperature=0.8, top_p=0.9, max_new_tokens=6, sampling_seed=4))
    alone = ContinuousEngine(CFG, params, max_batch=2, max_len=64).generate([plain])[0]
    together = ContinuousEngine(CFG, params, max_batch=2, max_len=64).generate([plain,
                                                                                 nucleus])[0]
    assert alone.output_ids == together.output_ids
    np.testing.assert_allclose(alone.logprobs, together.logprobs, atol=1e-6)


def test_a_slot_cache_the_device_cannot_hold_is_refused_naming_its_sizes():
    # Qwen3-8B in bf16 at the recipe's context: a slot's K and V are
    # 2 x 36 layers x 8 kv heads x 24,576 positions x 128 dims x 2 bytes = 3,623,878,656 bytes.
    cfg = models.preset("qwen3-8b", dtype="bfloat16")
    per_slot_kv = 2 * 36 * 8 * 24_576 * 128 * 2
    # ...plus its mask (S bools), penalty counts (V int32), stop ids (int32), ten 4-byte
    # scalars and one bool.
    per_slot = per_slot_kv + 24_576 + 151_936 * 4 + 4 * (engine_mod.MAX_STOP_IDS + 10) + 1
    assert engine_mod.state_bytes_per_device(cfg, 64, 24_576) == 64 * per_slot
    # Eight devices over the kv heads: each holds one head of the cache, the rest whole.
    mesh = parallel.make_mesh(parallel.MeshConfig())
    split = engine_mod.state_bytes_per_device(cfg, 64, 24_576, mesh)
    assert split == 64 * (per_slot_kv // 8 + per_slot - per_slot_kv)

    weights = jax.eval_shape(functools.partial(models.compute_copy, cfg), jax.eval_shape(
        functools.partial(models.init_params, cfg, 0)))
    w_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(weights))
    h200 = 141 * 10**9
    with pytest.raises(ValueError) as e:   # the default 64 slots at 24k on one H200
        engine_mod.check_state_fits(cfg, 64, 24_576, None, weights, h200)
    message = str(e.value)
    assert "max_batch=64" in message and "max_len=24576" in message
    assert "rollout.sampler_max_batch" in message and "--max-batch" in message
    fits = (h200 - w_bytes) // per_slot
    assert f"at most {fits} slots" in message and 30 < fits < 36
    # What fits passes; no known limit (the CPU reports none) checks nothing.
    engine_mod.check_state_fits(cfg, fits, 24_576, None, weights, h200)
    engine_mod.check_state_fits(cfg, 64, 24_576, None, weights, None)
    assert jax.devices()[0].memory_stats() is None or jax.default_backend() != "cpu"


def test_the_embedded_sampler_asks_the_check_with_its_params(params, monkeypatch):
    # The CPU reports no memory limit; as if the device held this engine's weights and 3 slots.
    from orchestrax.rollout import embedded
    per_slot = engine_mod.state_bytes_per_device(CFG, 1, 64)
    weights = sum(x.nbytes for x in jax.tree.leaves(params))
    monkeypatch.setattr(embedded, "device_memory_limit", lambda mesh: weights + 3 * per_slot)
    embedded.make_embedded_sampler(CFG, params, max_batch=3, max_len=64)
    with pytest.raises(ValueError, match=r"max_batch=4 slots x max_len=64 .* at most 3 slots"):
        embedded.make_embedded_sampler(CFG, params, max_batch=4, max_len=64)
