"""configs/toolorchestra.py: one recipe at every scale, the official hyper-parameters, the
weighted task mixture and its shares in the metrics."""

import dataclasses
import pathlib

import grain
import numpy as np
import pytest

from orchestrax.envs.mixture import MixConfig, MixSource
from orchestrax.envs.qa import QAConfig
from orchestrax.envs.tau2 import Tau2Config
from orchestrax.train import setup
from orchestrax.train.train_config import TrainConfig
from orchestrax.train.overrides import load_config

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
SCALES = ("config", "config_one_h200", "config_multinode", "config_tpu", "config_rehearsal")


def _load(spec: str) -> TrainConfig:
    return load_config(str(CONFIGS / spec))


def test_every_scale_loads_from_any_directory_and_shares_the_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # configs import their siblings by path, not as a package
    cfgs = {name: _load(f"toolorchestra.py:{name}") for name in SCALES}
    full = cfgs["config"]
    # The official run: lr 1e-6, 16 tasks x 8 rollouts, clip 0.2/0.28, dual clip 10, KL 1e-4,
    # 24k context, 50 turns; SFT warm start, then GRPO on the mixture.
    assert full.optim.lr == 1e-6
    assert (full.rollout.tasks_per_step, full.rollout.group_size) == (16, 8)
    assert (full.grpo.clip_low, full.grpo.clip_high, full.grpo.dual_clip) == (0.2, 0.28, 10.0)
    assert full.grpo.kl_coef == 1e-4 and full.grpo.min_group_std == 0.1
    assert (full.rollout.context_tokens, full.rollout.max_turns) == (24_000, 50)
    assert full.sft_steps > 0 and full.steps > 0 and isinstance(full.env, MixConfig)
    assert full.instances.randomize is not None and full.instances.preferences
    llms = {c.name: c.role for c in full.tools.llms}
    assert {"math", "coder", "generalist"} == set(llms.values())
    assert full.tools.python is not None and full.tools.search is not None
    assert full.tools.web is not None
    # Scale changes sizes and endpoints, never the recipe.
    for name, c in cfgs.items():
        assert [c_.name for c_ in c.tools.llms] == list(llms), name
        assert (c.grpo.clip_low, c.grpo.clip_high, c.grpo.dual_clip, c.grpo.kl_coef,
                c.grpo.min_group_std, c.optim.lr) == (0.2, 0.28, 10.0, 1e-4, 0.1, 1e-6), name
        # The rehearsal caps each instance's tool subset at one tool (a size: its prompt).
        sizeless = dataclasses.replace(c.instances, randomize=dataclasses.replace(
            c.instances.randomize, max_tools=full.instances.randomize.max_tools))
        assert sizeless == full.instances and isinstance(c.env, MixConfig), name
        assert c.tools.sheet == full.tools.sheet and c.sft_steps > 0, name
    assert cfgs["config_tpu"].out_dir.startswith("gs://")
    assert _load("qwen3_tpu.py").out_dir.startswith("gs://")
    assert _load("qwen3_8b_gpu.py") == full  # no second recipe
    assert _load("qwen3_8b_gpu.py:config_one_h200") == cfgs["config_one_h200"]
    assert len(cfgs["config_multinode"].rollout.server_urls) == 16
    rehearsal = cfgs["config_rehearsal"]
    assert rehearsal.model is not None and rehearsal.tools.search.backend == "bm25"
    assert all(c.chat.base_url.startswith("http://127.0.0.1:") for c in rehearsal.tools.llms)


def _mix_config(shared_data) -> TrainConfig:
    ns = __import__("runpy").run_path(str(CONFIGS / "toolorchestra.py"))
    mix = ns["mixture"](None, tau2_domains=("retail",),
                        qa_sets=("bamboogle_125", "musique_500"), tool_share=0.5)
    return dataclasses.replace(ns["config_rehearsal"](), tools=None, env=mix)


