"""What XLA makes of the shipped GPU configs on the cards they name, compiled on a CPU box.

Each shipped config's GRPO step, SFT step, reference pass and its embedded sampler's prefill /
decode (the continuous engine's slot steps, its state placed as the engine places it) are
lowered at the config's real shapes on abstract arguments and compiled for a GPU target that
is not there (an H200, or an 8xH100 node, from ../shared/gpu_targets/*.txtpb); the table gives
XLA's compiled memory per device (arguments, temporaries, their total with donated buffers
counted once), plus what stays on the device outside that compile ("held": the frozen KL
reference during the GRPO step; the train state and reference while the embedded sampler
runs), against the usable memory of the card, and what the optimized HLO holds: cuDNN
attention calls, big copies in the sampler's steps (a whole-cache or per-layer KV copy, a
layer's weight matrix copied out of stacked params: `hbm_traffic.copies`), collectives,
conditionals (each a host read of its predicate on XLA:GPU outside a CUDA graph), whether XLA warned of an "involuntary full rematerialization", and the HBM bytes
one execution moves, estimated from the optimized HLO (bench/hbm_traffic.py: XLA's
cost_analysis() is None for a deviceless GPU compile), with a decode step's ratio to its floor
(`decode_floor`: the weights and the K and V of the span it attends). The
`bench` rows are bench/gpu.py's train and sampler sections, built by its own code, on one H200:
what a lent GPU would run must fit before it is lent.

Setup, once (the CUDA compile plugin of the venv's JAX, and cuDNN, without which XLA refuses
to compile the cuDNN attention: "cuDNN not found"; no driver needed; kept out of the venv so
nothing else picks a CUDA backend; the plugin wheel is built per Python version, hence the
venv's own pip). 651 MB of wheels, 1.3 GB installed (jax 0.10.2: plugin + pjrt 402 MB, cuDNN
9.28 + CUDA runtime 906 MB), under a minute on a fast link:

    make xla-cuda      # XLA_CUDA=/opt/xla-cuda XLA_CUDNN=/opt/xla-cudnn by default

which runs, with V the venv's JAX version:

    .venv/bin/python -m pip install --no-deps --target /opt/xla-cuda \
      jax-cuda13-plugin==$V jax-cuda13-pjrt==$V
    .venv/bin/python -m pip install --no-deps --target /opt/xla-cudnn \
      nvidia-cudnn-cu13 nvidia-cuda-runtime

Run (the plugin directory is put on sys.path here; ~1-2 min per Qwen3-8B compile on 2 cores):

    python bench/gpu_compile.py                    # every case; appends the table to RESULTS.md
    python bench/gpu_compile.py --only one_h200    # cases whose name contains a word
    python bench/gpu_compile.py --smoke            # tiny model, both targets (a test runs it)

The kernel choice is explicit: models compile with `ModelConfig.attention="cudnn"` (the
default "auto" would read `jax.default_backend()`, which is the CPU here). Usable memory is the
card's size times XLA_PYTHON_CLIENT_MEM_FRACTION=0.95. What a deviceless compile cannot say:
times (no autotuning), and anything placed in pinned host memory (dropped).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import importlib
import importlib.util
import os
import pathlib
import re
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
PLUGIN_DIRS = os.environ.get("ORCHESTRAX_XLA_CUDA", "/opt/xla-cuda:/opt/xla-cudnn")
for _d in reversed(PLUGIN_DIRS.split(os.pathsep)):
    if os.path.isdir(_d) and _d not in sys.path:
        sys.path.insert(0, _d)
# The plugin checks the CUDA libraries of a machine that would run; this one only compiles.
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from orchestrax import models, parallel, rl  # noqa: E402
from orchestrax.rollout import engine as engine_mod  # noqa: E402

sys.path.insert(0, str(HERE))
import hbm_traffic  # noqa: E402

GIB = 2**30
MEM_FRACTION = 0.95
TARGET_DIR = pathlib.Path(os.environ.get("ORCHESTRAX_GPU_TARGETS",
                                         ROOT.parent / "shared" / "gpu_targets"))
if not TARGET_DIR.is_dir():
    TARGET_DIR = pathlib.Path("/work/shared/gpu_targets")
# target name -> (card's target config, devices on the node)
TARGETS = {"h200": ("h200.txtpb", 1), "8xh100": ("h100.txtpb", 8)}
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


@dataclasses.dataclass(frozen=True)
class Case:
    """One compile: `kind` of config `config` (module.function under configs/) on `devices`
    devices of `target`."""
    config: str
    target: str
    devices: int
    kind: str                  # grpo | sft | ref | prefill | prefill_rows | decode

    @property
    def name(self) -> str:
        return f"{self.config.split('.')[-1]}/{self.kind}@{self.devices}x{self.target[-4:]}"


def cases() -> list[Case]:
    """The shipped GPU configs: the 8-GPU node splits 4 trainer + 4 SGLang GPUs (`config`) or
    runs all 8 as trainer and embedded sampler (`config_embedded`); one H200 does both. Then
    bench/gpu.py's plan."""
    out = []
    for kind in ("grpo", "sft", "ref", "prefill", "prefill_rows", "decode"):
        out.append(Case("qwen3_8b_gpu.config_one_h200", "h200", 1, kind))
    for kind in ("grpo", "sft", "ref", "prefill", "prefill_rows", "decode"):
        out.append(Case("qwen3_8b_gpu.config_embedded", "8xh100", 8, kind))
    for kind in ("grpo", "ref"):
        out.append(Case("qwen3_8b_gpu.config", "8xh100", 4, kind))
    # bench/gpu.py's train and sampler sections, as a lent H200 would run them.
    for name, arg, _ in _bench_gpu().plan(smoke=False):
        if name in _bench_gpu().TRAIN_MODELS or name == "sampler":
            out.append(Case(f"gpu.{name}:{arg}", "h200", 1, "bench"))
    return out


