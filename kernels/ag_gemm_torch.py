"""All-Gather + GEMM as PyTorch runs it: C_local = all_gather(A) @ W_local with no kernel of ours.

- bsp: NCCL all_gather_into_tensor into a separate gathered buffer, then torch.matmul;
- bsp-graph: the same two calls captured in one CUDA graph;
- torch-async-tp: torch.ops.symm_mem.fused_all_gather_matmul, PyTorch's async tensor parallelism (the peer
  to beat).

Shapes, inputs in the symmetric heap and the fused variants: kernels/ag_gemm.py (make_variant builds
every variant by name).
"""

from __future__ import annotations

import torch

from taxes.kernels.device import replay_graph

from taxes.kernels.rank import RankContext, SymBuffer


def all_gather_rows(ctx: RankContext, out: torch.Tensor, shard: torch.Tensor, a_full: SymBuffer | None = None) -> None:
    """out = concatenation of every rank's shard. NCCL on GPUs; emulated ranks copy the peers' rows out
    of the symmetric heap between two barriers (a stand-in with the same result, no timing meaning)."""
    if ctx.backend == "cuda":
        import torch.distributed as dist

        dist.all_gather_into_tensor(out, shard)
        return
    rows = shard.shape[0]
    ctx.barrier()
    for r in range(ctx.world):
        out[r * rows:(r + 1) * rows].copy_(a_full.peers[r][r * rows:(r + 1) * rows])
    ctx.barrier()


class AgGemmBsp:
    """bsp (and bsp-graph): NCCL all-gather into a gathered buffer, then torch.matmul."""

    def __init__(self, ctx: RankContext, M: int, N_local: int, K: int, dtype: torch.dtype, graph: bool = False):
        self.ctx, self.M, self.graph = ctx, M, graph and ctx.device.type == "cuda"
        self.gathered = torch.empty(M, K, dtype=dtype, device=ctx.device)
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}

    def phases(self, a_full: SymBuffer, w_local, out, traced: bool = False) -> list[tuple[str, str, object]]:
        """The eager steps as (name, role, thunk); running the thunks in order is one call."""
        rows = self.M // self.ctx.world
        r = self.ctx.rank
        return [("all-gather", "communication",
                 lambda: all_gather_rows(self.ctx, self.gathered, a_full.local[r * rows:(r + 1) * rows], a_full)),
                ("matmul", "compute", lambda: torch.matmul(self.gathered, w_local, out=out))]

    def _eager(self, a_full: SymBuffer, w_local, out):
        for _, _, step in self.phases(a_full, w_local, out):
            step()
        return out

    def __call__(self, a_full: SymBuffer, w_local, out):
        if not self.graph:
            return self._eager(a_full, w_local, out)
        replay_graph(self._graphs, (a_full.local.data_ptr(), w_local.data_ptr(), out.data_ptr()),
                     lambda: self._eager(a_full, w_local, out))
        return out


class AgGemmTorchAsyncTP:
    """torch.ops.symm_mem.fused_all_gather_matmul (PyTorch's async tensor parallelism)."""

    def __init__(self, ctx: RankContext, M: int, N_local: int, K: int, dtype: torch.dtype):
        if ctx.backend != "cuda":
            raise NotImplementedError("torch-async-tp needs CUDA symmetric memory (no CPU emulation)")
        import torch.distributed as dist

        self.ctx, self.M, self.group_name = ctx, M, dist.group.WORLD.group_name

    def __call__(self, a_full: SymBuffer, w_local, out):
        rows = self.M // self.ctx.world
        r = self.ctx.rank
        _, (mm,) = torch.ops.symm_mem.fused_all_gather_matmul(a_full.local[r * rows:(r + 1) * rows], [w_local], gather_dim=0,
                                                             group_name=self.group_name)
        return mm
