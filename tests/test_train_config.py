"""Config validation at start: every bad value is refused before any compute, naming the field,
the value and what is allowed."""

import dataclasses
import json
import pathlib
import runpy

import jax.numpy as jnp
import pytest

from orchestrax import models
from orchestrax.envs.routing import RoutingConfig
from orchestrax.envs.tau2 import Tau2Config
from orchestrax.envs.tau2.domain import load_domain
from orchestrax.rl import GRPOConfig, OptimizerConfig
from orchestrax import checks
from orchestrax.train.train_config import (RolloutConfig, TrainConfig, check_env_fits,
                                     check_master_weights)
from orchestrax.train.loop import Trainer
from orchestrax.train.overrides import apply_overrides

ROOT = pathlib.Path(__file__).resolve().parents[1]
RETAIL = pathlib.Path("/work/shared/data/tau2/retail")


def demo() -> TrainConfig:
    return runpy.run_path(str(ROOT / "configs" / "demo.py"))["config"]()


@pytest.mark.parametrize("override, message", [
    ("steps=abc", "steps='abc'; expected an int"),
    ("optim.lr=fast", "optim.lr='fast'; expected a finite number"),
    ("optim.lr=inf", "optim.lr=inf; expected a finite number"),
    ("rollout.group_size=2.5", "rollout.group_size=2.5; expected an int"),
    ("resume=maybe", "resume='maybe'; expected True or False"),
    ("checkpoint_every=2.5", "checkpoint_every=2.5; expected an int"),
    ("steps=True", "steps=True; expected an int"),
    ("sft_optim.weight_decay=[1]", r"sft_optim.weight_decay=\(1,\); expected a finite number"),
    ("mesh.axes=(('data', 1.5),)", r"mesh.axes\[0\]\[1\]=1.5; expected an int"),
    ("rollout.server_urls=('a', 3)", r"rollout.server_urls\[1\]=3; expected a string"),
    ("init_from=3", None),  # a str | None field takes the text itself: "3"
    ("eval_every=-1", "TrainConfig.eval_every=-1; must be >= 0"),
    ("rollout.group_size=1", "RolloutConfig.group_size=1; GRPO needs >= 2"),
    ("grpo.clip_low=1.5", r"GRPOConfig.clip_low=1.5; must be in \[0, 1\)"),
    ("dtype=float16", "TrainConfig.dtype='float16'; allowed"),
    ("rollout.groupsize=4", "RolloutConfig has no field 'groupsize'"),
    ("grpo.temperature=0.5", "grpo.temperature=0.5 differs from rollout.temperature=0.7"),
])
def test_override_errors_name_field_value_and_rule(override, message):
    if message is None:
        assert apply_overrides(demo(), [override]).init_from == "3"
        return
    with pytest.raises(ValueError, match=message):
        apply_overrides(demo(), [override])


def test_overrides_apply_together():
    # Each alone breaks the temperature invariant; together they are one consistent change.
    cfg = apply_overrides(demo(), ["rollout.temperature=0.5", "grpo.temperature=0.5",
                                   "optim.lr=2e-4", "name=7"])
    assert (cfg.rollout.temperature, cfg.grpo.temperature, cfg.optim.lr) == (0.5, 0.5, 2e-4)
    assert cfg.name == "7"
    # model -> hf_path in one override (exactly one of them may be set); and explicitly.
    cfg = apply_overrides(demo(), ["hf_path=/ckpt/qwen3", "tokenizer=/ckpt/qwen3"])
    assert cfg.model is None and cfg.hf_path == "/ckpt/qwen3"
    assert apply_overrides(demo(), ["model=None", "hf_path=/c"]).hf_path == "/c"
    with pytest.raises(ValueError, match="exactly one of model"):
        apply_overrides(demo(), ["model=None"])
    with pytest.raises(ValueError, match="'sft_optim' is also set as a whole"):
        apply_overrides(demo(), ["sft_optim=None", "sft_optim.lr=1e-3"])
    with pytest.raises(ValueError, match="sft_optim is None, not a config with fields"):
        apply_overrides(demo().replace(sft_optim=None), ["sft_optim.lr=1e-3"])
    with pytest.raises(ValueError, match="expected key=value"):
        apply_overrides(demo(), ["steps"])


