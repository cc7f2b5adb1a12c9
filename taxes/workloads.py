"""The workloads: their shapes, and the work each one must do per rank.

A workload knows, per rank and from its shape alone:
- flops: matrix/attention FLOPs the rank must execute;
- hbm_bytes: essential device-memory traffic (each input read once, each output written once);
- link_bytes: bytes that must arrive over the GPU link (what peers must send this rank);
- intermediate_bytes(variant): bytes of intermediate tensors written to HBM by one phase and read back
  by another (written + read), the traffic behind the data-locality tax;
- kernel_count(variant): launches (kernels and collectives) one iteration of the variant makes.
All byte counts are per rank. The element size comes from the dtype (bf16 and fp16: 2 bytes).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

from taxes.errors import TaxesError
from taxes.variants import get, model_names, modelled

DTYPE_BYTES = {"bf16": 2, "fp16": 2}
# Partial outputs and log-sum-exps of flash decode are kept in float32 for a safe combine.
PARTIAL_BYTES = 4


def fused_tile_n(M: int, n_local: int, sms: int, block_m: int = 128, block_n: int = 256, narrow: int = 128) -> int:
    """The output tile's width the fused ag-gemm takes where no tuned entry is for its exact shape: block_n,
    unless the per-rank GEMM (M x n_local) then has at most half as many tiles as the GPU has SMs, where
    `narrow` tiles (twice as many) keep more SMs busy (benchmarks/gemm_vs_cublas.py --tune: 1.4-1.6x quicker
    alone at M=512, and M=1024 over 4 ranks, N=K=8192 on an H200). Used by the kernel's configuration and the
    model alike."""
    tiles = (M // block_m) * -(-n_local // block_n)
    return narrow if 2 * tiles <= sms and n_local % narrow == 0 and block_n > narrow else block_n


def _bulk(workload: str, variant: str) -> bool:
    """The model variant runs separate kernels and collectives (bsp or its graph), not fused kernels."""
    return modelled(workload, variant).bulk_synchronous


def model_variants(workload_name: str) -> tuple[str, ...]:
    """The variants the model predicts for a workload (taxes.variants)."""
    return model_names(workload_name)


@dataclass(frozen=True)
class AgGemm:
    """All-gather of A along M, then C = A @ W. A (M x K) has M/p rows per rank; W (K x N) has N/p
    columns per rank; each rank computes its M x N/p slice of C."""

    M: int
    N: int
    K: int
    world: int
    dtype: str = "bf16"
    name = "ag-gemm"
    dims = ("M", "N", "K")
    split_dims = ("M", "N")

    @property
    def elt(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def flops(self) -> float:
        return 2.0 * self.M * (self.N // self.world) * self.K

    def hbm_bytes(self) -> float:
        a_local = self.M // self.world * self.K
        w_local = self.K * (self.N // self.world)
        c_local = self.M * (self.N // self.world)
        return float((a_local + w_local + c_local) * self.elt)

    def link_bytes(self) -> float:
        return float((self.world - 1) * (self.M // self.world) * self.K * self.elt)

    def intermediate_bytes(self, variant: str) -> float:
        if _bulk(self.name, variant):
            # The gathered A (M x K) is written by the all-gather and read back by the GEMM.
            return 2.0 * self.M * self.K * self.elt
        # Fused: peer rows land in a local buffer (pushed by the peer, or staged by the consumer)
        # and are read once by the GEMM; local rows are read in place.
        return 2.0 * self.link_bytes()

    def kernel_count(self, variant: str) -> int:
        return 2 if _bulk(self.name, variant) else 1

    def phase_work(self, variant: str) -> dict[str, tuple[float, float]]:
        """Per compute phase of the variant as the kernels run it: (FLOPs, HBM bytes it reads and writes,
        intermediates included)."""
        e = self.elt
        nl = self.N // self.world
        if _bulk(self.name, variant):  # the GEMM reads the gathered A back
            return {"matmul": (self.flops(), float((self.M * self.K + self.K * nl + self.M * nl) * e))}
        return {"fused-gemm": (self.flops(), self.hbm_bytes() + self.intermediate_bytes(variant))}


@dataclass(frozen=True)
class GemmRs:
    """Each rank computes an M x N partial product from its K/p slice (A: M x K/p, W: K/p x N), then a
    reduce-scatter along M leaves each rank the summed M/p x N block it owns."""

    M: int
    N: int
    K: int
    world: int
    dtype: str = "bf16"
    name = "gemm-rs"
    dims = ("M", "N", "K")
    split_dims = ("M", "K")

    @property
    def elt(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def flops(self) -> float:
        return 2.0 * self.M * self.N * (self.K // self.world)

    def hbm_bytes(self) -> float:
        a_local = self.M * (self.K // self.world)
        w_local = (self.K // self.world) * self.N
        c_owned = (self.M // self.world) * self.N
        return float((a_local + w_local + c_owned) * self.elt)

    def link_bytes(self) -> float:
        return float((self.world - 1) * (self.M // self.world) * self.N * self.elt)

    def intermediate_bytes(self, variant: str) -> float:
        if _bulk(self.name, variant):
            # The whole M x N partial is written by the GEMM and read by the reduce-scatter.
            return 2.0 * self.M * self.N * self.elt
        # Fused: only the peers' partials for the rows this rank owns pass through HBM (written by
        # the peers, read by the reduction); the rank's own partial is reduced in registers.
        return 2.0 * self.link_bytes()

    def kernel_count(self, variant: str) -> int:
        return 2 if _bulk(self.name, variant) else 1

    def phase_work(self, variant: str) -> dict[str, tuple[float, float]]:
        """Per compute phase: (FLOPs, HBM bytes read and written, intermediates included)."""
        e, kl = self.elt, self.K // self.world
        if _bulk(self.name, variant):  # the GEMM writes the whole M x N partial
            return {"matmul": (self.flops(), float((self.M * kl + kl * self.N + self.M * self.N) * e))}
        return {"fused-gemm-rs": (self.flops(), self.hbm_bytes() + self.intermediate_bytes(variant))}


@dataclass(frozen=True)
class FlashDecode:
    """One decode step of attention with the KV cache split along the sequence: every rank holds S
    tokens of K and V for B sequences and Hkv heads; the query (B x Hq x D) is replicated; Hq query
    heads share Hkv KV heads (GQA). Every rank ends with the full output."""

    B: int
    Hq: int
    Hkv: int
    D: int
    S: int
    world: int
    dtype: str = "bf16"
    name = "flash-decode"
    dims = ("B", "Hq", "Hkv", "D", "S")
    split_dims = ()

    @property
    def elt(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def partial_bytes(self) -> float:
        """One rank's combined partial: output (D floats) and log-sum-exp (1 float) per (b, head)."""
        return float(self.B * self.Hq * (self.D + 1) * PARTIAL_BYTES)

    def kv_bytes(self) -> float:
        return float(2 * self.B * self.Hkv * self.S * self.D * self.elt)

    def flops(self) -> float:
        return 4.0 * self.B * self.Hq * self.S * self.D  # q.k^T and p.v

    def hbm_bytes(self) -> float:
        q_and_out = 2 * self.B * self.Hq * self.D * self.elt
        return self.kv_bytes() + q_and_out

    def link_bytes(self) -> float:
        return (self.world - 1) * self.partial_bytes()

    def kv_splits(self, sm_count: int, block_n: int = 64) -> int:
        """Split-KV count per (b, kv head): enough programs to fill the SMs about twice, at least one
        KV block per split."""
        want = math.ceil(2 * sm_count / (self.B * self.Hkv))
        return max(1, min(want, math.ceil(self.S / block_n)))

    def intermediate_bytes(self, variant: str, splits: int = 1) -> float:
        p, part = self.world, self.partial_bytes()
        split_round_trip = 2 * splits * part  # the split-KV kernel's partials, written then read by the combine
        if variant == "bsp-sdpa":  # PyTorch's attention writes o and lse, a kernel packs them (its splits: its own)
            return 4 * part + 2 * p * part
        if _bulk(self.name, variant):
            # local combine writes the rank's partial, the all-gather reads it and writes p of them,
            # the global combine reads those back.
            return split_round_trip + 2 * part + 2 * p * part
        # Fused: peers' partials land in the rank's inbox and are read by the global combine.
        return split_round_trip + 2 * (p - 1) * part

    def phase_work(self, variant: str, splits: int = 1) -> dict[str, tuple[float, float]]:
        """Per compute phase: (FLOPs, HBM bytes read and written, intermediates included). splits: the local
        decode's KV splits per (batch, KV head), whose partials the last program of each group merges."""
        p, part = self.world, self.partial_bytes()
        q_out = self.B * self.Hq * self.D * self.elt
        local = (self.flops(), self.kv_bytes() + q_out + 2 * splits * part + part)
        if _bulk(self.name, variant):  # local-sdpa is the same work done by PyTorch's attention
            return {"local-decode": local, "local-sdpa": local, "global-combine": (0.0, p * part + q_out)}
        return {"local-decode": (local[0], local[1] + (p - 1) * part), "fused-combine": (0.0, p * part + q_out)}

    def kernel_count(self, variant: str) -> int:
        # bsp: the local decode, all-gather, global combine; bsp-sdpa: PyTorch's attention call and the
        # kernel that packs its output before them. fused: the local decode (which pushes the rank's
        # partial to its peers) and the combine that merges them as they arrive.
        return (4 if variant == "bsp-sdpa" else 3) if _bulk(self.name, variant) else 2


