"""GEMM + reduce-scatter: out = rows [r*M/p, (r+1)*M/p) of sum over ranks of A_r @ W_r, bulk-synchronous
and as one fused Triton kernel.

Shapes (taxes/workloads.py GemmRs): K is split over p ranks; rank r holds A_r (M x K/p) and W_r (K/p x N),
computes the partial C_r = A_r @ W_r (M x N), and ends with the M/p x N block of sum_r C_r that it owns
(rows of rank r's shard). Inputs are ordinary local tensors: only the fused kernel's inbox and flags
live in the symmetric heap.

Variants:
- bsp: torch.matmul into an M x N partial, then NCCL reduce_scatter_tensor (sum) into out;
- bsp-graph: the same two calls captured in one CUDA graph;
- fused-push: one persistent Triton kernel; each CTA computes an output tile of C_r and, for a tile
  of a peer's rows, stores it into this rank's slot of the peer's inbox and raises a per-tile flag in
  the peer's memory; for a tile of its own rows it waits for every peer's flag of that tile, adds the
  peers' slots to its float32 accumulator and writes out (the owner reduces in its GEMM epilogue);
  With Config(producer="copy-engine") the same kernel runs as (p-1) x ce_chunks + 1 launches: each of
  the first stores a chunk of one owner's rows into a local staging buffer (TMA, HBM speed) and, when it
  has ended, a side stream copies the chunk into the owner's inbox and then copies the launch's epoch
  into the owner's flag for that chunk; the last launch computes the own rows and reduces as above. The
  copies overlap the next launch, and no GEMM CTA ever waits on the link (the CTA producer's remote
  stores and system-scope releases stalled its CTAs: docs/gemm_rs.md);
- fused-push-graph: the fused kernel replayed from a CUDA graph (with the copy engine: its launches,
  copies and the side stream's fork and join, all in the graph);
- torch-fused-rs: torch.ops.symm_mem.fused_matmul_reduce_scatter, the peer to beat (CUDA only).

Why the fused kernel looks like this. The tiles are taken from a queue (an atomic counter) in owner
order rank+1, rank+2, ..., rank: the peers' tiles first, so they are in flight while the rest is
computed, and this rank's own rows last, when the peers' tiles for them have had most of the kernel to
arrive. Rank s sends first to s+1, so every owner receives from one peer at a time. The owner's own
partial never leaves registers (the workload model counts only the peers' partials as intermediate
bytes), which is why the inbox has p-1 slots, not p: slot (src - owner - 1) mod p holds src's partial.
Of the two fused designs (the owner reduces as tiles arrive, or every producer writes a sum
into the owner's buffer) this is the first, merged with the owner's own GEMM epilogue; the second needs
remote atomic float adds (non-deterministic sums, fp32 output buffer) and was not built.

Partials travel in the input dtype (bf16/fp16), as in bsp (torch.matmul writes a bf16 partial and NCCL
reduces it) and in torch's fused_matmul_reduce_scatter: the link carries what the workload model counts
((p-1) * M/p * N * elt per rank) and the error is no larger than bsp's, since the owner sums the p
partials in float32 (its own unrounded). Config(fp32_partials=True) sends float32 partials instead
(twice the link bytes) for an accuracy comparison.

Reuse across calls: double buffering by epoch parity, no "free" flag. An epoch (one per call, the same
on every rank, kept on the device in a counters buffer and published by the last CTA to finish, so a
CUDA graph can replay the launch) stamps every flag; flags only grow and are tested with >=. In epoch e
a rank writes the parity e%2 half of its peers' inboxes. The owner read that half last in epoch e-2;
the writer is in epoch e, so it finished epoch e-1, whose own tiles waited for every peer's epoch e-1
tiles; a peer that sent epoch e-1 tiles had started its epoch e-1 launch, so (stream order) its epoch
e-2 launch, and with it every read of the half now being overwritten, had ended. A rank cannot run two
epochs ahead of a peer for the same reason, so a flag at e+1 never covers a slot still holding e-1
data. This costs twice the inbox memory (2 (p-1)/p M N elt bytes of symmetric heap) but no producer
ever waits before it writes; a free flag would make a fast rank's first stores wait for the slowest
owner to finish its reduction. It relies on one stream per rank running the calls in order.

The copy-engine producer uses one inbox half instead: its copies are made by the host at capture time
(fixed addresses in a CUDA graph), so they cannot follow the device's epoch parity. Its guard instead:
the last CTA of each staging launch waits until the owner published (done flag, system scope) that it
finished reducing the previous call, so the copy behind that launch never overwrites rows the owner has
not read. That wait is inside the launch, not a guard kernel on the copy stream, because a kernel there
could not be scheduled while the owner-rows launch, spinning on its flags, holds every SM.

Under Triton's interpreter the programs of a launch run one after another; a program only ever waits
for flags that other ranks raise, and every rank pushes all its peer tiles before it waits on any, so
no program waits for a later program of its own rank. A static round-robin schedule would break that,
so there is none.

Here: the host side (configurations, binding, the variants); the kernel itself in kernels/gemm_rs_kernel.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

from taxes.variants import kernel_names
from taxes.kernels.ag_gemm import nearest_tuned
from taxes.kernels.launch import BoundedCache, BoundLaunch, DescriptorCache, buffer_key
from taxes.kernels.device import interpreting, replay_graph, sm_count_of
from taxes.kernels.rank import RankContext
from taxes.kernels.gemm_rs_kernel import gemm_rs_fused_kernel
from taxes.kernels.sync import ERR_WORDS, raise_if_timed_out, wait_budget

__all__ = ["VARIANTS", "Config", "GemmRsBsp", "GemmRsFused", "GemmRsFusedGraph", "GemmRsTorchFused", "check_shape",
           "make_variant", "reference", "tuned_config", "reduce_scatter_rows"]

VARIANTS = kernel_names("gemm-rs")  # the variants with kernels here (taxes.variants)


@dataclass(frozen=True)
class Config:
    """The fused kernel's tiling. Untuned: 128x128 (not ag_gemm's 128x256) because an own tile holds its
    float32 accumulator and a peer's partial tile in registers at once during the reduction."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    grid: int = 0  # persistent CTAs; 0: one per SM
    fp32_partials: bool = False  # send float32 partials (accuracy comparison; twice the link bytes)
    warp_spec: bool = False  # tl.range(warp_specialize=True) on the K loop (Hopper: producer/consumer warps)
    producer: str = "ctas"  # who moves a peer's partial: "ctas" (the GEMM CTA stores it over the link) or
    # "copy-engine" (launches per owner store it locally; a side stream copies it to the owner)
    ce_chunks: int = 2  # copy engine: launches (and copies, and flags) per peer's block, so copies overlap
    # the next launch; 1 if M/p is not a multiple of ce_chunks * group_m * block_m


