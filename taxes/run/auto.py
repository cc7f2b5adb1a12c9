"""fused-auto: the fused schedule or the bulk-synchronous sequence in a CUDA graph, whichever the committed
measurements found faster for this workload, GPU kind and world at the nearest measured shape.

A fused kernel does not win everywhere (at 4 H100s NCCL + cuBLAS in a graph beats the fused ag-gemm at both
measured shapes), so a user who wants the fastest run asks for `fused-auto`: it runs the variant that the
table picks and says which (its configuration's `picked`, with the measurement it rests on). The table,
kernels/auto_tuned.json, is made from committed result documents by benchmarks/auto_table.py: per case,
every graph and fused variant's plain E2E and the fastest of them. With no measurement of the workload on
this GPU kind and world, it runs the graph: the baseline anyone can write.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from taxes.variants import Variant, get

FALLBACK = {"ag-gemm": "bsp-graph", "gemm-rs": "bsp-graph", "flash-decode": "bsp-graph", "tp-mlp": "all-graph"}


@lru_cache(maxsize=1)
def _entries() -> tuple:
    from taxes.kernels import __file__ as kernels_init

    path = Path(kernels_init).parent / "auto_tuned.json"
    if not path.is_file():
        return ()
    return tuple(json.loads(path.read_text())["entries"])


def shape_distance(a: dict, b: dict) -> float:
    """How far two shapes of one workload are apart: the sum over their common sizes of |log2 ratio|."""
    keys = [k for k in a if k in b and a[k] > 0 and b[k] > 0]
    return math.fsum(abs(math.log2(a[k] / b[k])) for k in keys) if keys else math.inf


def pick(workload: str, shape: dict, world: int, gpu: str, entries=None) -> tuple[str, dict]:
    """(variant to run, why): the table's pick at the nearest measured shape of this workload, GPU kind and
    world, else the workload's graph variant."""
    rows = [e for e in (entries if entries is not None else _entries())
            if e["workload"] == workload and e["gpu"] == gpu and e["world"] == world]
    if not rows:
        return FALLBACK[workload], {"picked": FALLBACK[workload],
                                    "because": f"no measurement of {workload} on {world} x {gpu}: the graph"}
    best = min(rows, key=lambda e: (shape_distance(shape, e["shape"]), e["document"]))
    shown = ",".join(f"{k}={v}" for k, v in best["shape"].items())
    return best["pick"], {"picked": best["pick"], "measured_at": shown, "document": best["document"],
                          "because": f"fastest of {', '.join(sorted(best['e2e_us']))} at {shown} on "
                                     f"{world} x {gpu} ({best['e2e_us'][best['pick']]:.1f} us)"}


def table_entries(doc: dict, path: str, gpu: str) -> list[dict]:
    """One table entry per case of a result document: every correct graph and fused variant's plain E2E
    (interquartile mean) and the fastest of them."""
    out = []
    for case in doc["cases"]:
        e2e = {}
        for v in case["variants"]:
            kind = _kind(case["workload"], v["variant"])
            if kind is None or kind.rung not in ("graph", "fused") or not v.get("correctness", {}).get("passed"):
                continue
            if v.get("plain_e2e_us"):
                e2e[v["variant"]] = float(v["plain_e2e_us"])
        if e2e:
            out.append({"workload": case["workload"], "gpu": gpu, "world": int(case["world"]),
                        "shape": dict(case["shape"]), "pick": min(e2e, key=e2e.get), "e2e_us": e2e,
                        "document": path})
    return out


def _kind(workload: str, name: str) -> Variant | None:
    try:
        return get(workload, name)
    except Exception:
        return None


class AutoRunner:
    """The picked variant's runner, as is (its calls, steps, checks and traces), with what was picked and why
    as its configuration."""

    def __init__(self, runner, variant: Variant, why: dict):
        self.runner, self.picked_variant = runner, variant
        inner = getattr(runner, "cfg", None)
        self.cfg = type("Picked", (), {})()
        self.cfg.__dict__.update(why | ({"config": dict(vars(inner))} if hasattr(inner, "__dict__") else {}))

    def describe(self) -> dict:
        """What was picked and why, with the picked runner's configuration as it ran (else its config)."""
        inner = getattr(self.runner, "describe", None)
        return dict(vars(self.cfg)) | ({"config": inner()} if callable(inner) else {})

    def __call__(self, *inputs):
        return self.runner(*inputs)

    def __getattr__(self, name):
        if name in ("runner", "picked_variant"):
            raise AttributeError(name)
        return getattr(self.runner, name)
