"""Preflight: a machine that cannot run a case, or a case too large for the GPU, is refused before anything
is allocated, in one line saying what is needed and what is there.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import math
import re

import pytest
import torch
from _emulated import emulated
from _util import assert_one_line
from hypothesis import given
from hypothesis import strategies as st

from taxes.variants import variants_of
from taxes.run import preflight
from taxes.errors import TaxesError
from taxes.kernels.rank import SymmetricHeap
from taxes.workloads import make_workload


# ---- preflight: refuse before allocating ---------------------------------------------------------------


H200 = "NVIDIA H200"


@pytest.mark.parametrize("facts,world,words", [
    (preflight.GpuFacts(False, [], "no CUDA", "2.13.0+cpu"), 2, ["no CUDA GPU", "taxes model"]),
    (preflight.GpuFacts(True, [H200], None), 2, ["--world 2 needs 2 GPUs", "shows 1", "--world 1"]),
    (preflight.GpuFacts(True, [H200, "NVIDIA H100 80GB HBM3"], None), 2, ["different kinds", "CUDA_VISIBLE_DEVICES"]),
    (preflight.GpuFacts(True, [H200, H200], "torch.distributed._symmetric_memory cannot be imported (x)"), 2,
     ["symmetric memory is not usable", "_symmetric_memory cannot be imported"]),
    (preflight.GpuFacts(True, [H200, H200], "GPU 0 cannot access GPU 1's memory (no peer access)"), 2, ["peer access"]),
])
def test_each_unusable_machine_gets_its_own_message(facts, world, words):
    with pytest.raises(TaxesError) as e:
        preflight.check_gpus(world, facts)
    msg = str(e.value)
    assert_one_line(msg)
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("world", [0, -2, True, 1.5])
def test_a_nonsense_world_size_is_refused(world):
    with pytest.raises(TaxesError, match="positive whole number"):
        preflight.check_gpus(world, preflight.GpuFacts(True, [H200] * 2, None))


def test_usable_machines_pass_the_gpu_check():
    assert preflight.check_gpus(2, preflight.GpuFacts(True, [H200] * 4, None)).names == [H200] * 4
    # one rank needs no symmetric memory; the unused GPUs may be of any kind
    preflight.check_gpus(1, preflight.GpuFacts(True, [H200, "other"], "no peer access"))
    if not torch.cuda.is_available():
        with pytest.raises(TaxesError, match="no CUDA GPU"):
            preflight.check_gpus(1)  # this machine's own facts


@given(need=st.floats(0, 1e13), free=st.integers(0, 1 << 43), reserve=st.sampled_from([0, 1 << 30, preflight.RESERVE_BYTES]))
def test_memory_check_refuses_exactly_what_does_not_fit(need, free, reserve):
    total = free + (5 << 30)
    try:
        preflight.check_memory(need, 3, free_total=(free, total), what="ag-gemm M=8192", reserve_bytes=reserve)
    except TaxesError as e:
        msg = str(e)
        assert need + reserve > free
        assert_one_line(msg)
        nums = [float(x) for x in re.findall(r"([\d.]+) GiB", msg)]
        assert nums == pytest.approx([(need + reserve) / 2**30, need / 2**30, reserve / 2**30, free / 2**30,
                                      total / 2**30], abs=0.051)
        assert msg.startswith("ag-gemm M=8192 needs") and "GPU 3 has" in msg
    else:
        assert need + reserve <= free


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_memory_check_refuses_a_nonsense_estimate(bad):
    with pytest.raises(TaxesError, match="not a byte count"):
        preflight.check_memory(bad, 0, free_total=(1 << 40, 1 << 40))


class _FakeCtx:
    """Enough of a RankContext for the kernels' constructors: rank 0 of `world`, CPU arenas."""

    def __init__(self, world):
        self.rank, self.world, self.backend, self.device = 0, world, "emulated", torch.device("cpu")
        self.heap = SymmetricHeap(0, world, [torch.zeros(64 << 20, dtype=torch.uint8) for _ in range(world)])
        self.private = 0

    def barrier(self, timeout_s=0):
        pass


def _count_private(monkeypatch, ctx):
    """Count the bytes of plain tensors the kernels allocate (torch.empty/zeros/arange)."""
    for name in ("empty", "zeros"):
        real = getattr(torch, name)

        def counting(*shape, _real=real, **kw):
            t = _real(*shape, **kw)
            ctx.private += t.numel() * t.element_size()
            return t

        monkeypatch.setattr(torch, name, counting)