@functools.cache
def _bench_gpu():
    spec = importlib.util.spec_from_file_location("bench_gpu", HERE / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- targets and abstract inputs ---------------------------------------------------------------
def target_devices(target: str, n: int):
    text_file, on_node = TARGETS[target]
    text = (TARGET_DIR / text_file).read_text()
    topo = topologies.get_topology_desc(platform="cuda", topology=f"1x{on_node}x1",
                                        target_config=text)
    memory = int(re.search(r"device_memory_size:\s*(\d+)", text).group(1))
    return list(topo.devices)[:n], memory * MEM_FRACTION


def abstract(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                        shardings)


def model_for(tc, smoke: bool) -> models.ModelConfig:
    """The config's model with the GPU kernels chosen explicitly."""
    if smoke:
        return models.tiny_config(dtype="bfloat16", remat=tc.remat, head_dim=32,
                                  attention="cudnn")
    if tc.model is not None:
        return tc.model.replace(attention="cudnn")
    name = pathlib.PurePath(tc.hf_path).name.lower()
    return models.preset(name, dtype=tc.dtype, remat=tc.remat, attention="cudnn")


def shapes_for(tc, kind: str, smoke: bool) -> dict:
    """Rows and lengths of one compile at the config's real sizes (smoke: tiny ones)."""
    r = tc.rollout
    rows = r.tasks_per_step * r.group_size
    seq = 64 * -(-r.context_tokens // 64)                 # rl.batch.bucket_len
    if smoke:
        rows, seq = 2 * tc.grpo.num_minibatches * tc.grpo.num_microbatches, 128
    max_len = r.context_tokens if not smoke else 256
    return {"rows": rows, "seq": seq, "sft_rows": tc.sft_batch if not smoke else rows,
            "slots": r.sampler_max_batch if not smoke else 8, "max_len": max_len}


# --- what is compiled --------------------------------------------------------------------------
def lower_case(case: Case, devices, smoke: bool):
    if case.kind == "bench":
        return _lower_bench(case, devices, smoke)
    mod_name, fn_name = case.config.rsplit(".", 1)
    tc = getattr(importlib.import_module(f"configs.{mod_name}"), fn_name)()
    cfg = model_for(tc, smoke)
    sh = shapes_for(tc, case.kind, smoke)
    mesh = parallel.make_mesh(tc.mesh, devices=devices)
    rows_spec = lambda nd: parallel.logical_to_spec(  # noqa: E731
        ("batch",) + (None,) * (nd - 1), mesh=mesh)
    row_sh, vec_sh = NamedSharding(mesh, rows_spec(2)), NamedSharding(mesh, rows_spec(1))
    p_shapes = jax.eval_shape(lambda: models.init_params(cfg))
    params = abstract(p_shapes, models.param_shardings(cfg, mesh))
    mat = lambda b, t, dt, s=row_sh: jax.ShapeDtypeStruct((b, t), dt, sharding=s)  # noqa: E731
    info = {"model": cfg, "tc": tc, "mesh": mesh, "shapes": sh}

    ref_params = abstract(jax.eval_shape(functools.partial(models.compute_copy, cfg),
                                         p_shapes), models.param_shardings(cfg, mesh))
    # Held on the device besides what a compile's arguments count: the frozen reference
    # (compute-dtype copy) with a KL term, and the train state while the sampler runs.
    held_ref = _device_bytes(ref_params) if tc.grpo.kl_coef > 0 else 0
    if case.kind in ("prefill", "prefill_rows", "decode"):
        # The train state stays on the device while the sampler runs.
        state = jax.eval_shape(lambda p: rl.init_state(p, tc.optim), p_shapes)
        info["held"] = held_ref + _device_bytes(abstract(
            state, rl.state_shardings(cfg, tc.optim, mesh)))
        # Traced as the sampler runs it: no mesh rules, its copy's layers unstacked.
        return _lower_engine(case.kind, cfg.replace(remat="none"), ref_params, sh, mesh, info)
    with parallel.activation_sharding(mesh):
        if case.kind in ("grpo", "sft"):
            sft = case.kind == "sft"
            # The warm start is plain SFT: no KL term, no reference.
            gcfg = (dataclasses.replace(tc.grpo, objective="sft", kl_coef=0.0) if sft
                    else tc.grpo)
            ocfg = (tc.sft_optim or tc.optim) if sft else tc.optim
            if sft:
                gcfg = dataclasses.replace(gcfg, num_minibatches=1)
            # Right-padded rows, as the trainer's batches are (rl.pack) and it says so.
            train = rl.make_train_step(cfg, gcfg, ocfg, mesh=mesh, right_padded=True)
            state = abstract(jax.eval_shape(lambda p: rl.init_state(p, ocfg), p_shapes),
                             train.shardings)
            b, t = (sh["sft_rows"] if sft else sh["rows"]), sh["seq"]
            batch = {"tokens": mat(b, t, jnp.int32), "attention_mask": mat(b, t, jnp.int32),
                     "loss_mask": mat(b, t, jnp.float32)}
            if sft:   # packed warm-start rows: segments and their own positions
                batch |= {"segment_ids": mat(b, t, jnp.int32), "positions": mat(b, t, jnp.int32)}
            else:     # what train/flow.py hands the step (old logprobs are recomputed)
                batch |= {"sampler_logprobs": mat(b, t, jnp.float32),
                          "advantages": jax.ShapeDtypeStruct((b,), jnp.float32, sharding=vec_sh),
                          "sample_mask": jax.ShapeDtypeStruct((b,), jnp.float32, sharding=vec_sh)}
                if gcfg.kl_coef > 0:
                    batch["ref_logprobs"] = mat(b, t, jnp.float32)
            info["rows"] = f"{b}x{t}, {gcfg.num_minibatches}x{gcfg.num_microbatches} micro"
            info["held"] = 0 if sft else held_ref
            fn = jax.jit(train.step, donate_argnums=0)
            return fn.lower(state, batch), info
        if case.kind == "ref":
            # As the loop runs it: the whole batch, a micro-batch of rows (>= 1 a device) a pass.
            b = sh["rows"]
            per = max(len(devices), b // (tc.grpo.num_minibatches * tc.grpo.num_microbatches))
            ids = mat(b, sh["seq"], jnp.int32)
            fn = jax.jit(lambda p, i, m: rl.reference_logprobs(cfg, tc.grpo, p, i, m, rows=per,
                                                               right_padded=True))
            info["rows"] = f"{b}x{sh['seq']}, {per} rows a pass"
            info["held"] = 0          # the reference is this compile's argument
            return fn.lower(ref_params, ids, ids), info


def _lower_engine(kind: str, scfg, sp, sh: dict, mesh, info: dict):
    """The continuous engine's own jitted steps over its slot cache, on the compute-dtype copy
    of the weights it gets at every weight sync (layers unstacked, as `sampler_copy` makes
    it), with the state placed as the engine places it on the params' mesh
    (`engine.state_shardings`: the cache's kv heads split over the GPUs)."""
    rep = NamedSharding(mesh, PartitionSpec())
    one = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=rep)  # noqa: E731
    stacked, sp = sp, unstacked(sp)
    slots, max_len = sh["slots"], sh["max_len"]
    st_shapes = jax.eval_shape(lambda: engine_mod.init_state(scfg, slots, max_len))
    st = abstract(st_shapes, engine_mod.state_shardings(scfg, slots, max_len, mesh))
    info["rows"] = f"continuous: {slots} slots x {max_len}"
    info["kv_layer_bytes"] = _device_bytes(st.k) // scfg.num_layers
    info["copy_bytes"] = _big_copy(stacked, info["kv_layer_bytes"], scfg.num_layers)
    if kind == "decode":
        info["floor_bytes"] = decode_floor(_device_bytes(sp), _device_bytes(st.k) * 2,
                                           max_len, max_len, 1)
    if kind in ("prefill", "prefill_rows"):
        # One row of a whole chunk, or the engine's batched dispatch of the most rows (the
        # most span read) at its largest chunk.
        eng = engine_mod.ContinuousEngine(scfg, None, max_batch=slots, max_len=max_len)
        rows, chunk = ((1, min(eng.prefill_chunk, max_len)) if kind == "prefill" else
                       max((p, c) for c, p in eng.batched_rows.items()))
        info["rows"] += f", {rows} x chunk {chunk}"

        def lower(rows):
            settings = jax.tree.map(lambda x: None if x is None else one(
                (rows,) + x.shape[1:], x.dtype), st_shapes._replace(k=None, v=None))
            at, on = one((rows,), jnp.int32), one((rows,), jnp.bool_)
            return engine_mod._prefill.lower(
                scfg, sp, st, at, one((rows, chunk), jnp.int32), one((rows, chunk), jnp.bool_),
                at, at, on, on, settings, n_top=0, span=max_len, filtering=True)
        if rows > 1:     # the peer: the same chunks a row a dispatch
            info["peer"] = (lower(1), rows)
        return lower(rows), info
    keep = one((slots,), jnp.bool_)
    info["rows"] += ", 1 step"
    return engine_mod._decode.lower(scfg, sp, st, keep, keep, n_steps=1, n_top=0,
                                    span=max_len, filtering=True), info


def _lower_bench(case: Case, devices, smoke: bool):
    """A bench/gpu.py section's step on one GPU as the section builds it (no mesh, no rules)."""
    gpu = _bench_gpu()
    name, arg = case.config.split(".", 1)[1].split(":")
    arg = int(arg)
    rep = NamedSharding(Mesh(devices, ("d",)), PartitionSpec())
    on = lambda tree: jax.tree.map(  # noqa: E731
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), tree)
    info = {"held": 0}
    if name in gpu.TRAIN_MODELS:
        cfg, gcfg, ocfg, b = gpu.train_setup(smoke, arg, gpu.TRAIN_MODELS[name])
        cfg = cfg.replace(attention="cudnn")
        train = rl.make_train_step(cfg, gcfg, ocfg, right_padded=True)
        p_shapes = jax.eval_shape(lambda: models.init_params(cfg))
        state = on(jax.eval_shape(lambda p: rl.init_state(p, ocfg), p_shapes))
        model = gpu.TRAIN_MODELS[name] if not smoke else f"tiny as {gpu.TRAIN_MODELS[name]}"
        info["rows"] = (f"{model}: {b}x{arg}, {gcfg.num_microbatches} micro, "
                        f"Adam moments {ocfg.mu_dtype or 'float32'}")
        return jax.jit(lambda s, x: train.step(s, x), donate_argnums=0).lower(
            state, on(gpu.train_batch(cfg, b, arg))), info
    # The decode step's attention reads a cache: the chunked path on any backend.
    cfg, prompt, new, chunk = gpu.sampler_setup(smoke, arg)
    max_len = chunk + new
    stacked = on(jax.eval_shape(lambda: models.init_params(cfg)))
    params = unstacked(stacked)
    st = on(jax.eval_shape(lambda: engine_mod.init_state(cfg, arg, max_len)))
    keep = jax.ShapeDtypeStruct((arg,), jnp.bool_, sharding=rep)
    info["rows"] = (f"continuous: {arg} slots x {max_len}, {gpu.SAMPLER_DECODE_STEPS} decode "
                    "steps")
    info["kv_layer_bytes"] = _device_bytes(st.k) // cfg.num_layers
    info["copy_bytes"] = _big_copy(stacked, info["kv_layer_bytes"], cfg.num_layers)
    info["floor_bytes"] = decode_floor(_device_bytes(params), 2 * _device_bytes(st.k), max_len,
                                       max_len, gpu.SAMPLER_DECODE_STEPS)
    return engine_mod._decode.lower(cfg, params, st, keep, keep,
                                    n_steps=gpu.SAMPLER_DECODE_STEPS, n_top=0,
                                    span=max_len, filtering=False), info


def unstacked(params):
    """Abstract params laid out as a sampler's copy (`models.unstack_layers`), each layer's
    arrays placed as the stacked ones were, less their layer axis."""
    layers = params["layers"]
    n = jax.tree.leaves(layers)[0].shape[0]
    one = lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=NamedSharding(  # noqa: E731
        x.sharding.mesh, PartitionSpec(*x.sharding.spec[1:])))
    return {**params, "layers": (jax.tree.map(one, layers),) * n}


