"""bench/hbm_traffic.py's kernel-boundary HBM estimate against bytes worked out by hand, on
small programs compiled for this CPU and on hand-written GPU-style HLO."""

import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import hbm_traffic  # noqa: E402

F32 = jnp.float32


def _estimate(fn, *args, donate=()):
    return hbm_traffic.estimate(jax.jit(fn, donate_argnums=donate).lower(*args).compile()
                                .as_text())


def test_matmul_reads_both_operands_and_writes_its_output():
    t = _estimate(lambda a, b: a @ b, jnp.ones((64, 128), F32), jnp.ones((128, 32), F32))
    # (64x128 + 128x32) f32 read, 64x32 f32 written
    assert (t.read, t.written) == (4 * (8192 + 4096), 4 * 2048)
    assert t.total == 57344


def test_in_place_update_counts_the_update_not_the_buffer():
    buf, row = jnp.ones((1024, 256), F32), jnp.ones((1, 256), F32)
    dus = lambda b, u, i: jax.lax.dynamic_update_slice(b, u, (i, 0))  # noqa: E731
    t = _estimate(dus, buf, row, jnp.int32(3), donate=0)
    # the 1 KiB row and the s32 index read, the row written: not the 1 MiB buffer
    assert (t.read, t.written) == (1024 + 4, 1024)
    # Not donated, XLA copies the buffer first (1 MiB read + 1 MiB written), then updates it.
    t = _estimate(dus, buf, row, jnp.int32(3))
    assert t.total == 2 * 2**20 + 2052


def test_in_place_scatter_counts_the_updates():
    cache = jnp.ones((4, 512, 64), F32)            # 512 KiB
    t = _estimate(lambda c, u, r: c.at[jnp.arange(4), r].set(u), cache,
                  jnp.ones((4, 64), F32), jnp.zeros((4,), jnp.int32), donate=0)
    # the scatter: 4x64 f32 updates + s32[4,2] indices read, the updates written (2080); the
    # indices built from iota and r: r read, s32[4,2] written (48)
    assert t.total == 2080 + 48, t.items
    assert t.total < 4096


def test_loop_with_known_trip_count_multiplies_its_body():
    t = _estimate(lambda x: jax.lax.fori_loop(0, 10, lambda i, x: x * 2 + 1, x),
                  jnp.ones((256,), F32))
    # body: 1 KiB read + 1 KiB written, 10 times; the counter's add (s32 + s32 -> s32, 12 B) and
    # the condition's compare (9 B), 10 times; the entry copies x (2 KiB) and the counter (8 B)
    assert t.unknown_trip_counts == 0
    assert t.total == 10 * 2048 + 10 * (12 + 9) + 2048 + 8
    # a while loop whose trip count depends on data counts once and says so
    t = _estimate(lambda x: jax.lax.while_loop(lambda x: x[0] < 100, lambda x: x * 2 + 1, x),
                  jnp.ones((256,), F32))
    assert t.unknown_trip_counts == 1


GPU_STYLE = """HloModule m, entry_computation_layout={(f32[8,1024]{1,0}, s32[], pred[])->f32[1,1024]{1,0}}

%fused_slice (p0: f32[8,1024], p1: s32[]) -> f32[1,1024] {
  %p0 = f32[8,1024]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %c = s32[] constant(0)
  %ds = f32[1,1024]{1,0} dynamic-slice(%p0, %p1, %c), dynamic_slice_sizes={1,1024}
  ROOT %n = f32[1,1024]{1,0} negate(%ds)
}

%big (a: f32[8,1024]) -> f32[8,1024] {
  %a = f32[8,1024]{1,0} parameter(0)
  ROOT %g = (f32[8,1024]{1,0}, s8[4096]{0}) custom-call(%a, %a), custom_call_target="__cublas$gemm"
}

%small (b: f32[8,1024]) -> f32[8,1024] {
  %b = f32[8,1024]{1,0} parameter(0)
  ROOT %t = f32[8,1024]{1,0} copy(%b)
}

ENTRY %main (a: f32[8,1024], i: s32[], p: pred[]) -> f32[1,1024] {
  %a = f32[8,1024]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %p = pred[] parameter(2)
  %cond = f32[8,1024]{1,0} conditional(%p, %a, %a), true_computation=%big, false_computation=%small
  ROOT %f = f32[1,1024]{1,0} fusion(%cond, %i), kind=kLoop, calls=%fused_slice
}
"""


