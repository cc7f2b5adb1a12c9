"""Stored known-answer records (raw records and plain samples per case and rank, with the facts beside them)
read back as the per-rank results taxes.run.planted_answers makes rows from."""

from __future__ import annotations

from taxes.run.planted import DELAYS

FACTS = ("how", "x_us", "late", "workload", "variant", "shape", "eager_twin", "comm", "spun_us",
         "spins_per_iteration", "intermediate_bytes", "locality_bytes", "us_per_byte")
SINGLE_CASES = ("base", "extra", "spin", "spin_more", "graph", "unfused", "fused")


def stored_facts(m: dict) -> dict:
    """What a late-rank case's stored records keep beside the raw records (FACTS)."""
    return {k: (list(m[k]) if k == "comm" else m[k]) for k in FACTS if k in m}


def _raw(d: dict) -> dict:
    """One rank's stored raw records; a fused call whose CTAs' stamps were kept has its waits taken again
    by the rule in use (taxes.run.measure.FUSED_WAIT_RULE)."""
    from taxes.run.measure import FUSED_WAIT_RULE, waits_by_rule
    from taxes.traces.records import raw_from_columns

    raw = raw_from_columns(d)
    for it in raw["iterations"]:
        if it.get("ctas"):
            it["waits"] = waits_by_rule(it["ctas"], FUSED_WAIT_RULE)
    return raw


def results_from_records(records: dict, facts: dict | None = None) -> list[dict]:
    """Stored records ({case: [per rank: raw columns with plain_us and facts]}) as known_answers' per-rank
    results, so a run's rows can be redone by today's rules. Late-rank cases stored without facts take them
    from the case's name ("WORKLOAD VARIANT HOW X", rank 1 late); single-rank cases from `facts`
    ({case: {fact: value}}, e.g. what the run's document says of its spins), where the records lack them."""
    from taxes.variants import get

    world = len(next(iter(records.values())))
    out = [{} for _ in range(world)]
    for key in SINGLE_CASES:
        for r, d in enumerate(records.get(key, [])):
            f = {"comm": (), "locality_bytes": 0.0, "us_per_byte": None} | (facts or {}).get(key, {}) | (d.get("facts") or {})
            out[r][key] = {"raw": _raw(d), "plain": list(d.get("plain_us") or []), **f,
                           "comm": tuple(f.get("comm") or ())}
    for key, ranks in records.items():
        parts = key.split(" ")
        if len(parts) != 4 or parts[2] not in DELAYS:
            continue
        wl, variant, how, x = parts
        v = get(wl, variant)
        for r, d in enumerate(ranks):
            facts = {"how": how, "x_us": float(x), "late": 1, "workload": wl, "variant": variant, "shape": "",
                     "eager_twin": v.eager_twin, "spun_us": 0.0,
                     "comm": () if v.fused else (("all-gather",) if wl == "ag-gemm" else ("reduce-scatter",))}
            facts.update(d.get("facts") or {})
            facts["comm"] = tuple(facts["comm"])
            out[r][key] = {"raw": _raw(d), "plain": list(d.get("plain_us") or []),
                           "locality_bytes": 0.0, "us_per_byte": None, **facts}
    return out
