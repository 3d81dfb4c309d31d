"""GRPO train-step throughput: jitted `rl.make_train_step` (forward + backward + AdamW + clip) vs
the same step in PyTorch (transformers Qwen3ForCausalLM, same weights, same loss), fp32 CPU,
measured in alternating rounds in one process. On a GPU it also records the Qwen3 step MFU for
the largest preset that fits.

    python bench/train_step.py [--batch 8 --seq 256 --layers 4 --hidden 256 --vocab 8192]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from common import peak_rss_mib, record
from orchestrax import models, rl

GCFG = rl.GRPOConfig(compute_entropy=False)              # clip .2/.28, dual clip 10, token-mean
OCFG = rl.OptimizerConfig(lr=1e-5, weight_decay=0.01, max_grad_norm=1.0)


def make_batch(cfg, B: int, T: int, params) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int32)
    loss_mask = np.zeros((B, T), np.float32)
    loss_mask[:, T // 4:] = 1                             # first quarter is the "prompt"
    lp = np.asarray(jax.jit(models.token_logprobs, static_argnums=0)(cfg, params, tokens))
    return dict(tokens=tokens, attention_mask=np.ones((B, T), np.int32), loss_mask=loss_mask,
                advantages=rng.normal(size=B).astype(np.float32),
                old_logprobs=(lp + rng.normal(0, 0.1, lp.shape)).astype(np.float32))


def torch_step_fn(model, batch):
    """The same GRPO step in torch: token logprobs, clipped surrogate with dual clip, token-mean,
    backward, global-norm clip, AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=OCFG.lr, betas=(OCFG.b1, OCFG.b2),
                            eps=OCFG.eps, weight_decay=OCFG.weight_decay)
    tok = torch.tensor(batch["tokens"], dtype=torch.long)
    attn = torch.tensor(batch["attention_mask"], dtype=torch.long)
    mask = torch.tensor(batch["loss_mask"])[:, 1:]
    old = torch.tensor(batch["old_logprobs"])[:, 1:]
    A = torch.tensor(batch["advantages"])[:, None]
    lo, hi, c = 1 - GCFG.clip_low, 1 + GCFG.clip_high, GCFG.dual_clip

    def step() -> float:
        logits = model(input_ids=tok, attention_mask=attn).logits[:, :-1].float()
        logp = torch.log_softmax(logits / GCFG.temperature, -1).gather(
            -1, tok[:, 1:, None])[..., 0]
        ratio = torch.exp(torch.clamp(logp - old, -GCFG.log_ratio_clamp, GCFG.log_ratio_clamp))
        pg = torch.maximum(-A * ratio, -A * torch.clamp(ratio, lo, hi))
        pg = torch.where(A < 0, torch.minimum(pg, -A * c), pg)
        loss = (pg * mask).sum() / mask.sum().clamp(min=1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OCFG.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="steps per framework per round")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    cfg = models.tiny_config(vocab_size=args.vocab, hidden_size=args.hidden,
                             intermediate_size=3 * args.hidden, num_layers=args.layers,
                             num_heads=4, num_kv_heads=2, head_dim=args.hidden // 4,
                             tie_embeddings=False)
    params = models.init_params(cfg, seed=0)
    batch = make_batch(cfg, args.batch, args.seq, params)
    with tempfile.TemporaryDirectory() as d:
        models.save_hf(cfg, params, d)
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    hf.train()

    train = rl.make_train_step(cfg, GCFG, OCFG)
    step = train.step
    state = train.init(params)                             # takes over the params' buffers
    jbatch = jax.device_put(batch)
    t0 = time.perf_counter()
    state, m = step(state, jbatch)
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - t0
    loss_jax = float(m["loss_first"])
    tstep = torch_step_fn(hf, batch)
    loss_torch = tstep()                                   # warm-up, and the same first loss
    rss_after_warmup = peak_rss_mib()

    t_jax, t_torch = [], []
    for _ in range(args.rounds):                           # alternate: the box is shared
        for _ in range(args.steps):
            t0 = time.perf_counter()
            state, m = step(state, jbatch)
            jax.block_until_ready(state)
            t_jax.append(time.perf_counter() - t0)
        for _ in range(args.steps):
            t0 = time.perf_counter()
            tstep()
            t_torch.append(time.perf_counter() - t0)
    tokens = args.batch * args.seq
    ours, theirs = tokens / statistics.median(t_jax), tokens / statistics.median(t_torch)
    n = models.num_params(cfg)
    gflops = rl.train_flops(cfg, tokens, args.seq) / statistics.median(t_jax) / 1e9
    print(f"first-step loss: orchestrax {loss_jax:.6f}, torch {loss_torch:.6f}, "
          f"|diff| {abs(loss_jax - loss_torch):.1e}; compile {compile_s:.1f} s; "
          f"model FLOP/s {gflops:.1f} GFLOP/s; N={n:,}")
    line = (f"train_step: Qwen3 L={args.layers} D={args.hidden} V={args.vocab} B={args.batch} "
            f"T={args.seq} fp32 {jax.devices()[0].platform}, GRPO clipped loss + AdamW, "
            f"orchestrax {ours:,.0f} tok/s, torch {theirs:,.0f} tok/s, ratio {ours / theirs:.2f}×, "
            f"first-step loss |diff| {abs(loss_jax - loss_torch):.1e}, peak RSS "
            f"{peak_rss_mib():,.0f} MiB (both frameworks in one process; "
            f"{rss_after_warmup:,.0f} MiB after warm-up) (command: python bench/train_step.py)")
    record(line) if not args.no_record else print(line)
    if jax.devices()[0].platform == "gpu":
        gpu_mfu(args.no_record)


def gpu_mfu(no_record: bool) -> None:
    """bf16 Qwen3 GRPO step, largest preset that fits one GPU (full remat), MFU vs bf16 peak."""
    kind = jax.devices()[0].device_kind.lower()
    chip = next((c for c in ("h200", "h100", "a100") if c in kind), None)
    for name in ("qwen3-8b", "qwen3-4b", "qwen3-1.7b", "qwen3-0.6b"):
        cfg = models.preset(name, dtype="bfloat16", remat="full")
        B, T = 4, 2048
        try:
            train = rl.make_train_step(cfg, GCFG, OCFG)
            state = train.init(jax.jit(models.init_params, static_argnums=0)(cfg))
            batch = {"tokens": jnp.zeros((B, T), jnp.int32),
                     "attention_mask": jnp.ones((B, T), jnp.int32),
                     "loss_mask": jnp.ones((B, T), jnp.float32),
                     "advantages": jnp.ones((B,), jnp.float32),
                     "old_logprobs": jnp.zeros((B, T), jnp.float32)}
            step = train.step
            state, _ = step(state, batch)
            jax.block_until_ready(state)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                state, _ = step(state, batch)
                jax.block_until_ready(state)
                times.append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - out of memory: try the next size down
            print(f"{name}: does not fit ({type(e).__name__}); trying smaller")
            train = state = None                       # free this attempt before the next
            continue
        t = statistics.median(times)
        n = models.num_params(cfg)
        util = rl.mfu(cfg, B * T, T, t, rl.peak_flops(chip)) if chip else float("nan")
        line = (f"train_step (GPU {kind}, bf16 compute, fp32 params, remat full): {name} B={B} "
                f"T={T}: {B * T / t:,.0f} tok/s, MFU {util:.1%} (command: python "
                f"bench/train_step.py)")
        record(line) if not no_record else print(line)
        return


if __name__ == "__main__":
    main()