def test_slice_reads_conditional_branches_and_workspace():
    t = hbm_traffic.estimate(GPU_STYLE)
    # fusion: one 4 KiB row of the 32 KiB operand read (+ the s32 index), the row written
    # conditional: the larger branch, a gemm reading 2 x 32 KiB and writing 32 KiB, its s8
    # workspace not counted (the copy branch: 64 KiB)
    assert dict((name, b) for name, _, b, _ in t.items) == {
        "main/f": 4096 + 4 + 4096, "big/g": 3 * 32768}
    assert t.total == 8196 + 98304
    assert hbm_traffic.describe(t, 1) == ("big/g (custom-call __cublas$gemm -> "
                                          "(f32[8,1024], s8[4096]), x1) 0.09 MiB")


# A prefill's attention input as XLA:GPU fused it: the last row's chunk written into the
# layer cache again inside the fusion (its in-place write is another fusion), then two rows
# gathered out of the updated buffer and padded.
REDERIVED = """HloModule m, entry_computation_layout={(f32[64,1024]{1,0}, f32[1,1024]{1,0}, s32[2,1]{1,0}, s32[])->f32[2,1,1280]{2,1,0}}

%fused_gather (c: f32[64,1024], u: f32[1,1024], r: s32[2,1], i: s32[]) -> f32[2,1,1280] {
  %c = f32[64,1024]{1,0} parameter(0)
  %u = f32[1,1024]{1,0} parameter(1)
  %r = s32[2,1]{1,0} parameter(2)
  %i = s32[] parameter(3)
  %z = s32[] constant(0)
  %w = f32[64,1024]{1,0} dynamic-update-slice(%c, %u, %i, %z)
  %g = f32[2,1,1024]{2,1,0} gather(%w, %r), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,1024}
  %zero = f32[] constant(0)
  ROOT %p = f32[2,1,1280]{2,1,0} pad(%g, %zero), padding=0_0x0_0x0_256
}

ENTRY %main (c: f32[64,1024], u: f32[1,1024], r: s32[2,1], i: s32[]) -> f32[2,1,1280] {
  %c = f32[64,1024]{1,0} parameter(0)
  %u = f32[1,1024]{1,0} parameter(1)
  %r = s32[2,1]{1,0} parameter(2)
  %i = s32[] parameter(3)
  ROOT %f = f32[2,1,1280]{2,1,0} fusion(%c, %u, %r, %i), kind=kLoop, calls=%fused_gather
}
"""


def test_an_update_inside_a_fusion_reads_only_what_is_sliced_of_its_buffer():
    t = hbm_traffic.estimate(REDERIVED)
    # the two gathered rows (8 KiB) of the 256 KiB cache, the 4 KiB update, the s32[2,1]
    # rows and the s32 index read; the padded [2, 1, 1280] f32 output (10 KiB) written
    assert t.total == 8192 + 4096 + 8 + 4 + 10240, t.items


