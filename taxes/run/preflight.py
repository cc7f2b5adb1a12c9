"""Checks `taxes profile` makes before it allocates anything: are the GPUs there and alike, can they
share memory, and will the run fit.

Each check is a plain function that takes the device facts it judges (so tests can hand it any
machine) and raises one TaxesError line saying what is wrong and what to do; `gpu_facts()` and
`free_memory()` read the facts of this machine.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

from taxes.errors import TaxesError
from taxes.variants import get, variants_of
from taxes.workloads import PARTIAL_BYTES, AgGemm, FlashDecode, GemmRs, TpMlp, Workload

GIB = float(1 << 30)
# Memory a rank uses besides its buffers: CUDA context, NCCL's buffers, cuBLAS workspace, Triton's
# modules. Assumed, with margin: the CUDA context alone is ~0.5 GiB on an H100/H200.
RESERVE_BYTES = 2 << 30
CONTROL_BYTES = 4096  # per rank: error words, counters and other small private tensors of a variant
SM_COUNT = 132  # for flash-decode's split count when the device is not at hand (H100/H200)


@dataclass(frozen=True)
class GpuFacts:
    """What check_gpus judges. symmetric_memory: None when usable, else why not."""

    cuda: bool
    names: list[str] = field(default_factory=list)
    symmetric_memory: str | None = None
    torch_version: str = ""


def gpu_facts() -> GpuFacts:
    """This machine's facts (imports torch; creates no CUDA context beyond what torch does to count)."""
    import torch

    if not torch.cuda.is_available():
        return GpuFacts(False, [], "no CUDA", torch.__version__)
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return GpuFacts(True, names, _symmetric_memory_problem(len(names)), torch.__version__)


def _symmetric_memory_problem(n_gpus: int) -> str | None:
    import torch

    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_nccl_available():
            return "this torch build has no NCCL (torch.distributed)"
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:
        return f"torch.distributed._symmetric_memory cannot be imported ({e})"
    missing = [f for f in ("empty", "rendezvous") if not hasattr(symm_mem, f)]
    if missing:
        return f"torch.distributed._symmetric_memory lacks {', '.join(missing)} (torch {torch.__version__} is too old)"
    for a in range(n_gpus):  # peers' arenas are mapped into each GPU's address space
        for b in range(n_gpus):
            if a != b and not torch.cuda.can_device_access_peer(a, b):
                return f"GPU {a} cannot access GPU {b}'s memory (no peer access: NVLink or PCIe P2P)"
    return None


