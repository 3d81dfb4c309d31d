"""Decode throughput: the embedded JAX sampler (the continuous engine) vs
`transformers.generate`, same tiny Qwen3, fp32 on CPU, batch 16, greedy, fixed prompt and
new-token lengths. Prints the ratio, and the cost of engine steps of 8 decode steps (the
default, so new requests join, streaming clients get tokens and departed clients' rows stop)
against engine steps of the whole output's decode steps."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import asyncio
import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.common import median_seconds, peak_rss_mib, record  # noqa: E402
from orchestrax import models  # noqa: E402
from orchestrax.rollout.sampler import GenerateRequest, SamplingParams  # noqa: E402
from orchestrax.rollout.embedded import ContinuousSampler  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cfg = models.tiny_config(vocab_size=1024, hidden_size=256, intermediate_size=768,
                             num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32)
    params = models.init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, cfg.vocab_size, (args.batch, args.prompt))
    new_tokens = args.batch * args.new

    # No stop ids: every row decodes exactly `new` tokens in both engines.
    reqs = [GenerateRequest(input_ids=tuple(int(t) for t in p),
                            sampling=SamplingParams(temperature=0.0, max_new_tokens=args.new))
            for p in prompts]

    async def embedded_run(decode_steps=8):
        # One call is one client: no slot kept back for others (reserve_slots=0); no top
        # logprobs, as transformers.generate computes none.
        s = ContinuousSampler(cfg, params, max_batch=args.batch,
                              max_len=args.prompt + args.new, prefill_chunk=args.prompt,
                              decode_steps=decode_steps, top_logprobs=0, reserve_slots=0)
        out = await s.generate(reqs)
        await s.aclose()
        return out

    ours_s = median_seconds(lambda: asyncio.run(embedded_run()), repeats=args.repeats)
    whole_s = median_seconds(lambda: asyncio.run(embedded_run(args.new)), repeats=args.repeats)
    ours = asyncio.run(embedded_run())
    assert [r.output_ids for r in ours] == [r.output_ids for r in asyncio.run(
        embedded_run(args.new))]

    import torch
    import transformers
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as d:
        models.save_hf(cfg, params, d)
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)

    def hf_run():
        with torch.no_grad():
            return hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=args.new, min_new_tokens=args.new,
                               pad_token_id=0, eos_token_id=None)

    hf_s = median_seconds(hf_run, repeats=args.repeats)
    hf_out = hf_run()[:, args.prompt:].numpy()
    agree = float(np.mean(hf_out == np.array([r.output_ids for r in ours])))
    ours_tps, hf_tps = new_tokens / ours_s, new_tokens / hf_s
    record(f"sampler decode (CPU fp32, greedy): L={cfg.num_layers} D={cfg.hidden_size} "
           f"V={cfg.vocab_size} B={args.batch} prompt={args.prompt} new={args.new}: embedded "
           f"{ours_tps:,.0f} tok/s, transformers.generate {hf_tps:,.0f} tok/s, ratio "
           f"{ours_tps / hf_tps:.2f}x (target >= 2x), greedy token agreement {agree:.3f}, "
           f"throughput at 8 decode steps an engine step / at {args.new} "
           f"{whole_s / ours_s:.2f}, "
           f"peak RSS {peak_rss_mib():,.0f} MiB (python bench/sampler.py)")


if __name__ == "__main__":
    main()
