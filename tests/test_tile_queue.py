"""The model's run of the fused ag-gemm's tile queue (taxes/model/tile_queue.py): hand-worked queues with known
finish times and waits, the queue order against the kernel's own _tile_coords run under Triton's interpreter,
and what the model then says about the fused kernel: waves, copier CTAs, and the wait the attribution reads."""

from __future__ import annotations

import math
import random

import pytest
import torch
import triton
import triton.language as tl
from _emulated import emulated

from taxes.kernels.ag_gemm_kernel import _tile_coords
from taxes.model.floor import floor_of
from taxes.model.hardware import get_profile
from taxes.model.predict import predict, steps_of
from taxes.model.steps import ModelOptions, options_from_config
from taxes.model.tile_queue import run_queue, tile_order
from taxes.workloads import make_workload


def test_a_queue_of_ready_tiles_takes_whole_waves_and_waits_nothing():
    for tiles, ctas in ((132, 132), (133, 132), (64, 132), (1000, 7)):
        run = run_queue([0.0] * tiles, 3.0, ctas)
        assert run.finish_us == pytest.approx(math.ceil(tiles / ctas) * 3.0)
        assert run.longest_wait_us == 0.0 and run.total_wait_us == 0.0


def test_a_late_chunk_makes_the_ctas_that_took_its_tiles_wait():
    # 3 CTAs, tiles of 4 us; three ready at once, three at 10 us: the second three are taken at 4 us, started
    # at 10: each of the three CTAs waited 6 us
    run = run_queue([0, 0, 0, 10, 10, 10], 4.0, 3)
    assert (run.finish_us, run.longest_wait_us, run.total_wait_us) == (14.0, 6.0, 18.0)
    # one CTA: it waits once per late tile, and its waits add up
    run = run_queue([0, 5, 20], 4.0, 1)
    assert (run.finish_us, run.longest_wait_us) == (24.0, 1.0 + 11.0)


def test_a_copier_joins_the_queue_when_its_copies_are_done():
    # CTA 0 copies until 5 us; CTA 1 takes the first tile at 0 and the second at 4, before CTA 0 is free
    assert run_queue([0, 0], 4.0, 2, busy_until_us=[5.0]).finish_us == 8.0
    # three tiles: the third goes to CTA 0 at 5
    assert run_queue([0, 0, 0], 4.0, 2, busy_until_us=[5.0]).finish_us == 9.0
    with pytest.raises(ValueError):
        run_queue([0.0], 1.0, 0)


@triton.jit
def _queue_order_kernel(rank, num_m_shard, num_n, pm_ptr, shard_ptr, n_tiles, WORLD: tl.constexpr,
                        GROUP_M: tl.constexpr):
    for t in range(0, n_tiles):
        pm, pn, shard = _tile_coords(t, rank, num_m_shard, num_n, WORLD, GROUP_M)
        tl.store(pm_ptr + t, pm)
        tl.store(shard_ptr + t, shard)


@emulated
@pytest.mark.parametrize("world,m_blocks,n_blocks,group_m,rank", [(2, 3, 2, 2, 1), (4, 5, 3, 8, 2), (4, 16, 2, 8, 0),
                                                                   (1, 4, 4, 8, 0)])
def test_the_queue_order_is_the_kernels(world, m_blocks, n_blocks, group_m, rank):
    """The model's queue order (source shard, row block) is what the kernel's own _tile_coords deals."""
    n = world * m_blocks * n_blocks
    pm, shard = torch.full((n,), -1, dtype=torch.int32), torch.full((n,), -1, dtype=torch.int32)
    _queue_order_kernel[(1,)](rank, m_blocks, n_blocks, pm, shard, n, WORLD=world, GROUP_M=group_m)
    kernel = [((rank - s) % world, p - s * m_blocks) for p, s in zip(pm.tolist(), shard.tolist())]
    assert tile_order(world, m_blocks, n_blocks, group_m) == kernel


def _fused(w, variant, hw, opt):
    (step,) = steps_of(w, variant, hw, opt)
    return step