def _big_copy(params, kv_layer_bytes: int, layers: int) -> int:
    """The size from which a copy in a sampler step counts as big: one layer's K (or V) of
    this device's cache, or its smallest weight matrix of one layer, whichever is smaller."""
    mats = [_device_bytes(x) // layers for x in jax.tree.leaves(params["layers"])
            if len(x.shape) >= 3]
    return min([kv_layer_bytes, *mats])


def decode_floor(weight_bytes: int, kv_bytes: int, span: int, max_len: int, steps: int) -> int:
    """HBM bytes `steps` decode steps must read at least: per step this device's weights
    (compute dtype) and the K and V of the `span` positions attended of every slot, every
    layer and this device's kv heads (`kv_bytes`: its whole K and V cache of `max_len`
    positions); the rest (a token a row written, logits) is negligible. The embedding table
    is counted whole although a step reads one row of it per slot."""
    return steps * (weight_bytes + kv_bytes * span // max_len)


def _device_bytes(tree) -> int:
    """Bytes of one device's shards of a tree of sharded ShapeDtypeStructs."""
    total = 0
    for x in jax.tree.leaves(tree):
        n = 1
        for d in x.sharding.shard_shape(x.shape):
            n *= d
        total += n * jnp.dtype(x.dtype).itemsize
    return total


@contextlib.contextmanager
def captured_stderr():
    """XLA logs (the remat warning among them) from C++ to fd 2: read them back."""
    with tempfile.TemporaryFile(mode="w+b") as f:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(f.fileno(), 2)
        out = {"text": ""}
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            out["text"] = f.read().decode(errors="replace")


_SHAPE = re.compile(r"=\s*(\w+)\[([\d,]*)\]")
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1,
          "f64": 8, "s64": 8}