# A decode step's layer loop as XLA:GPU compiled it with the cache stacked [L, ...]: the new
# K row written in place, then a kLoop fusion copies the layer's K and V out of the cache, a
# copy-hero dynamic-slice fusion a layer's weight out of the stacked params.
STACKED = """HloModule m, entry_computation_layout={(f32[4,2,1024]{2,1,0}, f32[4,2,1024]{2,1,0}, f32[4,1024,8]{2,1,0}, s32[])->f32[2,8]{1,0}}

%fused_kv (k: f32[4,2,1024], i: s32[], v: f32[4,2,1024]) -> (f32[1,2,1024], f32[1,2,1024]) {
  %k = f32[4,2,1024]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %v = f32[4,2,1024]{2,1,0} parameter(2)
  %z = s32[] constant(0)
  %dk = f32[1,2,1024]{2,1,0} dynamic-slice(%k, %i, %z, %z), dynamic_slice_sizes={1,2,1024}
  %dv = f32[1,2,1024]{2,1,0} dynamic-slice(%v, %i, %z, %z), dynamic_slice_sizes={1,2,1024}
  ROOT %t = (f32[1,2,1024]{2,1,0}, f32[1,2,1024]{2,1,0}) tuple(%dk, %dv)
}

%fused_write (k: f32[4,2,1024], u: f32[1,2,1024], i: s32[]) -> f32[4,2,1024] {
  %k = f32[4,2,1024]{2,1,0} parameter(0)
  %u = f32[1,2,1024]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %w = f32[4,2,1024]{2,1,0} dynamic-update-slice(%k, %u, %i, %z, %z)
}

%fused_w (w: f32[4,1024,8], i: s32[]) -> f32[1,1024,8] {
  %w = f32[4,1024,8]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = f32[1,1024,8]{2,1,0} dynamic-slice(%w, %i, %z, %z), dynamic_slice_sizes={1,1024,8}
  ROOT %c = f32[1,1024,8]{2,1,0} copy(%ds)
}

%fused_scale (a: f32[1,2,1024]) -> f32[1,2,1024] {
  %a = f32[1,2,1024]{2,1,0} parameter(0)
  %two = f32[] constant(2)
  %b = f32[1,2,1024]{2,1,0} broadcast(%two), dimensions={}
  ROOT %m = f32[1,2,1024]{2,1,0} multiply(%a, %b)
}

ENTRY %main (k: f32[4,2,1024], v: f32[4,2,1024], w: f32[4,1024,8], i: s32[], u: f32[1,2,1024]) -> f32[2,8] {
  %k = f32[4,2,1024]{2,1,0} parameter(0)
  %v = f32[4,2,1024]{2,1,0} parameter(1)
  %w = f32[4,1024,8]{2,1,0} parameter(2)
  %i = s32[] parameter(3)
  %u = f32[1,2,1024]{2,1,0} parameter(4)
  %ku = f32[4,2,1024]{2,1,0} fusion(%k, %u, %i), kind=kLoop, calls=%fused_write
  %kv = (f32[1,2,1024]{2,1,0}, f32[1,2,1024]{2,1,0}) fusion(%ku, %i, %v), kind=kLoop, calls=%fused_kv
  %wl = f32[1,1024,8]{2,1,0} fusion(%w, %i), kind=kCustom, calls=%fused_w, backend_config={"fusion_backend_config":{"kind":"__custom_fusion","custom_fusion_config":{"name":"dynamic_slice_fusion"}}}
  %k1 = f32[1,2,1024]{2,1,0} get-tuple-element(%kv), index=0
  %s = f32[1,2,1024]{2,1,0} fusion(%k1), kind=kLoop, calls=%fused_scale
  %sc = f32[1,2,1024]{2,1,0} copy(%s)
  %kb = f32[2,1024]{1,0} bitcast(%sc)
  %wb = f32[1024,8]{1,0} bitcast(%wl)
  ROOT %d = f32[2,8]{1,0} dot(%kb, %wb), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_copies_count_slice_fusions_of_a_stacked_cache_and_weights():
    # The K and V slices (8 KiB each; K out of the buffer updated in place) and the weight
    # slice (32 KiB); not the in-place write, nor the scaling fusion, which computes, nor
    # the copy of its result (an activation, not a buffer the program holds).
    found = hbm_traffic.copies(STACKED, 8192)
    assert sorted((name, b) for name, _, b in found) == [
        ("main/kv", 8192), ("main/kv", 8192), ("main/wl", 32768)]
    assert [name for name, _, _ in hbm_traffic.copies(STACKED, 16384)] == ["main/wl"]
    # On a CPU compile: a layer of a stacked buffer taken out whole is a copy (a slice kernel
    # of its own); the same slice consumed by arithmetic is fused into it and is not.
    x = jnp.ones((4, 64, 256), F32)
    taken = jax.jit(lambda x, i: jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False))
    hlo = taken.lower(x, 1).compile().as_text()
    assert [b for _, _, b in hbm_traffic.copies(hlo, 64 * 256 * 4)] == [64 * 256 * 4]
    used = jax.jit(lambda x, i: jnp.tanh(jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)))
    assert hbm_traffic.copies(used.lower(x, 1).compile().as_text(), 1024) == []
