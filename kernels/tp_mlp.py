"""A tensor-parallel MLP layer (tp-mlp): one Megatron-style sequence-parallel SwiGLU block, as in Llama 3.

Shapes (taxes/workloads.py TpMlp): M tokens, hidden size H, FFN size F, world p. Rank r holds X_r (its M/p
rows of X, M x H), W1_r (H x 2F/p: its F/p gate columns, then its F/p up columns) and W2_r (F/p x H):

    Y1    = all_gather(X) @ W1_r                    M x 2F/p   (ag-gemm: M, N = 2F, K = H)
    Z     = silu(Y1[:, :F/p]) * Y1[:, F/p:]         M x F/p    (the activation)
    out_r = rows r of sum_q Z_q @ W2_q             M/p x H    (gemm-rs: M, N = H, K = F)

Why it is shaped this way: between the two GEMMs every rank holds whole rows of Y1 for its own F/p
columns, so the activation needs no communication; the sequence (M) split of X and of the output keeps
the activations outside the block sharded too, so the block's only traffic is the all-gather of X going
in and the reduce-scatter of the partial products coming out. Putting the gate and up columns of a rank
side by side in one W1_r makes the first GEMM a single matmul.

What is fused and what is not. The all-fused variants replace the first GEMM and its all-gather with the
fused ag-gemm kernel (kernels/ag_gemm.py, fused-push) and the second GEMM and its reduce-scatter with
the fused gemm-rs kernel (kernels/gemm_rs.py, fused-push): the bulk-synchronous waits and the gathered X
and M x H partial round trips go. The activation stays a kernel of its own (swiglu_kernel below, one
launch that reads Y1 once and writes Z), so Y1 is written to HBM by the first GEMM and read back by the
activation, and Z is written and read back by the second GEMM: that data-locality tax remains in every
variant, fused or not. Folding the activation into the first GEMM's epilogue would remove it, but the
gate and up columns of a row then have to land in the same output tile (interleaved W1 columns), which
is a different kernel.

Variants:
- all-bsp: NCCL all-gather, torch.matmul, the activation as a user writes it (F.silu(g) * u: two torch
  kernels, silu then mul), torch.matmul, NCCL reduce-scatter; the ag-gemm and gemm-rs bsp runners'
  own steps;
- all-graph: the same six kernels captured in one CUDA graph per input set (eager without CUDA);
- all-fused-eager: the three launches (fused ag-gemm, SwiGLU, fused gemm-rs), launched eagerly;
- all-fused: the same three launches captured in one CUDA graph (eager without CUDA), so the report
  shows the launch tax the graph removes.
Intermediates (Y1, Z and the bsp partial) belong to the variant object, allocated once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as torch_f
import triton
import triton.language as tl

from taxes.variants import kernel_names
from taxes.kernels import ag_gemm as ag
from taxes.kernels import gemm_rs as rs
from taxes.kernels.ag_gemm_torch import AgGemmBsp
from taxes.kernels.config_keys import route
from taxes.kernels.launch import BoundLaunch
from taxes.kernels.device import interpreting, replay_graph
from taxes.kernels.rank import RankContext, SymBuffer

VARIANTS = kernel_names("tp-mlp")  # the variants with kernels here (taxes.variants)


@dataclass(frozen=True)
class SwigluConfig:
    """The activation kernel's tiling: a block of rows x columns of Z per program (untuned; it is
    memory-bound, so any block of a few thousand elements streams at close to HBM speed)."""

    block_m: int = 8
    block_n: int = 512
    num_warps: int = 4


# ---- the activation kernel -------------------------------------------------------------------------


@triton.jit
def _round_to_bf16_grid(x):
    """float32 x rounded to the nearest bfloat16 value (ties to even), still as float32: Triton 3.6's
    interpreter converts float32 to bfloat16 by truncation, a bias that the GPU's conversion has not."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(x == x, bits.to(tl.float32, bitcast=True), x)  # a NaN stays a NaN (poisoned inputs)


