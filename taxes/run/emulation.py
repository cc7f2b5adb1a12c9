"""Runs under Triton's interpreter (--emulate): tiles that fit the shape, the host memory the ranks need,
and a warning when a shape takes the interpreter long."""

from __future__ import annotations


def emulation_config(workload: str, shape: dict, world: int) -> dict:
    """Tile sizes that fit a shape under Triton's interpreter, for --emulate: the GPU's tuned tiles (128 x 256,
    16 copier CTAs of 132) fit neither small shapes nor the interpreter's 4 programs. Each block is the
    largest of 64, 32, 16 that divides its dimension (the interpreter runs a tile as one numpy operation,
    so larger tiles run faster), 2 copier CTAs of 4, chunks of at most 32 rows. --config overrides these."""
    from taxes.workloads import DEFAULT_SHAPES

    full = {**DEFAULT_SHAPES.get(workload, {}), **shape}

    def block(n: int, sizes=(64, 32, 16)) -> int:
        return next((b for b in sizes if n % b == 0), sizes[-1])

    p = max(1, world)
    if workload == "ag-gemm":
        shard = full["M"] // p
        return {"block_m": block(shard), "block_n": block(full["N"] // p), "block_k": block(full["K"]), "grid": 4,
                "copiers": 2, "chunk_rows": block(shard, (32, 16, 8, 4, 2, 1))}
    if workload == "gemm-rs":
        return {"block_m": block(full["M"] // p), "block_n": block(full["N"]), "block_k": block(full["K"] // p),
                "grid": 4}
    if workload == "tp-mlp":
        import math

        shard = full["M"] // p
        return {"block_m": block(shard), "block_n": block(math.gcd(full["H"], 2 * full["F"] // p)),
                "block_k": block(math.gcd(full["H"], full["F"] // p)), "copiers": 2,
                "chunk_rows": block(shard, (32, 16, 8, 4, 2, 1))}
    if workload == "flash-decode":  # the last step of a split is masked: no divisibility needed
        return {"block_n": max(16, min(64, 1 << (max(1, full["S"]).bit_length() - 1)))}
    return {}


def emulation_config_for(workload: str, shapes: list[dict], world: int) -> dict:
    """One configuration for every shape of a run: the smallest of each tile (powers of two: a smaller one
    divides whatever a larger one divides)."""
    configs = [emulation_config(workload, s, world) for s in shapes or [{}]]
    return {k: min(c[k] for c in configs) for k in configs[0]}


def check_emulated_memory(job) -> None:
    """Before an emulated run: its ranks' buffers and shared arenas fit this machine's memory, for the
    largest case (the arenas are sized for it; each rank holds one case at a time)."""
    from taxes.run.preflight import check_host_memory
    from taxes.run.profile import bytes_for_case, heap_bytes
    from taxes.workloads import make_workload

    cases = [make_workload(job.workload, s, job.world, job.dtype) for s in job.shapes]
    need = max(job.world * (heap_bytes(w) + bytes_for_case(w, job.variants, 1)) for w in cases)
    check_host_memory(need, ranks=job.world)


def emulation_cost_note(workload: str, shapes: list[dict], world: int) -> str | None:
    """A warning when a shape is large for the interpreter (it runs each tile as numpy on the CPU)."""
    from taxes.workloads import DEFAULT_SHAPES

    for shape in shapes:
        full = {**DEFAULT_SHAPES.get(workload, {}), **shape}
        if workload in ("ag-gemm", "gemm-rs"):
            work = full["M"] * full["N"] * full["K"] / world
        elif workload == "tp-mlp":
            work = full["M"] * full["H"] * full["F"] * 3 / world
        else:
            work = full["B"] * full["Hq"] * full["D"] * full["S"] * 64
        if work > 2 ** 27:
            return ("taxes: --emulate with this shape runs for many minutes under the interpreter; a shape like "
                    + {"ag-gemm": "M=256,N=256,K=256", "gemm-rs": "M=256,N=256,K=256", "tp-mlp": "M=64,H=64,F=128",
                       "flash-decode": "B=1,Hq=8,Hkv=2,D=64,S=256"}[workload] + " takes seconds")
    return None
