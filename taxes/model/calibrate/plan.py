"""What one calibration measures: the figures, and how many readings of what size each takes.

Every time is in us, every rate per second, every figure a median of repeated readings:

- launch: host time of back-to-back eager launches (an empty Triton kernel, a tiny torch op, a Triton
  kernel with TMA descriptors launched as the fused GEMMs are, a one-kernel CUDA graph's replay, and from
  the nccl figure a small collective); the device time per empty kernel when the host is ahead (the queue
  pre-filled behind a sleep kernel) and inside a replayed CUDA graph; and each kind's first launch on a
  drained device (a start event, one launch, its end): what an iteration's first kernel waits.
- hbm: a 1 GiB device-to-device copy (bytes read + written), and a Triton kernel that only reads 1 GiB
  (kernels/probes.py: hbm_read_kernel, at READ_CONFIGS; its sums checked exactly).
- matmul: torch.matmul 8192^3 in bf16 and fp16, and in bf16 at the shapes of matmul_shapes, like the
  workloads' per-rank GEMMs (a rate can differ by shape, more so at the power limit).
- triton_gemm: the persistent Triton GEMM of the fused kernels (kernels/ag_gemm.py) at 8192^3, checked
  against float32 first.
- combine: flash decode's combine kernel (kernels/flash_decode.py) with 4 programs merging each of
  COMBINE_SETS partial sets per row, checked against float32: its time at few programs is a loop of
  dependent loads, base + sets x per set, which the model charges the combines (not HBM bandwidth).
- nccl (2 or more GPUs): all_gather_into_tensor from 4 KiB to 256 MiB per rank, back-to-back calls
  behind a sleep (the device's time, launches hidden) after one call that lines the ranks up; then the
  same for reduce_scatter_tensor, and for both on the first w ranks at every smaller world of
  collective_worlds: the curves the model reads by collective and world.
- peer: one rank writes a peer's symmetric buffer with the copy engine, with a Triton kernel's stores
  (addressed as the fused kernels address peers, and directly through the peer tensor), and reads it with
  a Triton kernel's loads; the stores and loads again by PEER_CTAS programs (what the fused kernels'
  copier CTAs deliver); with more than 2 GPUs rank 0 also writes to every peer at once.
- pingpong: a one-CTA kernel on two ranks bouncing a flag, with relaxed stores and volatile polls (the
  link latency is half its round trip) and with the fused kernels' release signal and acquire wait; a
  stamped run gives each GPU's clock offset from rank 0's (NTP's rule).
- skew: after the barrier iterations start from (RankContext.start_barrier) each rank stamps %globaltimer in a kernel; the stamps' spread with the clocks
  corrected by the offsets; also the spread of a tiny all-reduce's duration across ranks (the fallback).
"""

from __future__ import annotations

from dataclasses import dataclass

FIGURES = ("launch", "hbm", "matmul", "nccl", "peer", "pingpong", "skew", "triton_gemm", "combine", "copiers")
PAIR_FIGURES = ("nccl", "peer", "pingpong", "skew", "copiers")  # need 2 or more GPUs


@dataclass(frozen=True)
class Plan:
    """How much to measure: counts and sizes of one calibration."""

    reps: int  # timed readings per figure (medians are taken over them)
    warmup: int
    launches: int  # kernels per launch-cost reading
    nccl_sizes: tuple  # bytes per rank
    copy_bytes: int  # HBM copy
    peer_bytes: int  # peer copies
    matmul_n: int
    matmul_reps: int
    rounds: int  # ping-pong round trips per reading
    pingpong_reps: int
    skew_reps: int
    copier_rows: int = 1024  # rows of A per rank in the copiers' reading (a calibration shape of its own)
    copier_nk: int = 4096  # its N and K


FULL = Plan(reps=10, warmup=3, launches=200, nccl_sizes=tuple(4096 << i for i in range(17)), copy_bytes=1 << 30,
            peer_bytes=256 << 20, matmul_n=8192, matmul_reps=20, rounds=1000, pingpong_reps=5, skew_reps=30)
QUICK = Plan(reps=5, warmup=2, launches=100, nccl_sizes=tuple(4096 << i for i in range(0, 17, 2)), copy_bytes=1 << 30,
             peer_bytes=128 << 20, matmul_n=8192, matmul_reps=8, rounds=300, pingpong_reps=3, skew_reps=15)

# Grid (programs per SM) and block (int32 per load) of the HBM read: the best one's rate counts.
READ_CONFIGS = ((2, 8192), (4, 4096), (8, 2048))
COMBINE_SETS = (4, 64)  # partial sets per row the combine kernel merges
PEER_CTAS = (1, 2, 4, 8, 16, 32, 64)  # programs of the peer copies by CTA count
PEER_CTA_BYTES = 32 << 20  # bytes each of those copies moves


def collective_worlds(world: int) -> list[int]:
    """The worlds whose collective curves a calibration on `world` GPUs measures: the powers of two below
    it (on its first ranks) and itself."""
    return sorted({w for w in (2, 4, 8, 16, 32, 64) if w < world} | ({world} if world > 1 else set()))


def matmul_shapes(n: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of the extra bf16 readings, relative to the plan's n: at 8192 they are the per-rank GEMMs
    of ag-gemm at M = 8192 and 16384 on 2 GPUs (N/p = 4096) and a wide one."""
    return [(n, n // 2, n), (2 * n, n // 2, n), (n // 2, n, n)]


def heap_bytes_for(world: int, quick: bool) -> int:
    """Symmetric heap a calibration needs: the peer buffer plus flags and stamps."""
    plan = QUICK if quick else FULL
    return (plan.peer_bytes if world > 1 else 0) + (4 << 20)