def test_mixture_shares_show_in_the_metrics_within_ten_percent(shared_data):
    cfg = _mix_config(shared_data)
    env = setup.make_env(cfg)
    weights = dict(zip(env.names, env.weights))
    assert weights == pytest.approx({"tau2_retail": 0.5, "qa_bamboogle_125": 0.25,
                                     "qa_musique_500": 0.25})
    tasks = env.tasks("train")
    stream = iter(setup.task_stream(cfg, env, len(tasks)).to_iter_dataset(
        grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
    shares = {name: [] for name in env.names}
    for _ in range(20):
        step = [tasks[i] for i in next(stream)]
        stats = env.stats(step, [[] for _ in step])  # what the loop logs for the step
        for name in env.names:
            shares[name].append(stats[f"mix/{name}"])
    for name, w in weights.items():
        assert abs(np.mean(shares[name]) - w) <= 0.1 * w, (name, np.mean(shares[name]), w)
    # Each task goes to its own source: tau2 tasks get the domain's tools, QA tasks none here.
    by_source = {t.metadata["source"]: t for t in tasks}
    assert env.tools(by_source["tau2_retail"]) and not env.tools(by_source["qa_musique_500"])
    assert env.user_for(by_source["qa_bamboogle_125"]) is None


def test_bad_mixture_is_named():
    qa = QAConfig(path="x.jsonl")
    inner = MixConfig(sources=(MixSource(name="a", weight=1.0, env=qa),))
    for sources, match in (((), "non-empty tuple of MixSource"),
                           ((MixSource(name="a", weight=0.0, env=qa),), "'a' has weight=0.0"),
                           ((MixSource(name="a", weight=1.0, env=inner),),
                            "allowed: any env config but MixConfig"),
                           ((MixSource(name="a", weight=1.0, env=qa),) * 2, "repeat")):
        with pytest.raises(ValueError, match=match):
            MixConfig(sources=sources)
    with pytest.raises(TypeError, match="'domain'"):
        Tau2Config()


def test_mixture_is_epoch_correct_and_never_repeats_a_task_in_a_step():
    """A source smaller than a few steps' share: within each of its epochs every task appears
    at most once, no step holds a task twice, and each source's count stays within one task of
    its share at every step."""
    from orchestrax.data.tasks import mixture_stream
    sizes, weights, per_step = (5, 3, 40), (0.5, 0.25, 0.25), 4
    ds = mixture_stream(sizes, weights, per_step, seed=0)
    offsets = np.cumsum([0, *sizes])
    counts = np.zeros(3)
    draws = {s: [] for s in range(3)}
    for i in range(60):
        step = ds[i].tolist()
        assert len(step) == per_step and len(set(step)) == per_step, (i, step)
        for t in step:
            s = int(np.searchsorted(offsets, t, side="right") - 1)
            counts[s] += 1
            draws[s].append(t)
        target = (i + 1) * per_step * np.asarray(weights) / sum(weights)
        assert np.all(np.abs(counts - target) < 1 + 1e-9), (i, counts, target)
    # Source 0 (5 tasks, 2 a step): epochs of 4 (two steps), then the remainder is skipped.
    for e in range(0, len(draws[0]), 4):
        assert len(set(draws[0][e:e + 4])) == 4
    assert np.array_equal(ds[17], mixture_stream(sizes, weights, per_step, seed=0)[17])
    with pytest.raises(ValueError, match="mixture source 1 has 1 tasks"):
        mixture_stream((50, 1), (0.5, 0.5), 4, seed=0)[0]


def test_each_rehearsal_process_syncs_weights_to_its_own_server(monkeypatch):
    """Two trainer processes: each gets one rollout server of its own (and posts its weight
    updates there); one URL shared by both processes, as a router would be, is refused."""
    cfg = _load("toolorchestra.py:config_rehearsal")
    monkeypatch.setattr(setup.jax, "process_count", lambda: 2)
    shares = []
    for i in range(2):
        monkeypatch.setattr(setup.jax, "process_index", lambda i=i: i)
        shares.append(setup.server_share(cfg.rollout.server_urls))
    assert len(shares[0]) == len(shares[1]) == 1 and not set(shares[0]) & set(shares[1])
    with pytest.raises(ValueError, match="repeats .*each URL must appear once"):
        setup.server_share(("http://127.0.0.1:30500",) * 2)


def test_mixture_instances_draw_their_tools_from_the_shared_catalog(monkeypatch):
    """The recipe's mixture offers its sources' one catalog, so each training instance gets its
    own tool subset and training sheet (a mixture without a catalog gave every instance all
    tools); sources given different catalogs are refused."""
    from orchestrax.data.instances import prepare_instance
    from orchestrax.envs.mixture import MixtureEnv
    from orchestrax.tools.randomize import TOOL_CONFIG_KEY
    from orchestrax.tools.sheets import load_sheet

    monkeypatch.setenv("ORCHESTRAX_REHEARSAL_PORT", "40000")
    cfg = _load("toolorchestra.py:config_rehearsal")
    env = setup.make_env(cfg)
    names = sorted(t.name for t in cfg.tools.llms) + ["local_search", "python"]
    assert sorted(env.catalog) == sorted(names)
    task = env.tasks("train")[0]
    drawn = [prepare_instance(task, env, split="train", seed=s, config=cfg.instances)
             for s in range(6)]
    subsets = [tuple(sorted(t.spec.name for t in env.tools(i))) for i in drawn]
    assert len(set(subsets)) > 1 and all(set(s) <= set(names) and s for s in subsets)
    for inst, subset in zip(drawn, subsets):
        assert tuple(inst.metadata[TOOL_CONFIG_KEY]["tools"]) == subset
        assert load_sheet(inst.metadata[TOOL_CONFIG_KEY]["sheet"]).split == "train"
    (qa_name, qa_env), (other_name, other_env) = list(env._envs.items())[:2]
    other_env.catalog = {"python": qa_env.catalog["python"]}
    with pytest.raises(ValueError, match="different tool catalogs"):
        MixtureEnv([(qa_name, 1.0, qa_env), (other_name, 1.0, other_env)])


def test_the_context_check_measures_the_longest_prompt_the_run_can_build(monkeypatch):
    """The rehearsal offers one tool a training instance: its context must hold the longest
    train prompt (every train task, the catalog's longest schema, the longest Pairs_train
    instruction), not only the first task's, and, when the run evaluates, every eval instance
    with the whole catalog; the recipe at full size (no cap) measures the whole catalog."""
    from orchestrax import registry
    from orchestrax.agent import chat
    from orchestrax.agent.episode import prompt_messages
    from orchestrax.data.instances import prepare_instance
    from orchestrax.tools.randomize import instance_seed
    from orchestrax.train.train_config import check_context, largest_offer, longest_prompt

    monkeypatch.setenv("ORCHESTRAX_REHEARSAL_PORT", "40000")
    cfg = _load("toolorchestra.py:config_rehearsal")
    env, codec = setup.make_env(cfg), registry.build_codec(cfg.tokenizer)
    train = env.tasks("train")

    def tokens(task, specs):
        return len(codec.encode_prompt(chat.prompt_parts(prompt_messages(task), tools=specs,
                                                         enable_thinking=False)))

    # Instances as the run draws them (8 a task): none longer than the measured bound, which
    # is longer than the first task's prompt without an instruction (the check before).
    drawn = [prepare_instance(t, env, split="train", seed=s, config=cfg.instances)
             for t in train for s in range(8)]
    assert all(len(env.tools(i)) == 1 and i.preference_instruction for i in drawn)
    seen = max(tokens(i, [t.spec for t in env.tools(i)]) for i in drawn)
    longest, task_id = longest_prompt(cfg, env, codec, train, "train")
    first = tokens(train[0], largest_offer(env.tools(train[0]), env.catalog,
                                           cfg.instances.randomize, codec))
    assert seen <= longest < cfg.rollout.context_tokens and first < seen - 200
    assert longest - seen < 40 and task_id != train[0].task_id
    fits = dataclasses.replace(cfg.rollout, context_tokens=longest + 1)
    check_context(cfg.replace(rollout=fits), env, codec, train)
    with pytest.raises(ValueError, match=rf"^rollout.context_tokens={longest} cannot hold the "
                                         rf"prompt of train task '{task_id}', {longest} tokens "
                                         rf"before any reply; must be > {longest} \(longest "
                                         rf"prompts: train {longest}\)$"):
        check_context(cfg.replace(rollout=dataclasses.replace(fits, context_tokens=longest)),
                      env, codec, train)
    # Eval instances offer the whole catalog: a context that holds every train prompt does not
    # hold them.
    evals = [prepare_instance(t, env, split="eval", seed=instance_seed(cfg.seed, t.task_id),
                              config=cfg.instances) for t in env.tasks("eval")]
    eval_longest, eval_id = longest_prompt(cfg, env, codec, evals, "eval")
    assert eval_longest == max(tokens(i, [t.spec for t in env.tools(i)]) for i in evals)
    assert eval_longest > longest + 300
    with pytest.raises(ValueError, match=rf"cannot hold the prompt of eval task '{eval_id}', "
                                         rf"{eval_longest} tokens .* \(longest prompts: train "
                                         rf"{longest}, eval {eval_longest}\)$"):
        check_context(cfg.replace(rollout=fits), env, codec, train, evals)
    # Uncapped instances (the recipe at full size) show the whole catalog.
    task = train[0]
    uncapped = dataclasses.replace(cfg.instances, randomize=dataclasses.replace(
        cfg.instances.randomize, max_tools=None))
    assert largest_offer(env.tools(task), env.catalog, uncapped.randomize, codec) == [
        t.spec for t in env.tools(task)]
    whole = tokens(task, [t.spec for t in env.tools(task)])
    assert longest_prompt(cfg.replace(instances=uncapped), env, codec, [task], "train")[0] > whole
    with pytest.raises(ValueError, match=r"cannot hold the prompt of train task"):
        check_context(cfg.replace(rollout=fits, instances=uncapped), env, codec, [task])


def test_the_shipped_embedded_samplers_split_their_cache_all_the_way():
    """The embedded sampler's cache splits its kv heads over its mesh's axes where they divide
    them, and stays whole where not (`engine.cache_split_shortfall` says so when built). Each
    shipped config with an embedded sampler, on the devices its sampler's mesh holds
    (`embedded.sampler_mesh`: the params' mesh in one process, a process's own devices with
    several), splits them all the way; the CPU demo does not on more than 2 devices."""
    import jax

    from orchestrax import models, parallel
    from orchestrax.rollout.engine import cache_split_shortfall

    qwen3_8b = models.preset("qwen3-8b", dtype="bfloat16")   # 8 kv heads
    devices = jax.devices()
    for spec, mesh in (
            ("qwen3_8b_gpu.py:config_embedded", lambda c: parallel.make_mesh(c.mesh, devices[:8])),
            ("toolorchestra.py:config_one_h200", lambda c: parallel.make_mesh(c.mesh, devices[:1])),
            # a v5p host's 4 chips, one process each
            ("toolorchestra.py:config_tpu", lambda c: parallel.make_mesh(parallel.MeshConfig(),
                                                                          devices[:4]))):
        c = _load(spec)
        assert c.rollout.backend == "embedded", spec
        assert cache_split_shortfall(qwen3_8b, c.rollout.sampler_max_batch,
                                     c.rollout.context_tokens, mesh(c)) is None, spec
    for name in ("config", "config_multinode"):
        assert _load(f"toolorchestra.py:{name}").rollout.backend == "sglang", name
    # The CPU demo's tiny model has 2 kv heads: on more than 2 devices (the tests' 8) its cache
    # stays whole, a few MiB, and the sampler says so.
    demo = load_config(str(CONFIGS / "demo.py:config"))
    line = cache_split_shortfall(demo.model, demo.rollout.sampler_max_batch,
                                 demo.rollout.context_tokens, parallel.make_mesh(demo.mesh, devices))
    assert "stay whole on every device: 32.0 MiB a device instead of 4.0 MiB" in line, line
