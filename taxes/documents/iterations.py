"""A variant's rows per iteration, from what its result document keeps: the values whose interquartile mean
the document's overall rows are (taxes.attribution.attribute.summarize), for statistics across iterations (the
intervals of `taxes compare`).

- a `taxes analyze` document: its steps' rows (trace_analysis.decomposition), the kept steps;
- a `taxes profile` document: every rank's raw records of the variant (`records`), attributed again as
  taxes.documents.profile_document.attribute_variant attributes them, with the hardware profile the document names.

Per iteration the slowest rank's rows (taxes.attribution.attribute.overall), as for the document's overall rows.
"""

from __future__ import annotations

import pandas as pd

from taxes.attribution import attribute as att
from taxes.errors import TaxesError


def iteration_rows(doc: dict, case: dict, variant: dict) -> pd.DataFrame | None:
    """One row per iteration (step, span_us and taxes.attribution.rows.ROWS), or None when the document keeps no
    per-iteration record of this variant (model documents, documents measured under older rules, or a
    hardware profile that does not load here)."""
    if doc["metadata"].get("kind") != "profile" or not (variant.get("attribution") or {}).get("available"):
        return None
    if doc["metadata"].get("source") == "trace":
        return _trace_rows(doc)
    if variant.get("records"):
        return _profile_rows(doc, case, variant)
    return None


def _trace_rows(doc: dict) -> pd.DataFrame | None:
    ta = doc.get("trace_analysis") or {}
    rows = pd.DataFrame([r for r in ta.get("decomposition") or [] if isinstance(r, dict)])
    kept = ta.get("kept_steps") or []
    if rows.empty or not {"rank", "step", "span_us", *att.ROWS} <= set(rows.columns):
        return None
    rows = rows[rows["step"].isin(kept)]
    return att.overall(rows)[["step", "span_us", *att.ROWS]].reset_index(drop=True) if len(rows) else None


def _profile_rows(doc: dict, case: dict, variant: dict) -> pd.DataFrame | None:
    from taxes.documents.profile_document import apply_floors, phase_floors
    from taxes.model.floor import floor_of
    from taxes.model.hardware import get_profile
    from taxes.traces.records import assemble_ranks, raw_from_columns
    from taxes.workloads import make_workload

    try:
        hw = get_profile(doc["metadata"]["hardware_profile"])
    except TaxesError:
        return None
    w = make_workload(case["workload"], case["shape"], case["world"], case["dtype"])
    rec, facts = variant["records"], variant.get("attribution") or {}
    twin = [tuple(x) for x in rec.get("graph_phases") or []] or None
    tls = assemble_ranks([raw_from_columns(d) for d in rec["ranks"]], twin, tuple(rec.get("comm_phases", ())))
    floors = phase_floors(w, variant["variant"], hw, facts.get("splits"))
    tls = [apply_floors(tl, floors) for tl in tls]
    a = att.attribute(tls, floor=floor_of(w, hw), locality_bytes=facts.get("locality_bytes"),
                      us_per_byte=1.0 / hw.hbm_bytes_per_us(), aligned_starts=True)
    rows = att.overall(a.rows)
    return rows[["step", "span_us", *att.ROWS]].reset_index(drop=True) if len(rows) else None
