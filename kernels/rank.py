"""One rank's context (taxes.kernels.runtime starts the ranks): the symmetric heap every fused kernel
allocates on (kernels/runtime.py says how its arenas come to be), the ranks' barrier and agreement, and the
one error a failed rank raises.

A symmetric heap, in the spirit of AMD's Iris: every rank owns one arena of the same size, and
allocations are bump-allocated in the same order on every rank, so an allocation sits at the same
offset in every arena. A kernel reaches a peer's copy of a buffer by adding the difference of the two
arenas' base addresses to its own pointer (`peer_ptr` in kernels/sync.py); the arenas' bases are one
int64 tensor per rank.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time
from dataclasses import dataclass, field

import torch

from taxes.errors import TaxesError

ALIGN = 256  # bytes; TMA wants 16, 256 keeps every buffer on its own cache lines


class RankError(TaxesError, RuntimeError):
    """A rank failed; the message is one line naming the rank and what it was doing (the command line shows
    it as such, exit 2)."""



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

    def mark(self) -> int:
        """Where the next allocation starts: release(mark) forgets every allocation made after it."""
        return self._top

    def release(self, mark: int) -> None:
        """Forget the allocations made since `mark` (all ranks together, when no kernel uses them)."""
        if not 0 <= mark <= self._top:
            raise ValueError(f"heap mark {mark} is not below the top {self._top}")
        self._top = mark


class StartGate:
    """A host barrier for ranks on one host that lets them go within about a microsecond of each other.

    Each rank has one 64-byte line of a shared page; arriving, it writes how many times it has arrived there
    and spins until every other rank's count has reached its own (counts only grow, so a rank already at the
    next gate never holds one back). dist.barrier() let two ranks of one H200 node go 7 us apart at the median
    when they arrived together, and 20-35 us apart in taxes profile's iterations, which rank first changing
    from one round to the next: an iteration begun after it carries that skew into its first collective, and
    two blocks of the same iterations differ by it (docs/method.md)."""

    LINE = 8  # int64 per rank: one cache line each
    # spin without pause this long, then poll every POLL_S (a rank far behind: compiling, failing); long enough
    # for any host work between two iterations (reading a fused kernel's stamps), or the early rank would sleep
    HOT_S = 2.0
    POLL_S = 20e-6

    def __init__(self, fd: int, rank: int, world: int):
        self.rank, self.world = rank, world
        self._map = mmap.mmap(fd, world * self.LINE * 8)
        self._slots = memoryview(self._map).cast("q")
        self._others = [r * self.LINE for r in range(world) if r != rank]
        self.count = 0
        self.place = ""  # where its page lives (MEMFD or a folder), set by whoever made it

    MEMFD = "memfd"  # where to make the page: an anonymous file, no name in any folder

    @staticmethod
    def create(world: int, folder: str | None = None) -> tuple[int, str]:
        """A zeroed page file for `world` ranks: (open fd, a path other processes open it by). folder MEMFD: an
        anonymous file (memfd), opened through this process's /proc entry for as long as the fd stays open;
        else a file in `folder` (/dev/shm where there is one)."""
        if folder == StartGate.MEMFD:
            fd = os.memfd_create("taxes-start-gate")
            path = f"/proc/{os.getpid()}/fd/{fd}"
        else:
            folder = folder or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
            fd, path = tempfile.mkstemp(prefix="taxes-gate-", dir=folder)
        os.ftruncate(fd, world * StartGate.LINE * 8)
        return fd, path

    def wait(self, timeout_s: float = 120.0) -> None:
        self.count += 1
        count, slots, others = self.count, self._slots, self._others
        slots[self.rank * self.LINE] = count
        spins, hot_until, deadline = 0, None, None
        while True:
            if all(slots[i] >= count for i in others):
                return
            spins += 1
            if spins & 0x3FF == 0:
                now = time.monotonic()
                if deadline is None:
                    hot_until, deadline = now + self.HOT_S, now + timeout_s
                elif now > deadline:
                    late = [i // self.LINE for i in others if slots[i] < count]
                    raise RankError(f"rank {self.rank}: rank {late[0]} did not reach the iteration's start within "
                                    f"{timeout_s:.0f} s")
                elif now > hot_until:
                    time.sleep(self.POLL_S)

    def mark(self, token: int) -> None:
        """Write a token in this rank's line beside its count (how the ranks prove they share the page)."""
        self._slots[self.rank * self.LINE + 1] = token

    def marked(self, rank: int) -> int:
        return self._slots[rank * self.LINE + 1]

    def close(self) -> None:
        self._slots.release()
        self._map.close()


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
    _gate: object = field(default=None, repr=False)  # cuda: a StartGate, where the ranks could share one

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

    def start_barrier(self, timeout_s: float = 120.0) -> None:
        """The barrier an iteration starts from: every device idle, then the hosts let go together (the
        StartGate, within about a microsecond; dist.barrier where the ranks share no gate)."""
        if self.backend == "cuda" and self._gate is not None:
            torch.cuda.synchronize()
            self._gate.wait(timeout_s)
        else:
            self.barrier(timeout_s)

    def start_barrier_kind(self) -> str:
        """What start_barrier is here, in words (a document's metadata says it)."""
        if self.backend != "cuda":
            return "the emulated ranks' barrier"
        return f"the start gate (its page: {self._gate.place})" if self._gate is not None else "dist.barrier"

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
            self._doing[self.rank] = " ".join(str(what).split())[:200]  # it ends up inside one-line errors
