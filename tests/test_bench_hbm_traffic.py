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