def _result_bytes(line: str) -> int:
    m = _SHAPE.search(line)
    if not m:
        return 0
    n = 1
    for d in filter(None, m.group(2).split(",")):
        n *= int(d)
    return n * _BYTES.get(m.group(1), 4)


def _address_only(hlo: str) -> set[str]:
    """Computations of XLA:GPU's dynamic-slice fusions, whose lines are the inside of one
    kernel (a slice and its hero), not kernels of their own. (With a copy as the hero the
    kernel does move the slice: `hbm_traffic.copies` counts it.)"""
    names = set()
    for ln in hlo.splitlines():
        if '"dynamic_slice_fusion"' in ln:
            m = re.search(r"calls=(%[\w.\-]+)", ln)
            if m:
                names.add(m.group(1))
    return names


def hlo_facts(hlo: str, big_copy_bytes: int | None) -> dict:
    """Counts from the optimized HLO text: cuDNN custom calls, collectives and conditionals
    (static ops: those in the scanned layer body run once per layer), copies at least
    `big_copy_bytes` large (`hbm_traffic.copies`: kernels that only move data, a copy, a
    transpose or a (dynamic) slice of an operand, as an op or a fusion of any kind)."""
    skip, inside = _address_only(hlo), None
    lines = []
    for ln in hlo.splitlines():
        head = re.match(r"\s*(?:ENTRY\s+)?(%[\w.\-]+)\s*\(.*\{\s*$", ln)
        if head:
            inside = head.group(1)
        elif " = " in ln and inside not in skip:
            lines.append(ln)
    cudnn = sum(1 for ln in lines if "custom-call" in ln and "cudnn" in ln.lower())
    coll = {c: sum(1 for ln in lines if re.search(rf"\b{c}(-start)?\(", ln)) for c in COLLECTIVES}
    # The largest says whether one moves cache or weights, not just activations.
    coll_max = 0
    for ln in lines:
        m = re.search(rf" = (.*?)\b({'|'.join(COLLECTIVES)})(-start)?\(", ln)
        if m:   # an async start's result is a tuple: (operand, result)
            coll_max = max([coll_max, *(_result_bytes("= " + t) for t in
                                        re.findall(r"\w+\[[\d,]*\]", m.group(1)))])
    copies = [b for _, _, b in hbm_traffic.copies(hlo, big_copy_bytes)] if big_copy_bytes else []
    # XLA:GPU reads a conditional's predicate on the host (a sync) unless a CUDA graph runs it.
    conditionals = sum(1 for ln in lines if re.search(r"\bconditional\(", ln))
    return {"cudnn": cudnn, "collectives": {k: v for k, v in coll.items() if v},
            "collective_max_bytes": coll_max,
            "conditionals": conditionals,
            "big_copies": len(copies), "big_copy_bytes": sum(copies)}


