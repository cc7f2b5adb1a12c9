"""The iteration-start barrier (kernels/rank.py StartGate): it holds every rank until the last one arrives,
gate after gate, names a rank that never comes, and the ranks' setup leaves no file behind."""

import multiprocessing as mp
import os
import random
import time

import pytest

from taxes.kernels.rank import RankError, StartGate

ROUNDS = 6


def _rank(fd_path, rank, world, delays, out):
    fd = os.open(fd_path, os.O_RDWR)
    gate = StartGate(fd, rank, world)
    os.close(fd)
    arrived, left = [], []
    for k in range(ROUNDS):
        time.sleep(delays[k][rank])
        arrived.append(time.monotonic())
        gate.wait(timeout_s=30)
        left.append(time.monotonic())
    gate.close()
    out.put((rank, arrived, left))


@pytest.mark.parametrize("world", [2, 3, 5])
def test_no_rank_leaves_before_the_last_arrives(tmp_path, world):
    rng = random.Random(world)
    # a different rank is last each round, by 5-40 ms
    delays = [[rng.uniform(0, 0.04) for _ in range(world)] for _ in range(ROUNDS)]
    fd, path = StartGate.create(world, str(tmp_path))
    os.close(fd)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(path, r, world, delays, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    for _ in range(world):
        r, arrived, left = out.get(timeout=60)
        results[r] = (arrived, left)
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    for k in range(ROUNDS):
        last_arrival = max(results[r][0][k] for r in range(world))
        for r in range(world):
            assert results[r][1][k] >= last_arrival, f"rank {r} left gate {k} before every rank had arrived"


def test_a_rank_that_never_comes_is_named(tmp_path):
    fd, path = StartGate.create(2, str(tmp_path))
    gate = StartGate(fd, 0, 2)
    os.close(fd)
    t0 = time.monotonic()
    with pytest.raises(RankError, match=r"^rank 0: rank 1 did not reach the iteration's start within 1 s$"):
        gate.wait(timeout_s=1.0)
    assert time.monotonic() - t0 < 10
    gate.close()


def test_a_rank_already_at_the_next_gate_lets_the_other_go(tmp_path):
    fd, path = StartGate.create(2, str(tmp_path))
    a, b = StartGate(fd, 0, 2), StartGate(fd, 1, 2)
    os.close(fd)
    b.count = 4
    b._slots[1 * StartGate.LINE] = 5  # rank 1 has gone through 5 gates; rank 0 arrives at its first
    a.wait(timeout_s=1.0)  # returns at once
    a.close()
    b.close()


def _setup_rank(rank, world, port, out):
    import torch
    import torch.distributed as dist

    from taxes.kernels.runtime import _start_gate

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gate = _start_gate(rank, world, torch.device("cpu"))
    assert gate.place in (StartGate.MEMFD, "/dev/shm", __import__("tempfile").gettempdir())
    time.sleep(0.05 * rank)
    arrived = time.monotonic()
    gate.wait(timeout_s=30)
    out.put((rank, arrived, time.monotonic()))
    gate.close()
    dist.destroy_process_group()


def test_the_ranks_share_one_gate_and_leave_no_file():
    from taxes.kernels.runtime import _free_port

    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
    before = set(os.listdir(folder or "/tmp"))
    world, port = 3, _free_port()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_setup_rank, args=(r, world, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in range(world)]
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    last = max(a for _, a, _ in got)
    assert all(left >= last for _, _, left in got)
    left_behind = [n for n in set(os.listdir(folder or "/tmp")) - before if n.startswith("taxes-gate-")]
    assert left_behind == []


def _unshared_rank(rank, world, port, out, folder):
    import torch
    import torch.distributed as dist

    import taxes.kernels.runtime as runtime

    if rank != 0:  # this rank's view of every folder is a folder of its own, as when a process has its own /dev/shm
        real_open = os.open

        def own_open(path, flags, *a):
            mine = os.path.join(folder, f"own-{rank}-" + os.path.basename(path))
            fd = real_open(mine, flags | os.O_CREAT, 0o600)
            os.ftruncate(fd, world * StartGate.LINE * 8)
            os.unlink(mine)
            return fd

        runtime.os.open = own_open
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gate = runtime._start_gate(rank, world, torch.device("cpu"))
    out.put((rank, gate is None))
    dist.destroy_process_group()


def test_ranks_that_do_not_see_one_page_share_no_gate_and_say_so(tmp_path, capfd):
    from taxes.kernels.runtime import _free_port

    world, port = 2, _free_port()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_unshared_rank, args=(r, world, port, out, str(tmp_path))) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=60) for _ in range(world))
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    assert got == {0: True, 1: True}  # no rank keeps a gate the others do not see
    err = capfd.readouterr().err
    assert "taxes: the ranks share no start gate (" in err and "rank 1 does not see the others' writes" in err
    assert "iterations start from dist.barrier" in err


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd on this system")
def test_an_anonymous_page_is_opened_by_another_process_through_proc():
    fd, path = StartGate.create(2, StartGate.MEMFD)
    assert path == f"/proc/{os.getpid()}/fd/{fd}"
    mine = StartGate(fd, 0, 2)
    ctx = mp.get_context("spawn")  # a process that inherits nothing: it reaches the page by the path alone
    p = ctx.Process(target=_write_token_at, args=(path,))
    p.start()
    p.join(60)
    os.close(fd)
    assert p.exitcode == 0
    assert mine.marked(1) == 4242
    mine.close()


def _write_token_at(path):
    fd = os.open(path, os.O_RDWR)
    gate = StartGate(fd, 1, 2)
    os.close(fd)
    gate.mark(4242)
    gate.close()
