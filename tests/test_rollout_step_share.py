"""Clients take turns at the engine's steps by the work each got (`fair.StepShare`): a small
request beside a giant call's long rows runs in steps at its own cache span, the long rows wait
(untouched) for those steps and give the same tokens as when they run alone."""

import asyncio

import numpy as np
import pytest

from orchestrax import models
from orchestrax.rollout.sampler import MAX_TOP_LOGPROBS
from orchestrax.rollout.embedded import ContinuousSampler
from orchestrax.rollout import engine as engine_module
from orchestrax.rollout.engine import ContinuousEngine
from orchestrax.rollout.fair import StepShare
from orchestrax.rollout.sampler import GenerateRequest, SamplingParams

CFG = models.tiny_config()
# One engine shape for every test here (ContinuousSampler's top_logprobs), so the jitted steps
# compile once: prefill chunks of 64 and 16, decode spans 128 and 32.
SHAPE = dict(max_batch=4, max_len=128, prefill_chunk=64, decode_steps=4,
             top_logprobs=MAX_TOP_LOGPROBS)


@pytest.fixture(scope="module")
def params():
    return models.init_params(CFG, 0)


def req(prompt_len, new, seed, t=0.0):
    ids = tuple(np.random.default_rng(seed).integers(0, CFG.vocab_size, prompt_len).tolist())
    return GenerateRequest(input_ids=ids, sampling=SamplingParams(
        temperature=t, max_new_tokens=new, stop_token_ids=(), sampling_seed=seed))


def steps8(span):   # a StepShare charge of 8 decode steps at every span
    return 8


def test_the_step_share_by_hand():
    """Spans 4096 and 32, 8 decode steps a step: a step of the giant costs 32768, one of the
    small client 256. Both start at 0: the tie goes to the smaller span (small alone, 256);
    then the giant, with the small riding (it fits in the span): giant 32768, small 512; then
    the small alone until its virtual time passes 32768: (32768 - 512) / 256 + 1 = 127 steps."""
    share = StepShare()
    spans = {"giant": 4096, "small": 32}
    got = [share.choose(spans, steps8) for _ in range(130)]
    both = {"giant", "small"}
    assert got == [{"small"}, both] + [{"small"}] * 127 + [both]
    # Equal spans: every step runs both.
    assert [share.choose({"a": 64, "b": 64}, steps8) for _ in range(3)] == [{"a", "b"}] * 3
    # A client that comes back starts at the others' smallest virtual time, not at its old one.
    share = StepShare()
    share.choose({"giant": 4096}, steps8)                        # giant: 32768
    assert share.choose({"giant": 4096, "new": 16}, steps8) == {"new"}     # tie at 32768 -> smaller
    assert share.choose({"giant": 4096, "new": 16}, steps8) == {"giant", "new"}   # 32896 > 32768
    assert share.choose({"giant": 4096}, steps8) == {"giant"}    # alone: always runs


def test_a_held_row_is_untouched_and_the_step_runs_at_the_others_span(params):
    """A held row neither decodes nor moves; the step's span is the running rows' alone; held
    for a while, each request still gets the tokens it gets unheld."""
    long_r, short_r = req(50, 40, seed=1), req(3, 12, seed=2, t=0.8)
    alone = ContinuousEngine(CFG, params, **SHAPE).generate([long_r, short_r])

    eng = ContinuousEngine(CFG, params, **SHAPE)
    a, b = eng.submit(long_r), eng.submit(short_r)
    results, spans = {}, []
    eng.step()                                 # both prefilled (one chunk each) and decoding
    for _ in range(3):
        before = list(eng._slots[eng.slot_of(a)].ids)
        spans.append(eng.span(hold={a}))
        results.update((r.rid, r) for r in eng.step(hold={a}))
        assert eng._slots[eng.slot_of(a)].ids == before      # held: no token, same place
    while eng.busy:
        results.update((r.rid, r) for r in eng.step())
    # the short row needs positions 16 + 1 + 4k + 4 < 32: the minimum bucket; the long one 128
    assert spans == [32, 32, 32] and eng.spans() == {}
    assert results[a].output_ids == alone[0].output_ids
    assert results[b].output_ids == alone[1].output_ids
    assert results[b].logprobs == pytest.approx(alone[1].logprobs, abs=1e-5)


