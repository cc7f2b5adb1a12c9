"""Every variant of every workload and what it is: one table, read wherever a variant's kind is asked.

    rung        where it stands on the ablation ladder: bsp (separate kernels and collectives, eager),
                graph (the same in a CUDA graph: launch tax removed), fused (kernels that move data
                themselves: the bulk-synchronous and locality taxes removed too), peer (someone else's
                implementation, timed for comparison)
    fused       runs fused kernels (timed with their traced build; waits read off their own clocks)
    graphed     replayed from a CUDA graph
    eager_twin  for a graphed variant, the same kernels launched eagerly; graph_twin the converse
    model       the model variant that predicts it (None: the model has none)
"""

from __future__ import annotations

from dataclasses import dataclass

from taxes.errors import TaxesError


@dataclass(frozen=True)
class Variant:
    workload: str
    name: str
    rung: str  # bsp | graph | fused | peer
    graphed: bool = False
    eager_twin: str | None = None
    model: str | None = None

    @property
    def fused(self) -> bool:
        return self.rung == "fused"

    @property
    def peer(self) -> bool:
        return self.rung == "peer"


def _table() -> dict[str, tuple[Variant, ...]]:
    def v(w, name, rung, graphed=False, eager=None, model=None):
        return Variant(w, name, rung, graphed, eager, model)

    out = {}
    for w in ("ag-gemm", "gemm-rs", "flash-decode"):
        rows = [v(w, "bsp", "bsp", model="bsp"), v(w, "bsp-graph", "graph", True, "bsp", "bsp-graph")]
        if w == "ag-gemm":
            rows.append(v(w, "fused-pull", "fused", model="fused-pull"))
        rows += [v(w, "fused-push", "fused", model="fused-push"),
                 v(w, "fused-push-graph", "fused", True, "fused-push", "fused-push-graph")]
        if w == "ag-gemm":
            rows.append(v(w, "torch-async-tp", "peer"))
        if w == "gemm-rs":
            rows.append(v(w, "torch-fused-rs", "peer"))
        if w == "flash-decode":  # the bsp a user would write: PyTorch's best local attention + NCCL + combine
            rows += [v(w, "bsp-sdpa", "bsp", model="bsp"),
                     v(w, "bsp-sdpa-graph", "graph", True, "bsp-sdpa", "bsp-graph")]
        out[w] = tuple(rows)
    w = "tp-mlp"
    out[w] = (v(w, "all-bsp", "bsp", model="all-bsp"), v(w, "all-graph", "graph", True, "all-bsp", "all-graph"),
              v(w, "all-fused-eager", "fused", model="all-fused-eager"),
              v(w, "all-fused", "fused", True, "all-fused-eager", "all-fused"))
    return out


TABLE = _table()


def variants_of(workload: str) -> tuple[Variant, ...]:
    if workload not in TABLE:
        raise TaxesError(f"no variants for workload {workload!r} (workloads: {', '.join(TABLE)})")
    return TABLE[workload]


def names(workload: str) -> tuple[str, ...]:
    return tuple(x.name for x in variants_of(workload))


def get(workload: str, name: str) -> Variant:
    for x in variants_of(workload):
        if x.name == name:
            return x
    raise TaxesError(f"unknown {workload} variant {name!r} (choose from {', '.join(names(workload))})")


def lookup(name: str) -> Variant | None:
    """A variant by name alone (the first workload that has it), for documents that name only variants."""
    for rows in TABLE.values():
        for x in rows:
            if x.name == name:
                return x
    return None


def graph_twin(workload: str, name: str) -> str | None:
    """The CUDA-graph twin of an eager variant."""
    for x in variants_of(workload):
        if x.eager_twin == name:
            return x.name
    return None


def rung_of(workload: str, rung: str) -> list[str]:
    return [x.name for x in variants_of(workload) if x.rung == rung]