@triton.jit
def swiglu_kernel(y_ptr, z_ptr, M, F_local, stride_y, stride_z, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  ROUND_BF16: tl.constexpr):
    """Z[i, j] = silu(Y[i, j]) * Y[i, F_local + j] for one BLOCK_M x BLOCK_N block of Z: each element of
    Y is read once, the math is float32, Z is stored once in its own dtype."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < F_local)[None, :]
    y_row = y_ptr + rows.to(tl.int64)[:, None] * stride_y + cols[None, :]
    gate = tl.load(y_row, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(y_row + F_local, mask=mask, other=0.0).to(tl.float32)
    z = gate * tl.sigmoid(gate) * up
    if ROUND_BF16:
        z = _round_to_bf16_grid(z)
    tl.store(z_ptr + rows.to(tl.int64)[:, None] * stride_z + cols[None, :], z.to(z_ptr.dtype.element_ty), mask=mask)


def swiglu(y1: torch.Tensor, z: torch.Tensor, cfg: SwigluConfig = SwigluConfig()) -> torch.Tensor:
    """z = silu(y1[:, :F]) * y1[:, F:] with y1 of shape M x 2F; one launch. Returns z."""
    bind_swiglu(y1, z, cfg)()
    return z


def bind_swiglu(y1: torch.Tensor, z: torch.Tensor, cfg: SwigluConfig = SwigluConfig()) -> BoundLaunch:
    """The activation kernel bound to y1 and z (checked here, once): calling it launches z = SwiGLU(y1)."""
    if y1.dim() != 2 or y1.shape[1] % 2:
        raise ValueError(f"swiglu expects Y1 of shape M x 2F, got {tuple(y1.shape)}")
    M, f_local = y1.shape[0], y1.shape[1] // 2
    if tuple(z.shape) != (M, f_local) or z.dtype != y1.dtype:
        raise ValueError(f"swiglu expects Z of shape {(M, f_local)} and dtype {y1.dtype}, got {tuple(z.shape)} {z.dtype}")
    if y1.stride(1) != 1 or z.stride(1) != 1:
        raise ValueError("swiglu expects Y1 and Z with contiguous rows")
    grid = (triton.cdiv(M, cfg.block_m), triton.cdiv(f_local, cfg.block_n))
    return BoundLaunch(swiglu_kernel, grid, (y1, z, M, f_local, y1.stride(0), z.stride(0)),
                       dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                            ROUND_BF16=interpreting() and z.dtype == torch.bfloat16, num_warps=cfg.num_warps))


def swiglu_torch(y1: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The activation as a user writes it in PyTorch: silu (one kernel, into a temporary), then mul into z."""
    f_local = z.shape[1]
    return torch.mul(torch_f.silu(y1[:, :f_local]), y1[:, f_local:], out=z)


# ---- shapes and configurations ---------------------------------------------------------------------


