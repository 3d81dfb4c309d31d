"""tools/export_hf.py: a drop-in Hugging Face directory (loads in transformers 4.x and 5.x,
stops at <|im_end|>, world-readable files) that never rewrites an export in place."""

import json
import os
import pathlib
import runpy
import stat
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from orchestrax import models
from orchestrax import registry
from orchestrax.train.checkpoint import Checkpointer
from orchestrax.train.setup import write_model_card

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "export_hf.py"
# A directory holding transformers at the project's lower bound (pip install --target DIR
# 'transformers==4.51.*' 'tokenizers<0.22' 'huggingface_hub<1' requests --no-deps); the load
# test in that version runs only where it is given.
LOWEST = os.environ.get("ORCHESTRAX_TRANSFORMERS_LOWEST")


def _params_that_end_at(cfg, params, token: int):
    """Attention and MLP outputs zeroed and one embedding coordinate made large, so the final
    hidden state points the same way at every position and the LM head puts `token` first."""
    params = dict(params)
    layers = dict(params["layers"])
    layers["o"] = np.zeros_like(layers["o"])
    layers["down"] = np.zeros_like(layers["down"])
    params["layers"] = layers
    embed = np.array(params["embed"])
    embed[:, 0] = 50.0
    params["embed"] = embed
    head = np.array(params["lm_head"])
    head[0, :] = 0.0
    head[0, token] = 10.0
    params["lm_head"] = head
    return jax.tree.map(jnp.asarray, params)


def make_run(run: pathlib.Path, *, seed: int = 0, ends_at_im_end: bool = False):
    cfg = models.tiny_config(vocab_size=512, hidden_size=32, intermediate_size=64,
                             num_heads=2, num_kv_heads=1, head_dim=16, tie_embeddings=False)
    tok = registry.build_tokenizer("tiny")
    params = models.init_params(cfg, seed)
    if ends_at_im_end:
        params = _params_that_end_at(cfg, params, tok.convert_tokens_to_ids("<|im_end|>"))
    write_model_card(run / "model", cfg, tok)
    ckpt = Checkpointer(run / "checkpoints", every=1)
    ckpt.maybe_save(1, {"params": params}, {"phase": "rl", "step": 1}, force=True)
    ckpt.close()
    return cfg, tok


def export(*args, **kwargs):
    return runpy.run_path(str(SCRIPT))["export"](*args, **kwargs)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    _, tok = make_run(root / "run", ends_at_im_end=True)
    return export(str(root / "run"), str(root / "hf")), tok


def test_export_names_qwen3_stop_tokens_and_is_world_readable(exported):
    out, tok = exported
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    hf = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    assert (hf["eos_token_id"], hf["bos_token_id"]) == (im_end, eot)
    assert gen["eos_token_id"] == [im_end, eot] and gen["pad_token_id"] == eot
    assert (gen["temperature"], gen["top_k"], gen["top_p"]) == (0.6, 20, 0.95)
    conf = json.loads((out / "tokenizer_config.json").read_text())
    assert conf["tokenizer_class"] == "PreTrainedTokenizerFast"
    for f in [out, *out.iterdir()]:
        assert os.stat(f).st_mode & stat.S_IROTH, f
    assert os.stat(out).st_mode & stat.S_IXOTH


LOAD_AND_GENERATE = r"""
import sys, torch, transformers
out = sys.argv[1]
tok = transformers.AutoTokenizer.from_pretrained(out)
model = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
ids = tok("hello there", return_tensors="pt").input_ids
new = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:].tolist()
print(transformers.__version__, tok.convert_ids_to_tokens(new))
"""


def _load_and_generate(out, extra_path=None):
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([extra_path, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", LOAD_AND_GENERATE, str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def test_export_loads_and_stops_at_im_end_in_installed_transformers(exported):
    line = _load_and_generate(exported[0])
    assert line.endswith("['<|im_end|>']"), line


@pytest.mark.skipif(not LOWEST, reason="set ORCHESTRAX_TRANSFORMERS_LOWEST to a --target dir "
                                       "holding transformers 4.51")
def test_export_loads_and_stops_at_im_end_in_lowest_transformers(exported):
    line = _load_and_generate(exported[0], LOWEST)
    assert line.startswith("4.51") and line.endswith("['<|im_end|>']"), line


def test_export_keeps_the_source_models_generation_config(tmp_path):
    cfg, tok = make_run(tmp_path / "run")
    own = {"eos_token_id": [7, 8], "temperature": 0.7}
    (tmp_path / "run" / "model" / "generation_config.json").write_text(json.dumps(own))
    (tmp_path / "run" / "train_config.json").write_text('{"rollout": {}}')
    out = export(str(tmp_path / "run"), str(tmp_path / "hf"))
    assert json.loads((out / "generation_config.json").read_text()) == own
    # The run's settings travel with the export, so eval of the export uses them.
    assert (out / "train_config.json").read_text() == '{"rollout": {}}'


def test_a_non_empty_export_is_replaced_only_with_overwrite_and_never_in_place(tmp_path):
    make_run(tmp_path / "a", seed=0)
    make_run(tmp_path / "b", seed=1)
    out = export(str(tmp_path / "a"), str(tmp_path / "hf"))
    weights = out / "model.safetensors"
    first = weights.read_bytes()
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "b"), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "--overwrite" in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert weights.read_bytes() == first
    with open(weights, "rb") as live:  # what a server holding the old export has open
        export(str(tmp_path / "b"), str(out), overwrite=True)
        assert live.read() == first
    assert weights.read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "hf"]  # no temp dirs left


def test_export_refuses_to_write_over_the_run(tmp_path):
    make_run(tmp_path / "run")
    script = runpy.run_path(str(SCRIPT))
    with pytest.raises(script["ExportError"], match="would replace files of the run"):
        script["export"](str(tmp_path / "run"), str(tmp_path / "run" / "model"), overwrite=True)


def test_orchestrax_export_is_the_same_command_in_the_one_config_dialect(tmp_path, capsys):
    """`orchestrax export RUN OUT --dtype bfloat16` and its --set form write the same export
    as tools/export_hf.py; the positional directories are shorthands of ExportCommand's
    fields."""
    from orchestrax.cli import build_parser, command_config, main
    from orchestrax.train.export import ExportCommand

    make_run(tmp_path / "run")
    args = build_parser().parse_args(["export", str(tmp_path / "run"), str(tmp_path / "a"),
                                      "--dtype", "bfloat16", "--step", "1"])
    sets = build_parser().parse_args(["export", "--set", f"run_dir={tmp_path / 'run'}",
                                      "--set", f"out_dir={tmp_path / 'a'}",
                                      "--set", "dtype=bfloat16", "--set", "step=1"])
    want = ExportCommand(run_dir=str(tmp_path / "run"), out_dir=str(tmp_path / "a"),
                         dtype="bfloat16", step=1)
    assert command_config(args) == command_config(sets) == want
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "a"), "--dtype",
                 "bfloat16"]) == 0
    export(str(tmp_path / "run"), str(tmp_path / "b"), dtype="bfloat16")
    assert ((tmp_path / "a" / "model.safetensors").read_bytes()
            == (tmp_path / "b" / "model.safetensors").read_bytes())
    # a user error is one line naming what to do, as from every command
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "a")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]   # (in-process: log lines above)
    assert last.startswith("orchestrax export: error:") and "--overwrite" in last
    assert main(["export", str(tmp_path / "run")]) == 2
    assert "ExportCommand.out_dir=''; must be given (OUT_DIR)" in capsys.readouterr().err
