"""ContinuousEngine.warm: every program a step can dispatch is compiled before the first request,
and a warmed engine gives what an unwarmed one gives."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from orchestrax import models
from orchestrax.rollout import engine as engine_mod
from orchestrax.rollout.engine import ContinuousEngine
from orchestrax.rollout.sampler import GenerateRequest, SamplingParams

CFG = models.tiny_config().replace(num_layers=1)
COMPILE = "/jax/core/compile/backend_compile_duration"   # also recorded on a persistent-cache hit


def workload() -> list[list[GenerateRequest]]:
    """Two waves: prompt lengths from 3 to 61 of a 64-position engine (one chunk, several
    chunks, unpadded pieces near the limit), greedy and sampled rows, top-k rows beside rows
    without it, and a prompt that extends an earlier one (a reused prefix)."""
    rng = np.random.default_rng(0)
    reqs = []
    for i, (n, new) in enumerate([(3, 5), (40, 9), (16, 2), (31, 30), (12, 1), (50, 13),
                                  (61, 10), (45, 40)]):
        sp = SamplingParams(temperature=0.5 * (i % 3), top_k=5 if i % 2 else -1,
                            max_new_tokens=new, sampling_seed=i)
        ids = tuple(int(x) for x in rng.integers(1, CFG.vocab_size, n))
        reqs.append(GenerateRequest(input_ids=ids, sampling=sp))
    reqs.append(GenerateRequest(input_ids=reqs[5].input_ids + (7, 8, 9),
                                sampling=SamplingParams(max_new_tokens=4)))
    return [reqs[:5], reqs[5:]]


def make_engine(params) -> ContinuousEngine:
    return ContinuousEngine(CFG, params, max_batch=3, max_len=64, prefill_chunk=16, seed=3)


def run(eng: ContinuousEngine):
    out = []
    for wave in workload():
        out += [(r.output_ids, r.logprobs, r.finish_reason, r.cached_tokens)
                for r in eng.generate(wave)]
    return out


def test_warm_compiles_every_program_a_workload_dispatches_and_changes_no_result():
    params = models.init_params(CFG, 1)
    warmed = make_engine(params)
    programs = warmed.programs()
    # chunks 1..16 at spans 32 and 64, decode at both, x2 filtering; copies at both
    assert len(programs) == 2 * (5 * 2 + 2) + 2
    assert warmed.warm() == len(programs)
    assert warmed.stats == make_engine(params).stats and not warmed.busy

    jitted = (engine_mod._prefill_chunk, engine_mod._decode, engine_mod._copy_prefix)
    entries = [f._cache_size() for f in jitted]
    compiles = []
    listener = lambda event, secs, **_: compiles.append(event) if event == COMPILE else None  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        got = run(warmed)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert [f._cache_size() for f in jitted] == entries
    # the workload reached the paths the programs are for
    assert warmed.stats["cached_tokens"] > 0

    cold = make_engine(params)
    assert run(cold) == got
    assert cold.stats == warmed.stats


def test_warm_refuses_an_allocated_slot_cache():
    params = models.init_params(CFG, 1)
    eng = make_engine(params)
    eng.generate(workload()[0][:1])
    with pytest.raises(RuntimeError, match="release"):
        eng.warm(filtering=(False,))


def test_sampler_warms_the_filter_values_its_requests_can_need(monkeypatch):
    from orchestrax.rollout.embedded import ContinuousSampler
    sampler = ContinuousSampler(CFG, models.init_params(CFG, 1), max_batch=2, max_len=64)
    asked = []
    monkeypatch.setattr(sampler.engine, "warm", lambda filtering: asked.append(list(filtering))
                        or 0)
    sampler.warm()
    sampler.warm([SamplingParams(temperature=1.0)])
    sampler.warm([SamplingParams(top_k=5), SamplingParams(top_p=0.9)])
    assert asked == [[False, True], [False], [True]]
    assert sampler.engine.params is sampler.params


def test_serve_warms_before_listening_when_asked(monkeypatch):
    import asyncio

    from orchestrax.train import serve
    events = []

    class Sampler:
        def warm(self):
            events.append("warm")

    class State:
        sampler = Sampler()

    async def start(state, host, port):
        events.append("listen")
        raise OSError("stop here")

    monkeypatch.setattr(serve, "build_state", lambda args: State())
    monkeypatch.setattr(serve, "start", start)
    for warm in (True, False):
        with pytest.raises(SystemExit):
            asyncio.run(serve._run(serve.ServeConfig(warm=warm)))
    assert events == ["warm", "listen", "listen"]
