"""The symmetric heap and the rank launcher that every fused kernel runs on.

A symmetric heap, in the spirit of AMD's Iris: every rank owns one arena of the same size, and
allocations are bump-allocated in the same order on every rank, so an allocation sits at the same
offset in every arena. A kernel reaches a peer's copy of a buffer by adding the difference of the two
arenas' base addresses to its own pointer (`peer_ptr` in kernels/sync.py); the arenas' bases are one
int64 tensor per rank.

Two backends give the arenas:
- cuda: one buffer from PyTorch symmetric memory (torch.distributed._symmetric_memory.empty, then
  rendezvous), peers mapped through get_buffer. NVLink multicast is never used.
- emulated: CPU tensors in shared memory, allocated before the rank processes fork, so they sit at the
  same address in every rank (../shared/PLATFORM.md); kernels run under Triton's interpreter
  (TRITON_INTERPRET=1), which reads and writes a peer's arena like its own. Timings mean nothing there;
  the logic is the same code.

`launch(fn, world, backend=...)` starts one process per rank, runs fn(ctx) in each, and returns the
ranks' results. It never waits forever: a rank that raises, dies or overruns its time budget ends the
whole run with one RankError line naming the rank and what it was doing.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import time
import traceback
from dataclasses import dataclass, field

import torch

# Multicast objects can take a shared host's GPUs down: keep them off in every process we start.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ALIGN = 256  # bytes; TMA wants 16, 256 keeps every buffer on its own cache lines


class RankError(RuntimeError):
    """A rank failed; the message is one line naming the rank and what it was doing."""


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass
class SymBuffer:
    """One symmetric allocation: this rank's tensor and every rank's view of the same bytes."""

    local: torch.Tensor
    peers: list[torch.Tensor]  # peers[r] is rank r's copy (peers[rank] is local)
    offset: int  # bytes from the arena's base, equal on every rank


class SymmetricHeap:
    def __init__(self, rank: int, world: int, arenas: list[torch.Tensor], keepalive=None):
        self.rank, self.world = rank, world
        self.arenas = arenas  # uint8, one per rank, all mapped in this process
        self.size = arenas[rank].numel()
        self.bases = torch.tensor([a.data_ptr() for a in arenas], dtype=torch.int64, device=arenas[rank].device)
        self._top = 0
        self._keepalive = keepalive  # e.g. the symmetric-memory handle

    @property
    def device(self) -> torch.device:
        return self.arenas[self.rank].device

    def alloc(self, shape, dtype: torch.dtype) -> SymBuffer:
        """Allocate on every rank (all ranks must make the same calls in the same order)."""
        shape = tuple(int(s) for s in shape)
        nbytes = max(1, torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        off = -(-self._top // ALIGN) * ALIGN
        if off + nbytes > self.size:
            raise MemoryError(f"symmetric heap of {self.size >> 20} MiB is full: {nbytes >> 20} MiB more asked, "
                              f"{(self.size - off) >> 20} MiB left")
        self._top = off + nbytes
        views = [a[off:off + nbytes].view(dtype).view(shape) for a in self.arenas]
        return SymBuffer(views[self.rank], views, off)

    def zeros(self, shape, dtype: torch.dtype) -> SymBuffer:
        buf = self.alloc(shape, dtype)
        buf.local.zero_()
        return buf

    def reset(self) -> None:
        """Forget every allocation (all ranks together, when no kernel uses them)."""
        self._top = 0


@dataclass
class RankContext:
    rank: int
    world: int
    backend: str  # "cuda" or "emulated"
    heap: SymmetricHeap
    device: torch.device
    _barrier: object = field(default=None, repr=False)
    _doing: object = field(default=None, repr=False)  # shared text: what this rank is doing now
    _scratch: object = field(default=None, repr=False)  # emulated: shared float64 [world, 64] for all_max

    def barrier(self, timeout_s: float = 120.0) -> None:
        """Host barrier of all ranks (on cuda also orders the device: synchronize first)."""
        if self.backend == "cuda":
            import torch.distributed as dist

            torch.cuda.synchronize()
            dist.barrier()
        else:
            try:
                self._barrier.wait(timeout_s)
            except Exception:
                raise RankError(f"rank {self.rank}: barrier not reached by every rank within {timeout_s:.0f} s") from None

    def all_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks (every rank gets the same list): how ranks agree."""
        if self.backend == "cuda":
            import torch.distributed as dist

            t = torch.tensor(values, dtype=torch.float64, device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t.tolist()
        n = len(values)
        if n > self._scratch.shape[1]:
            raise ValueError(f"all_max takes at most {self._scratch.shape[1]} values when emulated")
        self.barrier()
        self._scratch[self.rank, :n] = torch.tensor(values, dtype=torch.float64)
        self.barrier()
        out = self._scratch[:, :n].max(dim=0).values.tolist()
        self.barrier()
        return out

    def doing(self, what: str) -> None:
        """Say what this rank is doing, so a failure elsewhere can name it."""
        if self._doing is not None:
            self._doing[self.rank] = what[:200]


# ---- the launcher ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, backend, fn, args, results, doing, port, arenas, barrier, scratch, heap_bytes, timeout_s):
    import faulthandler

    os.environ.update(SAFE_ENV)
    # If this rank is still running near the launcher's deadline, show where it is stuck.
    faulthandler.dump_traceback_later(max(1.0, timeout_s - 20), exit=False)
    try:
        if backend == "cuda":
            ctx = _cuda_context(rank, world, port, heap_bytes, timeout_s)
        else:
            torch.set_num_threads(1)
            ctx = RankContext(rank, world, "emulated", SymmetricHeap(rank, world, arenas), torch.device("cpu"), barrier,
                              _scratch=scratch)
        ctx._doing = doing
        out = fn(ctx, *args)
        results.put((rank, "ok", out))
    except BaseException as e:  # report every failure as one line, with the traceback for debugging
        tb = traceback.format_exc(limit=-8)
        results.put((rank, "error", f"{type(e).__name__}: {e}".splitlines()[0][:500], tb))
    finally:
        if backend == "cuda":
            import torch.distributed as dist

            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:
                    pass


def _cuda_context(rank, world, port, heap_bytes, timeout_s) -> RankContext:
    import datetime

    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), device_id=dev)
    arena = symm_mem.empty(heap_bytes, dtype=torch.uint8, device=dev)
    handle = symm_mem.rendezvous(arena, group=dist.group.WORLD.group_name)
    arenas = [arena if r == rank else handle.get_buffer(r, (heap_bytes,), torch.uint8, 0) for r in range(world)]
    return RankContext(rank, world, "cuda", SymmetricHeap(rank, world, arenas, keepalive=handle), dev)


