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
    chunks, a last chunk filled out from behind near the limit), greedy and sampled rows, top-k
    rows beside rows without it, and a prompt that extends an earlier one (a reused prefix)."""
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
    # chunk 16 at spans 32 and 64, one row or three (3 x 16 <= BATCHED_PREFILL_TOKENS), one
    # token at 32, decode at both, x2 filtering; copies at both
    assert len(programs) == 2 * (2 * 2 + 1 + 2) + 2
    assert warmed.warm() == len(programs)
    assert warmed.stats == make_engine(params).stats and not warmed.busy

    jitted = (engine_mod._prefill, engine_mod._decode, engine_mod._copy_prefix)
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
    assert warmed.stats["prefill_dispatches"] < warmed.stats["prefill_chunks"]

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


def listed(eng: ContinuousEngine, filtering=(False, True)) -> set:
    return {(kind, tuple(sorted(shape.items()))) for kind, shape in eng.programs(filtering)}


def test_prompts_ending_at_the_context_limit_dispatch_only_listed_programs(monkeypatch):
    params = models.init_params(CFG, 1)
    eng = ContinuousEngine(CFG, params, max_batch=2, max_len=64, prefill_chunk=16, seed=3)
    seen = set()

    def spy(name, kind, shape):
        jitted = getattr(engine_mod, name)

        def call(*args, **kw):
            seen.add((kind, tuple(sorted(shape(args, kw).items()))))
            return jitted(*args, **kw)
        monkeypatch.setattr(engine_mod, name, call)

    spy("_prefill", "prefill", lambda a, kw: dict(
        rows=a[4].shape[0], chunk=a[4].shape[1], span=kw["span"],
        filtering=int(kw["filtering"])))
    spy("_decode", "decode", lambda a, kw: dict(span=kw["span"], steps=kw["n_steps"],
                                                filtering=int(kw["filtering"])))
    spy("_copy_prefix", "copy", lambda a, kw: dict(span=kw["span"]))
    # Each output budget runs to max_len (no room to pad): 5 goes one token a chunk, 30 as 16
    # then 16 filled out with 2 before it, 47 as two 16s then 16 filled out with 1.
    rng = np.random.default_rng(1)
    prompts = {n: tuple(int(x) for x in rng.integers(1, CFG.vocab_size, n))
               for n in (5, 30, 47, 32)}
    for n in (5, 30, 47):
        eng.generate([GenerateRequest(input_ids=prompts[n],
                                      sampling=SamplingParams(max_new_tokens=64))])
    # A next turn after a reused prefix (32 + 3 fed reply tokens), its 4 new tokens filled
    # out with 12 of the prefix's.
    out = eng.generate([GenerateRequest(input_ids=prompts[32],
                                        sampling=SamplingParams(max_new_tokens=4))])[0]
    ids = prompts[32] + out.output_ids + (5, 6, 7)
    again = eng.generate([GenerateRequest(input_ids=ids, sampling=SamplingParams(
        max_new_tokens=64, top_k=3, temperature=1.0))])[0]
    assert again.cached_tokens == 35 and len(again.output_ids) == 64 - len(ids)
    assert {c for k, s in seen if k == "prefill" for c in [dict(s)["chunk"]]} == {1, 16}
    assert seen <= listed(eng)


def test_program_counts_of_the_trainer_and_serve_defaults():
    """Counted from the rules of `ContinuousEngine.programs`: S buckets 32 * 2^k below max_len,
    and max_len; prefill at each bucketed chunk size (16 * 2^k below prefill_chunk = 512, and
    512) at each S bucket >= the chunk's own, plus one-token chunks at S = 32, and again for
    the several rows of a batched size (16 and 32 for 8 rows, 64 for 4, 128 for 2: rows x
    chunk <= BATCHED_PREFILL_TOKENS); decode and prefix copy at each S bucket; prefill and
    decode once per filter value."""
    from orchestrax import registry
    from orchestrax.rollout.engine import needs_filtering
    from orchestrax.train.serve import ServeConfig
    from orchestrax.train.setup import sampler_config
    from orchestrax.train.train_config import TrainConfig
    from orchestrax.rollout.sampler import SamplerConfig

    def count(max_len: int, filters: int) -> int:
        spans = [32 * 2**k for k in range(20) if 32 * 2**k < max_len] + [max_len]
        chunks = [16, 32, 64, 128, 256, 512]
        prefill = sum(1 + (c <= 128) for c in chunks for s in spans if s >= max(c, 32)) + 1
        return filters * (prefill + len(spans)) + len(spans)

    params = models.init_params(CFG, 1)
    train = TrainConfig(name="x", model=CFG)
    r = train.rollout
    trainer = registry.build_sampler(sampler_config(train), CFG, params)
    filters = {needs_filtering([SamplingParams(temperature=r.temperature, top_k=r.top_k,
                                               top_p=r.top_p)], CFG.vocab_size)}
    # 24000: 11 S buckets (32 ... 16384, 24000); chunks 16 and 32 at all 11, 64 at 10, 128 at
    # 9, 256 at 8, 512 at 7: 56 + 1 one-token, and 11 + 11 + 10 + 9 of several rows; 11
    # decodes, 11 copies.
    assert count(r.context_tokens, 1) == 56 + 1 + 41 + 11 + 11 == 120
    assert len(trainer.engine.programs(filters)) == 120 and filters == {False}

    s = ServeConfig()
    serve = registry.build_sampler(SamplerConfig(
        backend="embedded", max_batch=s.max_batch, max_len=s.max_len,
        dispatch_reads=s.dispatch_reads), CFG, params)
    # 4096: 8 S buckets; chunks 16 and 32 at 8, 64 at 7, 128 at 6, 256 at 5, 512 at 4: 38 + 1,
    # and 8 + 8 + 7 + 6 of several rows; both filter values: 2 x (68 + 8 decodes) + 8 copies.
    assert count(s.max_len, 2) == 2 * (68 + 8) + 8 == 160
    assert len(serve.engine.programs()) == 160