@emulated
@pytest.mark.parametrize("variant", ["bsp", "fused-push", "fused-pull"])
def test_ag_gemm_memory_estimate_covers_what_the_kernel_allocates(monkeypatch, variant):
    from taxes.kernels import ag_gemm as ag

    M, N, K, p = 256, 128, 64, 2
    ctx = _FakeCtx(p)
    a_full = ctx.heap.alloc((M, K), torch.bfloat16)  # the input every variant gets (taxes.run.cases)
    w, out = torch.empty(K, N // p, dtype=torch.bfloat16), torch.empty(M, N // p, dtype=torch.bfloat16)
    _count_private(monkeypatch, ctx)
    cfg = ag.Config(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, copiers=1,
                    chunk_rows=8, copy_block=256, grid=4)
    ag.make_variant(ctx, variant, M, N // p, K, torch.bfloat16, cfg)
    est = preflight.memory_breakdown(make_workload("ag-gemm", {"M": M, "N": N, "K": K}, p), variant, check=False)
    monkeypatch.undo()
    assert ctx.heap._top <= est["symmetric heap"]
    assert est["symmetric heap"] - ctx.heap._top < 8192  # not padded beyond flags and alignment
    assert a_full.local.numel() * 2 <= est["symmetric heap"]
    assert est["inputs"] == w.numel() * 2 and est["outputs"] == out.numel() * 2
    assert est["gathered"] <= ctx.private <= est["gathered"] + est["control words"]
    assert (est["gathered"] > 0) == (variant == "bsp")


@emulated
@pytest.mark.parametrize("variant", ["bsp", "fused-push"])
def test_flash_decode_memory_estimate_covers_what_the_kernel_allocates(monkeypatch, variant):
    from taxes.kernels import flash_decode as fd
    from taxes.kernels.decode_local import Config

    B, Hq, Hkv, D, S, p = 2, 16, 2, 64, 512, 2
    ctx = _FakeCtx(p)
    _count_private(monkeypatch, ctx)
    fd.FlashDecode(ctx, B, Hq, Hkv, D, S, torch.bfloat16, variant, Config(splits=0))
    w = make_workload("flash-decode", {"B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "S": S}, p)
    monkeypatch.setattr(preflight, "SM_COUNT", 4)  # the CPU stand-in's SM count (kernels/device.py)
    est = preflight.memory_breakdown(w, variant, check=False)
    monkeypatch.undo()
    assert ctx.heap._top <= est["symmetric heap"]
    assert est["gathered"] <= ctx.private <= est["gathered"] + est["control words"]


@given(pair=st.sampled_from([(w, v.name) for w in ("ag-gemm", "gemm-rs", "flash-decode") for v in variants_of(w)]),
       scale=st.integers(0, 4), world=st.sampled_from([1, 2, 4, 8]), sets=st.integers(1, 4))
def test_memory_estimate_grows_with_the_problem_and_covers_its_inputs(pair, scale, world, sets):
    name, variant = pair
    base = {"ag-gemm": {"M": 1024, "N": 1024, "K": 512}, "gemm-rs": {"M": 1024, "N": 512, "K": 1024},
            "flash-decode": {"B": 1, "Hq": 32, "Hkv": 8, "D": 128, "S": 1024}}[name]
    big = {k: v * (2 ** scale if k in ("M", "N", "K", "S") else 1) for k, v in base.items()}
    small_w, big_w = make_workload(name, base, world), make_workload(name, big, world)
    small, large = preflight.bytes_needed(small_w, variant, sets), preflight.bytes_needed(big_w, variant, sets)
    assert large >= small * (1.5 if scale else 1) * 0.999
    assert preflight.bytes_needed(big_w, variant, sets + 1) > large  # another input set costs memory
    assert large >= sets * big_w.hbm_bytes()  # inputs and outputs at least, for each input set
    assert preflight.heap_bytes_needed(big_w, variant, sets) >= preflight.memory_breakdown(big_w, variant, sets)["symmetric heap"]


def test_memory_estimate_refuses_unknown_variants_and_input_sets():
    w = make_workload("ag-gemm", {}, 2)
    for bad in [("nope", 1), ("bsp", 0), ("bsp", True), ("bsp", 1.5)]:
        with pytest.raises(TaxesError) as e:
            preflight.bytes_needed(w, *bad)
        assert_one_line(str(e.value))


def test_a_shape_too_large_for_the_gpu_is_refused_with_needed_and_available():
    w = make_workload("ag-gemm", {"M": 262144, "N": 262144, "K": 65536}, 2)
    need = preflight.bytes_needed(w, "bsp")
    with pytest.raises(TaxesError) as e:
        preflight.check_memory(need, 0, free_total=(130 << 30, 141 << 30), what="ag-gemm M=256K")
    msg = str(e.value)
    assert f"{(need + preflight.RESERVE_BYTES) / 2**30:.1f} GiB per GPU" in msg and "130.0 GiB free of 141.0 GiB" in msg