def compile_case(case: Case, smoke: bool, options: dict | None = None) -> dict:
    """One case's row; `options` are XLA compiler options (DebugOptions fields, as the
    XLA_FLAGS of a run would set them: {"xla_gpu_...": value})."""
    devices, usable = target_devices(case.target, case.devices)
    t0 = time.perf_counter()
    lowered, info = lower_case(case, devices, smoke)
    with captured_stderr() as err:
        compiled = lowered.compile(compiler_options=options or None)
    seconds = time.perf_counter() - t0
    m = compiled.memory_analysis()
    total = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
             + m.temp_size_in_bytes)
    kv_layer = info.get("kv_layer_bytes")
    hlo = compiled.as_text()
    facts = hlo_facts(hlo, info.get("copy_bytes"))
    traffic = hbm_traffic.estimate(hlo)
    if "peer" in info:   # a batched prefill against its rows dispatched one by one
        peer, n = info["peer"]
        alone = n * hbm_traffic.estimate(peer.compile(compiler_options=options or None).as_text(
            )).total
        info["rows"] += (f" (HBM est. {traffic.total / alone:.2f}x that of {n} one-row "
                         f"dispatches, {alone / GIB:.1f} GiB)")
    remat = len(re.findall(r"[Ii]nvoluntary full rematerialization", err["text"]))
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        accessed = float(cost.get("bytes accessed", 0)) if cost else None
    except Exception:  # noqa: BLE001 - cost analysis is optional per backend
        accessed = None
    return {"case": case, "rows": info["rows"], "args": m.argument_size_in_bytes,
            "temps": m.temp_size_in_bytes, "total": total, "held": info["held"],
            "usable": usable, "fits": total + info["held"] <= usable, "remat_warnings": remat, "compile_s": seconds,
            "bytes_accessed": accessed, "kv_layer": kv_layer, "hbm": traffic,
            "floor": info.get("floor_bytes"), **facts}