def test_a_small_request_runs_at_its_own_span_beside_a_giant_call(params):
    """Two clients: three long rows (prompt 50 in one 64-token chunk, 40 new tokens) and, once
    they decode, a 2-token request. The step that runs the small request holds every giant
    row and reads 32 cache positions instead of 128, and the small request ends in it; the
    giant rows' tokens equal those of a run without it."""
    giant = [req(50, 40, seed=10 + i) for i in range(3)]
    small = req(3, 2, seed=20)

    async def main(with_small):
        sampler = ContinuousSampler(CFG, params, **SHAPE)
        eng, steps = sampler.engine, []
        run = eng.step

        def recording(hold=()):   # (clients whose rows run, span, clients that finished)
            ran = {sampler._live[k].client[-1] for k in eng.spans() if k not in hold}
            span = eng.span(hold)
            done = run(hold)
            steps.append((ran, span, {sampler._live[r.rid].client[-1] for r in done}))
            return done

        eng.step = recording
        tasks = [asyncio.create_task(sampler.generate([r], client="giant")) for r in giant]
        if with_small:
            while sampler.stats["tokens"] < 3 * 8:     # the giant rows are decoding
                await asyncio.sleep(0.001)
            await sampler.generate([small], client="small")
        outs = [(await t)[0].output_ids for t in tasks]
        await sampler.aclose()
        return outs, steps

    alone, _ = asyncio.run(main(False))
    outs, steps = asyncio.run(main(True))
    assert outs == alone
    first = next(i for i, (ran, _, _) in enumerate(steps) if "small" in ran)
    assert steps[first] == ({"small"}, 32, {"small"})
    assert all(span == 128 for ran, span, _ in steps[first + 1:] if "giant" in ran)
    assert not any("small" in ran for ran, _, _ in steps[first + 1:])


def test_dispatch_reads_bounds_a_dispatch_and_leaves_the_tokens_as_they_were(params, monkeypatch):
    """dispatch_reads=64 with 4 decode steps a dispatch: 2 steps at span 32, 1 at spans 64 and
    128 (steps x span within 64, at least one step), so a request that arrives while long rows
    decode waits for one step of theirs, not 4. Every request gets the tokens and logprobs it
    gets with 4 steps a dispatch at every span."""
    eng = ContinuousEngine(CFG, params, **SHAPE, dispatch_reads=64)
    assert [eng.steps_at(s) for s in (32, 64, 128)] == [2, 1, 1]
    assert ContinuousEngine(CFG, params, **SHAPE).steps_at(128) == 4
    dispatches = []
    real = engine_module._decode

    def recording(*args, n_steps, span, **kw):
        dispatches.append((n_steps, span))
        return real(*args, n_steps=n_steps, span=span, **kw)

    requests = [req(50, 40, seed=1), req(3, 12, seed=2, t=0.8), req(20, 30, seed=3, t=1.0)]
    alone = req(5, 6, seed=4)
    base = ContinuousEngine(CFG, params, **SHAPE)
    want = base.generate(requests) + base.generate([alone])
    monkeypatch.setattr(engine_module, "_decode", recording)
    got = eng.generate(requests) + eng.generate([alone])
    assert set(dispatches) == {(1, 128), (2, 32)}   # with the long row; the short one alone
    assert all(n * span <= max(64, span) for n, span in dispatches)
    for g, w in zip(got, want):
        assert g.output_ids == w.output_ids and g.finish_reason == w.finish_reason
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-6)
    with pytest.raises(ValueError, match="dispatch_reads=0; must be >= 1 or None"):
        ContinuousEngine(CFG, params, **SHAPE, dispatch_reads=0)


def test_serve_bounds_its_dispatches_by_default():
    """`orchestrax serve` passes its dispatch_reads (2048 unless configured) to the engine."""
    from orchestrax.train import serve
    assert serve.build_state(serve.ServeConfig()).sampler.engine.dispatch_reads == 2048
    state = serve.build_state(serve.ServeConfig(dispatch_reads=None))
    assert state.sampler.engine.steps_at(4096) == state.sampler.engine.decode_steps
