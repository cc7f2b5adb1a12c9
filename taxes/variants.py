"""Every variant of every workload and what it is: one table, read wherever a variant's kind is asked.

    rung        where it stands on the ablation ladder: bsp (separate kernels and collectives, eager),
                graph (the same in a CUDA graph: launch tax removed), fused (kernels that move data
                themselves: the bulk-synchronous and locality taxes removed too), peer (someone else's
                implementation, timed for comparison), auto (fused-auto: a graph or fused variant, picked
                per workload, shape, world and GPU from the committed measurements, taxes.run.auto)
    graphed     replayed from a CUDA graph
    eager_twin  for a graphed variant, the same kernels launched eagerly (graph_twin() is the converse)
    model       the model variant that predicts it (None: the model has none); the model's own variants
                are rows too, `measured` False where no kernels exist for them
    producer    fused variants: who moves the data, "push" (the owner writes to its peers) or "pull"
    part        tp-mlp: the variant its two GEMM parts (ag-gemm, gemm-rs) run in
"""

from __future__ import annotations

from dataclasses import dataclass

from taxes.errors import TaxesError


@dataclass(frozen=True)
class Variant:
    workload: str
    name: str
    rung: str  # bsp | graph | fused | peer | auto
    graphed: bool = False
    eager_twin: str | None = None
    model: str | None = None
    measured: bool = True
    producer: str | None = None
    part: str | None = None

    @property
    def fused(self) -> bool:
        return self.rung == "fused"

    @property
    def peer(self) -> bool:
        return self.rung == "peer"

    @property
    def bulk_synchronous(self) -> bool:
        """Separate kernels and collectives (eager or graphed), as opposed to fused kernels."""
        return self.rung in ("bsp", "graph")


def _table() -> dict[str, tuple[Variant, ...]]:
    def v(w, name, rung, graphed=False, eager=None, model="self", measured=True, producer=None, part=None):
        return Variant(w, name, rung, graphed, eager, name if model == "self" else model, measured, producer, part)

    out = {}
    for w in ("ag-gemm", "gemm-rs", "flash-decode"):
        rows = [v(w, "bsp", "bsp"), v(w, "bsp-graph", "graph", True, "bsp"),
                v(w, "fused-pull", "fused", producer="pull", measured=w == "ag-gemm"),
                v(w, "fused-push", "fused", producer="push"),
                v(w, "fused-push-graph", "fused", True, "fused-push", producer="push")]
        if w == "ag-gemm":
            rows.append(v(w, "torch-async-tp", "peer", model=None))
        if w == "gemm-rs":
            rows.append(v(w, "torch-fused-rs", "peer", model=None))
        if w == "flash-decode":  # the bsp a user would write: PyTorch's best local attention + NCCL + combine
            # eager: PyTorch's attention call has a host cost of its own (a launcher kind, "sdpa"); in a graph
            # the host is gone and its kernels are priced as ours
            rows += [v(w, "bsp-sdpa", "bsp"), v(w, "bsp-sdpa-graph", "graph", True, "bsp-sdpa", "bsp-graph")]
        rows.append(v(w, "fused-auto", "auto", model=None))
        out[w] = tuple(rows)
    w = "tp-mlp"
    out[w] = (v(w, "all-bsp", "bsp", part="bsp"), v(w, "all-graph", "graph", True, "all-bsp", part="bsp-graph"),
              v(w, "all-fused-eager", "fused", producer="push", part="fused-push"),
              v(w, "all-fused", "fused", True, "all-fused-eager", producer="push", part="fused-push"),
              v(w, "fused-auto", "auto", model=None))
    return out


TABLE = _table()


def variants_of(workload: str) -> tuple[Variant, ...]:
    if workload not in TABLE:
        raise TaxesError(f"no variants for workload {workload!r} (workloads: {', '.join(TABLE)})")
    return TABLE[workload]


def names(workload: str) -> tuple[str, ...]:
    """The variants that have kernels (what `taxes profile` runs)."""
    return tuple(x.name for x in variants_of(workload) if x.measured)


def kernel_names(workload: str) -> tuple[str, ...]:
    """The variants with kernels of their own (fused-auto runs one of them)."""
    return tuple(x.name for x in variants_of(workload) if x.measured and x.rung != "auto")


def model_names(workload: str) -> tuple[str, ...]:
    """The variants the model predicts, in report order."""
    return tuple(x.name for x in variants_of(workload) if x.model == x.name)


def get(workload: str, name: str) -> Variant:
    for x in variants_of(workload):
        if x.name == name:
            return x
    raise TaxesError(f"unknown {workload} variant {name!r} (choose from {', '.join(names(workload))})")


def modelled(workload: str, name: str) -> Variant:
    """A variant the model predicts; one line naming the choices otherwise."""
    if name not in model_names(workload):
        raise TaxesError(f"unknown variant {name!r}: the model knows {', '.join(model_names(workload))}")
    return get(workload, name)


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
    return [x.name for x in variants_of(workload) if x.rung == rung and x.measured]