def launch(fn, world: int, *args, backend: str = "emulated", heap_bytes: int = 64 << 20, timeout_s: float = 600.0):
    """Run fn(ctx, *args) on `world` ranks, one process each; return [result of rank 0, 1, ...].

    emulated: forks (fn may be any function); the arenas are shared memory made here, before the fork.
    cuda: spawns fresh interpreters (fn must be importable), one GPU per rank, NCCL and symmetric memory.
    Raises RankError naming the first rank that failed, died or overran timeout_s."""
    import multiprocessing as mp

    if backend == "cuda":
        if not torch.cuda.is_available():
            raise RankError("no CUDA GPU here: use backend='emulated' (Triton interpreter) instead")
        if torch.cuda.device_count() < world:
            raise RankError(f"{world} ranks need {world} GPUs; this machine has {torch.cuda.device_count()}")
        ctx_mp = mp.get_context("spawn")
        arenas, barrier, scratch = None, None, None
    elif backend == "emulated":
        if not interpreting():
            raise RankError("emulated ranks run kernels under Triton's interpreter: set TRITON_INTERPRET=1 before importing triton")
        ctx_mp = mp.get_context("fork")
        arenas = [torch.zeros(heap_bytes, dtype=torch.uint8).share_memory_() for _ in range(world)]
        barrier = ctx_mp.Barrier(world)
        scratch = torch.zeros(world, 64, dtype=torch.float64).share_memory_()
    else:
        raise ValueError(f"unknown backend {backend!r}")
    os.environ.update(SAFE_ENV)
    results = ctx_mp.Queue()
    doing = _SharedText(ctx_mp, world)
    port = _free_port()
    procs = [ctx_mp.Process(target=_rank_main, args=(r, world, backend, fn, args, results, doing, port, arenas, barrier,
                                                     scratch, heap_bytes, timeout_s), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, object] = {}
    deadline = time.monotonic() + timeout_s

    def take(wait_s: float) -> None:
        try:
            item = results.get(timeout=wait_s)
        except queue.Empty:
            return
        while True:
            rank, status = item[0], item[1]
            if status == "error":
                if os.environ.get("TAXES_DEBUG"):
                    print(item[3])
                raise RankError(f"rank {rank} failed while {doing.get(rank, 'starting')}: {item[2]}")
            out[rank] = item[2]
            try:
                item = results.get_nowait()
            except queue.Empty:
                return

    try:
        while len(out) < world:
            take(0.2)
            dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode is not None]
            if dead:
                take(2.0)  # a rank that exited cleanly has flushed its result; collect it before judging
                for r in dead:
                    if r not in out:
                        code = procs[r].exitcode
                        how = f"signal {-code}" if code < 0 else f"exit code {code}"
                        raise RankError(f"rank {r} died ({how}) while {doing.get(r, 'starting')}")
            if time.monotonic() > deadline:
                late = [r for r in range(world) if r not in out]
                raise RankError(f"rank {late[0]} did not finish within {timeout_s:.0f} s (it was {doing.get(late[0], 'starting')})")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
    return [out[r] for r in range(world)]


class _SharedText:
    """A tiny shared 'what is rank r doing' board for forked ranks."""

    def __init__(self, ctx_mp, world, width=200):
        self.width = width
        self.buf = ctx_mp.Array("c", world * width, lock=False)

    def __setitem__(self, rank, text):
        b = text.encode()[: self.width - 1]
        self.buf[rank * self.width:(rank + 1) * self.width] = b + b"\0" * (self.width - len(b))

    def get(self, rank, default=None):
        raw = bytes(self.buf[rank * self.width:(rank + 1) * self.width]).split(b"\0", 1)[0]
        return raw.decode(errors="replace") or default
