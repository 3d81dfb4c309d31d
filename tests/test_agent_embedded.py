"""End to end with the real embedded JAX sampler on a tiny random Qwen3: the trajectory's
generated positions carry logprobs the trainer recomputes from the appended ids alone."""

import asyncio

import numpy as np
import pytest
from agent_fixtures import SleepTool

from orchestrax.agent.episode import EpisodeConfig, run_episode
from orchestrax.agent.scripted import tiny_qwen3_tokenizer
from orchestrax.data.records import Task
from orchestrax.rollout.sampler import SamplingParams

from orchestrax import models
from orchestrax.rollout import embedded


@pytest.mark.slow
def test_episode_with_embedded_sampler_matches_trainer_logprobs():
    tok = tiny_qwen3_tokenizer()
    cfg = models.tiny_config(vocab_size=len(tok))
    params = models.init_params(cfg, seed=0)
    task = Task(task_id="e2e", messages=({"role": "user", "content": "Find Paris."},),
                preference_instruction="Prefer cheap tools.")
    config = EpisodeConfig(max_turns=3, max_new_tokens=12, context_tokens=512,
                           sampling=SamplingParams(temperature=1.0, sampling_seed=7))

    async def main():
        sampler = embedded.ContinuousSampler(cfg, params, max_batch=4, max_len=512)
        try:
            return await run_episode(sampler, tok, task, [SleepTool("search")], config=config)
        finally:
            await sampler.aclose()
    traj = asyncio.run(main())
    traj.check()
    # A random model rambles: each turn is cut off at max_new_tokens, closed with <|im_end|>
    # (mask 0) and answered with a format-error notice, three times in a row.
    assert traj.end_reason == "format_errors" and [t.tokens_out for t in traj.turns] == [12] * 3
    assert traj.num_generated == 36
    ids = np.asarray(traj.token_ids)[None]
    logp = np.asarray(models.token_logprobs(cfg, params, ids, np.ones_like(ids), temperature=1.0))[0]
    mask = np.asarray(traj.loss_mask, bool)
    np.testing.assert_allclose(np.asarray(traj.logprobs)[mask], logp[mask], atol=1e-4)
