"""The grid of shapes `taxes validate` measures to judge the model: per workload, shapes from small to
large (and a tiny one per workload under --emulate, where only the plumbing is checked)."""

from __future__ import annotations

from taxes.errors import TaxesError

VALIDATE_GRID = {
    "ag-gemm": ["M=1024,N=8192,K=8192", "M=4096,N=8192,K=8192", "M=8192,N=8192,K=8192", "M=4096,N=28672,K=8192"],
    "flash-decode": ["B=1,S=8192", "B=1,S=32768", "B=16,S=32768", "B=64,S=8192"],
}
EMULATE_GRID = {"ag-gemm": ["M=64,N=64,K=32"], "flash-decode": ["B=1,Hq=8,Hkv=2,D=64,S=256"]}


def grid_workloads(text: str) -> list[str]:
    """The comma-separated workloads named, each with a grid (checked before anything runs)."""
    from taxes.sanitize import printable

    names = [w for w in text.split(",") if w]
    for wl in names:
        if wl not in VALIDATE_GRID:
            raise TaxesError(f"validate: no grid for workload {printable(wl)!r} (have {', '.join(VALIDATE_GRID)})")
    return names


def measure_grid(workloads: list[str], world: int, hw, iters: int, emulate: bool, timeout_s: float,
                 out_dir: str | None) -> list[dict]:
    """Profile every shape of the grid (every variant); each document is added to out_dir as it comes."""
    import os

    from taxes.documents.placement import write_document
    from taxes.run.emulation import emulation_config
    from taxes.run.profile import profile
    from taxes.workloads import parse_shape

    docs = []
    for wl in workloads:
        for shape in (EMULATE_GRID if emulate else VALIDATE_GRID)[wl]:
            config = emulation_config(wl, parse_shape(shape), world) if emulate else None
            res = profile(wl, shape, world, None, "bf16", iters, 3, emulate, hw, timeout_s=timeout_s, progress=True,
                          config=config)
            if res.document is None:
                continue
            docs.append(res.document)
            if out_dir:
                os.makedirs(out_dir, exist_ok=True)
                write_document(res.document, out_dir, False)
    return docs