@pytest.mark.parametrize("M", [512, 1024, 2048])
def test_a_gemm_of_fewer_tiles_than_sms_runs_one_tile_time_however_few_tiles(M):
    """At one GPU the fused GEMM is one wave while its tiles fit the SMs: halving M does not halve it."""
    hw = get_profile("h200-sxm")
    opt = ModelOptions(tile_m=128, tile_n=256)
    times = {m: sum(_fused(make_workload("ag-gemm", {"M": m, "N": 8192, "K": 8192}, 1), "fused-push", hw,
                           opt).parts.values()) for m in (M, 2 * M)}
    tiles = {m: (m // 128) * (8192 // 256) for m in times}
    if tiles[2 * M] <= hw.sm_count:
        assert times[M] == pytest.approx(times[2 * M], rel=0.02)
    else:
        assert times[M] < times[2 * M]


def test_few_copier_ctas_leave_the_last_peers_rows_late_and_the_wait_grows():
    """At 4 GPUs and M=1024 a rank sends 24 chunks of 32 rows: 8 copiers move them in three rounds, 16 in two,
    24 in one; the last peer's rows come a round later each time, and the longest wait is the CTAs' that took
    its tiles first, so more copiers cut both."""
    hw = get_profile("h200-x4-calibrated")
    w = make_workload("ag-gemm", {"M": 1024, "N": 8192, "K": 8192}, 4)
    parts = {c: _fused(w, "fused-push", hw, ModelOptions(copier_ctas=c, chunk_rows=32, tile_n=128)).parts
             for c in (8, 16, 24)}
    waits = {c: p["sync_wait"] + p["start_skew"] for c, p in parts.items()}
    assert waits[8] > waits[16] > waits[24] > 0
    times = {c: sum(p.values()) for c, p in parts.items()}
    assert times[8] > times[16] > times[24]


def test_the_in_kernel_wait_is_at_most_the_kernels_time_beyond_its_floor():
    hw = get_profile("h200-x4-calibrated")
    rng = random.Random(5)
    for _ in range(40):
        world = rng.choice([2, 4, 8])
        w = make_workload("ag-gemm", {"M": world * 128 * rng.randint(1, 32), "N": world * 256 * rng.randint(1, 16),
                                      "K": 1024 * rng.randint(1, 16)}, world)
        opt = ModelOptions(copier_ctas=rng.choice([0, 8, 16, 64]), chunk_rows=rng.choice([None, 16, 64, 512]))
        for variant in ("fused-pull", "fused-push", "fused-push-graph"):
            step = _fused(w, variant, hw, opt)
            fl = floor_of(w, hw)
            kernel = sum(step.parts.values()) - step.parts["locality"]
            wait = step.parts["sync_wait"] + step.parts["start_skew"]
            assert wait <= kernel - fl.work_us + 1e-6
            assert min(step.parts.values()) >= -1e-6, step.parts
            predict(w, variant, hw, opt)  # and the prediction passes every consistency check


def test_a_copy_engine_producer_holds_no_cta():
    """A copy-engine entry prices no copier CTAs, whatever its copiers field says (the kernel runs it with 0)."""
    assert options_from_config({"producer": "copy-engine", "copiers": 16}).copier_ctas == 0
    assert options_from_config({"producer": "ctas", "copiers": 16, "chunk_rows": 64}).chunk_rows == 64
    assert options_from_config({"static": True}).copiers_join is False


@pytest.mark.parametrize("shape", [{"M": 1 << 40, "N": 8192, "K": 8192}, {"M": 1024, "N": 1 << 40, "K": 64},
                                   {"M": 65536, "N": 28672, "K": 8192}])
def test_the_queue_of_a_huge_shape_stays_bounded_and_close(monkeypatch, shape):
    """Any shape the command line takes is priced from a queue of at most MAX_QUEUE_UNITS units (a tile queue
    of 2^33 tiles would never end), and coarser units move the prediction by under S / MAX_QUEUE_UNITS."""
    import taxes.model.steps as steps

    seen = []
    real = steps.run_queue

    def counting(ready, *a, **k):
        seen.append(len(ready))
        return real(ready, *a, **k)

    monkeypatch.setattr(steps, "run_queue", counting)
    hw = get_profile("h200-x4-calibrated")
    w = make_workload("ag-gemm", shape, 2)
    bounded = predict(w, "fused-push", hw, ModelOptions(chunk_rows=32))
    assert seen and max(seen) <= steps.MAX_QUEUE_UNITS
    monkeypatch.setattr(steps, "MAX_QUEUE_UNITS", steps.MAX_QUEUE_UNITS // 4)
    coarser = predict(w, "fused-push", hw, ModelOptions(chunk_rows=32))
    assert coarser.e2e_us == pytest.approx(bounded.e2e_us, rel=4 * hw.sm_count / steps.MAX_QUEUE_UNITS + 1e-3)
