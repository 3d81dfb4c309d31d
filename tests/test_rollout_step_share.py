"""Clients take turns at the engine's steps by the work each got (`fair.StepShare`): a small
request beside a giant call's long rows runs in steps at its own cache span, the long rows wait
(untouched) for those steps and give the same tokens as when they run alone."""

import asyncio

import numpy as np
import pytest

from orchestrax import models
from orchestrax.rollout.sampler import MAX_TOP_LOGPROBS
from orchestrax.rollout.embedded import ContinuousSampler
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


def test_the_step_share_by_hand():
    """Spans 4096 and 32, 8 decode steps a step: a step of the giant costs 32768, one of the
    small client 256. Both start at 0: the tie goes to the smaller span (small alone, 256);
    then the giant, with the small riding (it fits in the span): giant 32768, small 512; then
    the small alone until its virtual time passes 32768: (32768 - 512) / 256 + 1 = 127 steps."""
    share = StepShare()
    spans = {"giant": 4096, "small": 32}
    got = [share.choose(spans, 8) for _ in range(130)]
    both = {"giant", "small"}
    assert got == [{"small"}, both] + [{"small"}] * 127 + [both]
    # Equal spans: every step runs both.
    assert [share.choose({"a": 64, "b": 64}, 8) for _ in range(3)] == [{"a", "b"}] * 3
    # A client that comes back starts at the others' smallest virtual time, not at its old one.
    share = StepShare()
    share.choose({"giant": 4096}, 8)                        # giant: 32768
    assert share.choose({"giant": 4096, "new": 16}, 8) == {"new"}     # tie at 32768 -> smaller
    assert share.choose({"giant": 4096, "new": 16}, 8) == {"giant", "new"}   # 32896 > 32768
    assert share.choose({"giant": 4096}, 8) == {"giant"}    # alone: always runs


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
