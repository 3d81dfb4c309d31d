"""Learning check: GRPO teaches a tiny Qwen3 a contextual token bandit (fixed seed, CPU).

Each task q shows the prompt [BOS, task_q]; the policy emits one token; reward 1 iff it is the
task's answer token. Chance is 1/V. The whole loop (sample -> reward -> filter -> advantages ->
train_step) uses the real pieces.
"""

import jax
import jax.numpy as jnp
import numpy as np

from orchestrax import models, rl

V, Q, G = 8, 4, 8
CFG = models.tiny_config(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16)
TASK_TOKENS = np.array([2, 3, 4, 5])
ANSWERS = np.array([6, 1, 7, 0])            # deliberately unrelated to the prompt token


@jax.jit
def answer_probs(params):
    prompts = jnp.stack([jnp.ones(Q, jnp.int32), jnp.asarray(TASK_TOKENS)], axis=1)
    return jax.nn.softmax(models.forward(CFG, params, prompts)[:, -1], axis=-1)   # [Q, V]


def expected_reward(params) -> float:
    return float(jnp.mean(answer_probs(params)[jnp.arange(Q), ANSWERS]))


def test_grpo_learns_token_bandit():
    ocfg = rl.OptimizerConfig(lr=5e-3, weight_decay=0.0)
    gcfg = rl.GRPOConfig(ppo_epochs=2, num_minibatches=2, adv_clip=3.0, compute_entropy=False)
    train = rl.make_train_step(CFG, gcfg, ocfg)
    state = train.init(models.init_params(CFG, seed=0))
    key = jax.random.key(0)
    start = expected_reward(state.params)
    assert abs(start - 1 / V) < 0.1                  # ~chance at init
    history = []
    for _ in range(40):
        key, sub = jax.random.split(key)
        probs = answer_probs(state.params)                                     # [Q, V]
        actions = np.asarray(jax.random.categorical(sub, jnp.log(probs), shape=(G, Q))).T
        R = rl.outcome_reward(actions == ANSWERS[:, None])                     # [Q, G]
        keep, _ = rl.sample_mask(R, min_std=gcfg.min_group_std)
        A = rl.compute_advantages(R, gcfg.adv_estimator, eps=gcfg.adv_eps, clip=gcfg.adv_clip,
                                  mask=keep)
        tokens = np.stack([np.ones((Q, G), np.int32), np.repeat(TASK_TOKENS[:, None], G, 1),
                           actions.astype(np.int32)], axis=-1).reshape(Q * G, 3)
        batch = dict(tokens=tokens, attention_mask=np.ones_like(tokens),
                     loss_mask=np.tile(np.array([0, 0, 1], np.float32), (Q * G, 1)),
                     advantages=np.asarray(A).reshape(-1),
                     sample_mask=np.asarray(keep, np.float32).reshape(-1))
        state, metrics = train.step(state, batch)
        assert np.isfinite(float(metrics["loss"]))
        history.append(expected_reward(state.params))
        if history[-1] >= 0.95:
            break
    assert history[-1] >= 0.9, history
    assert int(state.counters["skipped_updates"]) == 0