def check_shape(M: int, H: int, F: int, world: int) -> None:
    """ValueError (one line) for a split the layer cannot make; the two GEMM kernels check their tiling."""
    for name, v in (("M", M), ("H", H), ("F", F)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive whole number")
    if M % world:
        raise ValueError(f"M={M} is not divisible by the world size {world} (X and the output are split by rows)")
    if F % world:
        raise ValueError(f"F={F} is not divisible by the world size {world} (W1 and W2 are split along F)")


CONFIG_PARTS = {"ag": ag.Config, "rs": rs.Config, "swiglu": SwigluConfig}  # --config's ag., rs. and swiglu. keys


def split_overrides(overrides: dict | None) -> dict[str, dict]:
    """Configuration overrides -> {"ag": {...}, "rs": {...}, "swiglu": {...}} (kernels/config_keys.py: "ag.KEY"
    to that part alone, a plain KEY to every part that has it; an unknown key is a one-line ValueError)."""
    return route("tp-mlp", CONFIG_PARTS, overrides)


# ---- the variants ------------------------------------------------------------------------------------


class TpMlpBsp:
    """all-bsp (and all-graph): the ag-gemm bsp runner's all-gather and matmul into Y1, the activation
    in torch, then the gemm-rs bsp runner's matmul and reduce-scatter into out."""

    def __init__(self, ctx: RankContext, M: int, H: int, F: int, dtype: torch.dtype, graph: bool = False):
        p = ctx.world
        check_shape(M, H, F, p)
        f_local = F // p
        self.ctx, self.M, self.H, self.F = ctx, M, H, F
        self.graph = graph and ctx.device.type == "cuda"
        self.ag = AgGemmBsp(ctx, M, 2 * f_local, H, dtype)
        self.rs = rs.GemmRsBsp(ctx, M, H, F, dtype)
        self.y1 = torch.empty(M, 2 * f_local, dtype=dtype, device=ctx.device)
        self.z = torch.empty(M, f_local, dtype=dtype, device=ctx.device)
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}

    def phases(self, x_full: SymBuffer, w1, w2, out, traced: bool = False) -> list[tuple[str, str, object]]:
        """The eager steps as (name, role, thunk); running the thunks in order is one call."""
        (_, _, gather), (_, _, matmul1) = self.ag.phases(x_full, w1, self.y1)
        (_, _, matmul2), (_, _, scatter) = self.rs.phases(self.z, w2, out)
        return [("all-gather", "communication", gather),
                ("matmul1", "compute", matmul1),
                ("swiglu", "compute", lambda: swiglu_torch(self.y1, self.z)),
                ("matmul2", "compute", matmul2),
                ("reduce-scatter", "communication", scatter)]

    def _eager(self, x_full, w1, w2, out):
        for _, _, step in self.phases(x_full, w1, w2, out):
            step()
        return out

    def __call__(self, x_full: SymBuffer, w1, w2, out):
        if not self.graph:
            return self._eager(x_full, w1, w2, out)
        replay_graph(self._graphs, (x_full.local.data_ptr(), w1.data_ptr(), w2.data_ptr(), out.data_ptr()),
                     lambda: self._eager(x_full, w1, w2, out))
        return out