# --- table -------------------------------------------------------------------------------------
HEADER = ("| case | shape | args GiB | temps GiB | total GiB | + held GiB | usable GiB | fits | "
          "cuDNN | "
          "big copies (sampler) | collectives (static ops) | involuntary remat | "
          "conditionals (static ops) | compile s | HBM GiB (est.) | x floor |")


def row(r: dict) -> str:
    coll = ", ".join(f"{k} {v}" for k, v in r["collectives"].items()) or "none"
    if r["collectives"]:
        coll += f" (largest {r['collective_max_bytes'] / 2**20:.1f} MiB)"
    copies = "-" if r["kv_layer"] is None else (
        f"{r['big_copies']} ({r['big_copy_bytes'] / GIB:.2f} GiB)")
    return (f"| {r['case'].name} | {r['rows']} | {r['args'] / GIB:.1f} | {r['temps'] / GIB:.1f} "
            f"| {r['total'] / GIB:.1f} | {r['held'] / GIB:.1f} | {r['usable'] / GIB:.1f} | "
            f"{'yes' if r['fits'] else '**NO**'} | {r['cudnn']} | {copies} | {coll} | "
            f"{r['remat_warnings'] or 'none'} | {r['conditionals']} | {r['compile_s']:.0f} | "
            f"{hbm_cells(r)} |")