def check_gpus(world: int, facts: GpuFacts | None = None) -> GpuFacts:
    """Refuse a run of `world` ranks that this machine cannot host; return the facts used."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise TaxesError(f"--world {world!r}: the number of GPUs must be a positive whole number")
    facts = gpu_facts() if facts is None else facts
    if not facts.cuda:
        raise TaxesError(f"no CUDA GPU is visible (torch {facts.torch_version or '?'}; check nvidia-smi, "
                         f"CUDA_VISIBLE_DEVICES and that torch is a CUDA build); `taxes model` needs none")
    if len(facts.names) < world:
        raise TaxesError(f"--world {world} needs {world} GPUs; this machine shows {len(facts.names)} "
                         f"({', '.join(facts.names) or 'none'}): use --world {len(facts.names)} or fewer")
    kinds = sorted(set(facts.names[:world]))
    if len(kinds) > 1:
        raise TaxesError(f"the {world} GPUs are of different kinds ({' / '.join(kinds)}): a fused kernel is as fast as "
                         f"its slowest rank; set CUDA_VISIBLE_DEVICES to GPUs of one kind")
    if world > 1 and facts.symmetric_memory is not None:
        raise TaxesError(f"symmetric memory is not usable here: {facts.symmetric_memory}; the fused variants need it "
                         f"(PyTorch >= 2.5 with NCCL, GPUs with peer access)")
    return facts


def free_memory(device_index: int) -> tuple[int, int]:
    """(free, total) bytes of one GPU, as the driver reports them now."""
    import torch

    return torch.cuda.mem_get_info(device_index)


def check_memory(bytes_needed_per_gpu: float, device_index: int = 0, free_total: tuple[int, int] | None = None,
                 what: str = "this run", reserve_bytes: float = RESERVE_BYTES) -> None:
    """Refuse a run that will not fit in GPU `device_index`'s free memory (plus a reserve for the CUDA
    context, NCCL and libraries)."""
    if not math.isfinite(bytes_needed_per_gpu) or bytes_needed_per_gpu < 0:
        raise TaxesError(f"{what}: memory estimate {bytes_needed_per_gpu!r} is not a byte count")
    free, total = free_memory(device_index) if free_total is None else free_total
    need = bytes_needed_per_gpu + reserve_bytes
    if need > free:
        raise TaxesError(f"{what} needs {need / GIB:.1f} GiB per GPU ({bytes_needed_per_gpu / GIB:.1f} GiB of buffers + "
                         f"{reserve_bytes / GIB:.1f} GiB reserve) but GPU {device_index} has {free / GIB:.1f} GiB free "
                         f"of {total / GIB:.1f} GiB: use a smaller shape or fewer input sets")


HOST_RESERVE_BYTES = 512 << 20  # per emulated rank besides its buffers: the interpreter, torch, Triton, numpy's temporaries


def host_available_bytes() -> int | None:
    """Memory this machine can give a new run now: MemAvailable (Linux: free memory and what the page cache
    would give back), else the free physical pages; None when neither is known."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f.read(1 << 16).decode("ascii", "replace").splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_host_memory(bytes_needed: float, available: int | None = None, what: str = "this emulated run",
                      ranks: int = 1) -> None:
    """Refuse a run on CPU ranks that would not fit in this machine's available memory (with
    HOST_RESERVE_BYTES per rank), before anything is allocated: past it the machine swaps or the kernel's
    out-of-memory killer picks a process, perhaps not ours. bytes_needed: every rank's buffers together."""
    if not math.isfinite(bytes_needed) or bytes_needed < 0:
        raise TaxesError(f"{what}: memory estimate {bytes_needed!r} is not a byte count")
    available = host_available_bytes() if available is None else available
    if available is None:
        return
    need = bytes_needed + ranks * HOST_RESERVE_BYTES
    if need > available:
        raise TaxesError(f"{what} needs {need / GIB:,.1f} GiB of host memory ({bytes_needed / GIB:,.1f} GiB of buffers "
                         f"for {ranks} rank(s) + {ranks * HOST_RESERVE_BYTES / GIB:.1f} GiB reserve) but this machine has "
                         f"{available / GIB:,.1f} GiB available: use a smaller shape")


# ---- estimates ------------------------------------------------------------------------------------