@dataclass(frozen=True)
class TpMlp:
    """One sequence-parallel SwiGLU MLP block (Llama 3's): Y1 = all_gather(X) @ W1_r, Z = silu(Y1's gate
    half) * (its up half), out_r = rows r of sum_q Z_q @ W2_q. X (M x H) and the output have M/p rows per
    rank; W1_r (H x 2F/p) holds the rank's F/p gate columns then its F/p up columns; W2_r is F/p x H.
    The layer is an ag-gemm (M, N=2F, K=H), the activation, and a gemm-rs (M, N=H, K=F): see parts()."""

    M: int
    H: int
    F: int
    world: int
    dtype: str = "bf16"
    name = "tp-mlp"
    dims = ("M", "H", "F")
    split_dims = ("M", "F")

    @property
    def elt(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def parts(self) -> tuple[AgGemm, GemmRs]:
        """The two GEMM workloads the layer is made of."""
        return (AgGemm(self.M, 2 * self.F, self.H, self.world, self.dtype),
                GemmRs(self.M, self.H, self.F, self.world, self.dtype))

    def y1_bytes(self) -> float:
        """Y1 (M x 2F/p): the first GEMM's output, the activation's input."""
        return float(self.M * 2 * (self.F // self.world) * self.elt)

    def z_bytes(self) -> float:
        """Z (M x F/p): the activation's output, the second GEMM's input."""
        return float(self.M * (self.F // self.world) * self.elt)

    def flops(self) -> float:
        """Both GEMMs' matrix FLOPs (the activation's few elementwise ones are not matrix work)."""
        ag, rs = self.parts()
        return ag.flops() + rs.flops()

    def hbm_bytes(self) -> float:
        """X_r, W1_r and W2_r read once, the output rows written once; Y1 and Z are intermediates."""
        p = self.world
        x_rows = self.M // p * self.H
        w1 = self.H * 2 * (self.F // p)
        w2 = (self.F // p) * self.H
        out = self.M // p * self.H
        return float((x_rows + w1 + w2 + out) * self.elt)

    def link_bytes(self) -> float:
        """The all-gather of X and the reduce-scatter of the partial products."""
        ag, rs = self.parts()
        return ag.link_bytes() + rs.link_bytes()

    def intermediate_bytes(self, variant: str) -> float:
        """The GEMM parts' own intermediates (gathered X and the M x H partial, or the fused kernels'
        inbox traffic), plus Y1 and Z, each written once and read once in every variant (the activation
        is a kernel of its own), plus, in the torch activation of the bsp variants, silu's M x F/p
        temporary (silu and mul are two kernels)."""
        part = modelled(self.name, variant).part
        ag, rs = self.parts()
        layer = 2 * self.y1_bytes() + 2 * self.z_bytes()
        if _bulk(self.name, variant):
            layer += 2 * self.z_bytes()  # silu(gate): written by silu, read by mul
        return ag.intermediate_bytes(part) + rs.intermediate_bytes(part) + layer

    def phase_work(self, variant: str) -> dict[str, tuple[float, float]]:
        """Per compute phase: (FLOPs, HBM bytes read and written, intermediates included)."""
        part = modelled(self.name, variant).part
        ag, rs = self.parts()
        y1, z = self.y1_bytes(), self.z_bytes()
        (ag_name, (ag_f, ag_b)), = ag.phase_work(part).items()
        (rs_name, (rs_f, rs_b)), = rs.phase_work(part).items()
        if _bulk(self.name, variant):  # torch's silu then mul: a temporary of Z's size written and read
            return {"matmul1": (ag_f, ag_b), "swiglu": (0.0, y1 + 3 * z), "matmul2": (rs_f, rs_b)}
        return {"fused-ag-gemm": (ag_f, ag_b), "swiglu": (0.0, y1 + z), "fused-gemm-rs": (rs_f, rs_b)}

    def kernel_count(self, variant: str) -> int:
        """bsp: all-gather, matmul, silu, mul, matmul, reduce-scatter; fused: ag-gemm, SwiGLU, gemm-rs."""
        return 6 if _bulk(self.name, variant) else 3


WORKLOADS = {cls.name: cls for cls in (AgGemm, GemmRs, FlashDecode, TpMlp)}
DEFAULT_SHAPES = {
    "ag-gemm": {"M": 8192, "N": 8192, "K": 8192},
    "gemm-rs": {"M": 8192, "N": 8192, "K": 8192},
    "flash-decode": {"B": 1, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768},
    "tp-mlp": {"M": 4096, "H": 4096, "F": 14336},  # Llama 3 8B's MLP, 4096 tokens
}
Workload = AgGemm | GemmRs | FlashDecode | TpMlp

_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}
MAX_DIM = 1 << 40  # the largest dimension a shape may have
# ASCII digits only: str.isdigit and \d also take full-width and Arabic-Indic digits, which no shape means
_INT = re.compile(r"[ \t]*(-?)([0-9]+)[ \t]*([kKmM]?)[ \t]*", re.ASCII)


def parse_int(text: str, field: str) -> int:
    """An integer with an optional binary suffix: 8192, 8K and 8k all mean 8192; 1M is 1048576. Digits are
    ASCII; a number of more digits than MAX_DIM has is refused before it is converted (a 10,000-digit
    integer is past what Python converts)."""
    from taxes.sanitize import printable

    m = _INT.fullmatch(str(text))
    if not m:
        raise TaxesError(f"shape: {field}={printable(text, 40)!r} is not a whole number in ASCII digits "
                         f"(e.g. {field}=8192 or {field}=8K)")
    digits = m.group(2).lstrip("0") or "0"
    if len(digits) > len(str(MAX_DIM)):
        raise TaxesError(f"shape: {field} has {len(digits)} digits: too large (at most {MAX_DIM})")
    return int(m.group(1) + digits) * _SUFFIX[m.group(3).lower()]


def parse_shape(text: str) -> dict[str, int]:
    """'M=8192,N=8192,K=8K' -> {'M': 8192, 'N': 8192, 'K': 8192}."""
    shape: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        if "=" not in item:
            raise TaxesError(f"shape: {item!r} is not NAME=VALUE (e.g. M=8192,N=8192,K=8192)")
        key, value = (s.strip() for s in item.split("=", 1))
        if not key.isidentifier():
            raise TaxesError(f"shape: {key!r} is not a dimension name (e.g. M=8192,N=8192,K=8192)")
        if key in shape:
            raise TaxesError(f"shape: {key!r} is given twice")
        shape[key] = parse_int(value, key)
    return shape


def make_workload(name: str, shape: dict[str, int], world: int, dtype: str = "bf16") -> Workload:
    """Build and validate a workload; every rejection is one TaxesError line naming the field."""
    if name not in WORKLOADS:
        raise TaxesError(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}")
    cls = WORKLOADS[name]
    if dtype not in DTYPE_BYTES:
        raise TaxesError(f"dtype: unknown dtype {dtype!r}: choose from {', '.join(DTYPE_BYTES)}")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise TaxesError(f"world: the world size must be a positive whole number, not {world!r}")
    unknown = sorted(set(shape) - set(cls.dims))
    if unknown:
        raise TaxesError(f"shape: {name} has no dimension {unknown[0]!r} (its dimensions: {', '.join(cls.dims)})")
    full = {**DEFAULT_SHAPES[name], **shape}
    for dim in cls.dims:
        value = full[dim]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise TaxesError(f"shape: {dim}={value} must be a positive whole number")
        if value > MAX_DIM:
            raise TaxesError(f"shape: {dim}={value} is too large (at most {MAX_DIM})")
    for dim in cls.split_dims:
        if full[dim] % world:
            raise TaxesError(f"shape: {dim}={full[dim]} is not divisible by the world size {world} ({dim} is split across ranks)")
    if name == "flash-decode" and full["Hq"] % full["Hkv"]:
        raise TaxesError(f"shape: Hq={full['Hq']} is not a multiple of Hkv={full['Hkv']} (GQA shares each KV head among Hq/Hkv query heads)")
    return cls(**full, world=world, dtype=dtype)


def shape_of(workload: Workload) -> dict[str, int]:
    return {d: getattr(workload, d) for d in workload.dims}


def shape_text(workload: Workload) -> str:
    return ",".join(f"{d}={getattr(workload, d)}" for d in workload.dims)


def workload_from_dict(d: dict) -> Workload:
    """Inverse of workload_dict (used by result documents)."""
    return make_workload(d["workload"], dict(d["shape"]), d["world"], d.get("dtype", "bf16"))


def workload_dict(workload: Workload) -> dict:
    return {"workload": workload.name, "shape": shape_of(workload), "world": workload.world, "dtype": workload.dtype}


def replace_dim(workload: Workload, dim: str, value: int) -> Workload:
    shape = shape_of(workload)
    shape[dim] = value
    return make_workload(workload.name, shape, workload.world, workload.dtype)


assert all({f.name for f in fields(c)} >= set(c.dims) for c in WORKLOADS.values())
