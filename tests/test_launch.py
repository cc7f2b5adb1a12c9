"""Bound launches and cached descriptors (kernels/launch.py) under Triton's interpreter, and on a GPU.

A descriptor or binding is made once per buffer (address, shape, strides, dtype) and reused; a changed
buffer gets a new one. The fused runners keep one binding per set of buffers: rotating over input sets,
replacing a buffer, or changing a buffer's contents must all still give the float32 reference, each
output poisoned with NaN first."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch
import triton
import triton.language as tl

from taxes.run.cases import rel_error
from taxes.kernels import ag_gemm as ag
from taxes.kernels import gemm_rs as rs
from taxes.kernels import tp_mlp as mlp
from taxes.kernels.launch import BoundedCache, BoundLaunch, DescriptorCache, buffer_key
from taxes.kernels.device import interpreting
from taxes.kernels.runtime import launch

TINY_AG = ag.Config(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, copiers=2, chunk_rows=8,
                    copy_block=256, grid=4)
TINY_RS = rs.Config(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, grid=3)
TINY_SWIGLU = mlp.SwigluConfig(block_m=8, block_n=16)
interpreted = pytest.mark.skipif(not interpreting(), reason="triton was imported before TRITON_INTERPRET was set")


# ---- the caches ----------------------------------------------------------------------------------------


def test_a_descriptor_is_made_once_per_buffer_and_block():
    cache = DescriptorCache()
    t = torch.randn(64, 32).to(torch.bfloat16)
    d = cache.get(t, [16, 16])
    assert cache.get(t, [16, 16]) is d and cache.made == 1
    assert (d.base.data_ptr(), list(d.shape), list(d.strides)) == (t.data_ptr(), [64, 32], [32, 1])
    assert cache.get(t.view(32, 64), [16, 16]) is not d  # same address, another shape
    assert cache.get(t, [16, 32]) is not d  # another block
    assert cache.get(t[16:], [16, 16]).base.data_ptr() == t[16:].data_ptr()  # another address
    assert cache.get(torch.empty_like(t), [16, 16]) is not d  # a fresh buffer of the same shape
    assert cache.get(t.view(torch.float16), [16, 16]) is not d  # another dtype
    assert cache.made == 6


def test_a_buffer_moved_in_place_gets_a_new_descriptor():
    cache = DescriptorCache()
    t = torch.zeros(32, 16)
    d = cache.get(t, [16, 16])
    key = buffer_key(t)
    t.set_(torch.ones(32, 16))  # the same tensor object, now over other memory
    assert buffer_key(t) != key
    d2 = cache.get(t, [16, 16])
    assert d2 is not d and d2.base.data_ptr() == t.data_ptr()


def test_the_bounded_cache_forgets_its_oldest_entries():
    cache = BoundedCache(capacity=2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (None, 2, 3, 2)


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@interpreted
def test_a_bound_launch_reads_its_buffers_contents_at_every_call():
    x, y, out = torch.randn(40), torch.randn(40), torch.empty(40)
    bound = BoundLaunch(_axpy_kernel, (3,), (x, y, out, 40, 2.0), dict(BLOCK=16))
    assert bound.mode == "unlaunched"
    for _ in range(2):
        x.copy_(torch.randn(40))  # new values in the same buffers: a binding fixes addresses, not data
        out.fill_(float("nan"))
        bound()
        torch.testing.assert_close(out, 2.0 * x + y)
    assert bound.mode == "jit"  # the interpreter has no compiled kernel to bind


@interpreted
def test_a_bound_launch_takes_a_swapped_pointer_for_one_call_only():
    x, y, out = torch.randn(40), torch.randn(40), torch.empty(40)
    bound = BoundLaunch(_axpy_kernel, (3,), (x, y, out, 40, 2.0), dict(BLOCK=16))
    other = torch.randn(40)  # a buffer another library allocated for this call
    out.fill_(float("nan"))
    bound(x_ptr=other)
    torch.testing.assert_close(out, 2.0 * other + y)
    out.fill_(float("nan"))
    bound()  # the next plain call reads the bound buffer again
    torch.testing.assert_close(out, 2.0 * x + y)


# ---- the fused runners across input sets ----------------------------------------------------------------


def _ag_rotation(ctx, variant, cfg, M, N, K):
    """Two input sets called alternately, then a new output buffer, then new weights in set 0's buffer;
    returns (relative errors, bindings, descriptors made)."""
    p, r = ctx.world, ctx.rank
    rows, dtype = M // p, torch.bfloat16
    run = ag.make_variant(ctx, variant, M, N // p, K, dtype, cfg, wait_s=30.0)
    sets = []
    for s in range(2):
        g = torch.Generator().manual_seed(100 * s + r)
        a_full = ctx.heap.alloc((M, K), dtype)
        a_full.local.fill_(float("nan"))
        a_full.local[r * rows:(r + 1) * rows] = torch.randn(rows, K, generator=g).to(dtype)
        sets.append([a_full, torch.randn(K, N // p, generator=g).to(dtype), torch.empty(M, N // p, dtype=dtype)])
    ctx.barrier()

    def call(a_full, w, out):
        out.fill_(float("nan"))
        run(a_full, w, out)
        run.check()
        ctx.barrier()
        return rel_error(out, ag.reference([a_full.peers[j][j * rows:(j + 1) * rows] for j in range(p)], w))

    errors = [call(*sets[i % 2]) for i in range(4)]
    counts = [len(run._bound), run._descs.made]
    sets[0][2] = torch.empty_like(sets[0][2])  # a new output buffer: a new binding
    errors.append(call(*sets[0]))
    sets[0][1].copy_(-sets[0][1])  # new weights in the same buffer: the same binding, the new values
    errors.append(call(*sets[0]))
    errors.append(call(*sets[1]))
    counts += [len(run._bound), run._descs.made]
    errors.append(call(sets[1][0], *sets[0][1:]))  # set 1's A with set 0's W and C: a binding of known buffers
    return errors, counts + [len(run._bound), run._descs.made]


@pytest.mark.slow
@interpreted
@pytest.mark.parametrize("world,variant,producer", [(1, "fused-push", "ctas"), (2, "fused-pull", "ctas"),
                                                    (2, "fused-push", "copy-engine")])
def test_ag_gemm_bindings_follow_the_buffers(world, variant, producer):
    cfg = dataclasses.replace(TINY_AG, producer=producer)
    for errors, counts in launch(_ag_rotation, world, variant, cfg, 32 * world, 24 * world, 32, timeout_s=300):
        assert all(e < 1e-2 for e in errors), errors
        # 2 sets: 2 bindings, 3 descriptors each (A, W, C); then one more binding and descriptor (the new
        # C); then a new combination of known buffers: one more binding, no descriptor
        assert counts == [2, 6, 3, 7, 4, 7], counts


def _rs_rotation(ctx, cfg, M, N, K):
    p, r = ctx.world, ctx.rank
    dtype = torch.bfloat16
    run = rs.make_variant(ctx, "fused-push", M, N, K, dtype, cfg, wait_s=30.0)

    def inputs(s, q):  # set s's A and W of rank q (every rank can rebuild every rank's)
        g = torch.Generator().manual_seed(1000 * s + q)
        return torch.randn(M, K // p, generator=g).to(dtype), torch.randn(K // p, N, generator=g).to(dtype)

    parts = [[inputs(s, q) for q in range(p)] for s in range(2)]
    outs = [torch.empty(M // p, N, dtype=dtype) for _ in range(2)]
    ctx.barrier()

    def call(s):
        out = outs[s]
        out.fill_(float("nan"))
        res = run(parts[s][r][0], parts[s][r][1], out)
        run.check()
        return rel_error(res, rs.reference([a for a, _ in parts[s]], [w for _, w in parts[s]], r))

    errors = [call(i % 2) for i in range(5)]
    counts = [len(run._bound), run._descs.made]
    out = outs[0]  # set 1's A with set 0's W and output: a new binding of known buffers
    out.fill_(float("nan"))
    run(parts[1][r][0], parts[0][r][1], out)
    run.check()
    errors.append(rel_error(out, rs.reference([a for a, _ in parts[1]], [w for _, w in parts[0]], r)))
    counts += [len(run._bound), run._descs.made]
    with pytest.raises(ValueError, match="gemm-rs expects a, w, out of shapes"):
        run(parts[0][r][0], parts[0][r][1], outs[0].view(N, M // p))  # same address, another shape: checked again
    ctx.barrier()
    return errors, counts


@pytest.mark.slow
@interpreted
@pytest.mark.parametrize("world,producer", [(1, "ctas"), (2, "ctas"), (2, "copy-engine")])
def test_gemm_rs_bindings_follow_the_buffers(world, producer):
    cfg = dataclasses.replace(TINY_RS, producer=producer, group_m=1)
    for errors, counts in launch(_rs_rotation, world, cfg, 32 * world, 40, 24 * world, timeout_s=300):
        assert all(e < 1e-2 for e in errors), errors
        # A, W, C per set; the inbox (world > 1) and the copy engine's staging buffer made once
        made = 6 + (world > 1) + (producer == "copy-engine")
        assert counts == [2, made, 3, made], counts


def _mlp_rotation(ctx, M, H, F):
    from taxes.kernels.device import round_bf16_like_a_gpu

    round_bf16_like_a_gpu()  # as the GPU rounds (tests/test_tp_mlp.py): four bf16 stores in a row
    dtype = torch.bfloat16
    run = mlp.make_variant(ctx, "all-fused-eager", M, H, F, dtype, TINY_AG, TINY_RS, TINY_SWIGLU, wait_s=30.0)
    sets = []
    for s in range(2):
        g = torch.Generator().manual_seed(7 + s)
        x_full = ctx.heap.alloc((M, H), dtype)
        x_full.local.copy_(torch.randn(M, H, generator=g).to(dtype))
        w1 = (torch.randn(H, 2 * F, generator=g) / H ** 0.5).to(dtype)
        w2 = (torch.randn(F, H, generator=g) / F ** 0.5).to(dtype)
        sets.append((x_full, w1, w2, torch.empty(M, H, dtype=dtype)))
    errors = []
    for i in range(4):
        x_full, w1, w2, out = sets[i % 2]
        out.fill_(float("nan"))
        run(x_full, w1, w2, out)
        run.check()
        errors.append(rel_error(out, mlp.reference(x_full.local, [w1], [w2])))
    return errors, [len(run.ag._bound), len(run.rs._bound)]


@pytest.mark.slow
@interpreted
def test_tp_mlp_bindings_follow_the_buffers():
    [(errors, counts)] = launch(_mlp_rotation, 1, 32, 32, 24, timeout_s=300)
    assert all(e < 1e-2 for e in errors), errors
    assert counts == [2, 2]  # ag: per (X, W1) set (Y1 is the layer's); rs: per (W2, out) set (Z is the layer's)


# ---- on a GPU: the direct path --------------------------------------------------------------------------


def _direct_job(ctx):
    """fused ag-gemm and gemm-rs at world 1 on two input sets, and their graphs replayed after rotation;
    which path the bindings took."""
    dtype = torch.bfloat16
    M, N, K = 512, 512, 256
    errs = []
    runs = {v: ag.make_variant(ctx, v, M, N, K, dtype, ag.Config(num_stages=3)) for v in ("fused-push", "fused-push-graph")}
    sets = []
    for s in range(2):
        a_full = ctx.heap.alloc((M, K), dtype)
        a_full.local.copy_(torch.randn(M, K, device=ctx.device).to(dtype))
        sets.append((a_full, (torch.randn(K, N, device=ctx.device) / K ** 0.5).to(dtype),
                     torch.empty(M, N, dtype=dtype, device=ctx.device)))
    for variant, run in runs.items():
        for i in range(5):
            a_full, w, out = sets[i % 2]
            out.fill_(float("nan"))
            run(a_full, w, out)
            torch.cuda.synchronize()
            errs.append((variant, rel_error(out, ag.reference([a_full.local], w))))
    modes = {b.mode for b, _ in runs["fused-push"]._bound._items.values()}
    rs_run = rs.make_variant(ctx, "fused-push", M, N, K, dtype, rs.Config())
    for i in range(3):
        a, w, out = sets[i % 2][0].local, sets[i % 2][1], sets[i % 2][2]
        out.fill_(float("nan"))
        rs_run(a, w, out)
        torch.cuda.synchronize()
        errs.append(("gemm-rs", rel_error(out, rs.reference([a], [w], 0))))
    modes |= {b.mode for bs in rs_run._bound._items.values() for b in bs}
    return errs, sorted(modes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or interpreting(), reason="needs a GPU (TRITON_INTERPRET=0)")
def test_direct_launches_compute_the_same_on_a_gpu():
    [(errs, modes)] = launch(_direct_job, 1, backend="cuda", heap_bytes=256 << 20, timeout_s=300)
    assert all(e < 1e-2 for _, e in errs), errs
    assert modes == ["direct"], modes  # Triton 3.6 on NVIDIA: the bound path, not the JIT fallback