def memory_breakdown(workload: Workload, variant: str, input_sets: int = 1, check: bool = True) -> dict[str, float]:
    """Bytes one rank allocates for `variant`, by kind (as kernels/ and benchmarks/ allocate them):
    inputs and outputs (once per rotated input set), gathered/staging buffers, the symmetric heap
    (buffers peers reach, sized to fit), and the float32 reference of the correctness check."""
    known = [v.name for v in variants_of(workload.name)]
    if variant not in known:
        raise TaxesError(f"no memory estimate for variant {variant!r}: choose from {', '.join(known)}")
    if isinstance(input_sets, bool) or not isinstance(input_sets, int) or input_sets < 1:
        raise TaxesError(f"input sets must be a positive whole number, not {input_sets!r}")
    # PyTorch's fused ops allocate like bsp: torch-async-tp gathers A, torch-fused-rs holds the M x N partial
    fused = get(workload.name, variant).fused
    p, e = workload.world, workload.elt
    if isinstance(workload, AgGemm):
        M, N, K = workload.M, workload.N, workload.K
        n_local = N // p
        out = {
            # a_full (M x K) is symmetric for every variant: a rank's own rows are its input, the rest workspace
            "symmetric heap": input_sets * M * K * e + _flags(p * M),
            "inputs": input_sets * K * n_local * e,
            "outputs": input_sets * M * n_local * e,
            "gathered": 0.0 if fused else M * K * e,
            "reference check": (M * K + K * n_local + M * n_local) * 4.0 if check else 0.0,
        }
    elif isinstance(workload, GemmRs):
        M, N, K = workload.M, workload.N, workload.K
        k_local = K // p
        out = {
            "inputs": input_sets * k_local * N * e,
            "outputs": input_sets * (M // p) * N * e,
            # bsp: the whole M x N partial product, then NCCL's reduce-scatter; fused: the copy-engine
            # producer's local staging of the peers' rows (counted whichever producer the config picks)
            "gathered": (p - 1) * (M // p) * N * e if fused else M * N * e,
            # A_r (M x K/p) is symmetric in every variant (taxes.run.cases: emulated reduce-scatters and torch's
            # fused op read peers'); fused: every peer's partial of the rows this rank owns lands in its
            # (double-buffered) inbox
            "symmetric heap": input_sets * M * k_local * e
                              + ((2 * (p - 1) * (M // p) * N * e + _flags(p * M)) if fused else 0.0),
            "reference check": (M * k_local + k_local * N + M * N) * 4.0 if check else 0.0,
        }
    elif isinstance(workload, FlashDecode):
        B, Hq, Hkv, D, S = workload.B, workload.Hq, workload.Hkv, workload.D, workload.S
        R = B * Hq
        row = (D + 1) * PARTIAL_BYTES  # one packed partial: output and log-sum-exp, float32
        splits = workload.kv_splits(SM_COUNT)
        chunk = max(256, min(8192, (1 << 30) // (B * Hkv * D * 4)))  # the reference's KV chunk (kernels/decode_local.py)
        out = {
            "inputs": input_sets * (2 * B * Hkv * S * D + R * D) * e,
            "outputs": input_sets * R * D * e,
            "gathered": R * splits * row + (0.0 if fused else (1 + p) * R * row),
            # fused: a double-buffered inbox of every rank's partial, and a flag per (rank, row block)
            "symmetric heap": (2 * p * R * row + _flags(p * R)) if fused else p * R * row,
            # float32 K and V of one chunk, scores and probabilities, accumulators
            "reference check": (2 * B * Hkv * min(S, chunk) * D + 2 * R * min(S, chunk) + 2 * p * R * (D + 2)) * 4.0
                               if check else 0.0,
        }
    elif isinstance(workload, TpMlp):
        M, H, F = workload.M, workload.H, workload.F
        rows, f_local = M // p, F // p
        fused = get(workload.name, variant).fused
        out = {
            # X (M x H) is symmetric: a rank's own rows are its input, the rest the all-gather's workspace;
            # fused: the gemm-rs inbox (double-buffered, p-1 slots of M/p x H) and flags
            "symmetric heap": input_sets * M * H * e + ((2 * (p - 1) * rows * H * e + _flags(p * M)) if fused else 0.0),
            "inputs": input_sets * 3 * H * f_local * e,  # W1_r (H x 2F/p) and W2_r (F/p x H)
            "outputs": input_sets * rows * H * e,
            # Y1 (M x 2F/p) and Z (M x F/p) in every variant; bsp also the gathered X, silu's temporary and
            # the M x H partial product; fused: the gemm-rs copy engine's staging of the peers' rows
            "gathered": (3 * M * f_local + ((p - 1) * rows * H if fused else M * H + M * f_local + M * H)) * e,
            # every rank's W1 and W2 (input dtype), then float32 of this rank's rows through the layer
            "reference check": (3 * H * F * e + (rows * H + 3 * H * F + 3 * rows * f_local + rows * H) * 4.0)
                               if check else 0.0,
        }
    else:
        raise TaxesError(f"no memory estimate for workload {getattr(workload, 'name', workload)!r}")
    out["control words"] = CONTROL_BYTES
    return {k: float(v) for k, v in out.items()}


def _flags(n: int) -> int:
    return 4 * n + 4096  # int32 flags at most one per row, plus small control words and alignment


def bytes_needed(workload: Workload, variant: str, input_sets: int = 1, check: bool = True) -> float:
    """Bytes one rank allocates for `variant` (the sum of memory_breakdown)."""
    return sum(memory_breakdown(workload, variant, input_sets, check).values())


def heap_bytes_needed(workload: Workload, variant: str, input_sets: int = 1) -> int:
    """The symmetric heap to ask launch() for: the heap's share of the estimate, rounded up to 64 MiB."""
    b = memory_breakdown(workload, variant, input_sets, check=False)["symmetric heap"]
    step = 64 << 20
    return max(step, int(-(-b // step) * step))


def no_gpu_here() -> bool:
    """True when this machine surely has no GPU a run could use, known without importing torch (which
    takes seconds): no NVIDIA driver (/proc/driver/nvidia/gpus, /dev/nvidia*), no ROCm (/dev/kfd), or
    CUDA_VISIBLE_DEVICES hiding every device. False means: ask torch."""
    import glob

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return True
    nvidia = (os.path.isdir("/proc/driver/nvidia/gpus") and os.listdir("/proc/driver/nvidia/gpus")) or \
        glob.glob("/dev/nvidia[0-9]*")
    return not nvidia and not os.path.exists("/dev/kfd")


def surely_no_gpu() -> bool:
    """No GPU, decided without importing torch: only while torch is not loaded yet (once it is, asking it is
    cheap and knows more)."""
    return "torch" not in sys.modules and no_gpu_here()
