"""The result document of `taxes analyze`: one case (workload 'trace') with one variant, the analysis's full
frames under the top-level key trace_analysis (docs/analyze.md: the JSON contract), and whether its
bulk-synchronous rows can be trusted.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from taxes.attribution import attribute as att
from taxes.attribution.analyze import PERTURBED, RULES, STATISTIC, Analysis
from taxes.documents import results
from taxes.provenance import collect_metadata

UNTRUSTED = 0.05  # a record that cost more than this share of the plain step: its waits describe the record


def analysis_document(an: Analysis) -> dict:
    """A taxes.result document: one case (workload 'trace') with one variant. samples_us: each rank's span
    per kept step; components: the attribution rows (taxes.attribution.rows.ROWS) per rank and overall (rank null:
    per step the slowest rank's rows), interquartile means over the kept steps, adding up to
    attributed_e2e_us; plain_e2e_us and measurement_cost_us when plain step times were given. The full
    frames go under the top-level key trace_analysis (docs/analyze.md: the JSON contract)."""
    ranks = sorted(an.ranks)
    d = an.decomposition.set_index(["rank", "step"])
    samples = [[float(d.loc[(r, s), "span_us"]) for s in an.kept_steps] for r in ranks]
    s = an.summary
    comps = []  # a row the trace cannot support is left out (not_measured says why), never written as 0
    for r, vals in sorted(s.get("per_rank", {}).items()):
        comps += [{"name": k, "rank": int(r), "value_us": float(vals[k]), "label": att.LABELS[k]} for k in att.ROWS
                  if _measured(vals.get(k))]
    comps += [{"name": k, "rank": None, "value_us": float(s["rows"][k]), "label": att.LABELS[k]} for k in att.ROWS
              if _measured(s.get("rows", {}).get(k))]
    info0 = an.info[ranks[0]]
    meta = collect_metadata("profile", an.world_size, an.hardware or "none", source="trace",
                                    hardware_source=an.hardware_source, statistic=STATISTIC,
                                    traces={str(r): an.ranks[r] for r in ranks}, warnings=list(an.warnings))
    meta.update({"torch_version": info0.get("torch_version"), "triton_version": info0.get("triton_version"),
                 "cuda_version": info0.get("cuda_version") or info0.get("hip_version"),
                 "nccl_version": info0.get("nccl_version"), "gpu_names": [an.devices[r] or "unknown" for r in ranks],
                 "windows": {str(r): an.windows_how[r] for r in ranks},
                 "trace_record": info0.get("record")})
    plain = an.plain
    cost, p = plain.get("measurement_cost_us"), plain.get("plain_e2e_us")
    variant = {
        "variant": "trace", "config": {"kept_steps": [int(x) for x in an.kept_steps],
                                       "flagged_steps": {str(k): v for k, v in an.flags.items()}},
        "correctness": {"checked": False, "passed": None, "rel_error": None, "tolerance": None, "reference": None},
        "samples_us": samples, "e2e_us": results.summarize_samples(samples, "measured"),
        "plain_e2e_us": p, "attributed_e2e_us": plain.get("attributed_e2e_us"), "measurement_cost_us": cost,
        "perturbed": bool(cost is not None and p and cost > PERTURBED * p),
        "phases": an.phases, "components": comps, "not_measured": dict(an.not_measured),
        "attribution": {"available": True, "clock": "torch.profiler", "rules": RULES, "statistic": STATISTIC,
                        "kept_iterations": len(s.get("kept", [])), "iterations": s.get("n", 0),
                        "unattributed_share": (s["rows"]["unattributed"] / s["e2e_us"]) if s.get("e2e_us") else None,
                        "unmatched_collectives": int((~an.instances["matched"]).sum()) if len(an.instances) else 0},
    }
    case = {"workload": results.TRACE_WORKLOAD, "shape": {"steps": max(1, len(an.kept_steps))}, "world": an.world_size,
            "dtype": "n/a", "variants": [variant]}
    doc = results.new_document(meta)
    doc["cases"].append(case)
    doc["trace_analysis"] = _frames_for_json(an)
    return doc


def _measured(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def untrusted(an: Analysis) -> str | None:
    """Why the bulk-synchronous rows and the straggler table are not to be trusted, or None: the record
    cost more than UNTRUSTED of the plain step, so arrivals and waits are the recorded run's."""
    cost, plain = an.plain.get("measurement_cost_us"), an.plain.get("plain_e2e_us")
    if cost is None or not plain or cost <= UNTRUSTED * plain:
        return None
    return (f"the record cost {cost / plain:+.0%} of the plain step (over {UNTRUSTED:.0%}): arrival order, sync wait "
            "and exposed transfer describe the recorded run, not the program; not to be trusted")


def _records(frame: pd.DataFrame) -> list[dict]:
    return json.loads(frame.to_json(orient="records", double_precision=15)) if len(frame) else []


def _frames_for_json(an: Analysis) -> dict:
    keep = ["rank", "step", "start_us", "end_us", "span_us", "comm_us", "busy_us", "exposed_comm_us", *att.ROWS,
            "locality_bytes", "launch_latency_us", "flag", "host_frames"]
    d = an.decomposition[[c for c in keep if c in an.decomposition.columns]]
    gaps = an.gaps.groupby(["rank", "step", "cause"])["dur_us"].agg(["sum", "count"]).reset_index() if len(an.gaps) \
        else pd.DataFrame(columns=["rank", "step", "cause", "sum", "count"])
    return {"decomposition": _records(d), "gaps_by_cause": _records(gaps), "what_if": [
        {"rank": int(x.rank), "step": int(x.step), "change": x.change, "projected_us": float(x.projected_us),
         "removed_us": float(x.removed_us), "label": "predicted"} for x in an.what_if.itertuples(index=False)],
        "collectives": _records(an.collectives.drop(columns=["activity"], errors="ignore")),
        "instances": _records(an.instances), "stragglers": _records(an.stragglers),
        "communication_by_rule": _records(an.comm_by_rule.rename(columns={"activities": "kernels"})),
        "locality": _records(an.locality), "not_measured": dict(an.not_measured), "untrusted": untrusted(an),
        "host_frames": _records(an.host_frames), "flagged_steps": {str(k): v for k, v in an.flags.items()},
        "kept_steps": [int(x) for x in an.kept_steps], "windows": {str(r): h for r, h in an.windows_how.items()},
        "hardware_source": an.hardware_source, "warnings": list(an.warnings)}