class TpMlpFused:
    """all-fused-eager (and all-fused): the fused ag-gemm into Y1, the SwiGLU kernel into Z, the fused
    gemm-rs into out; graph=True captures the three launches in one CUDA graph per input set."""

    traced_phase = "fused-ag-gemm"  # the phase whose traced build records per-CTA waits (taxes.run.cases.cta_stamps)

    def __init__(self, ctx: RankContext, M: int, H: int, F: int, dtype: torch.dtype, graph: bool = False,
                 ag_config: ag.Config | None = None, rs_config: rs.Config | None = None,
                 swiglu_config: SwigluConfig = SwigluConfig(), wait_s: float = 5.0):
        p = ctx.world
        check_shape(M, H, F, p)
        f_local = F // p
        self.ctx, self.M, self.H, self.F = ctx, M, H, F
        self.graph = graph and ctx.device.type == "cuda"
        cfg = ag_config or ag.tuned_config(M, 2 * F, H, p, "fused-push")
        # Built as for fused-push-graph, in both variants: a graph cannot replay the copy-engine producer
        # (its flag values come from the host), so the eager variant runs the very kernel the graph holds.
        ag_runner = ag.make_variant(ctx, "fused-push-graph", M, 2 * f_local, H, dtype, cfg, wait_s=wait_s)
        self.ag = ag_runner.inner
        self.rs = rs.make_variant(ctx, "fused-push", M, H, F, dtype, rs_config, wait_s=wait_s)
        self.swiglu_cfg = swiglu_config
        self.y1 = torch.zeros(M, 2 * f_local, dtype=dtype, device=ctx.device)
        self.z = torch.empty(M, f_local, dtype=dtype, device=ctx.device)
        # Compile and load the activation kernel now: loading a module while a spinning fused kernel holds
        # the GPU waits for that kernel (kernels/ag_gemm_kernel.py, wait_peers_kernel). Bound once: Y1 and Z
        # belong to this object.
        self._swiglu = bind_swiglu(self.y1, self.z, swiglu_config)
        self._swiglu()
        flat = {f"ag.{k}": v for k, v in asdict(self.ag.cfg).items()}
        flat |= {f"rs.{k}": v for k, v in asdict(self.rs.cfg).items()}
        flat |= {f"swiglu.{k}": v for k, v in asdict(swiglu_config).items()}
        self.cfg = SimpleNamespace(**flat)  # recorded in result documents: plain values only
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}

    def phases(self, x_full: SymBuffer, w1, w2, out, traced: bool = False) -> list[tuple[str, str, object]]:
        """Three launches. traced: the ag-gemm part runs its instrumented build (per-CTA waits)."""
        return [("fused-ag-gemm", "compute", lambda: self.ag(x_full, w1, self.y1, traced)),
                ("swiglu", "compute", self._swiglu),
                ("fused-gemm-rs", "compute", lambda: self.rs(self.z, w2, out))]

    def _eager(self, x_full, w1, w2, out, traced: bool = False):
        """The phases' three launches, called directly (no thunks built per call)."""
        self.ag(x_full, w1, self.y1, traced)
        self._swiglu()
        self.rs(self.z, w2, out)
        return out

    def __call__(self, x_full: SymBuffer, w1, w2, out, traced: bool = False):
        if not self.graph:
            return self._eager(x_full, w1, w2, out, traced)
        replay_graph(self._graphs, (x_full.local.data_ptr(), w1.data_ptr(), w2.data_ptr(), out.data_ptr(), traced),
                     lambda: self._eager(x_full, w1, w2, out, traced))
        return out

    def trace_buffers(self) -> list:
        return self.ag.trace_buffers()

    def cta_trace_rows(self) -> list[dict]:
        """The ag-gemm part's last traced call, per CTA (AgGemmFused.cta_trace_rows)."""
        return self.ag.cta_trace_rows()

    def tile_waits(self) -> list[tuple[int, int]]:
        """The ag-gemm part's last traced call, per output tile (AgGemmFused.tile_waits)."""
        return self.ag.tile_waits()

    def check(self, what: str = "tp-mlp") -> None:
        """Both fused parts' checks (each re-arms its error buffer); the first failure is raised after both ran."""
        failures = []
        for part, name in ((self.ag, "fused all-gather + GEMM"), (self.rs, "fused GEMM + reduce-scatter")):
            try:
                part.check(f"{what}: {name}")
            except Exception as e:  # FlagTimeout, or a device error: report it once the other part is re-armed too
                failures.append(e)
        if failures:
            raise failures[0]


def make_variant(ctx: RankContext, variant: str, M: int, H: int, F: int, dtype: torch.dtype,
                 ag_config: ag.Config | None = None, rs_config: rs.Config | None = None,
                 swiglu_config: SwigluConfig = SwigluConfig(), wait_s: float = 5.0):
    """A callable run(x_full, w1, w2, out) -> out for one variant: x_full an M x H symmetric buffer whose
    rows of this rank's shard hold X_r, w1 H x 2F/p (gate columns, then up columns), w2 F/p x H, out M/p x H."""
    if variant in ("all-bsp", "all-graph"):
        return TpMlpBsp(ctx, M, H, F, dtype, graph=variant == "all-graph")
    if variant in ("all-fused-eager", "all-fused"):
        return TpMlpFused(ctx, M, H, F, dtype, variant == "all-fused", ag_config, rs_config, swiglu_config, wait_s)
    raise ValueError(f"unknown tp-mlp variant {variant!r}: choose from {', '.join(VARIANTS)}")


def reference(x_rows: torch.Tensor, w1_parts: list[torch.Tensor], w2_parts: list[torch.Tensor]) -> torch.Tensor:
    """float32: a rank's output rows from its own X rows and every rank's W1 and W2 (a row of the output
    depends on the same row of X alone, so the peers' rows are not needed)."""
    x = x_rows.float()
    out = torch.zeros(x.shape[0], w2_parts[0].shape[1], dtype=torch.float32, device=x.device)
    for w1, w2 in zip(w1_parts, w2_parts):
        y = x @ w1.float()
        f_local = w2.shape[0]
        out += (torch_f.silu(y[:, :f_local]) * y[:, f_local:]) @ w2.float()
    return out