def test_bf16_master_weights_are_refused():
    bf16 = models.tiny_config(param_dtype="bfloat16")
    with pytest.raises(ValueError, match="model.param_dtype='bfloat16'; training needs float32"):
        TrainConfig(name="x", model=bf16, steps=1)
    # Inference-only (steps = sft_steps = 0) may keep bf16 weights; bf16 compute is fine.
    TrainConfig(name="x", model=bf16, steps=0)
    TrainConfig(name="x", model=models.tiny_config(dtype="bfloat16"), steps=1)
    cfg = TrainConfig(name="x", hf_path="/ckpt", dtype="bfloat16", steps=1)
    params = {"embed": jnp.zeros((2, 2), jnp.bfloat16), "norm": jnp.zeros((2,), jnp.float32)}
    with pytest.raises(ValueError, match="hf_path='/ckpt' with dtype='bfloat16' gives bfloat16"):
        check_master_weights(cfg, params)
    check_master_weights(cfg, {"embed": jnp.zeros((2, 2), jnp.float32)})


@pytest.mark.parametrize("field, value", [("top_p", 0.8), ("top_k", 20)])
def test_truncated_sampling_is_refused_for_training(field, value):
    rollout = RolloutConfig(**{field: value})
    with pytest.raises(ValueError, match=f"rollout.{field}={value}; training rollouts must "
                                         "sample the full softmax"):
        TrainConfig(name="x", model=models.tiny_config(), rollout=rollout)
    TrainConfig(name="x", model=models.tiny_config(), rollout=rollout, steps=0)


def tiny(tmp_path, **changes) -> TrainConfig:
    return TrainConfig(
        name="t", out_dir=str(tmp_path),
        model=models.tiny_config(vocab_size=512, hidden_size=32, intermediate_size=64,
                                 num_heads=2, num_kv_heads=1, head_dim=16),
        grpo=GRPOConfig(), optim=OptimizerConfig(lr=1e-3, total_steps=100),
        rollout=RolloutConfig(group_size=2, tasks_per_step=2, context_tokens=768),
        env=RoutingConfig(num_train=16, num_eval=4), sft_steps=4, steps=2, **changes)


def test_env_and_paths_checked_before_any_compute(tmp_path):
    too_many = tiny(tmp_path).replace(rollout=RolloutConfig(group_size=2, tasks_per_step=1000))
    with pytest.raises(ValueError, match=r"rollout.tasks_per_step=1000; the RoutingConfig env has "
                                         r"16 train tasks.*allowed 1..16"):
        Trainer(too_many)
    with pytest.raises(FileNotFoundError, match="TrainConfig.tokenizer='/nonexistent/tok': not a "
                                                "tokenizer directory"):
        Trainer(tiny(tmp_path, tokenizer="/nonexistent/tok"))
    with pytest.raises(FileNotFoundError, match="TrainConfig.hf_path='/nonexistent': no "
                                                "config.json"):
        Trainer(tiny(tmp_path).replace(model=None, hf_path="/nonexistent"))
    with pytest.raises(FileNotFoundError, match=r"TrainConfig.sft_data: \['/nope.jsonl'\] do "
                                                "not exist"):
        Trainer(tiny(tmp_path, sft_data=("/nope.jsonl",)))
    # Nothing was computed or written: the checks come before the params and checkpoints.
    assert not (tmp_path / "checkpoints").exists()
    with pytest.raises(ValueError, match="eval_every=10 but"):
        check_env_fits(tiny(tmp_path, eval_every=10), 16, 0)


def test_an_eval_over_no_tasks_is_refused_at_start(tmp_path):
    """A warm start (steps=0) still runs its final eval, and each process of a multi-process run
    evaluates its share: an empty one would log NaN accuracy, so the config is refused."""
    warm = tiny(tmp_path, eval_every=5).replace(steps=0)
    with pytest.raises(ValueError, match=r"^TrainConfig.eval_every=5 but the RoutingConfig env "
                                         r"has no eval tasks; set eval_every=0 or give"):
        check_env_fits(warm, 16, 0)
    with pytest.raises(ValueError, match=r"has 1 eval task\(s\) for 2 processes \(each "
                                         r"evaluates its share\)"):
        check_env_fits(tiny(tmp_path, eval_every=1), 16, 1, processes=2)
    check_env_fits(warm, 16, 2, processes=2)                      # one task each
    check_env_fits(warm.replace(eval_every=0), 16, 0)  # no eval: nothing to refuse


