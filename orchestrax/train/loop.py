"""The outer loop: rollouts -> verify -> reward -> advantages -> filters -> jitted update.

One RL step: Q tasks (chosen from the seed and the step number, so a resumed run sees the same
tasks), G episodes each, all in flight at once; the ToolOrchestra reward over each group; the
pure `train_step` on the packed batch; the new weights go to the sampler; metrics append to
`<out_dir>/metrics.jsonl`; a checkpoint every `checkpoint_every` steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import pathlib
import time
from typing import Any, Callable, Sequence

import grain
from tqdm.contrib.logging import logging_redirect_tqdm
import jax
import jax.numpy as jnp
import numpy as np

from orchestrax import models, parallel, registry, rl
from orchestrax.agent.episode import Codec, EpisodeConfig
from orchestrax.agent.executor import ToolExecutor
from orchestrax.data.instances import prepare_instance
from orchestrax.data.records import Task, Trajectory
from orchestrax.data.tasks import spread
from orchestrax.envs.environment import Environment
from orchestrax.rollout.sampler import SamplingParams
from orchestrax.tools.randomize import instance_seed
from orchestrax.train import (batching, checkpoint, compile_cache, console, rollouts, run_info,
                              setup, train_config, warmstart)
from orchestrax.train.checkpoint import Checkpointer
from orchestrax.train.train_config import TrainConfig
from orchestrax.train.flow import FlowRunner, make_subagent_sampler  # sub-agent mode
from orchestrax.train import plots
from orchestrax.train.metrics_log import MetricsLog, combine_process_rows, progress

log = logging.getLogger(__name__)


class Trainer:
    """`make_executor` builds the tool executor the episodes share (here and in the episode
    workers: a picklable callable there); the default is `ToolExecutor()`."""

    def __init__(self, cfg: TrainConfig, *,
                 make_executor: Callable[[], ToolExecutor] = ToolExecutor):
        self.cfg = cfg
        # Checkpoints under `out` (gs:// stays gs://); what needs a local file system under
        # `local` (out_dir itself unless out_dir is a URI).
        self.out = train_config.check_out_dir(cfg)
        self.local = run_info.local_dir(cfg.out_dir)
        # One trainer per out_dir: a second one would append every metrics row again.
        self._lock = run_info.lock_out_dir(self.local) if jax.process_index() == 0 else None
        log.info("orchestrax train %s: building the env, model and sampler", cfg.name)
        # Everything that can be wrong with the config or its inputs fails here, before any
        # compute (the environment first: its task count bounds tasks_per_step).
        train_config.check_paths(cfg)
        self.env: Environment = setup.make_env(cfg)
        self.train_tasks: Sequence[Task] = self.env.tasks("train")
        # Eval instances draw P from Pairs_eval, once per task (the same at every eval)
        self.eval_tasks: Sequence[Task] = [
            prepare_instance(t, self.env, split="eval", seed=instance_seed(cfg.seed, t.task_id),
                             config=cfg.instances) for t in self.env.tasks("eval")]
        train_config.check_env_fits(cfg, len(self.train_tasks), len(self.eval_tasks),
                                    jax.process_count())
        self.eval_tasks = spread(self.eval_tasks, cfg.eval_tasks)
        evaluated = self.eval_tasks if cfg.eval_every else ()
        # Multi-process: each process evaluates its own share (eval rows average the shares).
        self.eval_tasks = self.eval_tasks[jax.process_index()::jax.process_count()]
        self.mesh = parallel.make_mesh(cfg.mesh)
        train_config.check_batch_split(
            cfg, rl.data_parallel_degree(self.mesh, parallel.DEFAULT_RULES)[0])
        self.tokenizer = registry.build_tokenizer(cfg.tokenizer)
        self.codec = Codec(self.tokenizer)
        train_config.check_vocab(cfg, self.tokenizer)
        train_config.check_context(cfg, self.env, self.codec, self.train_tasks, evaluated)
        self.model_cfg, params = setup.load_params(cfg, self.mesh)
        train_config.check_master_weights(cfg, params)
        if jax.process_index() == 0:
            setup.write_model_card(self.local / "model", self.model_cfg, self.tokenizer,
                                   cfg.hf_path)
            run_info.write(self.local, cfg)  # eval and export read the run's settings from it
            # A note on reading the rows, not a fault: INFO (the demo's terminal, which shows
            # warnings only, states its eval settings in its table).
            for difference in console.eval_differences(cfg):
                log.info("%s", difference)
            log.info("orchestrax train %s: %d %s device(s), %d process(es), %.3gM params, "
                     "out_dir %s", cfg.name, jax.device_count(), jax.devices()[0].platform,
                     jax.process_count(), models.num_params(self.model_cfg) / 1e6, self.out)
        parallel.barrier("model card")
        grpo = (cfg.grpo if cfg.agent.mode == "direct"
                else dataclasses.replace(cfg.grpo, agg=cfg.agent.flow_agg))  # rows are turns
        # Every rollout batch is made of rl.pack's right-padded rows.
        self.update = rl.make_train_step(self.model_cfg, grpo, cfg.optim, self.mesh,
                                         right_padded=True)
        self.state = self.update.init(params)
        self.ckpt = Checkpointer(self.out / "checkpoints", every=cfg.checkpoint_every)
        self.step = 0
        self._just_restored: int | None = None   # checkpoint step of a restore not yet trained
        self.phase = "sft" if cfg.sft_steps else "rl"
        self.ref_params = None
        # Task indices per RL step; its position is saved with every checkpoint.
        self.task_ids = iter(setup.task_stream(cfg, self.env, len(self.train_tasks))
                             .to_iter_dataset(grain.ReadOptions(num_threads=0,
                                                                prefetch_buffer_size=0)))
        keep_rows, resumed_at = 0, None  # metrics rows of the restored checkpoint
        if cfg.resume and self.ckpt.latest_step is not None:
            keep_rows, resumed_at = self._resume()
            if self._complete():
                # Complete: nothing re-runs, so the rows after the last checkpoint (the final
                # eval) stay.
                keep_rows, resumed_at = 1 << 62, None
        elif cfg.init_from is not None:
            params, _, meta = checkpoint.read_params(
                run_info.out_path(cfg.init_from) / "checkpoints", like=self.state.params)
            self.phase, self.step, self.state = "rl", 0, self.update.init(params)
            log.info("starting RL from %s (its %s step %d)", cfg.init_from, meta["phase"],
                     meta["step"])
        self.metrics = MetricsLog(self.local, keep_rows=keep_rows, resume_step=resumed_at,
                                  writer=jax.process_index() == 0,
                                  mirror=None if str(self.out) == str(self.local) else self.out,
                                  wandb=cfg.wandb, run_name=cfg.name,
                                  run_config=run_info.to_json(cfg))
        self._clock = console.Clock()
        self.sampler = registry.build_sampler(setup.sampler_config(cfg, self.out), self.model_cfg,
                                              self.state.params)
        self.rollouts = self._rollout_driver(make_executor)
        self.episode_cfg = EpisodeConfig(
            max_turns=cfg.rollout.max_turns, context_tokens=cfg.rollout.context_tokens,
            max_new_tokens=cfg.rollout.max_new_tokens,
            enable_thinking=cfg.rollout.enable_thinking,
            sampling=SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                    top_k=cfg.rollout.top_k))

    def _rollout_driver(self, make_executor) -> rollouts.RolloutDriver:
        """Picked once: sub-agent mode (orchestrator rollouts, Flow-GRPO batches, frozen
        sub-agents), the released Orchestrator-8B protocol (its rounds as turn rows), Direct
        mode in episode worker processes, or on this event loop."""
        cfg, r = self.cfg, self.cfg.rollout
        if cfg.agent.mode == "subagent":
            return FlowRunner(cfg, self.env, self.codec, self.sampler,
                              make_subagent_sampler(cfg, self.model_cfg, self.state.params),
                              make_executor())
        if cfg.agent.mode == "orchestrator8b":
            from orchestrax.train.orchestrator8b_rollouts import Orchestrator8BRollouts
            return Orchestrator8BRollouts(cfg, self.env, self.sampler, self.codec, make_executor)
        if r.workers:
            return rollouts.PooledRollouts(
                cfg, self.env, self.sampler, self.codec,
                urls=setup.server_share(r.server_urls) if r.backend == "sglang" else (),
                tokenizer=self.tokenizer, model_dir=self.local / "model",
                make_executor=make_executor)
        return rollouts.DirectRollouts(cfg, self.env, self.sampler, self.codec, make_executor)

    # --- checkpoints ---------------------------------------------------------------------------
    def _resume(self) -> tuple[int, int]:
        """Restore the newest whole checkpoint; returns its metrics row count and global step."""
        state, meta = self.ckpt.restore(self.state, data=self.task_ids, check=self._check_meta)
        self.phase, self.step, self.state = meta["phase"], meta["step"], state
        self._just_restored = self.ckpt.restored_step
        resumed_at = self._global_step()
        if self.phase == "sft" and self.step >= self.cfg.sft_steps:
            # Warm start finished: RL begins with a fresh optimizer on the warm params.
            self.phase, self.step, self.state = "rl", 0, self.update.init(state.params)
        log.info("resumed %s phase at step %d", self.phase, self.step)
        # Checkpoints from before rows were counted keep every row.
        return meta.get("metrics_rows", 1 << 62), resumed_at

    def _check_meta(self, step: int, meta: dict[str, Any]) -> str | None:
        """Why a checkpoint's metadata or task-stream position disagrees with its step."""
        phase, n = meta.get("phase"), meta.get("step")
        if phase not in ("sft", "rl") or not isinstance(n, int):
            return f"metadata phase={phase!r} step={n!r}; expected phase sft or rl, an int step"
        if n + (self.cfg.sft_steps if phase == "rl" else 0) != step:
            return f"metadata says {phase} step {n}, which is not checkpoint step {step}"
        # One batch of task ids per RL step: the stream's position is the RL step.
        position = self.task_ids.get_state().get("next_index")
        expect = n if phase == "rl" else 0
        if position is not None and position != expect:
            return f"task stream is at batch {position}; {phase} step {n} has used {expect}"
        return None

    def _stop_if_broken(self, metrics: dict[str, Any]) -> None:
        """The first step after a restore: a non-finite loss or gradient stops the run before
        anything is saved over the restored step."""
        if self._just_restored is None:
            return
        why = checkpoint.nonfinite_after_restore(_floats(metrics), self._just_restored)
        self._just_restored = None
        if why is not None:
            raise RuntimeError(why)

    def _save(self, force: bool = False) -> None:
        meta = {"phase": self.phase, "step": self.step, "metrics_rows": self.metrics.rows}
        self.ckpt.maybe_save(self._global_step(), self.state, meta, data=self.task_ids,
                             force=force)

    def _global_step(self) -> int:
        return self.step + (self.cfg.sft_steps if self.phase == "rl" else 0)

    # --- phases --------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        history = []
        if self._complete():
            log.info("already complete: %s holds all %d RL steps; nothing to do (raise "
                     "steps, or pick another out_dir to start over)", self.out, self.cfg.steps)
            self._close()
            return history
        with logging_redirect_tqdm():  # log lines print above the progress bars
            if self.phase == "sft":
                history += self._sft()
            history += asyncio.run(self._rl())
        self._close()
        if jax.process_index() == 0:
            png = plots.plot_run(self.metrics.path, self.local / "metrics.png")
            log.info("done: %s; metrics %s, plots %s\n  export: python tools/export_hf.py %s "
                     "EXPORT_DIR\n  serve:  orchestrax serve --model EXPORT_DIR\n  eval:   "
                     "orchestrax eval --policy %s --tasks TASKS", self.cfg.name,
                     self.metrics.path, png, self.out, self.out)
        return history

    def _complete(self) -> bool:
        """Every RL step is done (a warm start with steps=0 is complete after its SFT)."""
        return self.phase == "rl" and self.step >= self.cfg.steps

    def _close(self) -> None:
        self.ckpt.close()
        self.metrics.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _sft(self) -> list[dict[str, Any]]:
        """Warm start on the environment's demonstrations (format and task, no preference) or on
        the JSONL trajectories of `sft_data`."""
        cfg = self.cfg
        # Token-mean whatever the RL phase aggregates by: a packed row holds several sequences,
        # and a per-row mean would weigh them as one.
        sft = rl.make_train_step(self.model_cfg,
                                 dataclasses.replace(cfg.grpo, objective="sft", num_minibatches=1,
                                                     temperature=1.0, kl_coef=0.0,
                                                     agg="token-mean"),
                                 cfg.sft_optim or cfg.optim, self.mesh, right_padded=True)
        self.state = sft.init(self.state.params) if self.step == 0 else self.state
        history = []
        shape = dict(seq_len=cfg.rollout.context_tokens, batch_size=cfg.sft_batch, seed=cfg.seed,
                     start=self.step)
        if cfg.sft_data:  # JSONL trajectories through grain, packed; each process its share
            batches = warmstart.jsonl_batches(cfg.sft_data, self.codec, workers=cfg.sft_workers,
                                              process_index=jax.process_index(),
                                              process_count=jax.process_count(), **shape)
            place = batching.from_process_rows
        else:  # the same batch on every process: each places its devices' rows
            demos = setup.demonstrations(self.env, self.train_tasks, self.tokenizer, cfg)
            batches = warmstart.demo_batches(demos, pad_id=setup.pad_id(self.codec), **shape)
            place = batching.from_global_rows
        bar = progress(cfg.sft_steps, self.step, "warm start")
        uncounted = None   # the metrics of the last step dispatched, not yet on the bar
        while self.step < cfg.sft_steps:
            batch = next(batches)
            self.state, metrics = sft.step(self.state, place(
                batch, rl.batch_shardings(batch, self.mesh)))
            self._stop_if_broken(metrics)
            self.step += 1
            # The bar counts a step once it has run, one step behind the dispatch (which returns
            # at once): counted at dispatch, it ran ahead to the next blocking row and waited
            # there, moving in jumps of ten steps.
            if uncounted is not None:
                _count(bar, uncounted)
            uncounted = metrics
            if self.step % 10 == 0 or self.step == cfg.sft_steps:
                row = {"phase": "sft", "step": self.step, **step_metrics(metrics)}
                history.append(self._log(row))
            self._save()
        if uncounted is not None:
            _count(bar, uncounted)
        bar.close()
        self._save(force=True)
        self.phase, self.step = "rl", 0
        self.state = self.update.init(self.state.params)
        return history

    async def _rl(self) -> list[dict[str, Any]]:
        await self.rollouts.start()
        try:
            return await self._rl_steps()
        finally:
            await self.rollouts.close()

    async def _rl_steps(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        history = []
        # Off the event loop (here and below: the update, checkpoint saves, the wait for a save
        # to commit, the metrics rows' all-gather): blocking work there stalls the loop's other
        # tasks, e.g. the SGLang client's health checks, whose timeouts then mark live servers
        # down. Each is awaited before the next, so every process still issues its collectives
        # in one order.
        await asyncio.to_thread(self._setup_reference)
        await self._publish_weights()
        if cfg.rollout.warm_sampler:   # the programs of the published weights (the compute copy)
            self.sampler.warm([self.episode_cfg.sampling])
        if self.step == 0 and cfg.eval_every:
            history.append(await asyncio.to_thread(self._log, await self._evaluate()))
        bar = progress(cfg.steps, self.step, "GRPO")
        while self.step < cfg.steps:
            t0 = time.perf_counter()
            # Each instance its own tool subset, sheet and P (Pairs_train), seeded
            tasks = [prepare_instance(self.train_tasks[i], self.env, split="train",
                                      seed=instance_seed(cfg.seed, self.train_tasks[i].task_id,
                                                         self.step), config=cfg.instances)
                     for i in next(self.task_ids)]
            groups, outcome = await self._rollout(tasks, cfg.rollout.group_size)
            t_roll = time.perf_counter() - t0
            # Published before the rollout: every turn should report this version.
            stale = rollouts.drop_stale((tr for gr in groups for tr in gr),
                                        str(self._global_step()))
            batch, stats = self.rollouts.make_batch(tasks, groups, outcome,
                                                    setup.pad_id(self.codec))
            stats |= stale | self._sampler_counters()
            self.sampler.drop_params()   # its copy is remade right after
            metrics = await asyncio.to_thread(self._update, batch)
            t_update = time.perf_counter() - t0 - t_roll
            self.step += 1
            await self._publish_weights()
            row = {"phase": "rl", "step": self.step, **stats, **metrics,
                   "time/rollout_s": t_roll, "time/update_s": t_update,
                   "time/step_s": time.perf_counter() - t0}
            history.append(await asyncio.to_thread(self._log, row))
            bar.set_postfix_str(console.bar_postfix(row), refresh=False)
            bar.update()
            # Eval before the checkpoint, so the checkpoint's row count holds the eval row and
            # a resumed run neither drops it nor evaluates again.
            if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.steps):
                # The final policy too. The row's all-gather waits for every process's share of
                # the eval, which may end far apart.
                history.append(await asyncio.to_thread(self._log, await self._evaluate()))
            await asyncio.to_thread(self._save)
        bar.close()
        await asyncio.to_thread(self._save, True)
        await self.sampler.aclose()
        return history

    def _update(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """One GRPO update on this process's rows of the step; returns its `train/` metrics once
        the update has finished (blocking: run it off the event loop)."""
        # The reference pass below takes the layout on trust; the step checks it only after.
        rl.check_right_padded(batch["attention_mask"], "the step's rollout batch")
        # Multi-process: the global batch from every process's own rows (padded on the right).
        batch = batching.from_process_rows(batch, rl.batch_shardings(batch, self.mesh))
        if self.ref_params is not None:
            batch["ref_logprobs"] = self._ref_logprobs(
                self.ref_params, batch["tokens"], batch["attention_mask"])
        self.state, metrics = self.update.step(self.state, batch)
        self._stop_if_broken(metrics)
        return step_metrics(metrics)   # waits for the update

    def _setup_reference(self) -> None:
        """With a KL term, the frozen reference is the policy RL started from (the warm-start
        result, or the loaded checkpoint); it is written once and re-read on resume."""
        self.ref_params = None
        if self.cfg.grpo.kl_coef <= 0:
            return
        path = self.out / "reference"  # absolute already; Orbax wants it so
        parallel.barrier("reference")  # every process sees the same answer to exists()
        # Frozen, so kept as the forward reads it (compute-dtype matrices): same logprobs as
        # the fp32 masters, half their memory.
        if path.exists():
            like = jax.eval_shape(functools.partial(models.compute_copy, self.model_cfg),
                                  self.state.params)
            like = jax.tree.map(lambda a, p: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                                  sharding=p.sharding),
                                like, self.state.params)
            self.ref_params = checkpoint.read_tree(path, like)
        else:
            self.ref_params = models.compute_copy(self.model_cfg, self.state.params)
            checkpoint.write_tree(path, self.ref_params)
        g, dp = self.cfg.grpo, rl.data_parallel_degree(self.mesh, parallel.DEFAULT_RULES)[0]

        def ref(p, t, m):   # a micro-batch of rows a pass (the step's memory), >= 1 a device
            b = t.shape[0]
            per = max(dp, b // (g.num_minibatches * g.num_microbatches))
            return rl.reference_logprobs(self.model_cfg, g, p, t, m,
                                         rows=per if b % per == 0 else b, right_padded=True)

        # Out on the batch's own row sharding, as the step takes it.
        rows = rl.batch_shardings({"tokens": np.zeros((1, 1))}, self.mesh)["tokens"]
        self._ref_logprobs = jax.jit(ref, out_shardings=rows)

    # --- pieces --------------------------------------------------------------------------------
    async def _rollout(self, tasks: Sequence[Task], group: int,
                       temperature: float | None = None,
                       on_done: Callable[[int], object] = rollouts.uncounted
                       ) -> tuple[list[list[Trajectory]], np.ndarray]:
        """G episodes per task, all in flight at once (up to rollout.max_in_flight); returns
        the groups and outcomes [Q, G]. `on_done(n)` as n more episodes finish."""
        cfg = self.episode_cfg
        if temperature is not None:
            cfg = dataclasses.replace(cfg, sampling=SamplingParams(
                temperature=temperature, top_p=cfg.sampling.top_p, top_k=cfg.sampling.top_k))
        # Each episode's sampling seed (its turns use seed + turn) comes from (run seed, step,
        # eval or train, episode), so a resumed run samples exactly what the crashed one would
        # have, whatever order requests reach the sampler in. The k tasks of one training group
        # (grpo.group_tasks) share their G seeds.
        train = temperature is None
        seeds = run_info.episode_seeds(self.cfg.seed, self._global_step(),
                                       0 if train else run_info.EVAL_SALT, len(tasks) * group,
                                       group=group,
                                       shared=self.cfg.grpo.group_tasks if train else 1)
        return await self.rollouts.rollout(tasks, group, cfg, seeds, on_done)

    async def _publish_weights(self) -> None:
        version = str(self._global_step())
        await self.sampler.publish(self.state.params, version)

    async def _evaluate(self) -> dict[str, Any]:
        """Rollouts on the eval split (greedy unless eval_temperature > 0): accuracy, cost,
        latency and the env's own stats."""
        # The checkpoint before it is whole before the eval's minutes.
        await asyncio.to_thread(self.ckpt.commit)
        tasks = list(self.eval_tasks)
        # Its own bar, erased when done (the row's line says how it went): an eval takes as
        # long as several steps, with no step bar moving.
        bar = progress(len(tasks) * self.cfg.eval_samples, 0, f"eval at step {self.step}",
                       unit="episode", leave=False)
        try:
            groups, outcome = await self._rollout(tasks, self.cfg.eval_samples,
                                                  temperature=self.cfg.eval_temperature,
                                                  on_done=bar.update)
        finally:
            bar.close()
        flat = [tr for gr in groups for tr in gr]
        row = {"phase": "eval", "step": self.step, "rollout/accuracy": float(outcome.mean()),
               "rollout/cost_mean": float(np.mean([tr.cost for tr in flat])),
               "rollout/latency_mean": float(np.mean([self.rollouts.clock_s(tr)
                                                      for tr in flat]))}
        known = {n for names in rollouts.task_tool_names(self.env, tasks) for n in names}
        return (row | rollouts.env_stats(self.env, tasks, groups) | rl.tool_totals(flat, known)
                | self._sampler_counters())

    def _sampler_counters(self) -> dict[str, float]:
        """Sampler requests, retries and failed requests since the previous row (a step's or an
        eval's rollouts): the trainer's own SGLang client (episodes on this event loop) plus the
        episode workers' clients (their counters come back with the episodes), or the embedded
        sampler's prefilled and cached prompt tokens: `sampler/<counter>`."""
        return {f"sampler/{k}": float(v) for k, v in self.rollouts.take_counters().items()}

    def _log(self, row: dict[str, Any]) -> dict[str, Any]:
        # Multi-process: rollout stats are each process's own episodes; one row for the run.
        row = combine_process_rows(parallel.allgather_json(row))
        self.metrics.write(row, self._global_step())
        total = {"sft": self.cfg.sft_steps, "rl": self.cfg.steps}.get(row["phase"])
        log.info(console.line(row, total, self._clock))
        for warning in console.degenerate(row):
            log.warning("step %d: %s", row["step"], warning)
        return row


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(np.asarray(v)) for k, v in jax.device_get(metrics).items()
            if np.asarray(v).size == 1}


def _count(bar, metrics: dict[str, Any]) -> None:
    """One finished SFT step on the bar (waits for its `metrics`), its loss in the postfix."""
    bar.set_postfix_str(console.bar_postfix({"phase": "sft", **step_metrics(metrics)}),
                        refresh=False)
    bar.update()


def step_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The train step's scalar metrics as row keys: `train/<name>`."""
    return {f"train/{k}": v for k, v in _floats(metrics).items()}


def train(cfg: TrainConfig) -> list[dict[str, Any]]:
    compile_cache.use_compile_cache(cfg.compile_cache_dir)
    return Trainer(cfg).run()

