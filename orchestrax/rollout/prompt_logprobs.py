"""Prompt (input) token logprobs for `/generate`'s `logprob_start_len` and `/v1/completions`'
`echo`: one causal forward over the prompt, apart from the sampler's KV cache.

SGLang's convention: the logprob of prompt token t is log_softmax(logits) at t - 1 (raw logits,
no temperature), and the first reported position gets null (`input_token_logprobs[0]` is
`[None, id, text]` whatever `logprob_start_len` is).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from orchestrax import models
from orchestrax.rollout.sampler import TopLogprobs
from orchestrax.rollout.engine import bucket

HEAD_CHUNK = 256   # positions per LM-head chunk: bounds the [B, C, V] float32 logits


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptLogprobs:
    """Per prompt position from `start` on: `logprobs[k]` of `ids[start + k]` (None at k = 0)
    and, when asked, the `top` alternatives of the distribution that predicted it."""
    start: int
    logprobs: tuple[float | None, ...]
    top: tuple[TopLogprobs | None, ...] = ()


@functools.partial(jax.jit, static_argnums=(0, 4))
def _score(cfg: models.ModelConfig, params: Any, ids_BT: jax.Array, mask_BT: jax.Array,
           n_top: int):
    """(logp_BT of token t given < t (0 at t = 0), top ids/logps [B, T, K] of the distribution
    predicting t (zeros at t = 0))."""
    # `PromptScorer._batch` right-pads every row: attention takes the fused kernel (cuDNN on
    # a GPU) with no run-time layout check, a host read per layer on XLA:GPU.
    h_BTD = models.hidden_states(cfg, params, ids_BT, mask_BT, right_padded=True)
    b, t, d = h_BTD.shape
    c = min(HEAD_CHUNK, t)
    h_NBCD = h_BTD.reshape(b, t // c, c, d).transpose(1, 0, 2, 3)
    nxt_NBC = jnp.pad(ids_BT[:, 1:], ((0, 0), (0, 1))).reshape(b, t // c, c).transpose(1, 0, 2)

    def chunk(args):
        h_BCD, nxt_BC = args
        lp_BCV = jax.nn.log_softmax(models.lm_logits(cfg, params, h_BCD), axis=-1)
        tok = jnp.take_along_axis(lp_BCV, nxt_BC[..., None], axis=-1)[..., 0]
        if n_top:
            top_lp, top_id = jax.lax.top_k(lp_BCV, n_top)
        else:
            top_lp = jnp.zeros((b, c, 0), jnp.float32)
            top_id = jnp.zeros((b, c, 0), jnp.int32)
        return tok, top_lp, top_id

    tok_NBC, lp_NBCK, id_NBCK = jax.lax.map(chunk, (h_NBCD, nxt_NBC))

    def unchunk(x):   # [N, B, C, ...] -> [B, T, ...], shifted so index t is about token t
        x = jnp.moveaxis(x, 0, 1).reshape(b, t, *x.shape[3:])
        return jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)

    return unchunk(tok_NBC), unchunk(lp_NBCK), unchunk(id_NBCK)


class PromptScorer:
    """Scores prompts with the params a getter returns (the sampler's, read per call)."""

    def __init__(self, cfg: models.ModelConfig, params: Callable[[], Any], *, min_bucket: int = 16,
                 max_rows: int = 8):
        self.cfg, self._params = cfg, params
        self.min_bucket, self.max_rows = min_bucket, max_rows

    def score(self, prompts: Sequence[Sequence[int]], starts: Sequence[int],
              top: Sequence[int]) -> list[PromptLogprobs]:
        """Blocking (run it in a worker thread). `starts[i]` in [0, len(prompts[i]))."""
        params = self._params()
        if params is None:
            raise RuntimeError("the weights are released; POST /resume_memory_occupation first")
        out: list[PromptLogprobs] = []
        for lo in range(0, len(prompts), self.max_rows):
            out += self._batch(params, prompts[lo:lo + self.max_rows],
                               starts[lo:lo + self.max_rows], top[lo:lo + self.max_rows])
        return out

    def _batch(self, params, prompts, starts, top) -> list[PromptLogprobs]:
        t = bucket(max(map(len, prompts)), lo=self.min_bucket, hi=1 << 30)
        if t > HEAD_CHUNK:
            t = -(-t // HEAD_CHUNK) * HEAD_CHUNK
        rows = bucket(len(prompts), lo=1, hi=self.max_rows)
        n_top = bucket(max(top), lo=4, hi=1 << 30) if max(top) else 0
        ids = np.zeros((rows, t), np.int32)
        mask = np.zeros((rows, t), np.int32)
        mask[:, 0] = 1   # padding rows see one token
        for i, p in enumerate(prompts):   # right padding: a real token never sees a pad
            ids[i, :len(p)], mask[i, :len(p)] = p, 1
        tok, top_lp, top_id = jax.device_get(_score(self.cfg, params, ids, mask, n_top))
        out = []
        for i, (p, s, k) in enumerate(zip(prompts, starts, top)):
            lps = [None] + [float(x) for x in tok[i, s + 1:len(p)]]
            alts = ([None] + [tuple(zip(map(int, top_id[i, j, :k]), map(float, top_lp[i, j, :k])))
                              for j in range(s + 1, len(p))]) if k else []
            out.append(PromptLogprobs(start=s, logprobs=tuple(lps), top=tuple(alts)))
        return out

    async def ascore(self, prompts, starts, top) -> list[PromptLogprobs]:
        return await asyncio.to_thread(self.score, prompts, starts, top)