def test_tau2_config_and_db_errors_are_clear(tmp_path):
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'domain'"):
        Tau2Config()
    with pytest.raises(ValueError, match="Tau2Config.domain=''; give the path"):
        Tau2Config(domain=" ")
    if not RETAIL.is_dir():
        pytest.skip("tau2 data not mounted")
    dom = tmp_path / "retail"
    dom.mkdir()
    for f in ("tasks.json", "policy.md"):
        (dom / f).symlink_to(RETAIL / f)
    db = dom / "db.json"
    db.write_text((RETAIL / "db.json").read_text()[:5000])
    with pytest.raises(ValueError, match=r"retail/db.json: not valid JSON at line \d+ column \d+ "
                                         r".*may be truncated"):
        load_domain(dom)
    db.write_text(json.dumps({"users": {}, "products": {}}))
    with pytest.raises(ValueError, match="retail DB needs the 'orders' table"):
        load_domain(dom)
    db.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="top level is a list; expected a dict"):
        load_domain(dom)
    db.write_text(json.dumps({"users": {}, "products": {}, "orders": {"o1": 5}}))
    with pytest.raises(ValueError, match="a record does not have the tau2 retail shape"):
        load_domain(dom)


def test_validator_reads_hints():
    @dataclasses.dataclass(frozen=True)
    class Inner:
        k: int

    @dataclasses.dataclass(frozen=True)
    class Outer:
        a: float | None
        b: tuple[tuple[str, int], ...]
        c: Inner | None

    checks.check_fields(Outer(a=1, b=(("x", 1),), c=None))
    checks.check_fields(Outer(a=None, b=(), c=Inner(k=2)))
    for bad, message in [(Outer(a="1", b=(), c=None), "a='1'; expected a finite number or None"),
                         (Outer(a=1.0, b=(("x",),), c=None), r"b\[0\]=\('x',\); expected a "
                                                               r"tuple of 2 \(a string, an int\)"),
                         (Outer(a=1.0, b=(), c=Inner(k=1.5)), "c.k=1.5; expected an int"),
                         (Outer(a=float("nan"), b=(), c=None), "a=nan")]:
        with pytest.raises(ValueError, match=message):
            checks.check_fields(bad)


def test_a_gs_out_dir_stays_gs_and_makes_no_local_gs_folder(tmp_path, monkeypatch):
    """configs/qwen3_tpu.py writes under gs://: checkpoints (Orbax) get the gs:// path, the
    files that need a local file system a mirror under ~/.cache; nothing contacts GCS."""
    from etils import epath
    from orchestrax.train import train_config, run_info
    from orchestrax.train.checkpoint import Checkpointer
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    tpu = runpy.run_path(str(pathlib.Path(__file__).parents[1] / "configs" / "qwen3_tpu.py"))
    assert tpu["config"]().out_dir.startswith("gs://")
    cfg = dataclasses.replace(tpu["config"](), out_dir="gs://bucket/run")
    out = train_config.check_out_dir(cfg)
    assert isinstance(out, epath.Path) and str(out) == "gs://bucket/run"
    assert str(out / "checkpoints") == "gs://bucket/run/checkpoints"
    # Checkpointer builds Orbax's manager (which would reach the bucket): only its path here.
    assert str(run_info.out_path(out / "checkpoints")) == "gs://bucket/run/checkpoints"
    local = run_info.local_dir(cfg.out_dir)
    assert local == tmp_path / "home/.cache/orchestrax/runs/gs/bucket/run" and local.is_dir()
    assert not any(p.name.startswith("gs:") for p in tmp_path.rglob("*")), \
        sorted(map(str, tmp_path.rglob("*")))
    # A local out_dir is its own local directory, absolute, and Orbax's path too.
    here = dataclasses.replace(cfg, out_dir="runs/x")
    assert str(train_config.check_out_dir(here)) == str(run_info.local_dir("runs/x")) == \
        str(tmp_path / "runs/x")
    ckpt = Checkpointer("runs/x/checkpoints", every=1)
    assert str(ckpt.directory) == str(tmp_path / "runs/x/checkpoints")
    ckpt.close()


def test_processes_sharing_an_out_dir_check_it_at_once(tmp_path):
    """The trainer processes of one run check the same out_dir as they start: each probe is
    its own file, so one's clean-up never removes another's (a common probe name failed the
    two-process trainer with 'No such file or directory')."""
    import concurrent.futures

    from orchestrax.train import train_config
    cfg = TrainConfig(name="x", out_dir=str(tmp_path / "run"), model=models.tiny_config())
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda _: train_config.check_out_dir(cfg), range(800)))
    assert {str(o) for o in outs} == {str(tmp_path / "run")}
    assert list((tmp_path / "run").iterdir()) == []  # no probe left behind