TUNED_FILE = Path(__file__).with_name("gemm_rs_tuned.json")


def tuned_config(M: int, N: int, K: int, world: int) -> Config:
    """The fused kernel's configuration for a shape: the tuned table's entry for the same N, K and world
    with the nearest M (benchmarks/tune.py gemm-rs measures the candidates on the GPUs and writes the
    table; docs/gemm_rs.md says how), else the tiling the tuned entries chose: 128x256 tiles (every entry),
    group_m 16 and 4 stages up to 4096 rows per rank, 8 and 3 beyond (5 of 6 and 2 of 2 entries); 128x128
    where N is not a multiple of 256. Config()'s 128x128 ran a held-out shape (M=2048, N=6144, K=8192, one
    H200) 1.5x slower than cuBLAS."""
    if TUNED_FILE.exists():
        rows = [r for r in json.loads(TUNED_FILE.read_text())["entries"]
                if r["N"] == N and r["K"] == K and r["world"] == world]
        if rows:
            return nearest_tuned(Config, rows, M)
    if N % 256:
        return Config()
    small = M // world <= 4096
    return Config(block_n=256, group_m=16 if small else 8, num_stages=4 if small else 3)


# ---- the host side --------------------------------------------------------------------------------


def check_shape(M: int, N: int, K: int, world: int, block_m: int | None = None) -> None:
    """ValueError (one line) for a shape the variants cannot run: the splits must be exact, and TMA
    needs 16-byte row strides (N and K/p multiples of 8 for 2-byte elements)."""
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive whole number")
    if M % world:
        raise ValueError(f"M={M} is not divisible by the world size {world}")
    if K % world:
        raise ValueError(f"K={K} is not divisible by the world size {world}")
    if block_m is not None:
        if (M // world) % block_m:
            raise ValueError(f"M/p={M // world} is not a multiple of block_m={block_m}")
        if N % 8 or (K // world) % 8:
            raise ValueError(f"N={N} and K/p={K // world} must be multiples of 8 (16-byte rows for TMA)")


def _check_call(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, M: int, N: int, K_local: int, world: int) -> None:
    want = ((M, K_local), (K_local, N), (M // world, N))
    got = (tuple(a.shape), tuple(w.shape), tuple(out.shape))
    if got != want:
        raise ValueError(f"gemm-rs expects a, w, out of shapes {want}, got {got}")
    if not (a.is_contiguous() and w.is_contiguous() and out.is_contiguous()):
        raise ValueError("gemm-rs expects contiguous a, w and out")


class GemmRsFused:
    """A fused GEMM + reduce-scatter for one shape on one rank: owns its inbox, flags, counters and epoch.

    All ranks build it with the same arguments (K is the full K; each rank holds K/p of it) and call it
    the same number of times, on one stream; run(a, w, out) writes out = this rank's rows of sum_r A_r W_r."""

    def __init__(self, ctx: RankContext, M: int, N: int, K: int, dtype: torch.dtype, config: Config = Config(),
                 wait_s: float = 5.0):
        p = ctx.world
        check_shape(M, N, K, p, config.block_m)
        if config.producer not in ("ctas", "copy-engine"):
            raise ValueError(f"gemm-rs producer {config.producer!r}: choose 'ctas' or 'copy-engine'")
        self.interp = interpreting()
        self.ctx, self.M, self.N, self.K_local, self.dtype, self.cfg = ctx, M, N, K // p, dtype, config
        self.grid = config.grid or sm_count_of(ctx.device)
        self.tiles_per_shard = (M // p // config.block_m) * triton.cdiv(N, config.block_n)
        heap = ctx.heap
        slots = max(p - 1, 1)  # world 1: a one-element stand-in, never touched
        inbox_dtype = torch.float32 if config.fp32_partials else dtype
        self.inbox = heap.alloc((2, slots, M // p, N) if p > 1 else (1,), inbox_dtype)  # [parity][slot]
        self.flags = heap.zeros((slots * self.tiles_per_shard,), torch.int32)  # [slot][tile], epochs
        self.ce = config.producer == "copy-engine" and p > 1
        blocks = M // p // config.block_m
        self.chunks = config.ce_chunks if self.ce and blocks % (config.ce_chunks * config.group_m) == 0 else 1
        # CE: chunks launches per peer's rows, then one for the own rows; the grouped tile order maps a
        # launch's tile range onto whole row blocks because a chunk is a multiple of group_m row blocks
        launches = (p - 1) * self.chunks + 1 if self.ce else 1
        self.counters = torch.zeros((launches, 3), dtype=torch.int32, device=ctx.device)
        self.done = heap.zeros((p,), torch.int32)  # CE: [rank] the last epoch whose reduction ended
        self.err = torch.zeros(ERR_WORDS, dtype=torch.int32, device=ctx.device)
        self.budget = wait_budget(wait_s, self.interp)
        self.epoch = 0
        # TMA descriptors, made once per buffer, and launches bound per (a, w, out) (kernels/launch.py)
        self._descs = DescriptorCache()
        self._bound = BoundedCache()
        if self.ce:
            self.staging = torch.empty(((p - 1) * (M // p), N), dtype=inbox_dtype, device=ctx.device)
            on_gpu = ctx.device.type == "cuda"
            self._side = torch.cuda.Stream(ctx.device) if on_gpu else None
            self._filled = [torch.cuda.Event() for _ in range(launches - 1)] if on_gpu else []
        ctx.barrier()  # every rank's flags are zero before anyone signals

    def __call__(self, a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        key = (buffer_key(a), buffer_key(w), buffer_key(out))
        launches = self._bound.get(key)
        if launches is None:
            _check_call(a, w, out, self.M, self.N, self.K_local, self.ctx.world)
            launches = self._bound.put(key, self._bind(a, w, out))
        self.epoch += 1
        if self.epoch >= 1 << 30:
            raise RuntimeError("epoch counter exhausted; build a new GemmRsFused")
        if not self.ce:
            launches[0]()
            return out
        # Copy engine: launch (s, c) fills chunk c of the staging block of owner rank+s and ends once the
        # owner has reduced the previous call; then the side stream copies the chunk into the owner's inbox
        # and the epoch into the owner's flag of that chunk (a copy starts when the one before it on its
        # stream has completed). Each copy overlaps the next launch; the own rows' launch comes last.
        main = torch.cuda.current_stream(self.ctx.device) if self._side is not None else None
        C = self.chunks
        for s in range(1, self.ctx.world):
            for c in range(C):
                row = (s - 1) * C + c
                launches[row]()
                if main is None:
                    self._copy_chunk(s, c, row)
                    continue
                self._filled[row].record(main)
                self._side.wait_event(self._filled[row])
                with torch.cuda.stream(self._side):
                    self._copy_chunk(s, c, row)
        launches[-1]()
        if main is not None:
            main.wait_stream(self._side)  # the next call refills the staging buffer
        return out

    def _bind(self, a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> list[BoundLaunch]:
        """The call's launches bound to these buffers: one, or (copy engine) one per chunk of each peer's
        rows (counters row (s-1)*chunks + c takes that chunk's tiles) and then the own rows'."""
        cfg, p, T = self.cfg, self.ctx.world, self.tiles_per_shard
        descs = self._descs
        d_out = descs.get(out, [cfg.block_m, cfg.block_n])
        gemm = (descs.get(a, [cfg.block_m, cfg.block_k]), descs.get(w, [cfg.block_k, cfg.block_n]), d_out)
        inbox = descs.get(self.inbox.local.view(-1, self.N), [cfg.block_m, cfg.block_n]) if p > 1 else d_out
        if not self.ce:
            return [self._bind_one(gemm, d_out, inbox, 0, 0, p * T)]
        staging = descs.get(self.staging, [cfg.block_m, cfg.block_n])
        C = self.chunks
        launches = [self._bind_one(gemm, staging, inbox, (s - 1) * C + c, (s - 1) * T + c * (T // C),
                                   (s - 1) * T + (c + 1) * (T // C))
                    for s in range(1, p) for c in range(C)]
        return launches + [self._bind_one(gemm, staging, inbox, (p - 1) * C, (p - 1) * T, p * T)]

    def _bind_one(self, gemm_descs, staging_desc, inbox_desc, row: int, t_begin: int, t_end: int) -> BoundLaunch:
        cfg, ctx = self.cfg, self.ctx
        args = (*gemm_descs, staging_desc, inbox_desc, self.inbox.local, self.flags.local, ctx.heap.bases,
                self.counters[row], self.err, self.done.local, ctx.rank, self.M, self.N, self.K_local, self.budget,
                t_begin, t_end, self.M // ctx.world // cfg.block_m // self.chunks)
        constants = dict(
            WORLD=ctx.world, GRID=self.grid, BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, GROUP_M=cfg.group_m,
            WARP_SPEC=cfg.warp_spec and not self.interp, INTERPRET=self.interp, DOT_F32=self.interp, CE=self.ce,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return BoundLaunch(gemm_rs_fused_kernel, (self.grid,), args, constants)

    def _copy_chunk(self, s: int, c: int, row: int) -> None:
        """The copy engine's part for chunk c of owner rank+s's rows: the rows, then the flag (the launch
        before it waited until the owner's inbox was free)."""
        ctx, p = self.ctx, self.ctx.world
        rows = self.M // p // self.chunks
        owner = (ctx.rank + s) % p
        slot = (ctx.rank - owner - 1) % p
        r0 = (s - 1) * self.chunks * rows + c * rows
        self.inbox.peers[owner][0, slot, c * rows:(c + 1) * rows].copy_(self.staging[r0:r0 + rows], non_blocking=True)
        flag = slot * self.tiles_per_shard + c
        self.flags.peers[owner][flag:flag + 1].copy_(self.counters[row, 2:3], non_blocking=True)

    def phases(self, a, w, out, traced: bool = False) -> list[tuple[str, str, object]]:
        """One call (one launch, or the copy engine's launches and copies): a single phase. (No traced
        build yet: `traced` is accepted and ignored.)"""
        return [("fused-gemm-rs", "compute", lambda: self(a, w, out))]

    def check(self, what: str = "fused GEMM + reduce-scatter") -> None:
        """Raise FlagTimeout if any wait of the last calls gave up (synchronises), and re-arm."""
        raise_if_timed_out(self.err, self.ctx.rank, what, self._describe, rearm=True)

    def _describe(self, kind: int, index: int) -> str:
        p, rank = self.ctx.world, self.ctx.rank
        if kind == 2:
            return f"rank {index} done reducing the previous call, before the copy engine writes its inbox"
        slot, tile = divmod(index, self.tiles_per_shard)
        src = (rank + slot + 1) % p
        if self.ce:
            return f"chunk {tile} of rank {rank}'s rows from rank {src}, copied by the copy engine"
        return f"tile {tile} of rank {rank}'s rows from rank {src}"


class GemmRsFusedGraph:
    """fused-push-graph: the fused kernel replayed from a CUDA graph (one per input set); the epoch lives
    on the device, so replays stay in step. Without CUDA it runs the kernel directly."""

    def __init__(self, fused: GemmRsFused):
        self.inner, self.ctx, self.cfg = fused, fused.ctx, fused.cfg
        self.on_gpu = fused.ctx.device.type == "cuda"
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}

    def __call__(self, a, w, out):
        if not self.on_gpu:
            return self.inner(a, w, out)
        replay_graph(self._graphs, (a.data_ptr(), w.data_ptr(), out.data_ptr()), lambda: self.inner(a, w, out))
        return out

    def phases(self, a, w, out, traced: bool = False):
        """The eager kernel's phase: the harness captures phases into its own graph (a replay cannot be
        captured)."""
        return self.inner.phases(a, w, out, traced)

    def check(self, what: str = "fused GEMM + reduce-scatter (graph)") -> None:
        self.inner.check(what)


# ---- bsp, bsp-graph, torch's fused op and the reference -------------------------------------------


def reduce_scatter_rows(ctx: RankContext, out: torch.Tensor, partial) -> None:
    """out = this rank's M/p rows of the sum over ranks of `partial` (M x N). NCCL on GPUs (partial a
    tensor); emulated ranks (partial a SymBuffer) sum the peers' rows in float32 out of the symmetric heap
    between two barriers (a stand-in with the same result, no timing meaning)."""
    if ctx.backend == "cuda":
        import torch.distributed as dist

        dist.reduce_scatter_tensor(out, partial)
        return
    rows = out.shape[0]
    r = ctx.rank
    ctx.barrier()
    total = torch.zeros(out.shape, dtype=torch.float32)
    for q in range(ctx.world):
        total += partial.peers[q][r * rows:(r + 1) * rows].float()
    out.copy_(total)
    ctx.barrier()  # no rank overwrites its partial while a peer still reads it


class GemmRsBsp:
    """bsp (and bsp-graph): torch.matmul into an M x N partial, then a reduce-scatter along M."""

    def __init__(self, ctx: RankContext, M: int, N: int, K: int, dtype: torch.dtype, graph: bool = False):
        check_shape(M, N, K, ctx.world)
        self.ctx, self.M, self.N, self.K_local = ctx, M, N, K // ctx.world
        self.graph = graph and ctx.device.type == "cuda"
        if ctx.backend == "cuda":
            self.partial = torch.empty(M, N, dtype=dtype, device=ctx.device)
            self._partial_local = self.partial
        else:  # the emulated reduce-scatter reads the peers' partials out of the heap
            self.partial = ctx.heap.alloc((M, N), dtype)
            self._partial_local = self.partial.local
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}

    def phases(self, a, w, out, traced: bool = False) -> list[tuple[str, str, object]]:
        """The eager steps as (name, role, thunk); running the thunks in order is one call."""
        _check_call(a, w, out, self.M, self.N, self.K_local, self.ctx.world)
        return [("matmul", "compute", lambda: torch.matmul(a, w, out=self._partial_local)),
                ("reduce-scatter", "communication", lambda: reduce_scatter_rows(self.ctx, out, self.partial))]

    def _eager(self, a, w, out):
        for _, _, step in self.phases(a, w, out):
            step()
        return out

    def __call__(self, a, w, out):
        if not self.graph:
            return self._eager(a, w, out)
        replay_graph(self._graphs, (a.data_ptr(), w.data_ptr(), out.data_ptr()), lambda: self._eager(a, w, out))
        return out


class GemmRsTorchFused:
    """torch.ops.symm_mem.fused_matmul_reduce_scatter (PyTorch's async tensor parallelism). It returns a
    new tensor (its own workspace), which is returned as is: copying into out would time a copy too."""

    def __init__(self, ctx: RankContext, M: int, N: int, K: int, dtype: torch.dtype):
        if ctx.backend != "cuda":
            raise NotImplementedError("torch-fused-rs needs CUDA symmetric memory (no CPU emulation)")
        check_shape(M, N, K, ctx.world)
        import torch.distributed as dist

        self.ctx, self.M, self.N, self.K_local = ctx, M, N, K // ctx.world
        self.group_name = dist.group.WORLD.group_name

    def __call__(self, a, w, out):
        _check_call(a, w, out, self.M, self.N, self.K_local, self.ctx.world)
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, w, "sum", 0, self.group_name)

    def phases(self, a, w, out, traced: bool = False):
        return [("fused-matmul-reduce-scatter", "compute", lambda: self(a, w, out))]


def make_variant(ctx: RankContext, variant: str, M: int, N: int, K: int, dtype: torch.dtype,
                 config: Config | None = None, wait_s: float = 5.0):
    """A callable run(a, w, out) -> this rank's M/p x N rows, for one variant. K is the full K: a is
    M x K/p, w is K/p x N, out is M/p x N."""
    if variant in ("bsp", "bsp-graph"):
        return GemmRsBsp(ctx, M, N, K, dtype, graph=variant == "bsp-graph")
    if variant in ("fused-push", "fused-push-graph"):
        fused = GemmRsFused(ctx, M, N, K, dtype, config or tuned_config(M, N, K, ctx.world), wait_s=wait_s)
        return fused if variant == "fused-push" else GemmRsFusedGraph(fused)
    if variant == "torch-fused-rs":
        return GemmRsTorchFused(ctx, M, N, K, dtype)
    raise ValueError(f"unknown gemm-rs variant {variant!r}: choose from {', '.join(VARIANTS)}")


def reference(a_parts: list[torch.Tensor], w_parts: list[torch.Tensor], rank: int) -> torch.Tensor:
    """float32: rank's M/p rows of sum_r a_parts[r] @ w_parts[r]."""
    p = len(a_parts)
    rows = a_parts[0].shape[0] // p
    return sum(a[rank * rows:(rank + 1) * rows].float() @ w.float() for a, w in zip(a_parts, w_parts))