def hbm_cells(r: dict) -> str:
    """Estimated HBM bytes per execution (bench/hbm_traffic.py) and their ratio to the decode
    floor; "+?" where a loop's trip count is unknown (counted once)."""
    t = r["hbm"]
    gib = lambda b: f"{b / GIB:.1f}" if b >= GIB else f"{b / GIB:.2g}"  # noqa: E731 - smoke
    est = gib(t.total) + ("+?" if t.unknown_trip_counts else "")
    ratio = f"{t.total / r['floor']:.2f} (floor {gib(r['floor'])})" if r["floor"] else "-"
    return f"{est} | {ratio}"


def top_lines(r: dict, n: int = 5) -> str:
    """A decode row's largest instructions by estimated bytes (a layer-loop one: all layers)."""
    kinds = ", ".join(f"{k} {b / GIB:.1f}" for k, b in hbm_traffic.by_kind(r["hbm"])[:4])
    return (f"  - {r['case'].name} top {n} by bytes: " + hbm_traffic.describe(r["hbm"], n)
            + f". By kind (GiB): {kinds}")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated words; a case runs when its "
                    "name contains one")
    ap.add_argument("--smoke", action="store_true", help="tiny model, real configs' layout")
    ap.add_argument("--results", default=str(HERE / "RESULTS.md"))
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--xla-flag", action="append", default=[], metavar="NAME=VALUE",
                    help="an XLA GPU option for every compile (xla_gpu_...=true), as XLA_FLAGS "
                    "would give it on the GPU machine; repeatable")
    args = ap.parse_args(argv)
    options = {}
    for flag in args.xla_flag:
        name, eq, value = flag.lstrip("-").partition("=")
        if not eq or not name.startswith("xla_"):
            raise SystemExit(f"--xla-flag {flag!r}; expected xla_NAME=VALUE")
        options[name] = {"true": True, "false": False}.get(value.lower(), value)
    words = [w for w in args.only.split(",") if w]
    todo = [c for c in cases() if not words or any(w in c.name for w in words)]
    if not todo:
        raise SystemExit(f"--only {args.only!r} matches no case; cases: "
                         f"{', '.join(c.name for c in cases())}")
    results, lines = [], [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    print(lines[0], flush=True)
    print(lines[1], flush=True)
    for case in todo:
        try:
            r = compile_case(case, args.smoke, options)
        except Exception as e:  # noqa: BLE001 - one failing compile is a row, not the end
            line = f"| {case.name} | FAILED: {type(e).__name__}: {str(e).splitlines()[0][:200]} |"
            print(line, flush=True)
            lines.append(line)
            continue
        results.append(r)
        lines.append(row(r))
        print(lines[-1], flush=True)
    tops = [top_lines(r) for r in results if r["floor"]]
    if tops:
        lines += ["", "HBM estimate, largest instructions (per execution):", "", *tops]
        print("\n".join(lines[-len(tops) - 2:]), flush=True)
    if not args.no_record:
        what = "smoke: tiny model" if args.smoke else "real shapes"
        with open(args.results, "a") as f:
            f.write(f"\n- {datetime.date.today().isoformat()} gpu_compile ({what}; deviceless "
                    f"compile for the GPU targets, XLA_PYTHON_CLIENT_MEM_FRACTION={MEM_FRACTION};"
                    f" {' '.join(['python bench/gpu_compile.py', *(argv or sys.argv[1:])])}):\n\n"
                    + "\n".join(lines) + "\n")
    return results


if __name__ == "__main__":
    main()
